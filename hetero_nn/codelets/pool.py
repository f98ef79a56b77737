"""Max-pooling codelets: 2-D forward pass with argmax, and the gradient routed back.

This module owns two codelets and every variant of them:

==============  =============================================  =====================
codelet         operands (access mode)                          params
==============  =============================================  =====================
maxpool2d_fwd   x[N,C,H,W] (R), y[N,C,OH,OW] (W), argmax (W)    kernel_size, stride
maxpool2d_bwd   dy[N,C,OH,OW] (R), argmax (R), dx[N,C,H,W] (W)  (kernel_size, stride)
==============  =============================================  =====================

The backward parameters are optional (``argmax`` says where each gradient
goes); given the forward's, the ``cuda`` variant routes without a scatter.

No padding, floor mode: ``OH = (H - KH) // SH + 1``. ``kernel_size`` and
``stride`` are an int or an ``(h, w)`` pair; ``stride`` defaults to
``kernel_size`` as in PyTorch. ``argmax`` is int64, the flat index into the
``H*W`` input plane, exactly what ``torch.nn.functional.max_pool2d(...,
return_indices=True)`` returns.

Which element wins a window matters for the gradient, so every variant follows
PyTorch's CPU kernel to the letter: the window is scanned in row-major order
starting from ``-inf`` and an element replaces the running maximum when it is
strictly greater *or is NaN*. Hence among equal maxima the first wins (ReLU
outputs make ties of zeros common), a NaN always wins and the last NaN of a
window is the one recorded, and a window of ``-inf`` records its first element.

Variants: ``ref`` (NumPy sliding windows + ``argmax``), ``cpu`` (Numba loops)
and ``cuda`` (a loop over the ``KH*KW`` window offsets of whole-array strided
slices, written against the array module: CuPy on a GPU, NumPy in CI; with
the window parameters the backward pass needs no scatter-add, so no atomics,
the same sums on every run, and no raw kernel).
"""

from __future__ import annotations

import math

import numpy as np
from numba import uintp
from numpy.lib.stride_tricks import sliding_window_view

from ._checks import pair, require_contiguous
from ._jit import jit, jit_inline
from .codelet import R, W, Codelet
from .xp import array_module

__all__ = ["maxpool2d_fwd", "maxpool2d_bwd", "maxpool2d_output_shape"]


# --------------------------------------------------------------------------- geometry

def _geometry(x_shape, kernel_size, stride):
    """Return ``(kh, kw, sh, sw, OH, OW)`` for pooling an ``x_shape`` input."""
    kh, kw = pair(kernel_size, "kernel_size", "maxpool2d")
    sh, sw = pair(kernel_size if stride is None else stride, "stride", "maxpool2d")
    if kh < 1 or kw < 1 or sh < 1 or sw < 1:
        raise ValueError(f"maxpool2d: kernel_size and stride must be >= 1, "
                         f"got kernel_size={kernel_size!r}, stride={stride!r}")
    height, width = x_shape[2], x_shape[3]
    if kh > height or kw > width:
        raise ValueError(f"maxpool2d: window {kh}x{kw} larger than the input {height}x{width}")
    return kh, kw, sh, sw, (height - kh) // sh + 1, (width - kw) // sw + 1


def maxpool2d_output_shape(x_shape, kernel_size, stride=None):
    """Shape ``(N, C, OH, OW)`` of ``maxpool2d_fwd``'s outputs.

    >>> maxpool2d_output_shape((64, 6, 28, 28), 2)
    (64, 6, 14, 14)
    """
    *_, out_h, out_w = _geometry(x_shape, kernel_size, stride)
    return (int(x_shape[0]), int(x_shape[1]), out_h, out_w)


def _fwd_flops(x, y, argmax, kernel_size, stride=None):
    kh, kw = pair(kernel_size, "kernel_size", "maxpool2d")
    return float(math.prod(y) * kh * kw)


