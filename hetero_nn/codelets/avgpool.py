"""Average-pooling codelets: 2-D forward and backward with zero padding.

This module owns two codelets and every variant of them:

==============  ===================================  ===============================
codelet         operands (access mode)               params
==============  ===================================  ===============================
avgpool2d_fwd   x[N,C,H,W] (R), y[N,C,OH,OW] (W)     kernel_size, stride, padding
avgpool2d_bwd   dy[N,C,OH,OW] (R), dx[N,C,H,W] (W)   kernel_size, stride, padding
==============  ===================================  ===============================

Semantics are ``torch.nn.functional.avg_pool2d``'s defaults: floor mode
(``OH = (H + 2 * PH - KH) // SH + 1``) and ``count_include_pad=True``, so every
window's sum is divided by ``KH * KW`` (padding counts as zeros); ``stride``
defaults to ``kernel_size``. The backward pass adds ``dy / (KH * KW)`` to every
input element of each window (padding dropped), as PyTorch's kernel. Global
average pooling (``AdaptiveAvgPool2d(1)``) is the window ``(H, W)``.

Variants: ``ref`` (NumPy sliding windows over the padded input), ``cpu`` (Numba
loops) and ``cuda`` (one strided slice per window offset, written against the
array module: CuPy on a GPU, NumPy in CI; no scatter, so no atomics).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._checks import pair, require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, W, Codelet
from .xp import array_module

__all__ = ["avgpool2d_fwd", "avgpool2d_bwd", "avgpool2d_output_shape"]


def _geometry(x_shape, kernel_size, stride, padding):
    """``(kh, kw, sh, sw, ph, pw, OH, OW)`` for pooling an ``x_shape`` input."""
    kh, kw = pair(kernel_size, "kernel_size", "avgpool2d")
    sh, sw = pair(kernel_size if stride is None else stride, "stride", "avgpool2d")
    ph, pw = pair(padding, "padding", "avgpool2d")
    if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0 or 2 * ph > kh or 2 * pw > kw:
        raise ValueError(f"avgpool2d: kernel_size and stride must be >= 1 and padding at most "
                         f"half the kernel, got kernel_size={kernel_size!r}, stride={stride!r}, "
                         f"padding={padding!r}")
    height, width = x_shape[2] + 2 * ph, x_shape[3] + 2 * pw
    if kh > height or kw > width:
        raise ValueError(f"avgpool2d: window {kh}x{kw} larger than the padded input "
                         f"{height}x{width}")
    return kh, kw, sh, sw, ph, pw, (height - kh) // sh + 1, (width - kw) // sw + 1


def avgpool2d_output_shape(x_shape, kernel_size, stride=None, padding=0):
    """Shape ``(N, C, OH, OW)`` of ``avgpool2d_fwd``'s output.

    >>> avgpool2d_output_shape((8, 3, 32, 32), 3, 2, 1)
    (8, 3, 16, 16)
    """
    *_, out_h, out_w = _geometry(x_shape, kernel_size, stride, padding)
    return (int(x_shape[0]), int(x_shape[1]), out_h, out_w)


def _flops(a, b, kernel_size, stride=None, padding=0):
    kh, kw = pair(kernel_size, "kernel_size", "avgpool2d")
    return float(max(math.prod(a), math.prod(b)) * kh * kw)


# --------------------------------------------------------------------------- ref (NumPy)

def avgpool2d_fwd_ref(x, y, kernel_size, stride=None, padding=0):
    """Each window's sum over the zero-padded input, divided by ``KH * KW``."""
    kh, kw, sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, kernel_size, stride, padding)
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    y[...] = windows[:, :, :out_h, :out_w].sum(axis=(-2, -1)) / x.dtype.type(kh * kw)


def avgpool2d_bwd_ref(dy, dx, kernel_size, stride=None, padding=0):
    """``dy / (KH * KW)`` added to every element of its window; padding dropped."""
    _bwd_xp(np, dy, dx, kernel_size, stride, padding)


# --------------------------------------------------------------------------- cuda (array module)

def _window_slices(kh, kw, sh, sw, out_h, out_w):
    """For each window offset: the slices of the padded input it covers over all windows."""
    for p in range(kh):
        for q in range(kw):
            yield (slice(None), slice(None), slice(p, p + sh * (out_h - 1) + 1, sh),
                   slice(q, q + sw * (out_w - 1) + 1, sw))


