"""Max-pooling codelets: 2-D forward pass with argmax, and the gradient routed back.

This module owns two codelets, every variant of them, and the pooling geometry
the average-pooling codelets share:

==============  =============================================
codelet         operands (access mode)
==============  =============================================
maxpool2d_fwd   x[N,C,H,W] (R), y[N,C,OH,OW] (W), argmax (W)
maxpool2d_bwd   dy[N,C,OH,OW] (R), argmax (R), dx[N,C,H,W] (W)
==============  =============================================

Parameters are ``torch.nn.functional.max_pool2d``'s: ``kernel_size``,
``stride=None`` (the kernel size), ``padding=0`` (at most half the kernel),
``dilation=1`` and ``ceil_mode=False``, each size an int or an ``(h, w)`` pair.
The backward parameters are optional (``argmax`` says where each gradient goes);
given the forward's, the ``cuda`` variant routes without a scatter.

Output size (PyTorch's ``pooling_output_shape``): ``OH = floor_or_ceil((H + 2*PH -
DH*(KH-1) - 1) / SH) + 1``; in ceil mode the last window must start inside the
input or the left padding, else it is dropped. Windows are clipped to the
input: padding never wins. A geometry where some window holds no input element
(possible with dilation; PyTorch then returns ``-inf`` and an index outside the
plane) is refused. ``argmax`` is int64, the flat index into the ``H*W`` input
plane, exactly what ``max_pool2d(..., return_indices=True)`` returns.

Which element wins a window matters for the gradient, so every variant follows
PyTorch's CPU kernel to the letter: the window's valid elements are scanned in
row-major order starting from ``-inf``, with the first of them as the initial
index, and an element replaces the running maximum when it is strictly greater
*or is NaN*. Hence among equal maxima the first wins (ReLU outputs make ties of
zeros common), a NaN always wins and the last NaN of a window is the one
recorded, and a window of ``-inf`` records its first element.

Variants: ``ref`` (NumPy sliding windows + ``argmax``), ``cpu`` (Numba loops, prepared)
and ``cuda`` (a loop over the window offsets of whole-array strided slices,
written against the array module: CuPy on a GPU, NumPy in CI; with the window
parameters the backward pass needs no scatter-add, so no atomics, the same sums
on every run, and no raw kernel; without them, an ordered scatter in rounds).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import uintp
from numpy.lib.stride_tricks import sliding_window_view

from ._checks import pair, require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, W, Codelet
from .gather import device_table
from .prepared import from_calls
from .xp import array_module

__all__ = ["maxpool2d_fwd", "maxpool2d_bwd", "maxpool2d_output_shape", "Pool2dGeometry",
           "pool2d_geometry", "pooled_size"]


# --------------------------------------------------------------------------- geometry

class Pool2dGeometry(NamedTuple):
    """Kernel, stride, padding and dilation per axis, and the output plane."""

    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    out_h: int
    out_w: int


def pooled_size(size, kernel, stride, pad, dilation, ceil_mode):
    """PyTorch's ``pooling_output_shape``: outputs along one axis.

    >>> pooled_size(6, 3, 2, 0, 1, False), pooled_size(6, 3, 2, 0, 1, True)
    (2, 3)
    """
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window would start in the right padding
    return out


def pool2d_geometry(x_shape, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                    owner="maxpool2d"):
    """The :class:`Pool2dGeometry` of pooling an ``x_shape`` input, after checking it.

    >>> pool2d_geometry((1, 1, 6, 6), 3, 2, ceil_mode=True).out_h
    3
    """
    def key(v):
        return tuple(v) if isinstance(v, list) else v
    return _geometry(tuple(x_shape), key(kernel_size), key(stride), key(padding), key(dilation),
                     bool(ceil_mode), owner)


@functools.lru_cache(maxsize=1024)
def _geometry(x_shape, kernel_size, stride, padding, dilation, ceil_mode, owner):
    kh, kw = pair(kernel_size, "kernel_size", owner)
    sh, sw = pair(kernel_size if stride is None else stride, "stride", owner)
    ph, pw = pair(padding, "padding", owner)
    dh, dw = pair(dilation, "dilation", owner)
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"{owner}: kernel_size, stride and dilation must be >= 1 and padding "
                         f">= 0, got kernel_size={kernel_size!r}, stride={stride!r}, "
                         f"padding={padding!r}, dilation={dilation!r}")
    if 2 * ph > kh or 2 * pw > kw:
        raise ValueError(f"{owner}: padding {(ph, pw)} must be at most half the kernel size "
                         f"{(kh, kw)}")
    height, width = x_shape[2], x_shape[3]
    out_h = pooled_size(height, kh, sh, ph, dh, ceil_mode)
    out_w = pooled_size(width, kw, sw, pw, dw, ceil_mode)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{owner}: window {kh}x{kw} (dilation {dh},{dw}) is larger than the "
                         f"input {height}x{width} padded by {(ph, pw)}: no output")
    for size, k, s, p, d, out in ((height, kh, sh, ph, dh, out_h), (width, kw, sw, pw, dw, out_w)):
        for i in range(out):
            if not any(0 <= i * s - p + t * d < size for t in range(k)):
                raise ValueError(f"{owner}: window {i} of kernel {k}, stride {s}, padding {p}, "
                                 f"dilation {d} holds no element of an input of size {size}")
    return Pool2dGeometry(kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w)


def maxpool2d_output_shape(x_shape, kernel_size, stride=None, padding=0, dilation=1,
                           ceil_mode=False):
    """Shape ``(N, C, OH, OW)`` of ``maxpool2d_fwd``'s outputs.

    >>> maxpool2d_output_shape((64, 6, 28, 28), 2)
    (64, 6, 14, 14)
    """
    g = pool2d_geometry(x_shape, kernel_size, stride, padding, dilation, ceil_mode)
    return (int(x_shape[0]), int(x_shape[1]), g.out_h, g.out_w)


def _fwd_flops(x, y, argmax, kernel_size, **params):
    kh, kw = pair(kernel_size, "kernel_size", "maxpool2d")
    return float(math.prod(y) * kh * kw)


def _bwd_flops(dy, argmax, dx, **params):
    return float(math.prod(dx) + math.prod(dy))


def _first_valid(out, k, s, p, d, size):
    """Per output along one axis: the index of the window's first tap inside the input."""
    return np.array([next(t for t in range(k) if 0 <= i * s - p + t * d < size)
                     for i in range(out)])


