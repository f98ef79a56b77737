"""Dense (fully connected) layer codelets: forward, input gradient, parameter gradients.

The layer computes ``y = x @ w.T + b`` with ``x[N, I]``, ``w[O, I]``,
``b[O]``, ``y[N, O]`` (PyTorch's ``nn.Linear`` layout). Backward gives
``dx = dy @ w`` and the parameter gradients ``dw = dy.T @ x``,
``db = dy.sum(0)``, which are REDUX: each batch partition adds its share into a
private partial and the runtime sums the partials.

Variants
--------
``"ref"``
    NumPy, i.e. one BLAS GEMM: the reference maths and, being BLAS, a strong
    CPU candidate.
``"cpu"``
    Numba loops register-blocked over four samples, with innermost loops that
    run along contiguous rows so LLVM vectorises them without ``fastmath``.
``"cpu:blas"``, the pinned one
    The reference's GEMMs through Numba's ``np.dot`` (SciPy's BLAS) and its bias
    gradient in NumPy's summation order, one ``nogil`` kernel per task, so a
    replayed task runs in the engine's compiled loop
    (:mod:`~hetero_nn.codelets.prepared`). Where NumPy and SciPy ship the same
    OpenBLAS kernels (the wheels of this project's pins: OpenBLAS 0.3.30 and 0.3.31,
    one BLAS thread per worker) it gives the reference's bits
    (``benchmarks/blas_bits.py`` checks the shapes of the built-in models).
``"cuda"``
    The same GEMMs written against ``xp`` (cuBLAS through CuPy on a GPU).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import kernels_cuda_layers
from ._jit import jit
from .codelet import REDUX, R, W, Codelet
from .prepared import calls_of, contiguous, prepares
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["dense_fwd", "dense_fwd_nobias", "dense_bwd_input", "dense_bwd_params",
           "dense_bwd_weight"]



def _check_dense(name, x, w, y, b=None):
    """Shapes of ``x[N, I]``, ``w[O, I]``, ``y[N, O]`` and ``b[O]``; Numba does not bounds-check."""
    if x.ndim != 2 or w.ndim != 2 or y.ndim != 2:
        raise ValueError(f"{name}: expected 2-d x, w and output, got shapes "
                         f"{x.shape}, {w.shape}, {y.shape}")
    n, i = x.shape
    o = w.shape[0]
    if w.shape[1] != i or y.shape != (n, o):
        raise ValueError(f"{name}: x {x.shape} and w {w.shape} give ({n}, {o}), "
                         f"output is {y.shape}")
    if b is not None and b.shape != (o,):
        raise ValueError(f"{name}: bias shape {b.shape}, expected ({o},)")


# --------------------------------------------------------------------------- forward

def _dense_fwd_ref(x, w, b, y):
    np.matmul(x, w.T, out=y)
    y += b


def _dense_fwd_nobias_ref(x, w, y):
    np.matmul(x, w.T, out=y)


@jit
def _matmul_acc_cpu(a, b, c):
    """``c += a @ b`` with ``b`` row-major: four rows of ``a`` scale each contiguous row of
    ``b`` into four rows of ``c`` (forward: ``y += x @ w.T``; input gradient: ``dx += dy @ w``)."""
    n_rows, n_inner = a.shape
    n_cols = b.shape[1]
    n_blocked = n_rows - n_rows % 4
    for n in range(0, n_blocked, 4):
        for k in range(n_inner):
            a0 = a[n, k]
            a1 = a[n + 1, k]
            a2 = a[n + 2, k]
            a3 = a[n + 3, k]
            for j in range(n_cols):
                bv = b[k, j]
                c[n, j] += a0 * bv
                c[n + 1, j] += a1 * bv
                c[n + 2, j] += a2 * bv
                c[n + 3, j] += a3 * bv
    for n in range(n_blocked, n_rows):
        for k in range(n_inner):
            av = a[n, k]
            for j in range(n_cols):
                c[n, j] += av * b[k, j]


def _dense_fwd_cpu_wrapper(x, w, b, y):
    _check_dense("dense_fwd", x, w, y, b)
    y[...] = b
    _matmul_acc_cpu(x, np.ascontiguousarray(w.T), y)


def _dense_fwd_nobias_cpu_wrapper(x, w, y):
    _check_dense("dense_fwd_nobias", x, w, y)
    y[...] = 0
    _matmul_acc_cpu(x, np.ascontiguousarray(w.T), y)


def _dense_fwd_cuda(x, w, b, y):
    if not kernels_cuda_layers.dense_fwd(array_module(x, w, b, y), x, w, b, y, False,
                                         _dense_fwd_xp, x, w, b, y):
        _dense_fwd_xp(x, w, b, y)


def _dense_fwd_xp(x, w, b, y):
    xp = array_module(x, w, b, y)
    xp.matmul(x, w.T, out=y)
    y += b


def _dense_fwd_nobias_cuda(x, w, y):
    xp = array_module(x, w, y)
    if not kernels_cuda_layers.dense_fwd(xp, x, w, None, y, False, xp.matmul, x, w.T, out=y):
        xp.matmul(x, w.T, out=y)


# --------------------------------------------------------------------------- BLAS in Numba

@jit
def _dot_cpu(a, b, out):
    """``out = a @ b`` (BLAS)."""
    np.dot(a, b, out)


@jit
def _dot_bias_cpu(a, b, bias, out):
    """``out = a @ b + bias`` (BLAS, then the bias added to each row)."""
    np.dot(a, b, out)
    out += bias


@jit
def _block_sum_cpu(a, start, n):
    """NumPy's pairwise sum of up to 128 terms ``a[start:start + n]``: under 8 in order
    from zero, else eight interleaved partial sums combined as a tree, then the rest."""
    if n < 8:
        res = a.dtype.type(0)
        for i in range(start, start + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = 8
    while i < n - n % 8:
        k = start + i
        r0 += a[k]
        r1 += a[k + 1]
        r2 += a[k + 2]
        r3 += a[k + 3]
        r4 += a[k + 4]
        r5 += a[k + 5]
        r6 += a[k + 6]
        r7 += a[k + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for k in range(start + i, start + n):
        res += a[k]
    return res


@jit
def _pairwise_sum_cpu(a):
    """NumPy's pairwise sum of the 1-d ``a`` (``pairwise_sum`` in its ``loops_utils.h``):
    blocks of up to 128 terms (:func:`_block_sum_cpu`), above that the two halves (cut
    at a multiple of 8) summed apart and added. Its recursion runs on an explicit stack
    (Numba's cache cannot reload a recursive function): ranges to sum (``n >= 0``) and
    additions of the two last sums (``n < 0``)."""
    n = a.shape[0]
    if n <= 128:
        return _block_sum_cpu(a, 0, n)
    starts = np.empty(192, np.int64)
    sizes = np.empty(192, np.int64)
    sums = np.empty(64, a.dtype)
    starts[0], sizes[0] = 0, n
    todo, done = 1, 0
    while todo:
        todo -= 1
        start, size = starts[todo], sizes[todo]
        if size < 0:
            done -= 1
            sums[done - 1] = sums[done - 1] + sums[done]
        elif size <= 128:
            sums[done] = _block_sum_cpu(a, start, size)
            done += 1
        else:
            half = size // 2
            half -= half % 8
            sizes[todo] = -1
            starts[todo + 1], sizes[todo + 1] = start + half, size - half
            starts[todo + 2], sizes[todo + 2] = start, half
            todo += 3
    return sums[0]


@jit
def _column_sums_acc_cpu(a, out):
    """``out += a.sum(axis=0)`` for a C-contiguous ``a``, in NumPy's order: from zero down
    each column, rows in order (NumPy's reduction runs along the contiguous rows), or
    the column's pairwise sum when there is one column (NumPy's inner loop)."""
    n, m = a.shape
    if m == 1:
        out[0] += a.dtype.type(0) + _pairwise_sum_cpu(a[:, 0])
        return
    for j in range(m):
        s = a.dtype.type(0)
        for i in range(n):
            s += a[i, j]
        out[j] += s


@jit
def _dense_bwd_params_blas_cpu(x, dy, dw, db, product):
    """``dw += dy.T @ x`` (BLAS into ``product``, then added) and, unless ``db`` is None,
    ``db += dy.sum(0)``: the reference's operations in its order."""
    np.dot(dy.T, x, product)
    dw += product
    if db is not None:
        _column_sums_acc_cpu(dy, db)


def _prepare_fwd_blas(buffers, x, w, b, y):
    _check_dense("dense_fwd", x, w, y, b)
    return [(_dot_bias_cpu, (x, w.T, b, y))] if contiguous(x, w, b, y) else None


def _prepare_fwd_nobias_blas(buffers, x, w, y):
    _check_dense("dense_fwd_nobias", x, w, y)
    return [(_dot_cpu, (x, w.T, y))] if contiguous(x, w, y) else None


def _prepare_bwd_input_blas(buffers, dy, w, dx):
    _check_dense("dense_bwd_input", dx, w, dy)
    return [(_dot_cpu, (dy, w, dx))] if contiguous(dy, w, dx) else None


def _prepare_bwd_params_blas(buffers, x, dy, dw, db=None):
    _check_dense(_params_name(db), x, dw, dy, db)
    if not contiguous(x, dy, dw, db):
        return None
    product = buffers("dense:dw", dw.shape, dw.dtype)
    return [(_dense_bwd_params_blas_cpu, (x, dy, dw, db, product))]


_c = np.ascontiguousarray


def _params_name(db):
    return "dense_bwd_weight" if db is None else "dense_bwd_params"


def _run_into(kernel, args, out):
    """``kernel(*args, out)``, through a contiguous copy of a strided ``out`` (BLAS writes
    C-contiguous rows)."""
    target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
    kernel(*args, target)
    if target is not out:
        out[...] = target


@prepares(_prepare_fwd_blas)
def _dense_fwd_cpu_blas(x, w, b, y):
    _check_dense("dense_fwd", x, w, y, b)
    _run_into(_dot_bias_cpu, (_c(x), _c(w).T, _c(b)), y)


@prepares(_prepare_fwd_nobias_blas)
def _dense_fwd_nobias_cpu_blas(x, w, y):
    _check_dense("dense_fwd_nobias", x, w, y)
    _run_into(_dot_cpu, (_c(x), _c(w).T), y)


@prepares(_prepare_bwd_input_blas)
def _dense_bwd_input_cpu_blas(dy, w, dx):
    _check_dense("dense_bwd_input", dx, w, dy)
    _run_into(_dot_cpu, (_c(dy), _c(w)), dx)


@prepares(_prepare_bwd_params_blas)
def _dense_bwd_params_cpu_blas(x, dy, dw, db=None):
    _check_dense(_params_name(db), x, dw, dy, db)
    _dense_bwd_params_blas_cpu(_c(x), _c(dy), dw, db, np.empty(dw.shape, dw.dtype))


def _rows(a, name, output=False):
    """``a`` of shape ``(n, *features)`` seen as ``(n, prod(features))`` through a view.

    This is what lets ``Flatten`` be a view with no task: a dense layer reads
    the convolution's 4-D output, and writes its input gradient in that shape.
    """
    if a.ndim == 2:
        return a
    if output and not a.flags.c_contiguous:
        raise ValueError(f"{name}: output of shape {a.shape} must be C-contiguous to be written as rows")
    return a.reshape(a.shape[0], -1)


def _rowwise(variants, index, output=False):
    """Variants whose operand ``index`` may have trailing feature dimensions."""
    def wrap(fn):
        @functools.wraps(fn)
        def variant(*arrays, **params):
            arrays = list(arrays)
            arrays[index] = _rows(arrays[index], fn.__name__, output)
            return fn(*arrays, **params)

        def prepare(buffers, *arrays, **params):
            arrays = list(arrays)
            a = arrays[index]
            if output and a.ndim != 2 and not a.flags.c_contiguous:
                return None  # the variant raises: let it, from Python
            arrays[index] = _rows(a, fn.__name__, output)
            return calls_of(fn, buffers, arrays, params)
        variant.prepare = prepare
        return variant
    return {name: wrap(fn) for name, fn in variants.items()}


def _dense_fwd_flops(x, w, *rest, **params):
    n, i = x[0], math.prod(x[1:])
    o = w[0]
    return 2.0 * n * i * o + (n * o if len(rest) == 2 else 0)


dense_fwd = Codelet(
    "dense_fwd", modes=(R, R, R, W),
    variants=_rowwise({"ref": _dense_fwd_ref, "cpu": _dense_fwd_cpu_wrapper,
                       "cpu:blas": _dense_fwd_cpu_blas, "cuda": _dense_fwd_cuda}, 0),
    flops=_dense_fwd_flops,
)
"""``y = x @ w.T + b`` (R x[N,I], R w[O,I], R b[O], W y[N,O])."""

dense_fwd_nobias = Codelet(
    "dense_fwd_nobias", modes=(R, R, W),
    variants=_rowwise({"ref": _dense_fwd_nobias_ref, "cpu": _dense_fwd_nobias_cpu_wrapper,
                       "cpu:blas": _dense_fwd_nobias_cpu_blas,
                       "cuda": _dense_fwd_nobias_cuda}, 0),
    flops=_dense_fwd_flops,
)
"""``y = x @ w.T`` (R x[N,I], R w[O,I], W y[N,O])."""


# --------------------------------------------------------------------------- input gradient

def _dense_bwd_input_ref(dy, w, dx):
    np.matmul(dy, w, out=dx)


def _dense_bwd_input_cpu_wrapper(dy, w, dx):
    _check_dense("dense_bwd_input", dx, w, dy)
    dx[...] = 0
    _matmul_acc_cpu(dy, w, dx)


def _dense_bwd_input_cuda(dy, w, dx):
    xp = array_module(dy, w, dx)
    if not kernels_cuda_layers.dense_bwd(xp, None, w, None, dy, dx, None, None, False,
                                         xp.matmul, dy, w, out=dx):
        xp.matmul(dy, w, out=dx)


dense_bwd_input = Codelet(
    "dense_bwd_input", modes=(R, R, W),
    variants=_rowwise({"ref": _dense_bwd_input_ref, "cpu": _dense_bwd_input_cpu_wrapper,
                       "cpu:blas": _dense_bwd_input_cpu_blas,
                       "cuda": _dense_bwd_input_cuda}, 2, output=True),
    flops=lambda dy, w, dx, **params: 2.0 * dy[0] * dy[1] * w[1],
)
"""``dx = dy @ w`` (R dy[N,O], R w[O,I], W dx[N,I])."""


# --------------------------------------------------------------------------- parameter gradients

def _dense_bwd_params_ref(x, dy, dw, db):
    dw += dy.T @ x
    db += dy.sum(axis=0)


def _dense_bwd_weight_ref(x, dy, dw):
    dw += dy.T @ x


@jit
def _dense_bwd_weight_cpu(x, dy, dw):
    """``dw += dy.T @ x``: four samples' rows of x folded into each row of dw per pass."""
    n_samples, n_in = x.shape
    n_out = dy.shape[1]
    n_blocked = n_samples - n_samples % 4
    for n in range(0, n_blocked, 4):
        for o in range(n_out):
            d0 = dy[n, o]
            d1 = dy[n + 1, o]
            d2 = dy[n + 2, o]
            d3 = dy[n + 3, o]
            for i in range(n_in):
                dw[o, i] += d0 * x[n, i] + d1 * x[n + 1, i] + d2 * x[n + 2, i] + d3 * x[n + 3, i]
    for n in range(n_blocked, n_samples):
        for o in range(n_out):
            dv = dy[n, o]
            for i in range(n_in):
                dw[o, i] += dv * x[n, i]


@jit
def _dense_bwd_bias_cpu(dy, db):
    """``db += dy.sum(0)``."""
    for n in range(dy.shape[0]):
        for o in range(dy.shape[1]):
            db[o] += dy[n, o]


def _dense_bwd_params_cpu_wrapper(x, dy, dw, db):
    _check_dense("dense_bwd_params", x, dw, dy, db)
    _dense_bwd_weight_cpu(x, dy, dw)
    _dense_bwd_bias_cpu(dy, db)


def _dense_bwd_weight_cpu_wrapper(x, dy, dw):
    _check_dense("dense_bwd_weight", x, dw, dy)
    _dense_bwd_weight_cpu(x, dy, dw)


def _dense_bwd_params_cuda(x, dy, dw, db):
    if not kernels_cuda_layers.dense_bwd(array_module(x, dy, dw, db), x, None, None, dy, None,
                                         dw, db, False, _dense_bwd_params_xp, x, dy, dw, db):
        _dense_bwd_params_xp(x, dy, dw, db)


def _dense_bwd_params_xp(x, dy, dw, db):
    xp = array_module(x, dy, dw, db)
    dw += xp.matmul(dy.T, x)
    db += dy.sum(axis=0)


def _dense_bwd_weight_cuda(x, dy, dw):
    if not kernels_cuda_layers.dense_bwd(array_module(x, dy, dw), x, None, None, dy, None, dw,
                                         None, False, _dense_bwd_weight_xp, x, dy, dw):
        _dense_bwd_weight_xp(x, dy, dw)


def _dense_bwd_weight_xp(x, dy, dw):
    xp = array_module(x, dy, dw)
    dw += xp.matmul(dy.T, x)


def _dense_bwd_params_flops(x, dy, *grads, **params):
    n, i = x[0], math.prod(x[1:])
    o = dy[1]
    return 2.0 * n * i * o + (n * o if len(grads) == 2 else 0)


dense_bwd_params = Codelet(
    "dense_bwd_params", modes=(R, R, REDUX, REDUX),
    variants=_rowwise({"ref": _dense_bwd_params_ref, "cpu": _dense_bwd_params_cpu_wrapper,
                       "cpu:blas": _dense_bwd_params_cpu_blas,
                       "cuda": _dense_bwd_params_cuda}, 0),
    init=zero_init, redux=add_redux, flops=_dense_bwd_params_flops,
)
"""``dw += dy.T @ x; db += dy.sum(0)`` (R x[N,I], R dy[N,O], REDUX dw[O,I], REDUX db[O])."""

dense_bwd_weight = Codelet(
    "dense_bwd_weight", modes=(R, R, REDUX),
    variants=_rowwise({"ref": _dense_bwd_weight_ref, "cpu": _dense_bwd_weight_cpu_wrapper,
                       "cpu:blas": _dense_bwd_params_cpu_blas,
                       "cuda": _dense_bwd_weight_cuda}, 0),
    init=zero_init, redux=add_redux, flops=_dense_bwd_params_flops,
)
"""``dw += dy.T @ x`` (R x[N,I], R dy[N,O], REDUX dw[O,I]) for a layer without bias."""
