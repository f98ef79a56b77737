"""Stacked depthwise kernels (Numba): the ``cpu:stacked`` variants of ``depthwise.py``.

``conv_direct.py``'s kernels (the depthwise ``cpu`` variants) work on one plane at a
time: one channel of one image, its taps as multiply-adds over one "wide" row of the
padded plane. On MobileNetV2's late layers (384-960 channels of 8x8 or 4x4 pixels) such
a row is 22-78 entries long: shorter than the 32 floats at which LLVM's vectorised loop
starts, so every tap runs scalar, and the per-plane overheads (padding, copies, calls)
are paid 15,000 times per task.

Here padded planes lie end to end at one pitch (``HP*WP``), so that a kernel tap's offset
is the same in every plane: a tap is ONE long unit-stride multiply-add over the whole
stack (hundreds to tens of thousands of entries), which vectorises. The forward pass and
the input gradient stack one channel of every image of the partition; the parameter
gradient stacks a block of one image's channels (its lanes, one per tap and position,
then hold the whole block: ``LANES_BYTES``). The positions between two planes' outputs
are computed and never read, or add ``w * 0``; the buffers keep their zeros.

Strided layers run on the unit-stride grid of the padded plane (``unit``, the geometry
with strides 1, ``stacked_geometry``): the forward pass computes every position and keeps
every ``SH``-th row and ``SW``-th column, the gradients place ``dy`` on that grid with
zeros between. That is up to ``SH*SW`` times the multiply-adds, all vectorised; the
performance model weighs it against ``cpu`` per shape.

Every output sums the same products in the same order as ``conv_direct.py``'s kernels
(the bias or zero, then the taps row by row, three per pass; the input gradient's taps,
and the channel multiplier's, in order; a parameter lane ``0 +`` the images' products in
order, the lanes added onto ``dw`` in raster order of the outputs), and the extra terms
are ``+ 0``: the ``cpu`` and ``cpu:stacked`` variants give the same bits on finite inputs
(``Codelet.same_bits``). The forward kernel also takes an activation, applied to a
stack's sums in place before they are copied out (``depthwise_fused.py``'s folded batch
norm + ReLU6).
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._rows import (START, add_scatter_row, axpy3_row, axpy_gather_row, fill_row, finish_row,
                    gather_row, mul3_row, mul_gather_row)
from .conv_direct import _add_taps, _tap
from .padding import fold_plane, pad_plane

__all__ = ["stacked_geometry", "fwd_stacked", "bwd_input_stacked", "bwd_params_stacked",
           "fwd_buffers", "bwd_input_buffers", "params_buffers"]

LANES_BYTES = 1 << 18
"""Size of the parameter gradient's lanes (every tap's, for a block of channels): in the
L2 cache beside the stacks they read."""


def stacked_geometry(geo):
    """``geo`` with unit strides: the grid of every position the kernel fits in the padded
    plane (``out_h x out_w`` of that geometry)."""
    return geo._replace(sh=1, sw=1, out_h=geo.hp - geo.dh * (geo.kh - 1),
                        out_w=geo.wp - geo.dw * (geo.kw - 1))


def _span(unit):
    """Entries of one plane's wide output rows on the unit grid."""
    return (unit.out_h - 1) * unit.wp + unit.out_w


def fwd_buffers(buffers, geo, x_shape, dtype):
    """``(unit, stack, acc)`` of :func:`fwd_stacked` from ``buffers(tag, shape, dtype, zero)``
    (a worker's): in 'zeros' mode the stack's borders are never written, so it is made
    zero once under a tag naming the geometry."""
    unit, area = stacked_geometry(geo), geo.hp * geo.wp
    return (unit,
            buffers(f"dw_stacked:stack:{tuple(geo)}", (x_shape[0] * area,), dtype, zero=True),
            buffers("dw_stacked:acc", ((x_shape[0] - 1) * area + _span(unit),), dtype))


