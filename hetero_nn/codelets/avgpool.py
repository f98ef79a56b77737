"""Average-pooling codelets: 2-D windows with padding, and adaptive windows.

This module owns four codelets and every variant of them:

=========================  ===================================
codelet                    operands (access mode)
=========================  ===================================
avgpool2d_fwd              x[N,C,H,W] (R), y[N,C,OH,OW] (W)
avgpool2d_bwd              dy[N,C,OH,OW] (R), dx[N,C,H,W] (W)
adaptive_avgpool2d_fwd     x (R), y (W)
adaptive_avgpool2d_bwd     dy (R), dx (W)
=========================  ===================================

``avgpool2d_*`` take ``torch.nn.functional.avg_pool2d``'s parameters:
``kernel_size``, ``stride=None`` (the kernel size), ``padding=0`` (at most half
the kernel), ``ceil_mode=False``, ``count_include_pad=True`` and
``divisor_override=None``; the output size and the ceil-mode rule are max
pooling's (``pool.pooled_size``). PyTorch's kernel fixes each window's divisor:
the window is first clipped to the padded input (``[i*SH - PH, min(i*SH - PH +
KH, H + PH))``, so ceil mode's last window may be shorter), its size is the
divisor with ``count_include_pad``, its size clipped to the input without, and
``divisor_override`` replaces both. The backward pass adds ``dy / divisor`` to
every input element of the window.

``adaptive_avgpool2d_*`` take no parameters: the output's shape says the
windows. Output row ``i`` of ``OH`` averages input rows ``[floor(i*H/OH),
ceil((i+1)*H/OH))`` (PyTorch's start/end index rule; windows may overlap when
``H`` is not a multiple of ``OH`` and repeat when ``OH > H``), columns likewise;
the sum is divided by the window's size ``KH*KW`` and the backward pass spreads
``dy / (KH*KW)`` over the window, as ``avgpool2d`` does (so global average pooling,
``GlobalAvgPool2D``, keeps the bits it had as an ``avgpool2d`` window over the plane;
PyTorch divides by ``KH`` then ``KW``: equal to rounding).

Variants: ``ref`` (NumPy sliding windows; the adaptive windows one slice each),
``cpu`` (Numba loops) and ``cuda`` (one strided slice per window offset, or per
adaptive window, written against the array module: CuPy on a GPU, NumPy in CI;
no scatter, so no atomics). The adaptive ``ref`` and ``cuda`` share one
function written against ``xp``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._checks import pair, require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, W, Codelet
from .pool import _padded, pool2d_geometry
from .xp import array_module

__all__ = ["avgpool2d_fwd", "avgpool2d_bwd", "avgpool2d_output_shape",
           "adaptive_avgpool2d_fwd", "adaptive_avgpool2d_bwd", "adaptive_windows"]


def _geometry(x_shape, kernel_size, stride=None, padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    """``(geometry, count_include_pad, divisor_override)``, checked."""
    if divisor_override is not None and (isinstance(divisor_override, bool)
                                         or not isinstance(divisor_override, (int, np.integer))
                                         or divisor_override == 0):
        raise ValueError(f"avgpool2d: divisor_override must be a non-zero integer or None, "
                         f"got {divisor_override!r}")
    geo = pool2d_geometry(x_shape, kernel_size, stride, padding, 1, ceil_mode, owner="avgpool2d")
    return geo, bool(count_include_pad), (0 if divisor_override is None else int(divisor_override))


def avgpool2d_output_shape(x_shape, kernel_size, stride=None, padding=0, ceil_mode=False, **_):
    """Shape ``(N, C, OH, OW)`` of ``avgpool2d_fwd``'s output.

    >>> avgpool2d_output_shape((8, 3, 32, 32), 3, 2, 1)
    (8, 3, 16, 16)
    """
    geo = pool2d_geometry(x_shape, kernel_size, stride, padding, 1, ceil_mode, owner="avgpool2d")
    return (int(x_shape[0]), int(x_shape[1]), geo.out_h, geo.out_w)


def _flops(a, b, kernel_size, **params):
    kh, kw = pair(kernel_size, "kernel_size", "avgpool2d")
    return float(max(math.prod(a), math.prod(b)) * kh * kw)


def _divisors(geo, height, width, include_pad, override):
    """Each window's divisor, ``[OH, OW]`` (see the module docstring)."""
    def along(out, k, s, p, size):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        return end - start, np.minimum(end, size) - np.maximum(start, 0)
    full_h, clipped_h = along(geo.out_h, geo.kh, geo.sh, geo.ph, height)
    full_w, clipped_w = along(geo.out_w, geo.kw, geo.sw, geo.pw, width)
    if override:
        return np.full((geo.out_h, geo.out_w), override)
    if include_pad:
        return full_h.reshape(-1, 1) * full_w
    return clipped_h.reshape(-1, 1) * clipped_w


# --------------------------------------------------------------------------- ref (NumPy)

