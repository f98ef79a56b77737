"""Batch-normalisation codelets: batch statistics by REDUX over partitions, the
normalisation, its backward pass, and the running-statistics update.

This module owns these codelets and every variant of them (``x`` is one batch
partition of shape ``(n, C, *spatial)``, statistics are per channel, ``(C,)``):

==============  ====================================================  ====================
codelet         operands (access mode)                                params
==============  ====================================================  ====================
bn_sum          x (R), sum (REDUX)                                    -
bn_mean         sum (R), mean (W)                                     count
bn_sqdev        x (R), mean (R), sqdev (REDUX)                        -
bn_var          sqdev (R), var (W)                                    count
bn_running      mean, sqdev (R), running_mean, running_var (RW),      count
                momentum (R)
bn_fwd          x, mean, var, weight, bias (R), y (W)                 eps
bn_bwd_sums     x, dy, mean (R), sum_dy, dotp (REDUX)                 -
bn_param_grads  sum_dy, dotp, var (R), dweight, dbias (REDUX)         eps
bn_bwd_input    x, dy, mean, var, weight, sum_dy, dotp (R), dx (W)    count, eps, batch_stats
==============  ====================================================  ====================

Policy: the statistics of a training step are those of the *whole* batch,
whatever its partitioning, and computed as PyTorch's CPU kernel does, in two
passes: every partition adds its per-channel sum into a REDUX handle, one task
divides by the batch's element count ``count = N * H * W`` (``bn_mean``); then
every partition adds its sum of squared deviations from that mean (``bn_sqdev``),
and one task divides again (``bn_var``, the biased variance used to normalise).
The runtime combines REDUX partials in a balanced tree in partition order, so
granularity changes only the rounding order and the policy changes nothing.
Running statistics follow ``torch.nn.BatchNorm2d``: ``running = momentum * batch
+ (1 - momentum) * running``, with the *unbiased* variance ``sqdev / (count - 1)``.
The momentum is the data of a one-element float64 operand read when the task runs
(``1 / num_batches_tracked`` for a cumulative average changes every step), so a
captured step graph stays valid every step.

The forward pass is PyTorch's ``y = x * alpha + beta`` with ``alpha = weight /
sqrt(var + eps)`` and ``beta = bias - mean * alpha``; in eval mode the layer hands
it the running statistics instead. The backward pass needs two more sums over
the batch, ``sum(dy)`` and ``dotp = sum((x - mean) * dy)``, again by REDUX; then
``dweight = dotp * invstd``, ``dbias = sum(dy)`` and (batch statistics)
``dx = (dy - sum(dy) / count - (x - mean) * dotp * invstd^2 / count) * invstd * weight``
or (fixed statistics, ``batch_stats=False``) ``dx = dy * invstd * weight``.

Sums accumulate in float64 whatever the dtype (PyTorch's CPU accumulation type).
Variants: ``ref`` (NumPy), ``cpu`` (Numba loops over ``(n, C, L)`` planes, each with a
``prepare``: a replayed task is one call of its kernel, the momentum read inside it)
and ``cuda`` (written against the array module: CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import as_dtype_of, jit, jit_inline
from .codelet import R, REDUX, RW, W, Codelet
from .prepared import from_calls
from .reduce import add_redux, zero_init
from . import kernels_cuda_norm
from .xp import array_module, by_xp

__all__ = ["bn_sum", "bn_mean", "bn_sqdev", "bn_var", "bn_running", "bn_fwd", "bn_bwd_sums",
           "bn_param_grads", "bn_bwd_input"]


def _planes(a):
    """``(n, C, *spatial)`` seen as ``(n, C, L)``."""
    return a.reshape(a.shape[0], a.shape[1], -1)


def _channel(v):
    """A ``(C,)`` vector broadcast against ``(n, C, L)`` planes."""
    return v.reshape(1, -1, 1)


def _size_flops(*shapes, **params):
    return float(math.prod(shapes[0]))


# --------------------------------------------------------------------------- ref and cuda (xp)
#
# One implementation against the array module: ``ref`` passes NumPy, ``cuda`` the
# module of its operands.

def _sum_xp(xp, x, total):
    total += _planes(x).sum(axis=(0, 2), dtype=xp.float64).astype(total.dtype)


def _sqdev_xp(xp, x, mean, sqdev):
    d = _planes(x).astype(xp.float64) - _channel(mean.astype(xp.float64))
    sqdev += (d * d).sum(axis=(0, 2)).astype(sqdev.dtype)


def _invstd(xp, var, eps):
    return 1.0 / xp.sqrt(var.astype(xp.float64) + eps)


def _fwd_xp(xp, x, mean, var, weight, bias, y, eps):
    alpha = _invstd(xp, var, eps) * weight
    beta = bias - mean * alpha
    _planes(y)[...] = _planes(x) * _channel(alpha.astype(x.dtype)) + _channel(beta.astype(x.dtype))


def _bwd_sums_xp(xp, x, dy, mean, sum_dy, dotp):
    g = _planes(dy).astype(xp.float64)
    sum_dy += g.sum(axis=(0, 2)).astype(sum_dy.dtype)
    d = _planes(x).astype(xp.float64) - _channel(mean.astype(xp.float64))
    dotp += (d * g).sum(axis=(0, 2)).astype(dotp.dtype)


def _param_grads_xp(xp, sum_dy, dotp, var, dweight, dbias, eps):
    dweight += (dotp * _invstd(xp, var, eps)).astype(dweight.dtype)
    dbias += sum_dy


def _bwd_input_xp(xp, x, dy, mean, var, weight, sum_dy, dotp, dx, count, eps, batch_stats=True):
    invstd = _invstd(xp, var, eps)
    scale = _channel((invstd * weight).astype(dx.dtype))
    if not batch_stats:
        _planes(dx)[...] = _planes(dy) * scale
        return
    grad_mean = _channel((sum_dy / count).astype(dx.dtype))
    k = _channel((dotp * invstd * invstd / count).astype(dx.dtype))
    d = _planes(x) - _channel(mean)
    _planes(dx)[...] = (_planes(dy) - grad_mean - d * k) * scale


def _mean_xp(xp, total, mean, count):
    mean[...] = total / total.dtype.type(count)


def _running_xp(xp, mean, sqdev, running_mean, running_var, momentum, count):
    # momentum is read where it lives (no host sync on a GPU); ``1 - m`` is rounded to the
    # running buffers' dtype, as a Python float's is when it multiplies them
    m = momentum.tolist()[0] if xp is np else momentum.reshape(-1)[0]
    unbiased = sqdev.astype(xp.float64) / (count - 1)  # the layer checks count > 1
    running_mean[...] = m * mean.astype(xp.float64) + _keep(xp, 1 - m, running_mean) * running_mean
    running_var[...] = m * unbiased + _keep(xp, 1 - m, running_var) * running_var


def _keep(xp, scalar, like):
    """``scalar`` (a Python float, or a 0-d device array) as it multiplies ``like``."""
    return scalar if xp is np else scalar.astype(like.dtype)


# --------------------------------------------------------------------------- cpu (Numba)

# The sums run four channels at once: a channel's float64 sum is one chain of dependent
# additions (its order, and so its bits, fixed: images, then positions), whose latency
# bounds a single chain at about 4 cycles an element; four independent chains share it.

@jit
def _sum_cpu(x, total):
    n, c, length = x.shape
    j = 0
    while j + 4 <= c:
        a0 = a1 = a2 = a3 = 0.0
        for i in range(n):
            for k in range(length):
                a0 += x[i, j, k]
                a1 += x[i, j + 1, k]
                a2 += x[i, j + 2, k]
                a3 += x[i, j + 3, k]
        total[j] += a0
        total[j + 1] += a1
        total[j + 2] += a2
        total[j + 3] += a3
        j += 4
    for j in range(j, c):
        acc = 0.0
        for i in range(n):
            for k in range(length):
                acc += x[i, j, k]
        total[j] += acc


@jit
def _sqdev_cpu(x, mean, sqdev):
    n, c, length = x.shape
    j = 0
    while j + 4 <= c:
        m0, m1 = np.float64(mean[j]), np.float64(mean[j + 1])
        m2, m3 = np.float64(mean[j + 2]), np.float64(mean[j + 3])
        a0 = a1 = a2 = a3 = 0.0
        for i in range(n):
            for k in range(length):
                d0 = x[i, j, k] - m0
                d1 = x[i, j + 1, k] - m1
                d2 = x[i, j + 2, k] - m2
                d3 = x[i, j + 3, k] - m3
                a0 += d0 * d0
                a1 += d1 * d1
                a2 += d2 * d2
                a3 += d3 * d3
        sqdev[j] += a0
        sqdev[j + 1] += a1
        sqdev[j + 2] += a2
        sqdev[j + 3] += a3
        j += 4
    for j in range(j, c):
        m = np.float64(mean[j])
        acc = 0.0
        for i in range(n):
            for k in range(length):
                d = x[i, j, k] - m
                acc += d * d
        sqdev[j] += acc


@jit_inline
def fold(mean, var, weight, bias, eps, like):
    """``(alpha, beta)`` of one channel in ``like``'s dtype: ``y = x * alpha + beta``."""
    alpha64 = weight / np.sqrt(np.float64(var) + eps)
    return as_dtype_of(like, alpha64), as_dtype_of(like, bias - mean * alpha64)


