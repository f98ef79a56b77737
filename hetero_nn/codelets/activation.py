"""ReLU codelets: forward and backward, on arrays of any shape.

Semantics follow PyTorch exactly, NaN included:

- forward ``y = 0 if x <= 0 else x`` (``clamp_min(x, 0)``: NaN stays NaN);
- backward ``dx = 0 if y <= 0 else dy`` (``threshold_backward(dy, y, 0)``:
  the gradient at exactly 0 is 0), computed from the forward *output* ``y``
  so the layer need not keep its input.

The Numba kernels run over the flattened buffers (a branch-free select that
LLVM vectorises); the ``"cuda"`` variants use ``xp.where``.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .codelet import R, W, Codelet
from .reduce import flat_view
from .xp import array_module

__all__ = ["relu_fwd", "relu_bwd"]


def _check_same_shape(name, *arrays):
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"{name}: operands must have one shape, got "
                         f"{[a.shape for a in arrays]}")


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


def _relu_fwd_cpu_wrapper(x, y):
    _check_same_shape("relu_fwd", x, y)
    y_flat = flat_view(y)
    if y_flat is None:
        tmp = np.empty(y.shape, y.dtype)
        _relu_fwd_cpu(np.ascontiguousarray(x).reshape(-1), tmp.reshape(-1))
        y[...] = tmp
        return
    _relu_fwd_cpu(np.ascontiguousarray(x).reshape(-1), y_flat)


def _relu_fwd_cuda(x, y):
    xp = array_module(x, y)
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


def _relu_bwd_cpu_wrapper(y, dy, dx):
    _check_same_shape("relu_bwd", y, dy, dx)
    y_flat = np.ascontiguousarray(y).reshape(-1)
    dy_flat = np.ascontiguousarray(dy).reshape(-1)
    dx_flat = flat_view(dx)
    if dx_flat is None:
        tmp = np.empty(dx.shape, dx.dtype)
        _relu_bwd_cpu(y_flat, dy_flat, tmp.reshape(-1))
        dx[...] = tmp
        return
    _relu_bwd_cpu(y_flat, dy_flat, dx_flat)


def _relu_bwd_cuda(y, dy, dx):
    xp = array_module(y, dy, dx)
    xp.copyto(dx, xp.where(y <= 0, xp.zeros((), dy.dtype), dy))


relu_bwd = Codelet(
    "relu_bwd", modes=(R, R, W),
    variants={"ref": _relu_bwd_ref, "cpu": _relu_bwd_cpu_wrapper, "cuda": _relu_bwd_cuda},
    flops=lambda y, dy, dx, **params: float(np.prod(y)),
)
"""``dx = dy where y > 0 else 0`` (R y, R dy, W dx): PyTorch's ``threshold_backward``."""