def avgpool2d_fwd_cuda(x, y, kernel_size, stride=None, padding=0):
    """``avgpool2d_fwd`` as a sum over the window offsets, in ``xp``."""
    xp = array_module(x, y)
    kh, kw, sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, kernel_size, stride, padding)
    padded = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    total = xp.zeros(y.shape, x.dtype)
    for window in _window_slices(kh, kw, sh, sw, out_h, out_w):
        total += padded[window]
    y[...] = total / x.dtype.type(kh * kw)


def _bwd_xp(xp, dy, dx, kernel_size, stride, padding):
    n, c, height, width = dx.shape
    kh, kw, sh, sw, ph, pw, out_h, out_w = _geometry(dx.shape, kernel_size, stride, padding)
    padded = xp.zeros((n, c, height + 2 * ph, width + 2 * pw), dx.dtype)
    share = dy / dy.dtype.type(kh * kw)
    for window in _window_slices(kh, kw, sh, sw, out_h, out_w):
        padded[window] += share
    dx[...] = padded[:, :, ph:ph + height, pw:pw + width]


def avgpool2d_bwd_cuda(dy, dx, kernel_size, stride=None, padding=0):
    """``avgpool2d_bwd`` as one strided add per window offset, in ``xp``."""
    _bwd_xp(array_module(dy, dx), dy, dx, kernel_size, stride, padding)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _span(i, stride, pad, k, size):
    """The input rows (or columns) ``[lo, hi)`` of window ``i`` that are not padding."""
    start = i * stride - pad
    return max(start, 0), min(start + k, size)


@jit
def _pool_cpu(x, y, kh, kw, sh, sw, ph, pw, backward):
    """Forward: ``y`` = each window's mean of ``x``. Backward (``x`` is ``dx``, ``y`` is
    ``dy``): ``x`` = zero, then each ``y / (KH * KW)`` added over its window."""
    n, c, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    area = y.dtype.type(kh * kw)
    if backward:
        x[...] = 0
    for b in range(n):
        for ch in range(c):
            for i in range(out_h):
                r0, r1 = _span(i, sh, ph, kh, height)
                for j in range(out_w):
                    s0, s1 = _span(j, sw, pw, kw, width)
                    if backward:
                        share = y[b, ch, i, j] / area
                        for r in range(r0, r1):
                            x[b, ch, r, s0:s1] += share
                    else:
                        acc = y.dtype.type(0)
                        for r in range(r0, r1):
                            for q in range(s0, s1):
                                acc += x[b, ch, r, q]
                        y[b, ch, i, j] = acc / area


def avgpool2d_fwd_cpu(x, y, kernel_size, stride=None, padding=0):
    """``avgpool2d_fwd`` by Numba loops."""
    kh, kw, sh, sw, ph, pw, _, _ = _geometry(x.shape, kernel_size, stride, padding)
    require_contiguous("avgpool2d_fwd", y=y)
    _pool_cpu(np.ascontiguousarray(x), y, kh, kw, sh, sw, ph, pw, False)


def avgpool2d_bwd_cpu(dy, dx, kernel_size, stride=None, padding=0):
    """``avgpool2d_bwd`` by Numba loops."""
    kh, kw, sh, sw, ph, pw, _, _ = _geometry(dx.shape, kernel_size, stride, padding)
    require_contiguous("avgpool2d_bwd", dx=dx)
    _pool_cpu(dx, np.ascontiguousarray(dy), kh, kw, sh, sw, ph, pw, True)


# --------------------------------------------------------------------------- codelets

avgpool2d_fwd = Codelet(
    "avgpool2d_fwd", modes=(R, W),
    variants={"ref": avgpool2d_fwd_ref, "cpu": avgpool2d_fwd_cpu, "cuda": avgpool2d_fwd_cuda},
    flops=_flops)
"""``y = avg_pool2d(x)``: operands ``(x R, y W)``."""

avgpool2d_bwd = Codelet(
    "avgpool2d_bwd", modes=(R, W),
    variants={"ref": avgpool2d_bwd_ref, "cpu": avgpool2d_bwd_cpu, "cuda": avgpool2d_bwd_cuda},
    flops=_flops)
"""``dx`` = each ``dy`` spread evenly over its window: operands ``(dy R, dx W)``."""
