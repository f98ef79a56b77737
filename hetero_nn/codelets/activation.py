"""Activation codelets (ReLU, LeakyReLU, Sigmoid, Tanh, GELU, SiLU, ReLU6, Hardswish):
forward and backward, on arrays of any shape.

Semantics follow PyTorch's formulas (named beside each codelet below); ReLU's to
the letter, NaN included:

- forward ``y = 0 if x <= 0 else x`` (``clamp_min(x, 0)``: NaN stays NaN);
- backward ``dx = 0 if y <= 0 else dy`` (``threshold_backward(dy, y, 0)``:
  the gradient at exactly 0 is 0), computed from the forward *output* ``y``
  so the layer need not keep its input.

The Numba kernels run over the flattened buffers (a branch-free select that
LLVM vectorises), each ``cpu`` variant with a ``prepare`` (one call of its kernel on
flat views, :func:`_flat_variant`); the ``"cuda"`` variants use ``xp.where``.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernels_cuda_layers
from ._jit import jit
from .codelet import R, W, Codelet
from .prepared import contiguous
from .reduce import flat_view
from .xp import array_module, by_xp

__all__ = ["relu_fwd", "relu_bwd", "leaky_relu_fwd", "leaky_relu_bwd", "sigmoid_fwd",
           "sigmoid_bwd", "tanh_fwd", "tanh_bwd", "gelu_fwd", "gelu_bwd", "silu_fwd", "silu_bwd",
           "relu6_fwd", "relu6_bwd", "hardswish_fwd", "hardswish_bwd"]


def _check_same_shape(name, *arrays):
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"{name}: operands must have one shape, got "
                         f"{[a.shape for a in arrays]}")


def _flat_calls(kernel, name, inputs, out, *scalars):
    """The prepared call of a flat kernel ``kernel(*inputs, out, *scalars)`` on same-shape
    arrays (flat views), or None when one is strided (:func:`_run_flat` copies it)."""
    _check_same_shape(name, *inputs, out)
    if not contiguous(*inputs, out):
        return None
    return [(kernel, (*(a.reshape(-1) for a in inputs), out.reshape(-1), *scalars))]


def _flat_variant(kernel, name, scalars=None):
    """The ``cpu`` variant ``variant(*inputs, out, **params)`` that runs a flat kernel, and its
    ``prepare``; ``scalars(out, **params)``: the kernel's arguments after ``out``."""
    def variant(*arrays, **params):
        _run_flat(kernel, name, arrays[:-1], arrays[-1],
                  *(scalars(arrays[-1], **params) if scalars else ()))

    def prepare(buffers, *arrays, **params):
        return _flat_calls(kernel, name, arrays[:-1], arrays[-1],
                           *(scalars(arrays[-1], **params) if scalars else ()))
    variant.__name__ = f"{kernel.__name__}_wrapper"
    variant.prepare = prepare
    return variant


def _run_flat(kernel, name, inputs, out, *scalars):
    """Run a flat Numba kernel ``kernel(*inputs, out, *scalars)`` on same-shape arrays."""
    _check_same_shape(name, *inputs, out)
    flat_in = [np.ascontiguousarray(a).reshape(-1) for a in inputs]
    out_flat = flat_view(out)
    if out_flat is None:
        tmp = np.empty(out.shape, out.dtype)
        kernel(*flat_in, tmp.reshape(-1), *scalars)
        out[...] = tmp
        return
    kernel(*flat_in, out_flat, *scalars)


# --------------------------------------------------------------------------- forward

def _relu_fwd_ref(x, y):
    np.maximum(x, np.zeros((), x.dtype), out=y)  # propagates NaN like clamp_min


@jit
def _relu_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        v = x[i]
        if v <= 0:
            y[i] = 0
        else:
            y[i] = v


_relu_fwd_cpu_wrapper = _flat_variant(_relu_fwd_cpu, "relu_fwd")


def _relu_fwd_cuda(x, y):
    xp = array_module(x, y)
    if not kernels_cuda_layers.relu(xp, x, None, y, _relu_fwd_xp, xp, x, y):
        _relu_fwd_xp(xp, x, y)


def _relu_fwd_xp(xp, x, y):
    xp.maximum(x, xp.zeros((), x.dtype), out=y)


