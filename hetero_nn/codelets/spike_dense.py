"""The dense layer on spikes: a dense and an event-driven variant that give the same bits.

This module owns four codelets, the dense layer's forward and parameter gradients when
its input is spikes (mostly zeros); the input gradient ``dy @ w`` is dense and stays
:data:`~hetero_nn.codelets.dense.dense_bwd_input`:

======================  ===============================================================
codelet                 operands (access mode)
======================  ===============================================================
spike_dense_fwd         x[N,I] (R), w[O,I] (R), b[O] (R), y[N,O] (W), count[()] (REDUX)
spike_dense_fwd_nobias  x (R), w (R), y (W), count (REDUX)
spike_dense_bwd_params  x (R), dy[N,O] (R), dw[O,I] (REDUX), db[O] (REDUX)
spike_dense_bwd_weight  x (R), dy (R), dw (REDUX)
======================  ===============================================================

``count`` (int64) gets the number of nonzero inputs: the layer reads it after a step to
measure the spike rate of its input. The parameter ``rate`` is that rate as measured in
the previous steps, rounded to a power of two (None before any): it enters the task's
footprint (``Codelet.footprint``) and its work (``rate * 2 N I O``), so the performance
model keeps the variants' times per rate and chooses per rate.

Variants
--------
``"cpu"``
    Dense Numba loops (:func:`~hetero_nn.codelets.dense._matmul_acc_cpu` for the forward).
``"cpu:events"``
    Event-driven: per row, the indices of the inputs that fired, then one weight row
    (of ``w.T``) accumulated per index; the gradient the same way, per row and index.
``"ref"``
    NumPy, one input column at a time (the order both Numba variants keep).
``"cuda"``
    ``xp.matmul`` (cuBLAS on a GPU), with ``xp.count_nonzero`` for the count.

The CPU variants sum in one order: ``y[r, o] = b[o] + sum over k ascending of x[r, k] *
w[o, k]`` and ``dw[o, k] = sum over r ascending of dy[r, o] * x[r, k]``, a skipped term
being an exact zero, so they give the same bits (``same_bits``) and a pinned runtime may
run either: the performance model chooses from the rate.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit
from .codelet import REDUX, R, W, Codelet
from .conv_im2col import worker_buffer
from .dense import _check_dense, _dense_bwd_bias_cpu, _matmul_acc_cpu, _rowwise
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["spike_dense_fwd", "spike_dense_fwd_nobias", "spike_dense_bwd_params",
           "spike_dense_bwd_weight", "rate_bucket", "SAME_BITS"]

SAME_BITS = ("cpu", "cpu:events")


def rate_bucket(rate):
    """A measured rate rounded to a power of two in [1/128, 1] (None stays None)."""
    if rate is None:
        return None
    return float(2.0 ** min(0, max(-7, round(math.log2(max(rate, 2.0 ** -8))))))


# --------------------------------------------------------------------------- kernels

@jit
def _events_fwd_cpu(x, wt, y, index):
    """``y += x @ wt`` row by row over the nonzero inputs only; returns their count."""
    n_rows, n_in = x.shape
    n_out = wt.shape[1]
    count = 0
    for r in range(n_rows):
        m = 0
        for k in range(n_in):
            if x[r, k] != 0:
                index[m] = k
                m += 1
        count += m
        for q in range(m):
            k = index[q]
            v = x[r, k]
            for o in range(n_out):
                y[r, o] += v * wt[k, o]
    return count


@jit
def _grad_wt_cpu(x, dy, gwt, events):
    """``gwt += x.T @ dy`` (``gwt`` is ``dw.T``) one row at a time, in row order; with
    ``events`` only over the nonzero inputs of each row."""
    n_rows, n_in = x.shape
    n_out = dy.shape[1]
    for r in range(n_rows):
        for k in range(n_in):
            v = x[r, k]
            if events and v == 0:
                continue
            for o in range(n_out):
                gwt[k, o] += v * dy[r, o]


@jit
def _count_cpu(x):
    count = 0
    for r in range(x.shape[0]):
        for k in range(x.shape[1]):
            if x[r, k] != 0:
                count += 1
    return count


# --------------------------------------------------------------------------- variants

def _fwd_cpu(events):
    def variant(x, w, b, y, count, *, rate=None):
        _check_dense("spike_dense_fwd", x, w, y, b)
        require_contiguous("spike_dense_fwd", y=y)
        y[...] = 0 if b is None else b
        x, wt = np.ascontiguousarray(x), np.ascontiguousarray(w.T)
        if events:
            n = _events_fwd_cpu(x, wt, y, worker_buffer("spike_dense:index", (x.shape[1],),
                                                        np.int64))
        else:
            _matmul_acc_cpu(x, wt, y)
            n = _count_cpu(x)
        count[...] += n
    variant.__name__ = "spike_dense_fwd_" + ("events" if events else "cpu")
    return variant


def _fwd_ref(x, w, b, y, count, *, rate=None):
    _check_dense("spike_dense_fwd", x, w, y, b)
    y[...] = 0 if b is None else b
    for k in np.flatnonzero(np.any(x != 0, axis=0)):  # column by column: the kernels' order
        y += x[:, k:k + 1] * w[:, k]
    count[...] += np.count_nonzero(x)


def _fwd_cuda(x, w, b, y, count, *, rate=None):
    xp = array_module(x, w, y)
    xp.matmul(x, w.T, out=y)
    if b is not None:
        y += b
    count[...] += xp.count_nonzero(x)


def _params_cpu(events):
    def variant(x, dy, dw, db=None, *, rate=None):
        _check_dense("spike_dense_bwd_params", x, dw, dy, db)
        gwt = worker_buffer("spike_dense:gwt", (x.shape[1], dy.shape[1]), dw.dtype)
        gwt[...] = 0
        _grad_wt_cpu(np.ascontiguousarray(x), np.ascontiguousarray(dy), gwt, events)
        dw += gwt.T
        if db is not None:
            _dense_bwd_bias_cpu(np.ascontiguousarray(dy), db)
    variant.__name__ = "spike_dense_bwd_" + ("events" if events else "cpu")
    return variant


def _params_ref(x, dy, dw, db=None, *, rate=None):
    _check_dense("spike_dense_bwd_params", x, dw, dy, db)
    gwt = np.zeros((x.shape[1], dy.shape[1]), dw.dtype)
    for r in range(x.shape[0]):  # row by row: the kernels' order
        gwt += x[r][:, None] * dy[r]
    dw += gwt.T
    if db is not None:
        for r in range(dy.shape[0]):
            db += dy[r]


def _params_cuda(x, dy, dw, db=None, *, rate=None):
    xp = array_module(x, dy, dw)
    dw += xp.matmul(dy.T, x)
    if db is not None:
        db += dy.sum(axis=0)


# --------------------------------------------------------------------------- declarations

def _fwd_work(x, w, *rest, rate=None, **params):
    return 2.0 * x[0] * math.prod(x[1:]) * w[0] * (1.0 if rate is None else rate)


def _params_work(x, dy, *rest, rate=None, **params):
    return 2.0 * x[0] * math.prod(x[1:]) * dy[1] * (1.0 if rate is None else rate)


def _footprint(*shapes, rate=None, **params):
    return rate


def _declare(name, modes, variants, work):
    return Codelet(name, modes=modes, variants=_rowwise(variants, 0), flops=work,
                   footprint=_footprint, same_bits=SAME_BITS, init=zero_init, redux=add_redux)


def _nobias(fwd):
    return lambda x, w, y, count, **params: fwd(x, w, None, y, count, **params)


_FWD = {"ref": _fwd_ref, "cpu": _fwd_cpu(False), "cpu:events": _fwd_cpu(True), "cuda": _fwd_cuda}
_PARAMS = {"ref": _params_ref, "cpu": _params_cpu(False), "cpu:events": _params_cpu(True),
           "cuda": _params_cuda}

spike_dense_fwd = _declare("spike_dense_fwd", (R, R, R, W, REDUX), _FWD, _fwd_work)
"""``y = x @ w.T + b; count += nonzeros(x)``."""
spike_dense_fwd_nobias = _declare("spike_dense_fwd_nobias", (R, R, W, REDUX),
                                  {v: _nobias(f) for v, f in _FWD.items()}, _fwd_work)
"""``y = x @ w.T; count += nonzeros(x)``."""
spike_dense_bwd_params = _declare("spike_dense_bwd_params", (R, R, REDUX, REDUX), _PARAMS,
                                  _params_work)
"""``dw += dy.T @ x; db += dy.sum(0)``."""
spike_dense_bwd_weight = _declare("spike_dense_bwd_weight", (R, R, REDUX), _PARAMS,
                                  _params_work)
"""``dw += dy.T @ x``."""
