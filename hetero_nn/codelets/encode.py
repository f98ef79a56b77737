"""Encoding codelets: the time axis of a spiking network's input, made from static samples.

This module owns three codelets and every variant of them:

=============  ===================================  =========================
codelet        operands (access mode)                params
=============  ===================================  =========================
repeat_fwd     x (R), y (W)                          --
repeat_bwd     dy (R), dx (W)                        --
rate_encode    x (R), key (R), y (W)                 start
=============  ===================================  =========================

``x`` is ``(n, *sample)``, ``y`` and ``dy`` are ``(n, T, *sample)`` (batch first, then
time). ``repeat_fwd`` copies every sample to each of its ``T`` steps (direct encoding);
``repeat_bwd`` sums the ``T`` steps' gradients, the last step first (the order in which
backpropagation through time produces them, and autograd accumulates them).

``rate_encode`` draws Bernoulli spikes: ``y[i, t, j] = 1`` when ``u < clamp(x[i, j], 0, 1)``
(snnTorch's ``spikegen.rate``), where ``u`` is the counter-based draw of
:mod:`~hetero_nn.codelets.dropout` for the element's position in the whole batch,
``((start + i) * T + t) * sample_size + j``, under ``key`` (a one-element uint64 operand,
as Dropout's). The spikes therefore depend on (key, sample, step, element) only: the same
at any granularity, on any worker, under any policy.

Variants: ``ref`` (NumPy), ``cpu`` (Numba) and ``cuda`` (the array module of the operands:
CuPy on a GPU, NumPy in CI); all three give the same bits.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit
from .prepared import from_calls
from .codelet import R, W, Codelet
from .dropout import _uniform, uniforms
from .xp import array_module

__all__ = ["repeat_fwd", "repeat_bwd", "rate_encode"]


def _check(name, x, y):
    if y.ndim != x.ndim + 1 or y.shape[0] != x.shape[0] or y.shape[2:] != x.shape[1:]:
        raise ValueError(f"{name}: expected (n, T, *sample) for samples {x.shape}, got {y.shape}")


# --------------------------------------------------------------------------- repeat

def _repeat_fwd_xp(xp, x, y):
    _check("repeat_fwd", x, y)
    y[...] = x[:, None]


def _repeat_bwd_xp(xp, dy, dx):
    _check("repeat_bwd", dx, dy)
    last = dy.shape[1] - 1
    dx[...] = dy[:, last]
    for t in range(last - 1, -1, -1):  # last step first, as backpropagation reaches them
        dx += dy[:, t]


@jit
def _repeat_bwd_cpu(dy, dx):
    n, T, F = dy.shape
    for i in range(n):
        for f in range(F):
            dx[i, f] = dy[i, T - 1, f]
        for t in range(T - 2, -1, -1):
            for f in range(F):
                dx[i, f] += dy[i, t, f]


@jit
def _repeat_fwd_cpu(x, y):
    n, T, F = y.shape
    for i in range(n):
        for t in range(T):
            for f in range(F):
                y[i, t, f] = x[i, f]


@from_calls
def repeat_fwd_cpu(view, x, y):
    """``repeat_fwd``'s one Numba call (a copy: NumPy's bits); compiled in a replay."""
    _check("repeat_fwd", x, y)
    require_contiguous("repeat_fwd", y=y)
    n, T = y.shape[:2]
    return [(_repeat_fwd_cpu, (view(x).reshape(n, -1), y.reshape(n, T, -1)))]


@from_calls
def repeat_bwd_cpu(view, dy, dx):
    """``repeat_bwd``'s one Numba call; compiled in a replay."""
    _check("repeat_bwd", dx, dy)
    require_contiguous("repeat_bwd", dx=dx)
    n, T = dy.shape[:2]
    return [(_repeat_bwd_cpu, (view(dy).reshape(n, T, -1), dx.reshape(n, -1)))]


repeat_fwd = Codelet(
    "repeat_fwd", modes=(R, W),
    variants={"ref": lambda x, y: _repeat_fwd_xp(np, x, y),
              "cpu": repeat_fwd_cpu,
              "cuda": lambda x, y: _repeat_fwd_xp(array_module(x, y), x, y)},
    flops=lambda x, y, **params: float(math.prod(y)))
"""``y[:, t] = x`` for every step ``t`` (R x, W y): a broadcast copy."""

repeat_bwd = Codelet(
    "repeat_bwd", modes=(R, W),
    variants={"ref": lambda dy, dx: _repeat_bwd_xp(np, dy, dx), "cpu": repeat_bwd_cpu,
              "cuda": lambda dy, dx: _repeat_bwd_xp(array_module(dy, dx), dy, dx)},
    flops=lambda dy, dx, **params: float(math.prod(dy)))
"""``dx = sum_t dy[:, t]``, the last step first (R dy, W dx)."""


# --------------------------------------------------------------------------- rate

def _rate_xp(xp, x, key, y, start):
    _check("rate_encode", x, y)
    n, T = y.shape[:2]
    u = uniforms(xp, (n, T * math.prod(x.shape[1:])), key, start).reshape(y.shape)
    p = xp.clip(x, 0, 1)[:, None]
    y[...] = u < p


@jit
def _rate_cpu(x, key, y, start):
    n, T, F = y.shape
    one, zero = y.dtype.type(1), y.dtype.type(0)
    for i in range(n):
        for t in range(T):
            base = ((np.uint64(start) + np.uint64(i)) * np.uint64(T) + np.uint64(t)) * np.uint64(F)
            for f in range(F):
                p = min(max(np.float64(x[i, f]), 0.0), 1.0)
                y[i, t, f] = one if _uniform(base + np.uint64(f), key) < p else zero


def _rate_cpu_wrapper(x, key, y, *, start):
    _check("rate_encode", x, y)
    require_contiguous("rate_encode", y=y)
    n, T = y.shape[:2]
    _rate_cpu(np.ascontiguousarray(x).reshape(n, -1), np.uint64(key[0]), y.reshape(n, T, -1),
              np.uint64(start))


rate_encode = Codelet(
    "rate_encode", modes=(R, R, W),
    variants={"ref": lambda x, key, y, *, start: _rate_xp(np, x, key, y, start),
              "cpu": _rate_cpu_wrapper,
              "cuda": lambda x, key, y, *, start: _rate_xp(array_module(x, y), x, key, y, start)},
    flops=lambda x, key, y, **params: 8.0 * math.prod(y))
"""Bernoulli spikes with probabilities ``clamp(x, 0, 1)`` at every step (R x, R key, W y)."""