relu_fwd = Codelet(
    "relu_fwd", modes=(R, W),
    variants={"ref": _relu_fwd_ref, "cpu": _relu_fwd_cpu_wrapper, "cuda": _relu_fwd_cuda},
    flops=lambda x, y, **params: float(np.prod(x)),
)
"""``y = max(x, 0)`` elementwise (R x, W y), PyTorch's NaN handling."""


# --------------------------------------------------------------------------- backward

def _relu_bwd_ref(y, dy, dx):
    np.copyto(dx, np.where(y <= 0, np.zeros((), dy.dtype), dy))


@jit
def _relu_bwd_cpu(y, dy, dx):
    for i in range(y.shape[0]):
        if y[i] <= 0:
            dx[i] = 0
        else:
            dx[i] = dy[i]


_relu_bwd_cpu_wrapper = _flat_variant(_relu_bwd_cpu, "relu_bwd")


def _relu_bwd_cuda(y, dy, dx):
    xp = array_module(y, dy, dx)
    if not kernels_cuda_layers.relu(xp, y, dy, dx, _relu_bwd_xp, xp, y, dy, dx):
        _relu_bwd_xp(xp, y, dy, dx)


def _relu_bwd_xp(xp, y, dy, dx):
    xp.copyto(dx, xp.where(y <= 0, xp.zeros((), dy.dtype), dy))


relu_bwd = Codelet(
    "relu_bwd", modes=(R, R, W),
    variants={"ref": _relu_bwd_ref, "cpu": _relu_bwd_cpu_wrapper, "cuda": _relu_bwd_cuda},
    flops=lambda y, dy, dx, **params: float(np.prod(y)),
)
"""``dx = dy where y > 0 else 0`` (R y, R dy, W dx): PyTorch's ``threshold_backward``."""


# --------------------------------------------------------------------------- more activations
#
# LeakyReLU, Sigmoid, Tanh and GELU (exact, erf form), each a forward and a backward
# codelet with PyTorch's formulas: ``leaky_relu_backward`` and ``gelu_backward`` read
# the forward *input*, ``sigmoid_backward`` and ``tanh_backward`` its *output*. The
# Numba kernels run over flat buffers through ``_run_flat``.

_SQRT1_2 = 0.7071067811865476        # M_SQRT1_2
_GELU_PDF = 0.3989422804014327       # M_2_SQRTPI * M_SQRT1_2 * 0.5 = 1 / sqrt(2 pi)


def _erf(xp, x):
    """``erf`` elementwise: CuPy's on a GPU, SciPy's on the host."""
    if xp is not np and hasattr(xp, "erf"):  # the strict CuPy stand-in (strict_xp)
        return xp.erf(x)
    if xp is not np:
        import cupyx.scipy.special  # cupy: optional, only on a real CUDA node
        return cupyx.scipy.special.erf(x)
    return host_erf(x)


def host_erf(x):
    """SciPy's ``erf`` on a host array: the one place the package loads ``scipy.special``
    (also the strict CuPy stand-in's ``erf``)."""
    from scipy.special import erf  # scipy.special: 0.1-0.2 s at start-up, for GELU only
    return erf(x)


def _unary_flops(*shapes, **params):
    return float(np.prod(shapes[0]))


def _pointwise(name, ref, cpu, cuda, modes):
    return Codelet(name, modes=modes, variants={"ref": ref, "cpu": cpu, "cuda": cuda},
                   flops=_unary_flops)


# LeakyReLU: y = x if x > 0 else slope * x; dx = dy if x > 0 else slope * dy

def _slope(out, negative_slope=0.01):
    """The leaky ReLU kernels' scalar: the slope in the operands' dtype."""
    return (out.dtype.type(negative_slope),)


def _leaky_relu_fwd_ref(x, y, negative_slope=0.01):
    np.copyto(y, np.where(x > 0, x, x * x.dtype.type(negative_slope)))


@jit
def _leaky_relu_fwd_cpu(x, y, slope):
    for i in range(x.shape[0]):
        v = x[i]
        y[i] = v if v > 0 else v * slope


_leaky_relu_fwd_cpu_wrapper = _flat_variant(_leaky_relu_fwd_cpu, "leaky_relu_fwd", _slope)


def _leaky_relu_fwd_cuda(x, y, negative_slope=0.01):
    xp = array_module(x, y)
    xp.copyto(y, xp.where(x > 0, x, x * x.dtype.type(negative_slope)))