def _padded(xp, x, geo, value):
    """``x`` padded with ``value`` to hold every tap of every window (ceil mode's last
    windows may reach past the right padding)."""
    height, width = x.shape[2], x.shape[3]
    bottom = max(geo.ph, (geo.out_h - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1 - height - geo.ph)
    right = max(geo.pw, (geo.out_w - 1) * geo.sw + (geo.kw - 1) * geo.dw + 1 - width - geo.pw)
    return xp.pad(x, ((0, 0), (0, 0), (geo.ph, bottom), (geo.pw, right)), constant_values=value)


# --------------------------------------------------------------------------- ref (NumPy)

def maxpool2d_fwd_ref(x, y, argmax, kernel_size, **params):
    """Maximum of each window and its flat input index (PyTorch's tie and NaN rules)."""
    geo = pool2d_geometry(x.shape, kernel_size, **params)
    kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w = geo
    height, width = x.shape[2], x.shape[3]
    extent = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    windows = sliding_window_view(_padded(np, x, geo, -np.inf), extent, axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :out_h, :out_w]
    windows = windows.reshape(*y.shape, kh * kw)
    pos = np.argmax(windows, axis=-1)  # first maximum in row-major scan order
    is_nan = np.isnan(windows)
    any_nan = is_nan.any(axis=-1)
    last_nan = kh * kw - 1 - np.argmax(is_nan[..., ::-1], axis=-1)
    first = (_first_valid(out_h, kh, sh, ph, dh, height).reshape(-1, 1) * kw
             + _first_valid(out_w, kw, sw, pw, dw, width))
    best = np.take_along_axis(windows, pos[..., None], axis=-1)[..., 0]
    pos = np.where(any_nan, last_nan, np.where(best == -np.inf, first, pos))
    y[...] = np.take_along_axis(windows, pos[..., None], axis=-1)[..., 0]
    di, dj = np.divmod(pos, kw)
    rows = np.arange(out_h).reshape(-1, 1) * sh - ph + di * dh
    cols = np.arange(out_w) * sw - pw + dj * dw
    argmax[...] = rows * width + cols


def maxpool2d_bwd_ref(dy, argmax, dx, kernel_size=None, **params):
    """``dx`` is ``dy`` routed to each window's argmax; overlapping windows add.

    The window geometry is not needed (``argmax`` says where each gradient
    goes); the parameters are accepted so that the backward task can be
    submitted with the forward task's.
    """
    dx[...] = _scatter_add(np, dy, argmax, dx.shape)


def _scatter_add(xp, dy, argmax, shape):
    """A zero array of ``shape`` with every ``dy`` added at its plane's ``argmax``, in the
    order of ``dy``'s elements (NumPy's ``add.at``: sequential)."""
    n_batch, n_chan, height, width = shape
    planes = np.zeros((n_batch * n_chan, height * width), dtype=dy.dtype)
    which = np.arange(n_batch * n_chan).reshape(-1, 1)
    np.add.at(planes, (which, argmax.reshape(n_batch * n_chan, -1)),
              dy.reshape(n_batch * n_chan, -1))
    return planes.reshape(shape)


def _ordered_scatter_add(xp, dy, argmax, shape):
    """:func:`_scatter_add` on a device without atomics, the same sums in the same order.

    The contributions are stably sorted by target (keeping ``dy``'s order within one
    target), then added in rounds: round ``r`` adds each target's ``r``-th contribution,
    whose targets are distinct, so a plain indexed add is exact and ordered. The
    number of rounds (the largest count of windows sharing an argmax) is read on the
    host: one sync, on this path only (a backward task submitted without the forward's
    window parameters; the layers always give them).
    """
    n_batch, n_chan, height, width = shape
    plane = xp.arange(n_batch * n_chan, dtype=xp.int64).reshape(-1, 1) * (height * width)
    target = (plane + argmax.reshape(n_batch * n_chan, -1)).reshape(-1)
    order = xp.argsort(target, kind="stable")
    target, values = target[order], dy.reshape(-1)[order]
    rank = xp.arange(target.size, dtype=xp.int64) - xp.searchsorted(target, target, side="left")
    out = xp.zeros(n_batch * n_chan * height * width, dtype=dy.dtype)
    rounds = int(rank.max().get() if hasattr(rank, "get") else rank.max()) + 1 if target.size else 0
    for r in range(rounds):
        pick = rank == r
        out[target[pick]] += values[pick]
    return out.reshape(shape)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _take(v, best, where, at):
    """PyTorch's scan step: ``v`` (at ``at``) replaces the maximum if greater or NaN."""
    take = (v > best) | (v != v)
    return (v if take else best), (at if take else where)


@jit_inline
def _take_number(v, best, where, at):
    """``_take`` where neither value is NaN: ``v`` replaces the maximum if greater (a
    select LLVM keeps branch-free; the NaN test made the 3x3 kernel 4x slower)."""
    take = v > best
    return (v if take else best), (at if take else where)


@jit_inline
def _has_nan_or_inf(xf, x0, area):
    """Whether the plane at ``x0`` holds a NaN or an infinity (``v - v`` is NaN just there;
    an and of comparisons, which LLVM vectorises where a sum would be one chain)."""
    finite = True
    for k in range(uintp(area)):
        v = xf[x0 + k]
        finite &= (v - v) == 0
    return not finite


@jit
def _maxpool2x2_fwd_cpu(x, y, argmax):
    """The 2x2, stride 2 window (most CNNs') unrolled: the four taps in PyTorch's order
    with no inner loops, which LLVM vectorises over the output row (4x the general
    scan's bandwidth on planes past the caches, 1.4-1.9x in cache:
    ``benchmarks/bench_bandwidth.py``, docs/benchmarks.md); a plane free of NaN and
    infinities by ``_take_number``."""
    n_batch, n_chan, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    xf, yf, af = x.reshape(-1), y.reshape(-1), argmax.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * height * width)
        y0 = uintp(plane * out_h * out_w)
        if _has_nan_or_inf(xf, x0, height * width):
            _plane2x2(xf, yf, af, x0, y0, width, out_h, out_w)
        else:  # no NaN: _take_number's select (4-5x: docs/benchmarks.md, branch tvinf)
            _plane2x2_numbers(xf, yf, af, x0, y0, width, out_h, out_w)