@jit_inline
def input_terms(var, weight, sum_dy, dotp, count, eps, like):
    """``(scale, grad_mean, k)`` of one channel in ``like``'s dtype, batch statistics:
    ``dx = (dy - grad_mean - (x - mean) * k) * scale``."""
    invstd = 1.0 / np.sqrt(np.float64(var) + eps)
    return (as_dtype_of(like, invstd * weight), as_dtype_of(like, sum_dy / count),
            as_dtype_of(like, dotp * invstd * invstd / count))


@jit
def _fwd_cpu(x, mean, var, weight, bias, y, eps):
    n, c, length = x.shape
    for j in range(c):
        alpha, beta = fold(mean[j], var[j], weight[j], bias[j], eps, y)
        for i in range(n):
            for k in range(length):
                y[i, j, k] = x[i, j, k] * alpha + beta


@jit_inline
def sums_pair(x, e, i, j, r, m0, m1, g0, g1, d0, d1):
    """Two channels' ``bn_bwd_sums`` chains over image ``i``: ``x[i, j]`` and ``x[i, j + 1]``
    against the gradient rows ``e[r]`` and ``e[r + 1]`` (``dy[i]``'s, or the activation's
    masked gradient); returns ``(g0, g1, d0, d1)``, each element added in row order."""
    for k in range(x.shape[2]):
        a = np.float64(e[r, k])
        b = np.float64(e[r + 1, k])
        g0 += a
        d0 += (x[i, j, k] - m0) * a
        g1 += b
        d1 += (x[i, j + 1, k] - m1) * b
    return g0, g1, d0, d1