def _leaky_relu_bwd_ref(x, dy, dx, negative_slope=0.01):
    np.copyto(dx, np.where(x > 0, dy, dy * dy.dtype.type(negative_slope)))


@jit
def _leaky_relu_bwd_cpu(x, dy, dx, slope):
    for i in range(x.shape[0]):
        dx[i] = dy[i] if x[i] > 0 else dy[i] * slope


_leaky_relu_bwd_cpu_wrapper = _flat_variant(_leaky_relu_bwd_cpu, "leaky_relu_bwd", _slope)


def _leaky_relu_bwd_cuda(x, dy, dx, negative_slope=0.01):
    xp = array_module(x, dy, dx)
    xp.copyto(dx, xp.where(x > 0, dy, dy * dy.dtype.type(negative_slope)))


leaky_relu_fwd = _pointwise("leaky_relu_fwd", _leaky_relu_fwd_ref, _leaky_relu_fwd_cpu_wrapper,
                            _leaky_relu_fwd_cuda, (R, W))
"""``y = leaky_relu(x, negative_slope)`` (R x, W y)."""
leaky_relu_bwd = _pointwise("leaky_relu_bwd", _leaky_relu_bwd_ref, _leaky_relu_bwd_cpu_wrapper,
                            _leaky_relu_bwd_cuda, (R, R, W))
"""``dx = dy if x > 0 else negative_slope * dy`` (R x, R dy, W dx)."""


# Sigmoid: y = 1 / (1 + exp(-x)); dx = dy * (1 - y) * y

def _sigmoid_fwd_ref(x, y):
    one = x.dtype.type(1)
    np.copyto(y, one / (one + np.exp(-x)))


@jit
def _sigmoid_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        y[i] = 1 / (1 + np.exp(-x[i]))


_sigmoid_fwd_cpu_wrapper = _flat_variant(_sigmoid_fwd_cpu, "sigmoid_fwd")


def _sigmoid_fwd_cuda(x, y):
    xp = array_module(x, y)
    one = x.dtype.type(1)
    xp.copyto(y, one / (one + xp.exp(-x)))


def _sigmoid_bwd_ref(y, dy, dx):
    np.copyto(dx, dy * (y.dtype.type(1) - y) * y)


@jit
def _sigmoid_bwd_cpu(y, dy, dx):
    for i in range(y.shape[0]):
        dx[i] = dy[i] * (1 - y[i]) * y[i]


_sigmoid_bwd_cpu_wrapper = _flat_variant(_sigmoid_bwd_cpu, "sigmoid_bwd")


def _sigmoid_bwd_cuda(y, dy, dx):
    xp = array_module(y, dy, dx)
    xp.copyto(dx, dy * (y.dtype.type(1) - y) * y)


sigmoid_fwd = _pointwise("sigmoid_fwd", _sigmoid_fwd_ref, _sigmoid_fwd_cpu_wrapper,
                         _sigmoid_fwd_cuda, (R, W))
"""``y = sigmoid(x)`` (R x, W y)."""
sigmoid_bwd = _pointwise("sigmoid_bwd", _sigmoid_bwd_ref, _sigmoid_bwd_cpu_wrapper,
                         _sigmoid_bwd_cuda, (R, R, W))
"""``dx = dy * (1 - y) * y`` from the forward output (R y, R dy, W dx)."""


# Tanh: y = tanh(x); dx = dy * (1 - y * y)

def _tanh_fwd_ref(x, y):
    np.tanh(x, out=y)


@jit
def _tanh_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        y[i] = np.tanh(x[i])


_tanh_fwd_cpu_wrapper = _flat_variant(_tanh_fwd_cpu, "tanh_fwd")


def _tanh_fwd_cuda(x, y):
    xp = array_module(x, y)
    xp.copyto(y, xp.tanh(x))


def _tanh_bwd_ref(y, dy, dx):
    np.copyto(dx, dy * (y.dtype.type(1) - y * y))


@jit
def _tanh_bwd_cpu(y, dy, dx):
    for i in range(y.shape[0]):
        dx[i] = dy[i] * (1 - y[i] * y[i])


_tanh_bwd_cpu_wrapper = _flat_variant(_tanh_bwd_cpu, "tanh_bwd")


def _tanh_bwd_cuda(y, dy, dx):
    xp = array_module(y, dy, dx)
    xp.copyto(dx, dy * (y.dtype.type(1) - y * y))