@jit_inline
def _plane2x2(xf, yf, af, x0, y0, width, out_h, out_w):
    """One plane's 2x2 windows by ``_take``."""
    for i in range(out_h):
        top = 2 * i * width
        row = y0 + uintp(i * out_w)
        for j in range(out_w):
            c = top + 2 * j
            best, where = xf[x0 + uintp(c)], c
            best, where = _take(xf[x0 + uintp(c + 1)], best, where, c + 1)
            best, where = _take(xf[x0 + uintp(c + width)], best, where, c + width)
            best, where = _take(xf[x0 + uintp(c + width + 1)], best, where, c + width + 1)
            yf[row + uintp(j)] = best
            af[row + uintp(j)] = where


@jit_inline
def _plane2x2_numbers(xf, yf, af, x0, y0, width, out_h, out_w):
    """``_plane2x2`` on a plane free of NaN, by ``_take_number``."""
    for i in range(out_h):
        row, c = y0 + uintp(i * out_w), 2 * i * width
        for j in range(out_w):
            best, where = _take_number(xf[x0 + uintp(c + 1)], xf[x0 + uintp(c)], c, c + 1)
            best, where = _take_number(xf[x0 + uintp(c + width)], best, where, c + width)
            yf[row + uintp(j)], af[row + uintp(j)] = _take_number(
                xf[x0 + uintp(c + width + 1)], best, where, c + width + 1)
            c += 2


