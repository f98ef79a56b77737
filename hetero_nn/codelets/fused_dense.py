"""Fused codelets of a dense layer and its ReLU, each run as one task.

This module owns three codelets (split from ``codelets/fused.py``, which owns the
convolution chain and re-exports these, so ``fused.dense_relu_fwd`` still names them):

=====================  ==============================================  ===================
codelet                operands (access mode)                          composes
=====================  ==============================================  ===================
dense_relu_fwd         x (R), w (R), b (R), y (W)                      dense_fwd, relu_fwd
dense_relu_bwd         x (R), w (R), y (R), dy (R), dx (W),            relu_bwd,
                       dw (REDUX), db (REDUX)                          dense_bwd_*
dense_relu_bwd_params  the same without w and dx (a first layer)
=====================  ==============================================  ===================

The backward chain masks ``dy`` by ``y > 0`` (PyTorch's ``threshold_backward``: the
ReLU's output is the layer's output) and runs the dense gradients on the masked rows.

Variants: ``ref`` (the composed reference variants), ``cpu`` (the composed Numba
kernels), ``cpu:blas`` (one Numba kernel calling BLAS, crossing the interpreter lock
once; pinned) and ``cuda`` (the composed ``cuda`` variants, in the array module given).
REDUX operands (``dw``, ``db``) are added into, as in the codelets composed.
"""

from __future__ import annotations

import math

import numpy as np

from . import conv_im2col, dense, kernels_cuda_layers
from ._checks import require_contiguous
from ._jit import jit
from .activation import _relu_bwd_cpu, _relu_bwd_ref, _relu_fwd_cpu
from .codelet import REDUX, R, W, Codelet
from .prepared import prepares
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["dense_relu_fwd", "dense_relu_bwd", "dense_relu_bwd_params"]


def _dense_relu_fwd_ref(x, w, b, y):
    dense._dense_fwd_ref(x, w, b, y)
    np.maximum(y, np.zeros((), y.dtype), out=y)


def _dense_relu_fwd_cpu(x, w, b, y):
    dense._dense_fwd_cpu_wrapper(x, w, b, y)
    flat = y.reshape(-1)
    _relu_fwd_cpu(flat, flat)


@jit
def _dense_relu_fwd_blas_cpu(x, w, b, y):
    """``y = relu(x @ w.T + b)``: BLAS (Numba's ``np.dot``), then the bias and ReLU."""
    np.dot(x, w.T, y)
    y += b
    flat = y.reshape(-1)
    _relu_fwd_cpu(flat, flat)


def _prepare_dense_relu_fwd_blas(buffers, x, w, b, y):
    return [(_dense_relu_fwd_blas_cpu, (x, w, b, y))] \
        if conv_im2col.views(y.dtype, x, w, b, y) else None


@prepares(_prepare_dense_relu_fwd_blas)
def _dense_relu_fwd_cpu_blas(x, w, b, y):
    require_contiguous("dense_relu_fwd", y=y)
    _dense_relu_fwd_blas_cpu(np.ascontiguousarray(x), np.ascontiguousarray(w), b, y)


def _dense_relu_fwd_cuda(x, w, b, y):
    xp = array_module(x, w, b, y)
    if kernels_cuda_layers.dense_fwd(xp, x, w, b, y, True, _dense_relu_fwd_xp, x, w, b, y):
        return
    _dense_relu_fwd_xp(x, w, b, y)


def _dense_relu_fwd_xp(x, w, b, y):
    xp = array_module(x, w, b, y)
    dense._dense_fwd_cuda(x, w, b, y)
    xp.maximum(y, xp.zeros((), y.dtype), out=y)


def _dense_relu_bwd_ref(x, w, y, dy, dx, dw, db):
    dz = np.empty_like(dy)
    _relu_bwd_ref(y, dy, dz)
    dense._dense_bwd_params_ref(x, dz, dw, db)
    dense._dense_bwd_input_ref(dz, w, dx)