tanh_fwd = _pointwise("tanh_fwd", _tanh_fwd_ref, _tanh_fwd_cpu_wrapper, _tanh_fwd_cuda, (R, W))
"""``y = tanh(x)`` (R x, W y)."""
tanh_bwd = _pointwise("tanh_bwd", _tanh_bwd_ref, _tanh_bwd_cpu_wrapper, _tanh_bwd_cuda,
                      (R, R, W))
"""``dx = dy * (1 - y^2)`` from the forward output (R y, R dy, W dx)."""


# GELU (exact): y = x * 0.5 * (1 + erf(x / sqrt 2)); dx = dy * (cdf(x) + x * pdf(x))

def _gelu_fwd_xp(xp, x, y):
    t = x.dtype.type
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in PyTorch
        xp.copyto(y, x * t(0.5) * (t(1) + _erf(xp, x * t(_SQRT1_2))))


def _gelu_bwd_xp(xp, x, dy, dx):
    t = x.dtype.type
    cdf = t(0.5) * (t(1) + _erf(xp, x * t(_SQRT1_2)))
    pdf = xp.exp(t(-0.5) * x * x) * t(_GELU_PDF)
    with np.errstate(invalid="ignore"):
        xp.copyto(dx, dy * (cdf + x * pdf))


def _gelu_fwd_ref(x, y):
    _gelu_fwd_xp(np, x, y)


@jit
def _gelu_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        v = x[i]
        y[i] = v * 0.5 * (1 + math.erf(v * _SQRT1_2))


_gelu_fwd_cpu_wrapper = _flat_variant(_gelu_fwd_cpu, "gelu_fwd")


def _gelu_fwd_cuda(x, y):
    _gelu_fwd_xp(array_module(x, y), x, y)


def _gelu_bwd_ref(x, dy, dx):
    _gelu_bwd_xp(np, x, dy, dx)


@jit
def _gelu_bwd_cpu(x, dy, dx):
    for i in range(x.shape[0]):
        v = x[i]
        cdf = 0.5 * (1 + math.erf(v * _SQRT1_2))
        pdf = np.exp(-0.5 * v * v) * _GELU_PDF
        dx[i] = dy[i] * (cdf + v * pdf)


_gelu_bwd_cpu_wrapper = _flat_variant(_gelu_bwd_cpu, "gelu_bwd")


def _gelu_bwd_cuda(x, dy, dx):
    _gelu_bwd_xp(array_module(x, dy, dx), x, dy, dx)


gelu_fwd = _pointwise("gelu_fwd", _gelu_fwd_ref, _gelu_fwd_cpu_wrapper, _gelu_fwd_cuda, (R, W))
"""``y = gelu(x)``, exact erf form (torch's ``approximate='none'``) (R x, W y)."""
gelu_bwd = _pointwise("gelu_bwd", _gelu_bwd_ref, _gelu_bwd_cpu_wrapper, _gelu_bwd_cuda,
                      (R, R, W))
"""``dx = dy * (Phi(x) + x * phi(x))`` from the forward input (R x, R dy, W dx)."""


# --------------------------------------------------------------------------- SiLU, ReLU6, Hardswish
#
# PyTorch's CPU formulas (``aten/src/ATen/native/cpu/Activation.cpp``): ``silu`` is
# ``x / (1 + exp(-x))`` and its backward ``dy * s * (1 + x * (1 - s))`` with ``s`` the
# sigmoid of ``x``; ``relu6`` is ``hardtanh(x, 0, 6)`` (a clamp: NaN and -0.0 pass) whose
# backward passes ``dy`` strictly inside (0, 6) (NaN gets 0); ``hardswish`` is
# ``x * min(max(x + 3, 0), 6) / 6`` and its backward ``0`` up to -3, ``dy * (x / 3 + 0.5)``
# strictly between -3 and 3, ``dy`` from 3 on (NaN included), as torch 2.x computes them. Every backward reads the forward *input*. One function per
# formula against ``xp`` gives the ``ref`` (NumPy) and ``cuda`` variants.

def _flat_codelet(name, fn, kernel, modes):
    """A pointwise codelet from its ``xp`` formula and its flat Numba kernel."""
    ref, cuda = by_xp(fn)
    return _pointwise(name, ref, _flat_variant(kernel, name), cuda, modes)


