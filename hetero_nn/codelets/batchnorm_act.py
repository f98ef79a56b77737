"""Batch norm and the ReLU or ReLU6 after it, in training: the normalisation and the
activation in one pass, the backward passes of both in two.

This module owns three codelets (``x`` one batch partition ``(n, C, *spatial)``, the
statistics per channel, as :mod:`.batchnorm`'s):

================  ============================================================  ==================
codelet           operands (access mode)                                        params
================  ============================================================  ==================
bn_act_fwd        x, mean, var, weight, bias (R), y (W)                         eps, activation
bn_act_bwd_sums   x, dy, mean, var, weight, bias (R), sum_dy, dotp (REDUX)      eps, activation
bn_act_bwd_input  x, dy, mean, var, weight, bias, sum_dy, dotp (R), dx (W)      count, eps,
                                                                                activation
================  ============================================================  ==================

``activation`` is ``"relu"`` or ``"relu6"``; ``y`` is the activation's output and ``dy``
its gradient. Policy: bit for bit the unfused chain. ``bn_act_fwd`` is ``bn_fwd`` then
``relu_fwd``/``relu6_fwd`` on its output ``u = x * alpha + beta``, each value rounded as
they round it, without storing ``u``. The backward codelets compute ``u`` again from
``x`` with the same roundings, so the activation's gradient ``g`` (``dy`` where
``relu_bwd``/``relu6_bwd`` pass it, else 0: ``u > 0``, or ``0 < u < 6``, NaN gives 0 for
ReLU6 and ``dy`` for ReLU, as PyTorch) is the array those wrote; then ``bn_bwd_sums``'s
and ``bn_bwd_input``'s formulas on ``g`` in their summation orders. So a model fused or
not gives the same bits, and a training step makes three passes fewer over each such
layer's activations (``u`` written and read, ``g`` written and read twice: four reads and
two writes less) and keeps one array fewer alive until the backward pass.

Variants: ``ref`` (NumPy, :mod:`.batchnorm`'s and :mod:`.activation`'s formulas composed),
``cpu`` (Numba, prepared: one kernel call per task) and ``cuda`` (the ``ref`` formulas
written against the array module of its operands).
"""

from __future__ import annotations

import numpy as np

from . import batchnorm as bn
from ._checks import require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, REDUX, W, Codelet
from .prepared import from_calls
from .reduce import add_redux, zero_init
from .xp import by_xp

__all__ = ["ACTIVATIONS", "bn_act_fwd", "bn_act_bwd_sums", "bn_act_bwd_input"]

ACTIVATIONS = ("relu", "relu6")


def _code(name, activation):
    """``activation`` as the kernels' flag: True for ReLU6."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation == "relu6"


# --------------------------------------------------------------------------- ref and cuda (xp)

def _pre_activation(xp, x, mean, var, weight, bias, eps):
    """``u``, as ``bn_fwd`` writes it."""
    u = xp.empty_like(x)
    bn._fwd_xp(xp, x, mean, var, weight, bias, u, eps)
    return u


def _activate_xp(xp, u, activation):
    t = u.dtype.type
    if activation == "relu":
        return xp.where(u <= 0, t(0), u)
    return xp.where(u < 0, t(0), xp.where(u > 6, t(6), u))


def _gradient_xp(xp, u, dy, activation):
    zero = dy.dtype.type(0)
    if activation == "relu":
        return xp.where(u <= 0, zero, dy)
    return xp.where((u > 0) & (u < 6), dy, zero)


def _act_fwd_xp(xp, x, mean, var, weight, bias, y, eps, activation):
    _code("bn_act_fwd", activation)
    u = _pre_activation(xp, x, mean, var, weight, bias, eps)
    xp.copyto(y, _activate_xp(xp, u, activation))


def _act_bwd_sums_xp(xp, x, dy, mean, var, weight, bias, sum_dy, dotp, eps, activation):
    _code("bn_act_bwd_sums", activation)
    u = _pre_activation(xp, x, mean, var, weight, bias, eps)
    bn._bwd_sums_xp(xp, x, _gradient_xp(xp, u, dy, activation), mean, sum_dy, dotp)


def _act_bwd_input_xp(xp, x, dy, mean, var, weight, bias, sum_dy, dotp, dx, count, eps,
                      activation):
    _code("bn_act_bwd_input", activation)
    u = _pre_activation(xp, x, mean, var, weight, bias, eps)
    bn._bwd_input_xp(xp, x, _gradient_xp(xp, u, dy, activation), mean, var, weight, sum_dy,
                     dotp, dx, count, eps)


# --------------------------------------------------------------------------- cpu (Numba)
#
# Each kernel recomputes ``u`` per element from ``bn.fold``'s ``alpha`` and ``beta`` (the
# values ``bn_fwd`` multiplies and adds), so the activation sees what it saw unfused.

@jit_inline
def _masked(u, g, zero, relu6):
    """The activation's gradient at ``u`` given its output's ``g``: ``relu6_bwd``'s
    (``g`` strictly inside (0, 6)), ``relu_bwd``'s (0 where ``u <= 0``)."""
    if relu6:
        r = g if u > 0 else zero  # two selects (``0 < u < 6`` branches: 7x slower)
        return r if u < 6 else zero
    return zero if u <= 0 else g


@jit
def _act_fwd_cpu(x, mean, var, weight, bias, y, eps, relu6):
    n, c, length = x.shape
    t = y.dtype.type
    for j in range(c):
        alpha, beta = bn.fold(mean[j], var[j], weight[j], bias[j], eps, y)
        for i in range(n):
            if relu6:
                for k in range(length):  # relu6_fwd's selects
                    u = x[i, j, k] * alpha + beta
                    r = t(0) if u < 0 else u
                    y[i, j, k] = t(6) if u > 6 else r
            else:
                for k in range(length):  # relu_fwd's
                    u = x[i, j, k] * alpha + beta
                    y[i, j, k] = t(0) if u <= 0 else u