def _dense_relu_bwd_params_ref(x, y, dy, dw, db):
    dz = np.empty_like(dy)
    _relu_bwd_ref(y, dy, dz)
    dense._dense_bwd_params_ref(x, dz, dw, db)


def _masked_cpu(y, dy):
    """``dy * (y > 0)`` by the ReLU kernel (a fresh array: rows of a dense layer are small,
    and the convolutions' scratch arrays keep the worker's buffers)."""
    dz = np.empty(dy.shape, dy.dtype)
    _relu_bwd_cpu(np.ascontiguousarray(y).reshape(-1), np.ascontiguousarray(dy).reshape(-1),
                  dz.reshape(-1))
    return dz


def _dense_relu_bwd_variants(bwd_params, bwd_input, label):
    """The fused backward variants, with and without ``dx``: the Numba ReLU mask, then the
    dense layer's ``bwd_params`` (and ``bwd_input``) on the masked gradient."""
    def with_input(x, w, y, dy, dx, dw, db):
        dz = _masked_cpu(y, dy)
        bwd_params(x, dz, dw, db)
        bwd_input(dz, w, dx)

    def params_only(x, y, dy, dw, db):
        bwd_params(x, _masked_cpu(y, dy), dw, db)

    with_input.__name__ = f"dense_relu_bwd_{label}"
    params_only.__name__ = f"dense_relu_bwd_params_{label}"
    return with_input, params_only


_dense_relu_bwd_cpu, _dense_relu_bwd_params_cpu = _dense_relu_bwd_variants(
    dense._dense_bwd_params_cpu_wrapper, dense._dense_bwd_input_cpu_wrapper, "cpu")
@jit
def _dense_relu_bwd_blas_cpu(x, w, y, dy, dz, dx, dw, db, with_input):
    """``dz = dy * (y > 0)``; ``dw += dz.T @ x``, ``db += dz.sum(0)`` (rows in order) and,
    ``with_input``, ``dx = dz @ w``: BLAS through Numba's ``np.dot``, one call."""
    _relu_bwd_cpu(y.reshape(-1), dy.reshape(-1), dz.reshape(-1))
    dw += np.dot(dz.T, x)
    for n in range(dz.shape[0]):
        db += dz[n]
    if with_input:
        np.dot(dz, w, dx)


def _dense_relu_bwd_blas_args(dz, x, w, y, dy, dx, dw, db):
    """The arguments of ``_dense_relu_bwd_blas_cpu`` (``w``, ``dx`` None: parameters only)."""
    x = np.ascontiguousarray(x)
    if w is None:
        return (x, x[:0, :0], np.ascontiguousarray(y), np.ascontiguousarray(dy), dz, dz[:0, :0],
                dw, db, False)
    require_contiguous("dense_relu_bwd", dx=dx)
    return (x, np.ascontiguousarray(w), np.ascontiguousarray(y), np.ascontiguousarray(dy), dz,
            dx, dw, db, True)


def _prepare_dense_relu_bwd_blas(buffers, x, w, y, dy, dx, dw, db):
    if not conv_im2col.views(dy.dtype, x, w, y, dy, dx, dw, db):
        return None
    dz = buffers("dense_relu:dz", dy.shape, dy.dtype)
    return [(_dense_relu_bwd_blas_cpu, _dense_relu_bwd_blas_args(dz, x, w, y, dy, dx, dw, db))]


def _prepare_dense_relu_bwd_params_blas(buffers, x, y, dy, dw, db):
    return _prepare_dense_relu_bwd_blas(buffers, x, None, y, dy, None, dw, db)


@prepares(_prepare_dense_relu_bwd_blas)
def _dense_relu_bwd_cpu_blas(x, w, y, dy, dx, dw, db):
    _dense_relu_bwd_blas_cpu(*_dense_relu_bwd_blas_args(np.empty(dy.shape, dy.dtype), x, w, y,
                                                        dy, dx, dw, db))


@prepares(_prepare_dense_relu_bwd_params_blas)
def _dense_relu_bwd_params_cpu_blas(x, y, dy, dw, db):
    _dense_relu_bwd_blas_cpu(*_dense_relu_bwd_blas_args(np.empty(dy.shape, dy.dtype), x, None,
                                                        y, dy, None, dw, db))


