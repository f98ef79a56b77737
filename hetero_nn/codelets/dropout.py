"""Dropout codelets: a counter-based mask, so the same elements drop on every device,
worker, policy and granularity.

This module owns four codelets and every variant of them:

===============  ==========================  ==================================
codelet          operands (access mode)       params
===============  ==========================  ==================================
dropout_fwd      x (R), y (W), key (R)        p, start
dropout_bwd      dy (R), dx (W), key (R)      p, start
dropout2d_fwd    x (R), y (W), key (R)        p, start, block
dropout2d_bwd    dy (R), dx (W), key (R)      p, start, block
===============  ==========================  ==================================

Policy: element ``j`` of sample ``start + i`` of the batch (``x`` is the partition
that begins at sample ``start``) is kept when ``u >= p``, where ``u`` in [0, 1) is
the top 53 bits of ``splitmix64(key + counter * GOLDEN)`` and ``counter = (start +
i) * sample_size + j`` is the element's position in the whole batch. The layer
derives ``key`` from its seed and its step count (:func:`dropout_key`), so a mask
depends on (seed, step, sample, element) only. The key is not a task parameter but
the data of a one-element uint64 operand (:func:`key_data`), read when the task
runs, so a captured step graph stays valid every step (the layer writes the next
step's key into it); the backward pass recomputes it
instead of storing it. Kept elements are scaled by ``1 / (1 - p)`` computed in
the operands' dtype, as ``torch.nn.functional.dropout`` does (``p = 1`` drops all).

``dropout2d`` (``torch.nn.Dropout2d``) draws one value per *channel* of a sample and
drops or keeps the channel's ``block`` contiguous elements (its plane) together: the
same rule with ``counter = (start + i) * (sample_size / block) + j // block``, which for
``block = 1`` is the element-wise mask above.

Variants: ``ref`` (NumPy uint64 arithmetic, which wraps), ``cpu`` (Numba, prepared:
the kernel reads the key) and
``cuda`` (the array module's uint64 arithmetic: CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, W, Codelet
from .prepared import from_calls
from .xp import array_module

__all__ = ["dropout_fwd", "dropout_bwd", "dropout2d_fwd", "dropout2d_bwd", "dropout_key", "key_data",
           "keep_mask", "uniforms"]

_MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (mod 2**64)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def dropout_key(seed: int, step: int) -> int:
    """The 64-bit key of one forward call: a layer's ``seed`` and its ``step`` count."""
    return _mix_int(_mix_int(int(seed)) + int(step) * GOLDEN)


def key_data(seed: int, step: int) -> np.ndarray:
    """The ``key`` operand's data: ``[dropout_key(seed, step)]`` as uint64."""
    return np.array([dropout_key(seed, step)], np.uint64)


def _scale(p, dtype):
    """PyTorch's ``1 / (1 - p)`` in the operands' dtype (0 when everything drops)."""
    return dtype.type(0) if p >= 1 else dtype.type(1) / dtype.type(1 - p)


# --------------------------------------------------------------------------- ref and cuda (xp)

def keep_mask(xp, shape, p, key, start, block=1):
    """Boolean mask of the elements kept, for a partition of ``shape`` at sample ``start``;
    ``key`` is an int or the ``key`` operand (an array of the module ``xp``, read there);
    each run of ``block`` elements of a sample shares one draw (Dropout2d's channels)."""
    return uniforms(xp, shape, key, start, block) >= p


def uniforms(xp, shape, key, start, block=1):
    """The float64 draws in [0, 1) of a partition of ``shape`` at sample ``start`` (the module
    docstring's ``u``), ``key`` and ``block`` as for :func:`keep_mask`."""
    n, size = shape[0], math.prod(shape[1:])
    units = size // block
    counter = (xp.arange(n, dtype=xp.uint64).reshape(-1, 1) + xp.uint64(start)) * xp.uint64(units) \
        + xp.arange(size, dtype=xp.uint64) // xp.uint64(block)
    z = counter * xp.uint64(GOLDEN) + xp.asarray(key, dtype=xp.uint64)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    z = z ^ (z >> xp.uint64(31))
    u = (z >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))
    return u.reshape(shape)


def _apply_xp(xp, src, dst, key, p, start, block):
    keep = keep_mask(xp, src.shape, float(p), key, int(start), int(block))
    xp.copyto(dst, xp.where(keep, src * _scale(p, src.dtype), src.dtype.type(0)))


def _fwd_ref(x, y, key, *, p, start, block=1):
    _apply_xp(np, x, y, key, p, start, block)


def _fwd_cuda(x, y, key, *, p, start, block=1):
    _apply_xp(array_module(x, y, key), x, y, key, p, start, block)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _uniform(counter, key):
    z = counter * np.uint64(GOLDEN) + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@jit
def _apply_cpu(src, dst, p, key_data, start, scale, block):
    """``dst = src * keep * scale`` on ``(n, sample size)`` rows, the key read from its
    operand here (it changes every step)."""
    key = key_data[0]
    n, size = src.shape
    zero = dst.dtype.type(0)
    units = size // block
    for i in range(n):
        base = (np.uint64(start) + np.uint64(i)) * np.uint64(units)
        for unit in range(units):
            keep = _uniform(base + np.uint64(unit), key) >= p
            for j in range(unit * block, (unit + 1) * block):
                dst[i, j] = src[i, j] * scale if keep else zero


@from_calls
def _apply_cpu_wrapper(view, src, dst, key, *, p, start, block=1):
    require_contiguous("dropout", dst=dst)
    n = src.shape[0]
    return [(_apply_cpu, (view(src).reshape(n, -1), dst.reshape(n, -1), float(p),
                          view(key).reshape(-1), np.uint64(start), _scale(p, dst.dtype),
                          int(block)))]


# --------------------------------------------------------------------------- codelets

def _flops(a, *others, **params):
    return float(math.prod(a))


_VARIANTS = {"ref": _fwd_ref, "cpu": _apply_cpu_wrapper, "cuda": _fwd_cuda}

dropout_fwd = Codelet("dropout_fwd", modes=(R, W, R), variants=_VARIANTS, flops=_flops)
"""``y = x * keep / (1 - p)`` (R x, W y, R key); the mask from ``(key[0], start)``."""

dropout_bwd = Codelet("dropout_bwd", modes=(R, W, R), variants=_VARIANTS, flops=_flops)
"""``dx = dy * keep / (1 - p)`` (R dy, W dx, R key): the forward's mask, recomputed."""

dropout2d_fwd = Codelet("dropout2d_fwd", modes=(R, W, R), variants=_VARIANTS, flops=_flops)
"""``y = x * keep / (1 - p)`` with one draw per channel of ``block`` elements (R x, W y,
R key)."""

dropout2d_bwd = Codelet("dropout2d_bwd", modes=(R, W, R), variants=_VARIANTS, flops=_flops)
"""``dx = dy * keep / (1 - p)``, the forward's channel mask recomputed (R dy, W dx, R key)."""