def avgpool2d_fwd_ref(x, y, kernel_size, **params):
    """Each window's sum over the zero-padded input, divided by the window's divisor."""
    geo, include_pad, override = _geometry(x.shape, kernel_size, **params)
    windows = sliding_window_view(_padded(np, x, geo, 0), (geo.kh, geo.kw), axis=(2, 3))
    total = windows[:, :, ::geo.sh, ::geo.sw][:, :, :geo.out_h, :geo.out_w].sum(axis=(-2, -1))
    y[...] = total / _divisors(geo, *x.shape[2:], include_pad, override).astype(x.dtype)


def avgpool2d_bwd_ref(dy, dx, kernel_size, **params):
    """``dy / divisor`` added to every element of its window; padding dropped."""
    _bwd_xp(np, dy, dx, kernel_size, params)


# --------------------------------------------------------------------------- cuda (array module)

def _window_slices(geo):
    """For each window offset: the slices of the padded input it covers over all windows."""
    for p in range(geo.kh):
        for q in range(geo.kw):
            yield (slice(None), slice(None), slice(p, p + geo.sh * (geo.out_h - 1) + 1, geo.sh),
                   slice(q, q + geo.sw * (geo.out_w - 1) + 1, geo.sw))


def avgpool2d_fwd_cuda(x, y, kernel_size, **params):
    """``avgpool2d_fwd`` as a sum over the window offsets, in ``xp``."""
    xp = array_module(x, y)
    geo, include_pad, override = _geometry(x.shape, kernel_size, **params)
    padded = _padded(xp, x, geo, 0)
    total = xp.zeros(y.shape, x.dtype)
    for window in _window_slices(geo):
        total += padded[window]
    y[...] = total / xp.asarray(_divisors(geo, *x.shape[2:], include_pad, override), x.dtype)


def _bwd_xp(xp, dy, dx, kernel_size, params):
    geo, include_pad, override = _geometry(dx.shape, kernel_size, **params)
    height, width = dx.shape[2], dx.shape[3]
    padded = _padded(xp, xp.zeros_like(dx), geo, 0)
    share = dy / xp.asarray(_divisors(geo, height, width, include_pad, override), dy.dtype)
    for window in _window_slices(geo):
        padded[window] += share
    dx[...] = padded[:, :, geo.ph:geo.ph + height, geo.pw:geo.pw + width]


def avgpool2d_bwd_cuda(dy, dx, kernel_size, **params):
    """``avgpool2d_bwd`` as one strided add per window offset, in ``xp``."""
    _bwd_xp(array_module(dy, dx), dy, dx, kernel_size, params)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _span(i, stride, pad, k, size):
    """Window ``i``'s extent in the padded input, then clipped to the input:
    ``(full size, lo, hi)`` (PyTorch's ``avg_pool2d`` kernel)."""
    start = i * stride - pad
    end = min(start + k, size + pad)
    return end - start, max(start, 0), min(end, size)


@jit_inline
def _average(x, y, b, ch, i, j, r0, r1, s0, s1, divisor, backward):
    """One window ``[r0, r1) x [s0, s1)`` of plane ``(b, ch)``: forward, ``y[b, ch, i, j]`` =
    its sum (row-major) over ``divisor``; backward (``x`` is ``dx``), ``y[b, ch, i, j] /
    divisor`` added over the window."""
    divisor = y.dtype.type(divisor)
    if backward:
        share = y[b, ch, i, j] / divisor
        for r in range(r0, r1):
            for q in range(s0, s1):
                x[b, ch, r, q] += share
    else:
        acc = y.dtype.type(0)
        for r in range(r0, r1):
            for q in range(s0, s1):
                acc += x[b, ch, r, q]
        y[b, ch, i, j] = acc / divisor


@jit
def _pool_cpu(x, y, geo, include_pad, override, backward):
    """Forward: ``y`` = each window's sum of ``x`` over its divisor. Backward (``x`` is
    ``dx``, ``y`` is ``dy``): ``x`` = zero, then each ``y / divisor`` added over its window."""
    n, c, height, width = x.shape
    if backward:
        x[...] = 0
    for b in range(n):
        for ch in range(c):
            for i in range(geo.out_h):
                full_h, r0, r1 = _span(i, geo.sh, geo.ph, geo.kh, height)
                for j in range(geo.out_w):
                    full_w, s0, s1 = _span(j, geo.sw, geo.pw, geo.kw, width)
                    if override != 0:
                        divisor = override
                    elif include_pad:
                        divisor = full_h * full_w
                    else:
                        divisor = (r1 - r0) * (s1 - s0)
                    _average(x, y, b, ch, i, j, r0, r1, s0, s1, divisor, backward)


def avgpool2d_fwd_cpu(x, y, kernel_size, **params):
    """``avgpool2d_fwd`` by Numba loops."""
    geo, include_pad, override = _geometry(x.shape, kernel_size, **params)
    require_contiguous("avgpool2d_fwd", y=y)
    _pool_cpu(np.ascontiguousarray(x), y, geo, include_pad, override, False)


def avgpool2d_bwd_cpu(dy, dx, kernel_size, **params):
    """``avgpool2d_bwd`` by Numba loops."""
    geo, include_pad, override = _geometry(dx.shape, kernel_size, **params)
    require_contiguous("avgpool2d_bwd", dx=dx)
    _pool_cpu(dx, np.ascontiguousarray(dy), geo, include_pad, override, True)