def _bwd_flops(dy, argmax, dx, kernel_size=None, stride=None):
    return float(math.prod(dx) + math.prod(dy))


# --------------------------------------------------------------------------- ref (NumPy)

def maxpool2d_fwd_ref(x, y, argmax, kernel_size, stride=None):
    """Maximum of each window and its flat input index (PyTorch's tie and NaN rules)."""
    kh, kw, sh, sw, out_h, out_w = _geometry(x.shape, kernel_size, stride)
    width = x.shape[3]
    windows = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    windows = windows[:, :, :out_h, :out_w].reshape(*y.shape, kh * kw)
    pos = np.argmax(windows, axis=-1)  # first maximum in row-major scan order
    is_nan = np.isnan(windows)
    last_nan = kh * kw - 1 - np.argmax(is_nan[..., ::-1], axis=-1)
    pos = np.where(is_nan.any(axis=-1), last_nan, pos)
    y[...] = np.take_along_axis(windows, pos[..., None], axis=-1)[..., 0]
    di, dj = np.divmod(pos, kw)
    rows = np.arange(out_h).reshape(-1, 1) * sh + di
    cols = np.arange(out_w) * sw + dj
    argmax[...] = rows * width + cols


def maxpool2d_bwd_ref(dy, argmax, dx, kernel_size=None, stride=None):
    """``dx`` is ``dy`` routed to each window's argmax; overlapping windows add.

    The window geometry is not needed (``argmax`` says where each gradient
    goes); ``kernel_size`` and ``stride`` are accepted so that the backward
    task can be submitted with the forward task's parameters.
    """
    dx[...] = _scatter_add(np, dy, argmax, dx.shape)


def _scatter_add(xp, dy, argmax, shape):
    """A zero array of ``shape`` with every ``dy`` added at its plane's ``argmax``."""
    n_batch, n_chan, height, width = shape
    planes = xp.zeros((n_batch * n_chan, height * width), dtype=dy.dtype)
    which = xp.arange(n_batch * n_chan).reshape(-1, 1)
    index = (which, argmax.reshape(n_batch * n_chan, -1))
    if xp is np:
        np.add.at(planes, index, dy.reshape(n_batch * n_chan, -1))
    else:  # CuPy: the same unbuffered add, with atomics
        import cupyx
        cupyx.scatter_add(planes, index, dy.reshape(n_batch * n_chan, -1))
    return planes.reshape(shape)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _take(v, best, where, at):
    """PyTorch's scan step: ``v`` (at ``at``) replaces the maximum if greater or NaN."""
    take = (v > best) | (v != v)
    return (v if take else best), (at if take else where)


@jit
def _maxpool2x2_fwd_cpu(x, y, argmax):
    """The 2x2, stride 2 window (most CNNs') unrolled: the four taps in PyTorch's order
    with no inner loops, which LLVM vectorises over the output row (4x the general
    scan's bandwidth on planes past the caches, 1.4-1.9x in cache:
    ``benchmarks/bench_bandwidth.py``, docs/benchmarks.md)."""
    n_batch, n_chan, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    xf, yf, af = x.reshape(-1), y.reshape(-1), argmax.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * height * width)
        y0 = uintp(plane * out_h * out_w)
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


@jit
def _maxpool2d_fwd_cpu(x, y, argmax, kh, kw, sh, sw):
    """PyTorch's scan: replace the running maximum when strictly greater or NaN.

    Branch-free selects (ReLU outputs make the comparison unpredictable);
    flat views with unsigned offsets (no wraparound checks). Starting from a
    window's first element is the same as starting from -inf and scanning
    it, and keeps the running maximum in the input dtype.
    """
    if kh == 2 and kw == 2 and sh == 2 and sw == 2:
        _maxpool2x2_fwd_cpu(x, y, argmax)
        return
    n_batch, n_chan, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    xf, yf, af = x.reshape(-1), y.reshape(-1), argmax.reshape(-1)
    for plane in range(n_batch * n_chan):
        x0 = uintp(plane * height * width)
        y0 = uintp(plane * out_h * out_w)
        for i in range(out_h):
            for j in range(out_w):
                first = i * sh * width + j * sw
                best = xf[x0 + uintp(first)]
                where = first
                for p in range(kh):
                    row = first + p * width
                    for q in range(kw):
                        best, where = _take(xf[x0 + uintp(row + q)], best, where, row + q)
                k = y0 + uintp(i * out_w + j)
                yf[k] = best
                af[k] = where