def _silu_fwd_xp(xp, x, y):
    with np.errstate(over="ignore", invalid="ignore"):  # x << 0: -0; -inf / inf: NaN, as torch
        xp.copyto(y, x / (x.dtype.type(1) + xp.exp(-x)))


def _silu_bwd_xp(xp, x, dy, dx):
    one = x.dtype.type(1)
    with np.errstate(over="ignore"):
        s = one / (one + xp.exp(-x))
    with np.errstate(invalid="ignore"):  # -inf * 0, as in PyTorch
        xp.copyto(dx, dy * s * (one + x * (one - s)))


@jit
def _silu_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] / (1 + np.exp(-x[i]))


@jit
def _silu_bwd_cpu(x, dy, dx):
    for i in range(x.shape[0]):
        s = 1 / (1 + np.exp(-x[i]))
        dx[i] = dy[i] * s * (1 + x[i] * (1 - s))


def _relu6_fwd_xp(xp, x, y):
    t = x.dtype.type
    xp.copyto(y, xp.where(x < 0, t(0), xp.where(x > 6, t(6), x)))


def _relu6_bwd_xp(xp, x, dy, dx):
    xp.copyto(dx, xp.where((x > 0) & (x < 6), dy, dy.dtype.type(0)))


@jit
def _relu6_fwd_cpu(x, y):
    for i in range(x.shape[0]):  # selects, one store: vectorised (branches: 4x slower)
        v = x[i]
        r = x.dtype.type(0) if v < 0 else v  # NaN and -0.0 pass, as clamp
        y[i] = x.dtype.type(6) if v > 6 else r


@jit
def _relu6_bwd_cpu(x, dy, dx):
    for i in range(x.shape[0]):
        v = x[i]
        dx[i] = dy[i] if 0 < v < 6 else 0


def _hardswish_fwd_xp(xp, x, y):
    t = x.dtype.type
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in PyTorch
        xp.copyto(y, x * xp.minimum(xp.maximum(x + t(3), t(0)), t(6)) / t(6))


def _hardswish_bwd_xp(xp, x, dy, dx):
    t = x.dtype.type
    xp.copyto(dx, xp.where(x <= -3, t(0), xp.where(x < 3, dy * (x / t(3) + t(0.5)), dy)))


@jit
def _hardswish_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        v = x[i]
        r = v + 3
        if r < 0:
            r = 0
        if r > 6:
            r = 6
        y[i] = v * r / 6  # NaN stays NaN: no comparison above holds for it


@jit
def _hardswish_bwd_cpu(x, dy, dx):
    for i in range(x.shape[0]):
        v = x[i]
        if v <= -3:
            dx[i] = 0
        elif v < 3:
            dx[i] = dy[i] * (v / 3 + 0.5)
        else:
            dx[i] = dy[i]


silu_fwd = _flat_codelet("silu_fwd", _silu_fwd_xp, _silu_fwd_cpu, (R, W))
"""``y = x / (1 + exp(-x))`` (R x, W y): ``torch.nn.SiLU``."""
silu_bwd = _flat_codelet("silu_bwd", _silu_bwd_xp, _silu_bwd_cpu, (R, R, W))
"""``dx = dy * s * (1 + x * (1 - s))``, ``s = sigmoid(x)`` (R x, R dy, W dx)."""
relu6_fwd = _flat_codelet("relu6_fwd", _relu6_fwd_xp, _relu6_fwd_cpu, (R, W))
"""``y = min(max(x, 0), 6)`` (R x, W y): ``torch.nn.ReLU6`` (``hardtanh(x, 0, 6)``)."""
relu6_bwd = _flat_codelet("relu6_bwd", _relu6_bwd_xp, _relu6_bwd_cpu, (R, R, W))
"""``dx = dy where 0 < x < 6 else 0`` (R x, R dy, W dx): ``hardtanh_backward``."""
hardswish_fwd = _flat_codelet("hardswish_fwd", _hardswish_fwd_xp, _hardswish_fwd_cpu, (R, W))
"""``y = x * relu6(x + 3) / 6`` (R x, W y): ``torch.nn.Hardswish``."""
hardswish_bwd = _flat_codelet("hardswish_bwd", _hardswish_bwd_xp, _hardswish_bwd_cpu,
                              (R, R, W))
"""``dx = 0 (x <= -3), dy * (x / 3 + 1/2) (-3 < x < 3), dy (else)`` (R x, R dy, W dx)."""