@jit_inline
def sums_row(x, e, i, j, r, m0, g0, d0):
    """One channel's chains (:func:`sums_pair`'s, for a last odd channel)."""
    for k in range(x.shape[2]):
        a = np.float64(e[r, k])
        g0 += a
        d0 += (x[i, j, k] - m0) * a
    return g0, d0


@jit
def _bwd_sums_cpu(x, dy, mean, sum_dy, dotp):
    n, c, _ = x.shape
    j = 0
    while j + 2 <= c:  # two channels, four chains
        m0, m1 = np.float64(mean[j]), np.float64(mean[j + 1])
        g0 = g1 = d0 = d1 = 0.0
        for i in range(n):
            g0, g1, d0, d1 = sums_pair(x, dy[i], i, j, j, m0, m1, g0, g1, d0, d1)
        sum_dy[j] += g0
        dotp[j] += d0
        sum_dy[j + 1] += g1
        dotp[j + 1] += d1
        j += 2
    for j in range(j, c):
        m = np.float64(mean[j])
        acc_g = 0.0
        acc_d = 0.0
        for i in range(n):
            acc_g, acc_d = sums_row(x, dy[i], i, j, j, m, acc_g, acc_d)
        sum_dy[j] += acc_g
        dotp[j] += acc_d


@jit
def _bwd_input_cpu(x, dy, mean, var, weight, sum_dy, dotp, dx, count, eps, batch_stats):
    n, c, length = x.shape
    for j in range(c):
        scale, grad_mean, k_ = input_terms(var[j], weight[j], sum_dy[j], dotp[j], count, eps,
                                           dx)
        m = mean[j]
        for i in range(n):
            for k in range(length):
                if batch_stats:
                    dx[i, j, k] = (dy[i, j, k] - grad_mean - (x[i, j, k] - m) * k_) * scale
                else:
                    dx[i, j, k] = dy[i, j, k] * scale


