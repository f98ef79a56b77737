"""Softmax codelets along one axis of a batch partition: forward and backward.

This module owns two codelets and every variant of them:

============  ===============================  ======
codelet       operands (access mode)            params
============  ===============================  ======
softmax_fwd   x (R), y (W)                      dim
softmax_bwd   y (R), dy (R), dx (W)             dim
============  ===============================  ======

``dim`` is an axis of the partition other than the batch axis (0), so every sample
is normalised on its own and a partition needs nothing from the others. PyTorch's
formulas (``aten/src/ATen/native/cpu/SoftMaxKernel.cpp``): ``y = exp(x - max) /
sum(exp(x - max))`` along ``dim``, and the backward from the forward *output*,
``dx = y * (dy - sum(dy * y))``. The array is seen as ``(outer, K, inner)`` with
``K`` the length of ``dim``; the Numba kernel runs over that view with the ``inner``
axis innermost (contiguous), accumulating in the operands' dtype as PyTorch's CPU
kernel does.

Variants: ``ref`` (NumPy), ``cpu`` (Numba) and ``cuda`` (written against the array
module: CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit
from .codelet import R, W, Codelet
from .xp import array_module

__all__ = ["softmax_fwd", "softmax_bwd"]


def _three(a, dim):
    """``a`` seen as ``(outer, K, inner)`` around axis ``dim``."""
    return a.reshape(math.prod(a.shape[:dim]), a.shape[dim], math.prod(a.shape[dim + 1:]))


def _check_dim(name, a, dim):
    if not 1 <= dim < a.ndim:
        raise ValueError(f"{name}: dim must be an axis of a sample (1..{a.ndim - 1}) of an "
                         f"operand of shape {a.shape}, got {dim}")


# --------------------------------------------------------------------------- ref and cuda (xp)

def _fwd_xp(xp, x, y, dim):
    _check_dim("softmax_fwd", x, dim)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN, as in PyTorch
        e = xp.exp(x - x.max(axis=dim, keepdims=True))
        xp.copyto(y, e / e.sum(axis=dim, keepdims=True))


def _bwd_xp(xp, y, dy, dx, dim):
    _check_dim("softmax_bwd", y, dim)
    xp.copyto(dx, y * (dy - (dy * y).sum(axis=dim, keepdims=True)))


def _fwd_ref(x, y, *, dim):
    _fwd_xp(np, x, y, dim)


def _fwd_cuda(x, y, *, dim):
    _fwd_xp(array_module(x, y), x, y, dim)


def _bwd_ref(y, dy, dx, *, dim):
    _bwd_xp(np, y, dy, dx, dim)


def _bwd_cuda(y, dy, dx, *, dim):
    _bwd_xp(array_module(y, dy, dx), y, dy, dx, dim)


# --------------------------------------------------------------------------- cpu (Numba)

@jit
def _fwd_cpu(x, y):
    outer, k, inner = x.shape
    m = np.empty(inner, x.dtype)
    total = np.empty(inner, y.dtype)
    for o in range(outer):  # the inner axis innermost: contiguous rows, vectorisable
        for i in range(inner):
            m[i] = x[o, 0, i]
        for j in range(1, k):
            for i in range(inner):
                v = x[o, j, i]
                if v > m[i] or v != v:  # NaN wins, as torch's max
                    m[i] = v
        total[:] = 0
        for j in range(k):
            for i in range(inner):
                e = np.exp(x[o, j, i] - m[i])
                y[o, j, i] = e
                total[i] += e
        for j in range(k):
            for i in range(inner):
                y[o, j, i] = y[o, j, i] / total[i]


@jit
def _bwd_cpu(y, dy, dx):
    outer, k, inner = y.shape
    dot = np.empty(inner, dx.dtype)
    for o in range(outer):
        dot[:] = 0
        for j in range(k):
            for i in range(inner):
                dot[i] += dy[o, j, i] * y[o, j, i]
        for j in range(k):
            for i in range(inner):
                dx[o, j, i] = y[o, j, i] * (dy[o, j, i] - dot[i])


def _fwd_cpu_wrapper(x, y, *, dim):
    _check_dim("softmax_fwd", x, dim)
    require_contiguous("softmax_fwd", y=y)
    _fwd_cpu(np.ascontiguousarray(_three(x, dim)), _three(y, dim))


def _bwd_cpu_wrapper(y, dy, dx, *, dim):
    _check_dim("softmax_bwd", y, dim)
    require_contiguous("softmax_bwd", dx=dx)
    _bwd_cpu(np.ascontiguousarray(_three(y, dim)), np.ascontiguousarray(_three(dy, dim)),
             _three(dx, dim))


# --------------------------------------------------------------------------- codelets

def _flops(a, *others, **params):
    return float(math.prod(a))


softmax_fwd = Codelet("softmax_fwd", modes=(R, W),
                      variants={"ref": _fwd_ref, "cpu": _fwd_cpu_wrapper, "cuda": _fwd_cuda},
                      flops=_flops)
"""``y = softmax(x, dim)`` (R x, W y)."""

softmax_bwd = Codelet("softmax_bwd", modes=(R, R, W),
                      variants={"ref": _bwd_ref, "cpu": _bwd_cpu_wrapper, "cuda": _bwd_cuda},
                      flops=_flops)
"""``dx = y * (dy - sum(dy * y, dim))`` from the forward output (R y, R dy, W dx)."""
