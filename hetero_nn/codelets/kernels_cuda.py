"""Whole-operation CUDA kernels for the ``cuda`` variants, made by memoized factories.

A ``cuda`` variant written against the array module issues one kernel per array
operation: an SGD step with momentum is about 15, a batch-norm backward 18. On a GPU
each launch costs the host a few microseconds, so a training step is bound by the
host. This module replaces such a chain by **one** kernel per operation:

* a :class:`Kernel` is one CUDA C translation unit (``extern "C"``, the element type
  ``T`` a ``typedef``) launched by CuPy's ``RawKernel``, plus its NumPy **twin**: the
  array-module code the variant ran before, which states the kernel's semantics;
* the factories (``@functools.lru_cache`` on the element type) build each kernel
  once; CuPy compiles it with NVRTC once per device on first use;
* :func:`launch` runs the kernel on CuPy arrays, the twin on NumPy arrays, and on the
  strict stand-in (:mod:`.strict_xp`) the twin under the stand-in's rules counted as
  **one** launch: so CI runs the variant's kernel path, with the kernel body's
  semantics from the twin.

Policy: kernels are compiled with ``--fmad=false`` (no contraction of ``a * b + c``
into an FMA: each operation rounds as NumPy's does), use no atomics (every sum runs in
a fixed order, so a result is the same bits on every run and under every policy), and
take C-contiguous operands of one float type (float32 or float64); a variant whose
operands are otherwise, or a layer larger than a kernel's work limit, takes its
array-module path. The sources are compile-checked to PTX with NVRTC in CI
(``tests/test_kernels_cuda.py``).

Owns: :class:`Kernel`, :func:`launch`, :func:`covers` and the
optimizer and loss kernels (the layer kernels: :mod:`.kernels_cuda_layers`).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["Kernel", "launch", "covers", "FACTORIES", "sgd_kernel", "adam_kernel",
           "xent_kernel", "BLOCK", "OPTIONS"]

BLOCK = 128
"""Threads per block of every kernel."""

OPTIONS = ("--fmad=false",)
"""NVRTC options: no FMA contraction, so each operation rounds as NumPy's does."""

_C_TYPES = {"float32": "float", "float64": "double"}


class Kernel:
    """One CUDA C kernel (``name`` in ``source``) and the NumPy twin that states what it
    computes. ``single_block``: launched as one block (kernels that end in a fixed-order
    sum over all threads), else one thread per work item."""

    def __init__(self, name: str, source: str, single_block: bool = False):
        self.name = name
        self.source = source
        self.single_block = single_block
        self.params = _parameters(source, name)
        self._raw = None

    def __repr__(self):
        return f"Kernel({self.name})"

    def raw(self, cupy):
        """The CuPy ``RawKernel`` (compiled by NVRTC on its first launch on a device)."""
        if self._raw is None:
            self._raw = cupy.RawKernel(self.source, self.name, options=OPTIONS)
        return self._raw

    def arguments(self, args) -> tuple:
        """``args`` as the kernel's parameters take them (a RawKernel passes a scalar by
        its NumPy type: an ``int`` where ``double`` is declared would be read as bits):
        arrays for pointers, ``float64``/``int64`` for ``double``/``long long``. Checked
        on every path, so CI catches a call that does not fit the signature."""
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.params)} "
                            "parameters")
        out = []
        for kind, value in zip(self.params, args):
            if kind == "pointer":
                if not hasattr(value, "shape"):
                    raise TypeError(f"{self.name}: an array expected, got {type(value).__name__}")
                out.append(value)
            elif hasattr(value, "shape") or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"{self.name}: a {kind} expected, got {type(value).__name__}")
            else:
                out.append(np.float64(value) if kind == "double" else np.int64(value))
        return tuple(out)


def _parameters(text: str, name: str) -> list[str]:
    """``"pointer"``, ``"double"`` or ``"long long"`` for each parameter of ``name``."""
    head = text[text.index(f"void {name}(") + len(name) + 6:]
    kinds = []
    for param in head[:head.index(")")].split(","):
        kinds.append("pointer" if "*" in param else "double" if "double" in param
                     else "long long")
        if kinds[-1] == "long long" and "long long" not in param:
            raise ValueError(f"{name}: parameter {param.strip()!r}: only pointers, double "
                             "and long long are passed")
    return kinds