@jit_inline
def _window(i, stride, pad, dilation, k, size):
    """Taps ``[lo, hi)`` (step ``dilation``) of window ``i`` that lie inside the input."""
    lo = i * stride - pad
    hi = min(lo + (k - 1) * dilation + 1, size)
    while lo < 0:
        lo += dilation
    return lo, hi


@jit_inline
def _scan(xf, x0, r0, r1, c0, c1, dh, dw, width):
    """``(maximum, flat index)`` of the taps ``[r0, r1) x [c0, c1)`` (steps ``dh``, ``dw``) of
    the plane at ``x0``: PyTorch's scan from the first tap."""
    where = r0 * width + c0
    best = xf[x0 + uintp(where)]
    for r in range(r0, r1, dh):
        for c in range(c0, c1, dw):
            at = r * width + c
            best, where = _take(xf[x0 + uintp(at)], best, where, at)
    return best, where


@jit
def _maxpool3x3_fwd_cpu(x, y, argmax, geo):
    """3x3 windows, dilation 1 (torchvision ResNet's stem pool: stride 2, padding 1).

    A plane that holds a NaN (or an infinity) runs ``_scan`` on every window. On the
    others ``_take`` is ``_take_number``, and as the scan is a fold, folding a window's
    rows in turn equals taking each row's own result (its first maximum) in turn: a
    first pass takes each input row's taps under each window (once for the windows that
    share the row: two, at stride 2), a second takes each window's row results (one to
    three rows, one to three taps: the border clips them). The same values and argmax
    as the scan (docs/benchmarks.md, branch ``tvinf``: 2x on ResNet-18's 16x16 planes)."""
    n_batch, n_chan, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    sh, sw, ph, pw = geo.sh, geo.sw, geo.ph, geo.pw
    j0 = min(out_w, (pw + sw - 1) // sw)  # the first window whose left tap is inside
    j1 = j0  # past the last window whose right tap is inside
    while j1 < out_w and j1 * sw - pw + 3 <= width:
        j1 += 1
    row_best = np.empty((height, out_w), dtype=x.dtype)
    row_where = np.empty((height, out_w), dtype=np.int64)
    xf, yf, af = x.reshape(-1), y.reshape(-1), argmax.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * height * width)
        y0 = uintp(plane * out_h * out_w)
        if _has_nan_or_inf(xf, x0, height * width):
            for i in range(out_h):
                r0, r1 = _window(i, sh, ph, 1, 3, height)
                for j in range(out_w):
                    c0, c1 = _window(j, sw, pw, 1, 3, width)
                    k = y0 + uintp(i * out_w + j)
                    yf[k], af[k] = _scan(xf, x0, r0, r1, c0, c1, 1, 1, width)
            continue
        for r in range(height):  # each row's taps under each window, once per row
            rb, rw = row_best[r], row_where[r]
            for j in range(out_w):
                if j0 <= j < j1:
                    at = r * width + j * sw - pw
                    best, where = _take_number(xf[x0 + uintp(at + 1)], xf[x0 + uintp(at)], at,
                                               at + 1)
                    rb[j], rw[j] = _take_number(xf[x0 + uintp(at + 2)], best, where, at + 2)
                else:  # clipped by the border
                    c0, c1 = _window(j, sw, pw, 1, 3, width)
                    at = r * width + c0
                    best, where = xf[x0 + uintp(at)], at
                    for c in range(at + 1, r * width + c1):
                        best, where = _take_number(xf[x0 + uintp(c)], best, where, c)
                    rb[j], rw[j] = best, where
        for i in range(out_h):
            row = y0 + uintp(i * out_w)
            r0, r1 = _window(i, sh, ph, 1, 3, height)
            if r1 == r0 + 3:
                b0, b1, b2 = row_best[r0], row_best[r0 + 1], row_best[r0 + 2]
                w0, w1, w2 = row_where[r0], row_where[r0 + 1], row_where[r0 + 2]
                for j in range(out_w):
                    best, where = _take_number(b1[j], b0[j], w0[j], w1[j])
                    yf[row + uintp(j)], af[row + uintp(j)] = _take_number(b2[j], best, where,
                                                                          w2[j])
            else:  # clipped by the border
                for j in range(out_w):
                    best, where = row_best[r0, j], row_where[r0, j]
                    for r in range(r0 + 1, r1):
                        best, where = _take_number(row_best[r, j], best, where, row_where[r, j])
                    yf[row + uintp(j)], af[row + uintp(j)] = best, where