@jit
def _maxpool2d_bwd_cpu(dy, argmax, dx):
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


def maxpool2d_fwd_cpu(x, y, argmax, kernel_size, stride=None):
    """``maxpool2d_fwd`` by Numba loops."""
    kh, kw, sh, sw, _, _ = _geometry(x.shape, kernel_size, stride)
    require_contiguous("maxpool2d_fwd", y=y, argmax=argmax)
    _maxpool2d_fwd_cpu(np.ascontiguousarray(x), y, argmax, kh, kw, sh, sw)


def maxpool2d_bwd_cpu(dy, argmax, dx, kernel_size=None, stride=None):
    """``maxpool2d_bwd`` by Numba loops."""
    require_contiguous("maxpool2d_bwd", dx=dx)
    _maxpool2d_bwd_cpu(np.ascontiguousarray(dy), np.ascontiguousarray(argmax), dx)


# --------------------------------------------------------------------------- cuda (array module)

def _offset_slices(kh, kw, sh, sw, out_h, out_w):
    """For each window offset ``(p, q)``: the slices of the input it reads over all windows."""
    for p in range(kh):
        for q in range(kw):
            yield p, q, (slice(None), slice(None), slice(p, p + sh * (out_h - 1) + 1, sh),
                         slice(q, q + sw * (out_w - 1) + 1, sw))


def maxpool2d_fwd_cuda(x, y, argmax, kernel_size, stride=None):
    """``maxpool2d_fwd`` as a running max over the window offsets, in ``xp``."""
    xp = array_module(x, y, argmax)
    kh, kw, sh, sw, out_h, out_w = _geometry(x.shape, kernel_size, stride)
    width = x.shape[3]
    corner = (xp.arange(out_h).reshape(-1, 1) * sh * width
              + xp.arange(out_w) * sw).astype(xp.int64)  # flat index of each window's (0, 0)
    best = xp.full(y.shape, -np.inf, dtype=x.dtype)
    where = xp.broadcast_to(corner, y.shape).copy()
    for p, q, window in _offset_slices(kh, kw, sh, sw, out_h, out_w):
        v = x[window]
        take = (v > best) | xp.isnan(v)
        best = xp.where(take, v, best)
        where = xp.where(take, corner + (p * width + q), where)
    y[...] = best
    argmax[...] = where


def maxpool2d_bwd_cuda(dy, argmax, dx, kernel_size=None, stride=None):
    """``maxpool2d_bwd`` as one masked add per window offset, in ``xp``.

    With the window geometry this needs no scatter (so no atomics, and the
    same sums in the same order on every run); without it, a scatter-add.
    """
    xp = array_module(dy, argmax, dx)
    if kernel_size is None:
        dx[...] = _scatter_add(xp, dy, argmax, dx.shape)
        return
    kh, kw, sh, sw, out_h, out_w = _geometry(dx.shape, kernel_size, stride)
    width = dx.shape[3]
    corner = (xp.arange(out_h).reshape(-1, 1) * sh * width
              + xp.arange(out_w) * sw).astype(xp.int64)
    dx[...] = 0
    for p, q, window in _offset_slices(kh, kw, sh, sw, out_h, out_w):
        dx[window] += xp.where(argmax == corner + (p * width + q), dy, 0)


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