def bwd_input_buffers(buffers, geo, dx_shape, n_out, dtype):
    """``(unit, gwide, planes)`` of :func:`bwd_input_stacked` (see :func:`fwd_buffers`: only
    the outputs' positions of the wide gradient are ever written)."""
    unit, area = stacked_geometry(geo), geo.hp * geo.wp
    stride = dx_shape[0] * area + 2 * (geo.kw - 1) * geo.dw
    return (unit,
            buffers(f"dw_stacked:gwide:{tuple(geo)}", (n_out // dx_shape[1] * stride,), dtype,
                    zero=True),
            buffers("dw_stacked:planes", (dx_shape[0] * area,), dtype))


def params_buffers(buffers, geo, x_shape, dtype):
    """``(unit, block, stack, gwide, lanes, blanes)`` of :func:`bwd_params_stacked` (see
    :func:`fwd_buffers`): ``block`` channels per stack, so that the lanes of every tap fit
    ``LANES_BYTES``."""
    unit, area, taps = stacked_geometry(geo), geo.hp * geo.wp, geo.kh * geo.kw
    block = max(1, min(x_shape[1], LANES_BYTES // (taps * area * np.dtype(dtype).itemsize)))
    return (unit, block,
            buffers(f"dw_stacked:cstack:{tuple(geo)}", (block * area,), dtype, zero=True),
            buffers(f"dw_stacked:cgwide:{tuple(geo)}", (block * area,), dtype, zero=True),
            buffers("dw_stacked:lanes", (taps * block * area,), dtype),
            buffers("dw_stacked:blanes", (block * area,), dtype))


@jit
def _load_stack(xf, x0, pitch_src, n_planes, height, width, dst, geo):
    """The planes ``xf[x0 + k*pitch_src]`` (``k < n_planes``), padded, at ``dst[k*HP*WP]``;
    in 'zeros' mode only their interiors are written."""
    for k in range(n_planes):
        pad_plane(xf, x0 + k * pitch_src, height, width, dst, k * geo.hp * geo.wp, geo.pt,
                  geo.pl, geo.hp, geo.wp, geo.mode)


@jit
def _widen_stack(gf, g0, n_planes, geo, wide, w0):
    """The output planes ``gf[g0:]`` (``n_planes`` of ``OH x OW``) on the unit grid of the
    padded planes: output ``(i, j)`` of plane ``k`` at ``wide[w0 + k*HP*WP + i*SH*WP +
    j*SW]``; the other entries are left as they are (the caller keeps them zero)."""
    out_h, out_w = geo.out_h, geo.out_w
    for k in range(n_planes):
        for i in range(out_h):
            gather = g0 + (k * out_h + i) * out_w
            row = w0 + k * geo.hp * geo.wp + i * geo.sh * geo.wp
            if geo.sw == 1:
                gather_row(wide, row, gf, gather, 1, out_w)
            else:
                for j in range(out_w):
                    wide[row + j * geo.sw] = gf[gather + j]


@jit
def fwd_stacked(x, w, b, has_bias, activation, y, geo, unit, stack, acc):
    """Depthwise ``y`` (overwritten) from ``x`` and ``w[m*C, 1, KH, KW]``, one channel's stack
    at a time; ``activation``: 0 none, 1 ReLU, 2 ReLU6 (clamp: NaN and -0.0 pass), applied
    to the stack's sums (``finish_row``) before they are copied out. Buffers:
    :func:`fwd_buffers`."""
    n_batch, n_in, height, width = x.shape
    n_out, _, kh_size, kw_size = w.shape
    mult = n_out // n_in
    out_h, out_w, wp = geo.out_h, geo.out_w, geo.wp
    area = geo.hp * wp
    count = (n_batch - 1) * area + (unit.out_h - 1) * wp + unit.out_w
    xf, wf, yf = x.reshape(-1), w.reshape(-1), y.reshape(-1)
    zero = y.dtype.type(0)
    for c in range(n_in):
        _load_stack(xf, c * height * width, n_in * height * width, n_batch, height, width,
                    stack, geo)
        for k in range(mult):
            o = c * mult + k
            start = b[o] if has_bias else zero
            for p in range(kh_size):
                _add_taps(acc, wf, (o * kh_size + p) * kw_size, kw_size, stack, 0, p, unit,
                          geo.hp, wp, count, start, p == 0)
            if activation:  # over the whole stack at once: long rows vectorise
                finish_row(acc, 0, acc, 0, count, b[:0], 0, activation)
            for n in range(n_batch):
                y0 = (n * n_out + o) * out_h * out_w
                for i in range(out_h):
                    gather_row(yf, y0 + i * out_w, acc, n * area + i * geo.sh * wp, geo.sw,
                               out_w)


@jit
def bwd_input_stacked(dy, w, dx, geo, unit, gwide, planes):
    """Depthwise ``dx`` (overwritten) from ``dy`` and ``w[m*C, 1, KH, KW]``, one input channel's
    stack at a time, folded onto ``dx`` per image (padding modes); the taps (and the
    multiplier's channels) added in ``conv_direct.conv2d_bwd_input_cpu``'s order. Buffers:
    :func:`bwd_input_buffers`."""
    n_batch, n_in, height, width = dx.shape
    n_out, _, kh_size, kw_size = w.shape
    mult = n_out // n_in
    hp, wp, dh, dw = geo.hp, geo.wp, geo.dh, geo.dw
    area = hp * wp
    margin = (kw_size - 1) * dw
    span = (n_batch - 1) * area + (unit.out_h - 1) * wp + unit.out_w
    stride = n_batch * area + 2 * margin  # one output channel's wide stack and its margins
    gf, wf, dxf = dy.reshape(-1), w.reshape(-1), dx.reshape(-1)
    for c in range(n_in):
        for k in range(mult):
            for n in range(n_batch):
                _widen_stack(gf, (n * n_out + c * mult + k) * geo.out_h * geo.out_w, 1, geo,
                             gwide, k * stride + margin + n * area)
        fill_row(planes, 0, n_batch * area, 0.0)
        for k in range(mult):
            w0 = (c * mult + k) * kh_size * kw_size
            base = k * stride + margin
            for p in range(kh_size):  # three taps per pass, gathered (offsets -DW apart)
                q = 0
                d0 = p * dh * wp
                while q < kw_size:
                    s0 = base - q * dw
                    if q + 3 <= kw_size:
                        axpy3_row(planes, d0, wf[w0 + p * kw_size + q],
                                  wf[w0 + p * kw_size + q + 1], wf[w0 + p * kw_size + q + 2],
                                  gwide, s0, s0 - dw, s0 - 2 * dw, span + margin)
                        q += 3
                    else:
                        axpy_gather_row(planes, d0, wf[w0 + p * kw_size + q], gwide, s0, 1,
                                        span + margin)
                        q += 1
        for n in range(n_batch):
            fold_plane(planes, n * area, hp, wp, dxf, (n * n_in + c) * height * width, height,
                       width, geo.pt, geo.pl, geo.mode)


@jit
def _strided_sum(src, s0, geo, total):
    """``total`` plus the outputs' entries of one plane's unit-grid lanes ``src[s0:]``, in
    raster order."""
    for i in range(geo.out_h):
        row = s0 + i * geo.sh * geo.wp
        for j in range(geo.out_w):
            total += src[row + j * geo.sw]
    return total


@jit
def bwd_params_stacked(x, dy, dw, db, has_bias, geo, unit, block, stack, gwide, lanes, blanes):
    """Depthwise ``dw`` (and ``db``) ``+=`` the parameter gradient (one output channel per
    input channel), ``block`` channels of one image stacked at a time: each tap's lanes are
    one long pass over the block per image. Buffers: :func:`params_buffers`."""
    n_batch, n_in, height, width = x.shape
    kh_size, kw_size = dw.shape[2], dw.shape[3]
    taps = kh_size * kw_size
    area = geo.hp * geo.wp
    xf, gf, dwf = x.reshape(-1), dy.reshape(-1), dw.reshape(-1)
    pitch = block * area  # one tap's lanes
    for c0 in range(0, n_in, block):
        kb = min(block, n_in - c0)
        count = (kb - 1) * area + (unit.out_h - 1) * geo.wp + unit.out_w
        fill_row(lanes, 0, taps * pitch, 0.0)
        if has_bias:
            fill_row(blanes, 0, pitch, 0.0)
        for n in range(n_batch):
            _load_stack(xf, (n * n_in + c0) * height * width, height * width, kb, height, width,
                        stack, geo)
            _widen_stack(gf, (n * n_in + c0) * geo.out_h * geo.out_w, kb, geo, gwide, START)
            if has_bias:
                add_scatter_row(blanes, 0, 1, gwide, 0, count)
            for p in range(kh_size):
                q = 0
                while q < kw_size:
                    l0 = (p * kw_size + q) * pitch
                    if q + 3 <= kw_size:
                        mul3_row(lanes, l0, l0 + pitch, l0 + 2 * pitch, gwide, 0, stack,
                                 _tap(p, q, unit, geo.hp, geo.wp),
                                 _tap(p, q + 1, unit, geo.hp, geo.wp),
                                 _tap(p, q + 2, unit, geo.hp, geo.wp), count)
                        q += 3
                    else:
                        mul_gather_row(lanes, l0, gwide, 0, stack,
                                       _tap(p, q, unit, geo.hp, geo.wp), 1, count)
                        q += 1
        for k in range(kb):
            c = c0 + k
            if has_bias:
                db[c] = _strided_sum(blanes, k * area, geo, db[c])
            for t in range(taps):
                dwf[c * taps + t] = _strided_sum(lanes, t * pitch + k * area, geo,
                                                 dwf[c * taps + t])