@jit
def maxpool2d_fwd_cpu_kernel(x, y, argmax, geo):
    """PyTorch's scan: replace the running maximum when strictly greater or NaN.

    Branch-free selects (ReLU outputs make the comparison unpredictable);
    flat views with unsigned offsets (no wraparound checks). Starting from a
    window's first valid element is the same as starting from -inf with it as
    the initial index, and keeps the running maximum in the input dtype.
    """
    n_batch, n_chan, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    if (geo.kh == 2 and geo.kw == 2 and geo.sh == 2 and geo.sw == 2 and geo.ph == 0
            and geo.pw == 0 and geo.dh == 1 and geo.dw == 1 and 2 * out_h <= height
            and 2 * out_w <= width):
        _maxpool2x2_fwd_cpu(x, y, argmax)
        return
    if geo.kh == 3 and geo.kw == 3 and geo.dh == 1 and geo.dw == 1:
        _maxpool3x3_fwd_cpu(x, y, argmax, geo)
        return
    xf, yf, af = x.reshape(-1), y.reshape(-1), argmax.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * height * width)
        y0 = uintp(plane * out_h * out_w)
        for i in range(out_h):
            r0, r1 = _window(i, geo.sh, geo.ph, geo.dh, geo.kh, height)
            for j in range(out_w):
                c0, c1 = _window(j, geo.sw, geo.pw, geo.dw, geo.kw, width)
                best, where = _scan(xf, x0, r0, r1, c0, c1, geo.dh, geo.dw, width)
                k = y0 + uintp(i * out_w + j)
                yf[k] = best
                af[k] = where


@jit
def maxpool2d_bwd_cpu_kernel(dy, argmax, dx):
    """Zero ``dx``, then add each ``dy`` at its window's argmax (checked to lie in the plane),
    a plane at a time, so the additions find the zeroed plane in cache."""
    n_batch, n_chan, height, width = dx.shape
    out_h, out_w = dy.shape[2], dy.shape[3]
    area, out_area = height * width, out_h * out_w
    gf, af, dxf = dy.reshape(-1), argmax.reshape(-1), dx.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * area)
        g0 = uintp(plane * out_area)
        for k in range(uintp(area)):
            dxf[x0 + k] = 0.0
        for k in range(uintp(out_area)):
            where = af[g0 + k]
            if where < 0 or where >= area:
                raise IndexError("maxpool2d_bwd: argmax index outside the input plane")
            dxf[x0 + uintp(where)] += gf[g0 + k]


@from_calls
def maxpool2d_fwd_cpu(view, x, y, argmax, kernel_size, **params):
    """``maxpool2d_fwd`` by Numba loops."""
    geo = pool2d_geometry(x.shape, kernel_size, **params)
    require_contiguous("maxpool2d_fwd", y=y, argmax=argmax)
    return [(maxpool2d_fwd_cpu_kernel, (view(x), y, argmax, geo))]


@from_calls
def maxpool2d_bwd_cpu(view, dy, argmax, dx, kernel_size=None, **params):
    """``maxpool2d_bwd`` by Numba loops."""
    require_contiguous("maxpool2d_bwd", dx=dx)
    return [(maxpool2d_bwd_cpu_kernel, (view(dy), view(argmax), dx))]