@jit_inline
def _gradient_row(x, dy, i, j, alpha, beta, row, relu6):
    """``row[:] = g[i, j]``: a vectorised pass (the selects inside a float64 sum's chain
    become branches, which random signs mispredict: 4-6x slower)."""
    zero = dy.dtype.type(0)
    for k in range(x.shape[2]):
        row[k] = _masked(x[i, j, k] * alpha + beta, dy[i, j, k], zero, relu6)


@jit
def _act_bwd_sums_cpu(x, dy, mean, var, weight, bias, sum_dy, dotp, eps, relu6):
    n, c, length = x.shape
    rows = np.empty((2, length), dy.dtype)  # g of one image in two channels
    j = 0
    while j + 2 <= c:  # two channels, four chains, in bn_bwd_sums's order (its helpers)
        a0, b0 = bn.fold(mean[j], var[j], weight[j], bias[j], eps, x)
        a1, b1 = bn.fold(mean[j + 1], var[j + 1], weight[j + 1], bias[j + 1], eps, x)
        m0, m1 = np.float64(mean[j]), np.float64(mean[j + 1])
        g0 = g1 = d0 = d1 = 0.0
        for i in range(n):
            _gradient_row(x, dy, i, j, a0, b0, rows[0], relu6)
            _gradient_row(x, dy, i, j + 1, a1, b1, rows[1], relu6)
            g0, g1, d0, d1 = bn.sums_pair(x, rows, i, j, 0, m0, m1, g0, g1, d0, d1)
        sum_dy[j] += g0
        dotp[j] += d0
        sum_dy[j + 1] += g1
        dotp[j + 1] += d1
        j += 2
    for j in range(j, c):
        alpha, beta = bn.fold(mean[j], var[j], weight[j], bias[j], eps, x)
        m = np.float64(mean[j])
        acc_g = 0.0
        acc_d = 0.0
        for i in range(n):
            _gradient_row(x, dy, i, j, alpha, beta, rows[0], relu6)
            acc_g, acc_d = bn.sums_row(x, rows, i, j, 0, m, acc_g, acc_d)
        sum_dy[j] += acc_g
        dotp[j] += acc_d


@jit
def _act_bwd_input_cpu(x, dy, mean, var, weight, bias, sum_dy, dotp, dx, count, eps, relu6):
    n, c, length = x.shape
    t = dx.dtype.type
    for j in range(c):
        alpha, beta = bn.fold(mean[j], var[j], weight[j], bias[j], eps, x)
        scale, grad_mean, k_ = bn.input_terms(var[j], weight[j], sum_dy[j], dotp[j], count,
                                              eps, dx)
        m = mean[j]
        for i in range(n):
            for k in range(length):
                v = x[i, j, k]
                g = _masked(v * alpha + beta, dy[i, j, k], t(0), relu6)
                dx[i, j, k] = (g - grad_mean - (v - m) * k_) * scale


@from_calls
def _act_fwd_cpu_wrapper(view, x, mean, var, weight, bias, y, eps, activation):
    require_contiguous("bn_act_fwd", y=y)
    return [(_act_fwd_cpu, (bn._planes(view(x)), mean, var, weight, bias, bn._planes(y),
                            float(eps), _code("bn_act_fwd", activation)))]


@from_calls
def _act_bwd_sums_cpu_wrapper(view, x, dy, mean, var, weight, bias, sum_dy, dotp, eps,
                              activation):
    return [(_act_bwd_sums_cpu, (bn._planes(view(x)), bn._planes(view(dy)), mean, var, weight,
                                 bias, sum_dy, dotp, float(eps),
                                 _code("bn_act_bwd_sums", activation)))]


@from_calls
def _act_bwd_input_cpu_wrapper(view, x, dy, mean, var, weight, bias, sum_dy, dotp, dx, count,
                               eps, activation):
    require_contiguous("bn_act_bwd_input", dx=dx)
    return [(_act_bwd_input_cpu, (bn._planes(view(x)), bn._planes(view(dy)), mean, var, weight,
                                  bias, sum_dy, dotp, bn._planes(dx), float(count), float(eps),
                                  _code("bn_act_bwd_input", activation)))]


# --------------------------------------------------------------------------- codelets

def _codelet(name, modes, fn, cpu, reduce=False):
    ref, cuda = by_xp(fn)
    extra = {"init": zero_init, "redux": add_redux} if reduce else {}
    return Codelet(name, modes=modes, variants={"ref": ref, "cpu": cpu, "cuda": cuda},
                   flops=bn._size_flops, **extra)


bn_act_fwd = _codelet("bn_act_fwd", (R, R, R, R, R, W), _act_fwd_xp, _act_fwd_cpu_wrapper)
"""``y = activation(bn_fwd(x))`` (R x, mean, var, weight, bias; W y)."""
bn_act_bwd_sums = _codelet("bn_act_bwd_sums", (R, R, R, R, R, R, REDUX, REDUX),
                           _act_bwd_sums_xp, _act_bwd_sums_cpu_wrapper, reduce=True)
"""``bn_bwd_sums`` of the activation's input gradient ``g`` (R x, dy, mean, var, weight,
bias; REDUX sum_dy, dotp)."""
bn_act_bwd_input = _codelet("bn_act_bwd_input", (R, R, R, R, R, R, R, R, W), _act_bwd_input_xp,
                            _act_bwd_input_cpu_wrapper)
"""``bn_bwd_input`` (batch statistics) of the activation's input gradient ``g`` (R x, dy,
mean, var, weight, bias, sum_dy, dotp; W dx)."""