def launch(xp, kernel: Kernel, work: int, args: tuple, twin, *twin_args, **twin_kwargs):
    """Run ``kernel`` over ``work`` items with ``args`` on CuPy arrays; elsewhere run
    ``twin(*twin_args, **twin_kwargs)`` (on the strict stand-in, as one counted launch).
    ``args`` are checked against the kernel's signature on every path."""
    arguments = kernel.arguments(args)
    if hasattr(xp, "RawKernel"):  # CuPy
        blocks = 1 if kernel.single_block else max(1, -(-int(work) // BLOCK))
        kernel.raw(xp)((blocks,), (BLOCK,), arguments)
    elif hasattr(xp, "launch_twin"):  # the strict stand-in
        xp.launch_twin(kernel.name, twin, twin_args, twin_kwargs)
    else:
        twin(*twin_args, **twin_kwargs)


def covers(*arrays, dtype=None) -> bool:
    """Whether the kernels take these operands: C-contiguous, float ones all ``dtype``
    (the first float operand's by default) and that a float32 or float64."""
    for a in arrays:
        if a is None:
            continue
        if not getattr(a, "flags", None) or not a.flags.c_contiguous:
            return False
        if a.dtype.kind == "f":
            dtype = dtype or a.dtype
            if a.dtype != dtype:
                return False
    return dtype is not None and np.dtype(dtype).name in _C_TYPES


def source(template: str, dtype) -> tuple[str, str]:
    """``(kernel name suffix, source)``: ``template`` with ``T`` the C type of ``dtype``."""
    name = np.dtype(dtype).name
    suffix = "f32" if name == "float32" else "f64"
    return suffix, f"typedef {_C_TYPES[name]} T;\n" + template.replace("@", suffix)


# --------------------------------------------------------------------------- optimizers

_SGD = r"""
extern "C" __global__ void sgd_step_@(
    T* param, const T* grad, T* buf, const double* hyper, const double dampening,
    const double weight_decay, const long long nesterov, const long long has_buf,
    const long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double lr = hyper[0], momentum = hyper[1], first = hyper[2];
    T g = grad[i];
    if (weight_decay != 0.0) g = g + (T)weight_decay * param[i];
    if (has_buf && momentum != 0.0) {
        const T m = (T)momentum;
        const T b = first != 0.0 ? g : buf[i] * m + (T)(1.0 - dampening) * g;
        buf[i] = b;
        g = nesterov ? g + m * b : b;
    }
    param[i] += (T)(-lr) * g;
}
"""


@functools.lru_cache(maxsize=None)
def sgd_kernel(dtype: str) -> Kernel:
    """SGD's step (momentum, dampening, Nesterov, weight decay), one thread per element;
    twin: :func:`.optim_cuda.sgd_step_xp`."""
    suffix, text = source(_SGD, dtype)
    return Kernel(f"sgd_step_{suffix}", text)


_ADAM = r"""
extern "C" __global__ void adam_step_@(
    T* param, const T* grad, T* exp_avg, T* exp_avg_sq, const double* hyper,
    const double eps, const double weight_decay, const long long decoupled, const long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double lr = hyper[0], beta1 = hyper[1], beta2 = hyper[2], step = hyper[3];
    const double step_size = step >= 1.0 ? lr / (1.0 - pow(beta1, step)) : nan("");
    const double bias_correction2_sqrt = pow(1.0 - pow(beta2, step), 0.5);
    T p = param[i];
    T g = grad[i];
    if (weight_decay != 0.0 && decoupled) p *= (T)(1.0 - lr * weight_decay);
    else if (weight_decay != 0.0) g = g + (T)weight_decay * p;
    const T weight = (T)(1.0 - beta1);
    const T a = exp_avg[i];
    const T avg = fabs(weight) < (T)0.5 ? a + weight * (g - a) : g + (weight - (T)1) * (g - a);
    exp_avg[i] = avg;
    T sq = exp_avg_sq[i] * (T)beta2;
    sq += ((T)(1.0 - beta2) * g) * g;
    exp_avg_sq[i] = sq;
    T denom = sqrt(sq);
    denom /= (T)bias_correction2_sqrt;
    denom += (T)eps;
    param[i] = p + ((T)(-step_size) * avg) / denom;
}
"""


@functools.lru_cache(maxsize=None)
def adam_kernel(dtype: str) -> Kernel:
    """Adam's (``decoupled``: AdamW's) step, one thread per element; twin:
    :func:`.optim_cuda.adam_step_xp`."""
    suffix, text = source(_ADAM, dtype)
    return Kernel(f"adam_step_{suffix}", text)


# --------------------------------------------------------------------------- softmax cross-entropy

_XENT = r"""
extern "C" __global__ void softmax_xent_@(
    const T* logits, const long long* labels, T* dlogits, T* loss, long long* correct,
    const long long n, const long long k, const long long batch, const double smoothing,
    const long long with_grad)
{
    // one block: each thread takes rows t, t + blockDim.x, ...; its partial sums are
    // then added by thread 0 in thread order (a fixed order: no atomics)
    __shared__ T nll_part[128];
    __shared__ T smooth_part[128];
    __shared__ long long correct_part[128];
    __shared__ int bad_part[128];
    const int t = threadIdx.x;
    T nll = 0, smooth = 0;
    long long hits = 0;
    int bad = 0;
    for (long long r = t; r < n; r += blockDim.x) {
        const T* row = logits + r * k;
        long long label = labels[r];
        if (label < 0 || label >= k) { bad = 1; label = 0; }
        long long arg = 0;                          // NumPy's argmax: the first NaN, else
        T top = row[0];                             // the first maximum
        for (long long j = 1; j < k && top == top; ++j)
            if (row[j] > top || row[j] != row[j]) { top = row[j]; arg = j; }
        hits += arg == label;
        T m = row[0];                               // the row's max (NaN if it has one)
        for (long long j = 1; j < k && m == m; ++j)
            if (row[j] > m || row[j] != row[j]) m = row[j];
        T total = 0;
        for (long long j = 0; j < k; ++j) total += exp(row[j] - m);
        const T lse = log(total);
        nll -= (row[label] - m) - lse;
        if (smoothing != 0.0)
            for (long long j = 0; j < k; ++j) smooth -= (row[j] - m) - lse;
        if (with_grad) {
            const T inv = (T)(1.0 / batch);
            const T keep = smoothing != 0.0 ? (T)((1.0 - smoothing) / batch) : inv;
            for (long long j = 0; j < k; ++j) {
                T d = exp((row[j] - m) - lse) * inv;
                if (smoothing != 0.0) d -= (T)(smoothing / k / batch);
                dlogits[r * k + j] = j == label ? d - keep : d;
            }
        }
    }
    nll_part[t] = nll; smooth_part[t] = smooth; correct_part[t] = hits; bad_part[t] = bad;
    __syncthreads();
    if (t == 0) {
        T nll_sum = 0, smooth_sum = 0;
        long long hit_sum = 0;
        int any_bad = 0;
        for (int u = 0; u < blockDim.x; ++u) {
            nll_sum += nll_part[u]; smooth_sum += smooth_part[u];
            hit_sum += correct_part[u]; any_bad |= bad_part[u];
        }
        T value = smoothing != 0.0
            ? (T)(1.0 - smoothing) * nll_sum + smooth_sum * (T)(smoothing / k) : nll_sum;
        loss[0] = any_bad ? (T)nan("") : loss[0] + value / (T)batch;
        correct[0] += hit_sum;
        bad_part[0] = any_bad;
    }
    __syncthreads();
    if (with_grad && bad_part[0])
        for (long long e = t; e < n * k; e += blockDim.x) dlogits[e] = (T)nan("");
}
"""


@functools.lru_cache(maxsize=None)
def xent_kernel(dtype: str) -> Kernel:
    """Softmax cross-entropy (loss, correct count, and its gradient unless evaluating) in
    one block; twin: the array-module path of :mod:`.loss`."""
    suffix, text = source(_XENT, dtype)
    return Kernel(f"softmax_xent_{suffix}", text, single_block=True)


FACTORIES = [sgd_kernel, adam_kernel, xent_kernel]
"""The factories of this module (:func:`.kernels_cuda_layers.all_kernels` lists every kernel)."""