@jit
def _param_grads_cpu(sum_dy, dotp, var, dweight, dbias, eps):
    for j in range(var.shape[0]):
        dweight[j] += dotp[j] * (1.0 / np.sqrt(np.float64(var[j]) + eps))
        dbias[j] += sum_dy[j]


@jit
def _running_cpu(mean, sqdev, running_mean, running_var, count, momentum_data):
    """The update with ``momentum`` read from its operand here (it changes every step)."""
    momentum = momentum_data[0]
    for j in range(mean.shape[0]):
        unbiased = np.float64(sqdev[j]) / (count - 1)
        running_mean[j] = momentum * mean[j] + (1 - momentum) * running_mean[j]
        running_var[j] = momentum * unbiased + (1 - momentum) * running_var[j]


@jit
def _divide_cpu(total, out, count):
    """``out = total / count``, ``count`` rounded to ``total``'s dtype (the ``xp`` formula)."""
    d = as_dtype_of(total, count)
    for j in range(total.shape[0]):
        out[j] = total[j] / d


# The ``cpu`` variants: each is its kernel's one call (``from_calls``), the inputs it reads
# as ``(n, C, L)`` planes through ``view`` (copied from Python when strided).

@from_calls
def _sum_cpu_wrapper(view, x, total):
    return [(_sum_cpu, (_planes(view(x)), total))]


@from_calls
def _sqdev_cpu_wrapper(view, x, mean, sqdev):
    return [(_sqdev_cpu, (_planes(view(x)), mean, sqdev))]


@from_calls
def _fwd_cpu_wrapper(view, x, mean, var, weight, bias, y, eps):
    require_contiguous("bn_fwd", y=y)
    return [(_fwd_cpu, (_planes(view(x)), mean, var, weight, bias, _planes(y), float(eps)))]


@from_calls
def _bwd_sums_cpu_wrapper(view, x, dy, mean, sum_dy, dotp):
    return [(_bwd_sums_cpu, (_planes(view(x)), _planes(view(dy)), mean, sum_dy, dotp))]


@from_calls
def _param_grads_cpu_wrapper(view, sum_dy, dotp, var, dweight, dbias, eps):
    return [(_param_grads_cpu, (sum_dy, dotp, var, dweight, dbias, float(eps)))]


@from_calls
def _bwd_input_cpu_wrapper(view, x, dy, mean, var, weight, sum_dy, dotp, dx, count, eps,
                           batch_stats=True):
    require_contiguous("bn_bwd_input", dx=dx)
    return [(_bwd_input_cpu, (_planes(view(x)), _planes(view(dy)), mean, var, weight, sum_dy,
                              dotp, _planes(dx), float(count), float(eps), bool(batch_stats)))]