# --------------------------------------------------------------------------- adaptive

def adaptive_windows(size, out):
    """``(starts, ends)`` of the ``out`` adaptive windows over ``size`` (PyTorch's rule).

    >>> adaptive_windows(5, 3)
    ([0, 1, 3], [2, 4, 5])
    """
    return [i * size // out for i in range(out)], [-(-(i + 1) * size // out) for i in range(out)]


def _adaptive_check(name, big, small):
    if big.shape[:2] != small.shape[:2] or min(small.shape[2:]) < 1:
        raise ValueError(f"{name}: input {tuple(big.shape)} and output {tuple(small.shape)} "
                         "must share N and C, with an output plane of at least 1x1")


def _adaptive_xp(xp, x, y, backward):
    """The adaptive windows one slice each, in ``xp``: forward ``y`` from ``x``; backward
    (``x`` is ``dx``, ``y`` is ``dy``) ``x`` = zero plus each ``y / (KH*KW)`` over its window."""
    _adaptive_check("adaptive_avgpool2d_" + ("bwd" if backward else "fwd"), x, y)
    rows = zip(*adaptive_windows(x.shape[2], y.shape[2]))
    cols = list(zip(*adaptive_windows(x.shape[3], y.shape[3])))
    if backward:
        x[...] = 0
    for i, (r0, r1) in enumerate(rows):
        for j, (s0, s1) in enumerate(cols):
            size = x.dtype.type((r1 - r0) * (s1 - s0))
            if backward:
                x[:, :, r0:r1, s0:s1] += (y[:, :, i, j] / size)[:, :, None, None]
            else:
                y[:, :, i, j] = x[:, :, r0:r1, s0:s1].sum(axis=(2, 3)) / size


def adaptive_avgpool2d_fwd_ref(x, y):
    """``y[n, c, i, j]`` = the mean of ``x[n, c]`` over the adaptive window ``(i, j)``."""
    _adaptive_xp(np, x, y, False)


def adaptive_avgpool2d_bwd_ref(dy, dx):
    """``dx`` = each ``dy[n, c, i, j] / (KH*KW)`` spread over its window; windows add."""
    _adaptive_xp(np, dx, dy, True)


def adaptive_avgpool2d_fwd_cuda(x, y):
    """``adaptive_avgpool2d_fwd`` in ``xp``, one slice per window."""
    _adaptive_xp(array_module(x, y), x, y, False)


def adaptive_avgpool2d_bwd_cuda(dy, dx):
    """``adaptive_avgpool2d_bwd`` in ``xp``, one strided add per window."""
    _adaptive_xp(array_module(dy, dx), dx, dy, True)


@jit
def _adaptive_cpu(x, y, backward):
    """``_adaptive_xp`` by Numba loops, a plane at a time (``x`` is ``dx`` backward)."""
    n, c, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    if backward:
        x[...] = 0
    for b in range(n):
        for ch in range(c):
            for i in range(out_h):
                r0, r1 = i * height // out_h, ((i + 1) * height + out_h - 1) // out_h
                for j in range(out_w):
                    s0, s1 = j * width // out_w, ((j + 1) * width + out_w - 1) // out_w
                    _average(x, y, b, ch, i, j, r0, r1, s0, s1, (r1 - r0) * (s1 - s0),
                             backward)


def adaptive_avgpool2d_fwd_cpu(x, y):
    """``adaptive_avgpool2d_fwd`` by Numba loops."""
    _adaptive_check("adaptive_avgpool2d_fwd", x, y)
    require_contiguous("adaptive_avgpool2d_fwd", y=y)
    _adaptive_cpu(np.ascontiguousarray(x), y, False)


def adaptive_avgpool2d_bwd_cpu(dy, dx):
    """``adaptive_avgpool2d_bwd`` by Numba loops."""
    _adaptive_check("adaptive_avgpool2d_bwd", dx, dy)
    require_contiguous("adaptive_avgpool2d_bwd", dx=dx)
    _adaptive_cpu(dx, np.ascontiguousarray(dy), True)


def _adaptive_flops(a, b):
    return float(max(math.prod(a), math.prod(b)))


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

adaptive_avgpool2d_fwd = Codelet(
    "adaptive_avgpool2d_fwd", modes=(R, W),
    variants={"ref": adaptive_avgpool2d_fwd_ref, "cpu": adaptive_avgpool2d_fwd_cpu,
              "cuda": adaptive_avgpool2d_fwd_cuda},
    flops=_adaptive_flops)
"""``y = adaptive_avg_pool2d(x, y.shape[2:])``: operands ``(x R, y W)``."""

adaptive_avgpool2d_bwd = Codelet(
    "adaptive_avgpool2d_bwd", modes=(R, W),
    variants={"ref": adaptive_avgpool2d_bwd_ref, "cpu": adaptive_avgpool2d_bwd_cpu,
              "cuda": adaptive_avgpool2d_bwd_cuda},
    flops=_adaptive_flops)
"""``dx`` = each ``dy`` spread over its adaptive window: operands ``(dy R, dx W)``."""