def _dense_relu_bwd_cuda(x, w, y, dy, dx, dw, db):
    if not kernels_cuda_layers.dense_bwd(array_module(x, w, y, dy), x, w, y, dy, dx, dw, db,
                                         True, _dense_relu_bwd_xp, x, w, y, dy, dx, dw, db):
        _dense_relu_bwd_xp(x, w, y, dy, dx, dw, db)


def _dense_relu_bwd_xp(x, w, y, dy, dx, dw, db):
    xp = array_module(x, w, y, dy)
    dz = xp.where(y <= 0, xp.zeros((), dy.dtype), dy)
    dense._dense_bwd_params_cuda(x, dz, dw, db)
    dense._dense_bwd_input_cuda(dz, w, dx)


def _dense_relu_bwd_params_cuda(x, y, dy, dw, db):
    if not kernels_cuda_layers.dense_bwd(array_module(x, y, dy), x, None, y, dy, None, dw, db,
                                         True, _dense_relu_bwd_params_xp, x, y, dy, dw, db):
        _dense_relu_bwd_params_xp(x, y, dy, dw, db)


def _dense_relu_bwd_params_xp(x, y, dy, dw, db):
    xp = array_module(x, y, dy)
    dense._dense_bwd_params_cuda(x, xp.where(y <= 0, xp.zeros((), dy.dtype), dy), dw, db)


def _dense_relu_fwd_flops(x, w, b, y, **params):
    return dense._dense_fwd_flops(x, w, b, y) + math.prod(y)


def _dense_relu_bwd_flops(x, w, y, dy, dx, dw, db, **params):
    return math.prod(y) + dense._dense_bwd_params_flops(x, dy, dw, db) + 2.0 * math.prod(dy) * w[1]


def _dense_relu_bwd_params_flops(x, y, dy, dw, db, **params):
    return math.prod(y) + dense._dense_bwd_params_flops(x, dy, dw, db)


def _rows_of(variants, *indices, output=()):
    """``dense._rowwise`` over several operands: inputs (and outputs) with trailing features."""
    for i in indices:
        variants = dense._rowwise(variants, i, output=i in output)
    return variants


dense_relu_fwd = Codelet(
    "dense_relu_fwd", modes=(R, R, R, W),
    variants=_rows_of({"ref": _dense_relu_fwd_ref, "cpu": _dense_relu_fwd_cpu,
                       "cpu:blas": _dense_relu_fwd_cpu_blas, "cuda": _dense_relu_fwd_cuda}, 0),
    flops=_dense_relu_fwd_flops)
"""``y = relu(x @ w.T + b)`` (R x[N,I], R w[O,I], R b[O], W y[N,O])."""

dense_relu_bwd = Codelet(
    "dense_relu_bwd", modes=(R, R, R, R, W, REDUX, REDUX),
    variants=_rows_of({"ref": _dense_relu_bwd_ref, "cpu": _dense_relu_bwd_cpu,
                       "cpu:blas": _dense_relu_bwd_cpu_blas, "cuda": _dense_relu_bwd_cuda},
                      0, 4, output=(4,)),
    init=zero_init, redux=add_redux, flops=_dense_relu_bwd_flops)
"""The chain's gradients: ``(x R, w R, y R, dy R, dx W, dw REDUX, db REDUX)``, ``dz = dy * (y > 0)``."""

dense_relu_bwd_params = Codelet(
    "dense_relu_bwd_params", modes=(R, R, R, REDUX, REDUX),
    variants=_rows_of({"ref": _dense_relu_bwd_params_ref, "cpu": _dense_relu_bwd_params_cpu,
                       "cpu:blas": _dense_relu_bwd_params_cpu_blas,
                       "cuda": _dense_relu_bwd_params_cuda}, 0),
    init=zero_init, redux=add_redux, flops=_dense_relu_bwd_params_flops)
"""The chain's parameter gradients only: ``(x R, y R, dy R, dw REDUX, db REDUX)``."""