@from_calls
def _mean_cpu_wrapper(view, total, mean, count):
    return [(_divide_cpu, (total, mean, float(count)))]


@from_calls
def _running_cpu_wrapper(view, mean, sqdev, running_mean, running_var, momentum, count):
    return [(_running_cpu, (mean, sqdev, running_mean, running_var, float(count), momentum))]


# --------------------------------------------------------------------------- codelets

def _kernel_first(launcher, fn, name):
    """The ``cuda`` variant: one kernel (:mod:`.kernels_cuda_norm`) where it takes the
    operands, else ``fn`` in the operands' array module."""
    def cuda(*arrays, **params):
        xp = array_module(*arrays)
        if not launcher(xp, fn, *arrays, **params):
            fn(xp, *arrays, **params)
    cuda.__name__ = name
    return cuda


def _codelet(name, modes, fn, cpu, flops=_size_flops, reduce=False):
    ref, cuda = by_xp(fn)
    cuda = _kernel_first(kernels_cuda_norm.LAUNCHERS[name], fn, cuda.__name__)
    extra = {"init": zero_init, "redux": add_redux} if reduce else {}
    return Codelet(name, modes=modes, variants={"ref": ref, "cpu": cpu, "cuda": cuda},
                   flops=flops, **extra)


bn_sum = _codelet("bn_sum", (R, REDUX), _sum_xp, _sum_cpu_wrapper, reduce=True)
"""``sum += x.sum(axis=(0, 2, 3))`` (R x, REDUX sum)."""
bn_mean = _codelet("bn_mean", (R, W), _mean_xp, _mean_cpu_wrapper)
"""``mean = sum / count`` (R sum, W mean)."""
bn_sqdev = _codelet("bn_sqdev", (R, R, REDUX), _sqdev_xp, _sqdev_cpu_wrapper, reduce=True)
"""``sqdev += ((x - mean)^2).sum(axis=(0, 2, 3))`` (R x, R mean, REDUX sqdev)."""
bn_var = _codelet("bn_var", (R, W), _mean_xp, _mean_cpu_wrapper)
"""``var = sqdev / count``, the biased variance (R sqdev, W var)."""
bn_running = _codelet("bn_running", (R, R, RW, RW, R), _running_xp, _running_cpu_wrapper)
"""Running statistics update with the unbiased variance (R mean, R sqdev, RW running_mean,
RW running_var, R momentum = ``[momentum]`` in float64)."""
bn_fwd = _codelet("bn_fwd", (R, R, R, R, R, W), _fwd_xp, _fwd_cpu_wrapper)
"""``y = (x - mean) / sqrt(var + eps) * weight + bias`` (R x, mean, var, weight, bias; W y)."""
bn_bwd_sums = _codelet("bn_bwd_sums", (R, R, R, REDUX, REDUX), _bwd_sums_xp,
                       _bwd_sums_cpu_wrapper, reduce=True)
"""``sum_dy += dy.sum``, ``dotp += ((x - mean) * dy).sum`` per channel (R x, dy, mean; REDUX
sum_dy, dotp)."""
bn_param_grads = _codelet("bn_param_grads", (R, R, R, REDUX, REDUX), _param_grads_xp,
                          _param_grads_cpu_wrapper, reduce=True)
"""``dweight += dotp / sqrt(var + eps)``, ``dbias += sum_dy`` (R sum_dy, dotp, var; REDUX
dweight, dbias)."""
bn_bwd_input = _codelet("bn_bwd_input", (R, R, R, R, R, R, R, W), _bwd_input_xp,
                        _bwd_input_cpu_wrapper)
"""The input gradient through batch (or, ``batch_stats=False``, fixed) statistics."""