# --------------------------------------------------------------------------- cuda (array module)

def _offset_slices(geo):
    """For each window offset ``(p, q)``: the slices of the padded input (see ``_padded``)
    it reads over all windows, and the offset's flat index relative to ``corner``."""
    for p in range(geo.kh):
        for q in range(geo.kw):
            top, left = p * geo.dh, q * geo.dw
            yield (top, left), (slice(None), slice(None),
                                slice(top, top + geo.sh * (geo.out_h - 1) + 1, geo.sh),
                                slice(left, left + geo.sw * (geo.out_w - 1) + 1, geo.sw))


def _corner(xp, geo, width):
    """Flat input index of each window's ``(0, 0)`` tap (it may lie in the padding)."""
    return ((xp.arange(geo.out_h).reshape(-1, 1) * geo.sh - geo.ph) * width
            + xp.arange(geo.out_w) * geo.sw - geo.pw).astype(xp.int64)


def maxpool2d_fwd_cuda(x, y, argmax, kernel_size, **params):
    """``maxpool2d_fwd`` as a running max over the window offsets of the input padded with
    ``-inf`` (never taken), from each window's first valid element, in ``xp``."""
    xp = array_module(x, y, argmax)
    geo = pool2d_geometry(x.shape, kernel_size, **params)
    height, width = x.shape[2], x.shape[3]
    corner = _corner(xp, geo, width)
    first = device_table(xp, ("maxpool_first", geo, height, width), lambda: (
        _first_valid(geo.out_h, geo.kh, geo.sh, geo.ph, geo.dh, height).reshape(-1, 1)
        * geo.dh * width + _first_valid(geo.out_w, geo.kw, geo.sw, geo.pw, geo.dw, width)
        * geo.dw))  # built and copied to the device once per geometry
    padded = _padded(xp, x, geo, -np.inf)
    best = xp.full(y.shape, -np.inf, dtype=x.dtype)
    where = xp.broadcast_to(corner + first, y.shape).copy()
    for (top, left), window in _offset_slices(geo):
        v = padded[window]
        take = (v > best) | xp.isnan(v)
        best = xp.where(take, v, best)
        where = xp.where(take, corner + (top * width + left), where)
    y[...] = best
    argmax[...] = where


def maxpool2d_bwd_cuda(dy, argmax, dx, kernel_size=None, **params):
    """``maxpool2d_bwd`` as one masked add per window offset, in ``xp``.

    With the window geometry this needs no scatter (so no atomics), and the offsets are
    taken last to first, so each input element receives its windows' gradients in
    row-major window order, as the ``ref`` variant's sequential scatter adds them: the
    same bits. A tap in the padding may match the index of an input element; its add
    lands in the padding, which is cropped. Without the geometry:
    :func:`_ordered_scatter_add` (deterministic too, one host sync).
    """
    xp = array_module(dy, argmax, dx)
    if kernel_size is None:
        dx[...] = _ordered_scatter_add(xp, dy, argmax, dx.shape)
        return
    geo = pool2d_geometry(dx.shape, kernel_size, **params)
    height, width = dx.shape[2], dx.shape[3]
    corner = _corner(xp, geo, width)
    padded = _padded(xp, xp.zeros_like(dx), geo, 0)
    for (top, left), window in reversed(list(_offset_slices(geo))):
        padded[window] += xp.where(argmax == corner + (top * width + left), dy, 0)
    dx[...] = padded[:, :, geo.ph:geo.ph + height, geo.pw:geo.pw + width]


# --------------------------------------------------------------------------- codelets

maxpool2d_fwd = Codelet(
    "maxpool2d_fwd", modes=(R, W, W),
    variants={"ref": maxpool2d_fwd_ref, "cpu": maxpool2d_fwd_cpu, "cuda": maxpool2d_fwd_cuda},
    flops=_fwd_flops)
"""``y, argmax = max_pool2d(x)``: operands ``(x R, y W, argmax W)``."""

maxpool2d_bwd = Codelet(
    "maxpool2d_bwd", modes=(R, R, W),
    variants={"ref": maxpool2d_bwd_ref, "cpu": maxpool2d_bwd_cpu, "cuda": maxpool2d_bwd_cuda},
    flops=_bwd_flops)
"""``dx = dy`` routed through ``argmax``: operands ``(dy R, argmax R, dx W)``."""
