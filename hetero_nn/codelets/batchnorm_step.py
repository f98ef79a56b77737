"""Batch norm's training step over a batch in one partition: two codelets, not nine.

This module owns two codelets that a one-partition batch-norm layer submits instead
of :mod:`.batchnorm`'s chain (``bn_sum``, ``bn_mean``, ``bn_sqdev``, ``bn_var``,
``bn_running``, ``bn_fwd``; ``bn_bwd_sums``, ``bn_param_grads``, ``bn_bwd_input``
and the ``fill_zero`` of each sum):

==============  ==========================================================  ==========
codelet         operands (access mode)                                      params
==============  ==========================================================  ==========
bn_train_fwd    x, weight, bias (R), running_mean, running_var (RW),        count, eps
                momentum (R), mean, var, y (W)
bn_train_bwd    x, dy, mean, var, weight (R), dx (W), dweight, dbias        count, eps
                (REDUX)
==============  ==========================================================  ==========

Policy: each is the chain it replaces, run in one task on the whole batch, step by step
in the same order and the same dtypes, so a one-partition step has the same bits
whichever codelets run it (with one partition a REDUX sum is ``0 + partial``). The
statistics need every sample before any output, so with several partitions (or the
batch of a cluster rank) the layer submits the chain. ``ref`` and ``cuda`` compose
:mod:`.batchnorm`'s array-module functions (``cuda``: one kernel of
:mod:`.kernels_cuda_bn_step`, one block per channel); ``cpu`` calls its Numba kernels
in turn (prepared: one replayed task is those calls).
"""

from __future__ import annotations

import numpy as np

from . import batchnorm as bn
from . import kernels_cuda_bn_step
from ._checks import require_contiguous
from .codelet import R, REDUX, RW, W, Codelet
from .prepared import from_calls
from .reduce import _fill_zero_cpu, add_redux, zero_init
from .xp import array_module

__all__ = ["bn_train_fwd", "bn_train_bwd"]


# --------------------------------------------------------------------------- ref and cuda (xp)

def _train_fwd_xp(xp, x, weight, bias, running_mean, running_var, momentum, mean, var, y,
                  count, eps):
    sums = xp.zeros((2, mean.shape[0]), mean.dtype)  # the sum and the squared deviations
    bn._sum_xp(xp, x, sums[0])
    bn._mean_xp(xp, sums[0], mean, count)
    bn._sqdev_xp(xp, x, mean, sums[1])
    bn._mean_xp(xp, sums[1], var, count)
    bn._running_xp(xp, mean, sums[1], running_mean, running_var, momentum, count)
    bn._fwd_xp(xp, x, mean, var, weight, bias, y, eps)


def _train_bwd_xp(xp, x, dy, mean, var, weight, dx, dweight, dbias, count, eps):
    sums = xp.zeros((2, mean.shape[0]), mean.dtype)  # sum(dy), sum((x - mean) dy)
    bn._bwd_sums_xp(xp, x, dy, mean, sums[0], sums[1])
    bn._param_grads_xp(xp, sums[0], sums[1], var, dweight, dbias, eps)
    bn._bwd_input_xp(xp, x, dy, mean, var, weight, sums[0], sums[1], dx, count, eps)


def _variants(fn, name):
    launcher = kernels_cuda_bn_step.LAUNCHERS[name]

    def ref(*arrays, **params):
        fn(np, *arrays, **params)

    def cuda(*arrays, **params):
        xp = array_module(*arrays)
        if not launcher(xp, fn, *arrays, **params):
            fn(xp, *arrays, **params)
    ref.__name__, cuda.__name__ = f"{name}_ref", f"{name}_cuda"
    return ref, cuda


# --------------------------------------------------------------------------- cpu (Numba)

@from_calls
def _train_fwd_cpu(view, x, weight, bias, running_mean, running_var, momentum, mean, var, y,
                   count, eps):
    require_contiguous("bn_train_fwd", y=y)
    planes = bn._planes(view(x))
    total, sqdev = (np.zeros_like(mean) for _ in range(2))
    count = float(count)
    return [(_fill_zero_cpu, (total,)), (bn._sum_cpu, (planes, total)),
            (bn._divide_cpu, (total, mean, count)),
            (_fill_zero_cpu, (sqdev,)), (bn._sqdev_cpu, (planes, mean, sqdev)),
            (bn._divide_cpu, (sqdev, var, count)),
            (bn._running_cpu, (mean, sqdev, running_mean, running_var, count, momentum)),
            (bn._fwd_cpu, (planes, mean, var, weight, bias, bn._planes(y), float(eps)))]


@from_calls
def _train_bwd_cpu(view, x, dy, mean, var, weight, dx, dweight, dbias, count, eps):
    require_contiguous("bn_train_bwd", dx=dx)
    planes, grads = bn._planes(view(x)), bn._planes(view(dy))
    sum_dy, dotp = (np.zeros_like(mean) for _ in range(2))
    return [(_fill_zero_cpu, (sum_dy,)), (_fill_zero_cpu, (dotp,)),
            (bn._bwd_sums_cpu, (planes, grads, mean, sum_dy, dotp)),
            (bn._param_grads_cpu, (sum_dy, dotp, var, dweight, dbias, float(eps))),
            (bn._bwd_input_cpu, (planes, grads, mean, var, weight, sum_dy, dotp,
                                 bn._planes(dx), float(count), float(eps), True))]


# --------------------------------------------------------------------------- codelets

def _codelet(name, modes, fn, cpu, **extra):
    ref, cuda = _variants(fn, name)
    return Codelet(name, modes=modes, variants={"ref": ref, "cpu": cpu, "cuda": cuda},
                   flops=bn._size_flops, **extra)


bn_train_fwd = _codelet("bn_train_fwd", (R, R, R, RW, RW, R, W, W, W), _train_fwd_xp,
                        _train_fwd_cpu)
"""Batch statistics, running statistics and normalisation of a one-partition batch (R x,
weight, bias; RW running_mean, running_var; R momentum; W mean, var, y)."""
bn_train_bwd = _codelet("bn_train_bwd", (R, R, R, R, R, W, REDUX, REDUX), _train_bwd_xp,
                        _train_bwd_cpu, init=zero_init, redux=add_redux)
"""The input and parameter gradients of a one-partition batch through its statistics (R x,
dy, mean, var, weight; W dx; REDUX dweight, dbias)."""
