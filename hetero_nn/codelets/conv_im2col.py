"""im2col convolution kernels (Numba + BLAS): the ``cpu:im2col`` variants and the fused chains'.

A Numba kernel unfolds a chunk of samples into columns ``[n, C*KH*KW, OH*OW]``
(or folds them back, ``col2im``) and BLAS runs one GEMM per sample and group,
straight into ``y`` (Numba's ``np.dot``, which calls SciPy's BLAS). A whole
variant is one Numba call: one round trip through the interpreter lock per
task, so two workers' kernels do not wait for each other's
(``benchmarks/bench_gil.py``). Without groups the bias rides in the GEMM as one
more column of weights against a row of ones, and so does its gradient; with
groups each group is its own GEMM (``[O/G, C/G*KH*KW]`` by its block of rows)
and the bias is added, or summed, apart. Chunks are sized to stay in the core's
L2 cache; the buffers are the worker thread's own, reused from call to call.

Row ``(c*KH + p)*KW + q``, column ``i*OW + j`` of a sample's columns is
``xpad[c, i*SH + p*DH, j*SW + q*DW]``, ``xpad`` the padded sample (padding
modes by ``padding.pad_planes``): every row is a plain strided copy. ``geo`` is a
:class:`~hetero_nn.codelets.conv.Conv2dGeometry`.

The ``*_operands`` helpers take ``buffers``, where their scratch arrays come from:
the calling thread's (``worker_buffer``, the default) or a prepared task's worker's
(:mod:`~hetero_nn.codelets.prepared`). ``[w | b]`` is packed by a kernel
(``pack_weights_cpu``) into one of them: a prepared task runs that call at every
run, so the weights it multiplies are the current ones.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import uintp

from ._jit import jit
from ._rows import START, add_scatter_row, copy8, fill_row, gather_row, row_sum
from .padding import fold_plane, pad_planes

IM2COL_CHUNK_BYTES = 1 << 19
"""Target size of one chunk's columns plus its slice of ``y`` (or ``dy``): half of
one core's L2 cache, so the GEMM finds both there, beside its packed panels."""

_c = np.ascontiguousarray

# --------------------------------------------------------------------------- worker buffers

_worker = threading.local()
_WORKER_BUFFERS = 16
"""Most scratch arrays one worker thread keeps (the oldest goes first)."""


def worker_buffer(tag, shape, dtype, zero=False):
    """A scratch array of the calling thread, reused by its later calls with the same
    ``(tag, shape, dtype)``: no allocation and no page faults on the hot path.

    Contents are whatever the last user left (zeros when first made with
    ``zero=True``). The runtime runs one task per worker thread at a time, so
    a variant owns its thread's buffers until it returns; none may outlive
    the call (never an output, never a view returned).
    """
    buffers = getattr(_worker, "buffers", None)
    if buffers is None:
        buffers = _worker.buffers = {}
    key = (tag, tuple(int(d) for d in shape), np.dtype(dtype).str)
    buf = buffers.get(key)
    if buf is None:
        if len(buffers) >= _WORKER_BUFFERS:
            del buffers[next(iter(buffers))]
        buf = buffers[key] = (np.zeros if zero else np.empty)(key[1], dtype=dtype)
    return buf


def _chunk(n_batch, rows, n_out, area, itemsize):
    """Samples per chunk: ``rows`` of columns and ``n_out`` of ``y`` or ``dy``, each
    ``area`` long, per sample, within ``IM2COL_CHUNK_BYTES``."""
    per_sample = max(1, (rows + n_out) * area * itemsize)
    return max(1, min(n_batch, IM2COL_CHUNK_BYTES // per_sample))


def _pad_buffer(x_shape, geo, dtype, buffers=worker_buffer):
    """The padded sample ``im2col_cpu`` copies into (empty without padding).

    Made zero once: in ``'zeros'`` mode only the interior is written, which the
    key (padding offsets, mode and padded shape) pins down, so the borders stay
    zero for good; other modes write the borders every time.
    """
    _, n_in, height, width = x_shape
    if geo.hp == height and geo.wp == width:
        return np.empty(0, dtype=dtype)
    padded = buffers(("im2col:xpad", geo.pt, geo.pl, geo.mode), (n_in, geo.hp, geo.wp),
                     dtype, zero=True)
    return padded.reshape(-1)


def _columns(x, geo, n_rows, n_out, buffers=worker_buffer):
    """Column buffer ``[chunk, n_rows, OH*OW]`` and chunk size for ``x``; rows past
    ``C*KH*KW`` (the bias row) are set to one. The key names ``C*KH*KW``, so those rows
    stay ones for every user of the buffer (im2col writes the rows above)."""
    rows, area = x.shape[1] * geo.kh * geo.kw, geo.out_h * geo.out_w
    step = _chunk(x.shape[0], n_rows, n_out, area, x.itemsize)
    cols = buffers(("im2col:cols", rows), (step, n_rows, area), x.dtype)
    cols[:, rows:] = 1
    return cols, step


# --------------------------------------------------------------------------- unfold / fold

@jit
def _unfold_sample(src, s0, colf, r0, n_in, geo):
    """Rows ``colf[r0 + ((c*KH + p)*KW + q)*OH*OW + i*OW:]`` of one padded sample ``src[s0:]``.

    The general case (any stride, any width). This and the two functions
    below are kernels of their own, not inlined: one loop nest per kernel
    keeps LLVM's code for the fast ones 20-30% faster.
    """
    hp, wp, out_h, out_w = geo.hp, geo.wp, geo.out_h, geo.out_w
    area = out_h * out_w
    for c in range(n_in):
        for p in range(geo.kh):
            for q in range(geo.kw):
                b0 = s0 + (c * hp + p * geo.dh) * wp + q * geo.dw
                for i in range(out_h):
                    gather_row(colf, r0 + i * out_w, src, b0 + i * geo.sh * wp, geo.sw, out_w)
                r0 += area


@jit
def _unfold_sample_short(src, s0, colf, r0, n_in, geo):
    """``_unfold_sample`` for unit column stride and ``8 <= OW <= 16``: two blocks per row."""
    d, tail, ow = uintp(r0), uintp(geo.out_w - 8), uintp(geo.out_w)
    row_step = uintp(geo.sh * geo.wp)
    for c in range(n_in):
        for p in range(geo.kh):
            for q in range(geo.kw):
                s = uintp(s0 + (c * geo.hp + p * geo.dh) * geo.wp + q * geo.dw)
                for i in range(geo.out_h):
                    copy8(colf, d, src, s)
                    copy8(colf, d + tail, src, s + tail)
                    d += ow
                    s += row_step


@jit
def _unfold_sample_long(src, s0, colf, r0, n_in, geo):
    """``_unfold_sample`` for unit column stride and ``OW > 16``: blocks of 8 per row."""
    d, tail, ow = uintp(r0), uintp(geo.out_w - 8), uintp(geo.out_w)
    row_step = uintp(geo.sh * geo.wp)
    eight = uintp(8)
    for c in range(n_in):
        for p in range(geo.kh):
            for q in range(geo.kw):
                s = uintp(s0 + (c * geo.hp + p * geo.dh) * geo.wp + q * geo.dw)
                for i in range(geo.out_h):
                    j = uintp(0)
                    while j < tail:
                        copy8(colf, d + j, src, s + j)
                        j += eight
                    copy8(colf, d + tail, src, s + tail)
                    d += ow
                    s += row_step


@jit
def sample_source(x, xf, n, xpad, geo):
    """``(src, s0)``: where sample ``n``'s planes start, ``xf`` being ``x`` flat; with
    padding, the sample padded into ``xpad`` first (``_pad_buffer``)."""
    _, n_in, height, width = x.shape
    x0 = n * n_in * height * width
    if geo.hp != height or geo.wp != width:
        pad_planes(xf, x0, n_in, height, width, xpad, START, geo)
        return xpad, START
    return xf, np.intp(x0)


@jit
def im2col_cpu(x, n0, n1, xpad, cols, geo):
    """Unfold samples ``n0 <= n < n1`` of ``x`` into ``cols[n - n0, :C*KH*KW, :OH*OW]``.

    ``xpad`` is a flat ``C*HP*WP`` buffer (see ``_pad_buffer``), unused without
    padding. Rows of ``cols`` past ``C*KH*KW`` are left as they are (the
    caller's row of ones for the bias).
    """
    n_in = x.shape[1]
    per_sample = cols.shape[1] * geo.out_h * geo.out_w
    xf, colf = x.reshape(-1), cols.reshape(-1)
    for n in range(n0, n1):
        src, s0 = sample_source(x, xf, n, xpad, geo)
        r0 = (n - n0) * per_sample
        if geo.sw != 1 or geo.out_w < 8:
            _unfold_sample(src, s0, colf, r0, n_in, geo)
        elif geo.out_w <= 16:
            _unfold_sample_short(src, s0, colf, r0, n_in, geo)
        else:
            _unfold_sample_long(src, s0, colf, r0, n_in, geo)


@jit
def _col2im_cpu(cols, n0, n1, plane, dx, geo):
    """Fold ``cols[n - n0]`` (laid out as by ``im2col_cpu``) onto ``dx[n]``, overwritten.

    Overlapping windows add up in ``plane``, one padded ``HP*WP`` input plane,
    which is then folded onto the input (its interior, plus the borders in a
    padding mode other than zeros).
    """
    _, n_in, height, width = dx.shape
    hp, wp, out_h, out_w = geo.hp, geo.wp, geo.out_h, geo.out_w
    area = out_h * out_w
    per_sample = cols.shape[1] * area
    colf, dxf = cols.reshape(-1), dx.reshape(-1)
    for n in range(n0, n1):
        r0 = (n - n0) * per_sample
        for c in range(n_in):
            fill_row(plane, 0, hp * wp, 0.0)
            for p in range(geo.kh):
                for q in range(geo.kw):
                    for i in range(out_h):
                        add_scatter_row(plane, (i * geo.sh + p * geo.dh) * wp + q * geo.dw,
                                        geo.sw, colf, r0 + i * out_w, out_w)
                    r0 += area
            fold_plane(plane, START, hp, wp, dxf, (n * n_in + c) * height * width, height, width,
                       geo.pt, geo.pl, geo.mode)


@jit
def _widen_cpu(dy, n0, n1, wp, wide):
    """``wide[n - n0, o, i*WP + j] = dy[n, o, i, j]`` for ``j < OW``, zero for ``OW <= j < WP``."""
    _, n_out, out_h, out_w = dy.shape
    gf, wf = dy.reshape(-1), wide.reshape(-1)
    for n in range(n0, n1):
        for o in range(n_out):
            s0 = (n * n_out + o) * out_h * out_w
            d0 = ((n - n0) * n_out + o) * out_h * wp
            for i in range(out_h):
                gather_row(wf, d0 + i * wp, gf, s0 + i * out_w, 1, out_w)
                fill_row(wf, d0 + i * wp + out_w, wp - out_w, 0.0)


@jit
def _col2im_wide_cpu(cols, n0, n1, plane, dx, geo):
    """``_col2im_cpu`` for stride 1 on wide rows: ``cols[n - n0, (c, p, q), i*WP + j]``.

    The columns come from a widened gradient, so they are zero for ``j >= OW``
    and each tap is ONE add of ``(OH-1)*WP + OW`` entries at
    ``plane[p*DH*WP + q*DW:]`` (no short rows; the last lands on the plane's
    last entry).
    """
    _, n_in, height, width = dx.shape
    hp, wp = geo.hp, geo.wp
    span = geo.out_h * wp
    run = (geo.out_h - 1) * wp + geo.out_w
    per_sample = cols.shape[1] * span
    colf, dxf = cols.reshape(-1), dx.reshape(-1)
    for n in range(n0, n1):
        r0 = (n - n0) * per_sample
        for c in range(n_in):
            fill_row(plane, 0, hp * wp, 0.0)
            for p in range(geo.kh):
                for q in range(geo.kw):
                    add_scatter_row(plane, p * geo.dh * wp + q * geo.dw, 1, colf, r0, run)
                    r0 += span
            fold_plane(plane, START, hp, wp, dxf, (n * n_in + c) * height * width, height, width,
                       geo.pt, geo.pl, geo.mode)


# --------------------------------------------------------------------------- GEMM loops

@jit
def gemm_columns_cpu(x, n0, n1, w3, bias, out, cols, xpad, geo, step):
    """``out[n - n0, g] = w3[g] @ im2col(x[n])[g]`` (+ ``bias`` if not empty) for
    ``n0 <= n < n1``, ``step`` samples unfolded at a time; ``out`` is ``[n, O, OH*OW]``,
    ``w3`` is ``[G, O/G, rows per group]``."""
    n_groups, group_out, group_rows = w3.shape
    area = geo.out_h * geo.out_w
    cols4 = cols.reshape(cols.shape[0], n_groups, group_rows, area)
    out4 = out.reshape(out.shape[0], n_groups, group_out, area)
    for start in range(n0, n1, step):
        stop = min(start + step, n1)
        im2col_cpu(x, start, stop, xpad, cols, geo)
        for n in range(start, stop):
            for g in range(n_groups):
                np.dot(w3[g], cols4[n - start, g], out4[n - n0, g])
            for o in range(bias.size):
                row = out[n - n0, o]
                row += bias[o]


@jit
def pack_weights_cpu(w_rows, bias, w2d):
    """``w2d = [w_rows | bias]`` in ``w2d``'s dtype (``bias`` empty: no bias column)."""
    rows = w_rows.shape[1]
    for o in range(w2d.shape[0]):
        for r in range(rows):
            w2d[o, r] = w_rows[o, r]
        if bias.shape[0]:
            w2d[o, rows] = bias[o]


def fwd_operands(x, w, b, dtype, geo, buffers=worker_buffer):
    """``((x, w3, bias, cols, xpad, step), pack)``: the arguments of ``gemm_columns_cpu``
    after ``n0, n1`` for ``conv2d(x, w) + b`` (the contiguous input, the weights as ``[G,
    O/G, rows]``: ``[w | b]`` without groups, the bias to add apart with groups, the
    column and padding buffers, the chunk size), and the call ``(pack_weights_cpu,
    args)`` that packs ``[w | b]`` into ``w3`` first (None when ``w3`` is a view of
    ``w``)."""
    x = _c(x)
    n_out, groups = w.shape[0], geo.groups
    bias = np.empty(0, dtype=dtype)
    pack = None
    if groups == 1:
        w_rows = _c(w).reshape(n_out, -1)
        w3 = w_rows.reshape(1, n_out, -1)
        if b is not None or w3.dtype != dtype:
            w3 = buffers("im2col:w3", (1, n_out, w_rows.shape[1] + (b is not None)), dtype)
            pack = (pack_weights_cpu, (w_rows, w_rows[0, :0] if b is None else b, w3[0]))
    else:
        w3 = _c(w.reshape(groups, n_out // groups, -1), dtype=dtype)
        if b is not None:
            bias = _c(b, dtype=dtype)
    cols, step = _columns(x, geo, groups * w3.shape[2], n_out, buffers)
    return (x, w3, bias, cols, _pad_buffer(x.shape, geo, x.dtype, buffers), step), pack


def _wide_rows(geo, n_out, itemsize):
    """Whether ``bwd_input_im2col_cpu`` should widen ``dy`` (stride 1 only).

    Widening pays when col2im's rows are short enough for LLVM's loop to run
    them scalar (under 4 vectors: ``OW * itemsize < 128``) and the GEMM's extra
    work per row, ``O * (WP - OW)`` multiply-adds, stays small (measured: LeNet's
    second layer in float32 gains 20%; wider layers and float64 lose).
    """
    return (geo.sh == 1 and geo.sw == 1 and geo.out_w * itemsize < 128
            and n_out * (geo.wp - geo.out_w) * itemsize <= 256)


@jit
def bwd_input_im2col_cpu(dy, w3, dx, cols, plane, dy_wide, geo, wide, step):
    """``dx = col2im(w^T dy)`` per group, ``step`` samples at a time; on wide rows ``dy``
    is first widened into ``dy_wide`` (see ``_wide_rows``)."""
    n_groups, group_out, group_rows = w3.shape
    n_batch, n_out = dy.shape[0], dy.shape[1]
    area = geo.out_h * geo.wp if wide else geo.out_h * geo.out_w
    dy4 = dy.reshape(n_batch, n_groups, group_out, geo.out_h * geo.out_w)
    wide4 = (dy_wide.reshape(dy_wide.shape[0], n_groups, group_out, area) if wide
             else dy_wide.reshape(1, 1, 1, 1))
    cols4 = cols.reshape(cols.shape[0], n_groups, group_rows, area)
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        if wide:
            _widen_cpu(dy, start, stop, geo.wp, dy_wide)
            for n in range(start, stop):
                for g in range(n_groups):
                    np.dot(w3[g].T, wide4[n - start, g], cols4[n - start, g])
            _col2im_wide_cpu(cols, start, stop, plane, dx, geo)
        else:
            for n in range(start, stop):
                for g in range(n_groups):
                    np.dot(w3[g].T, dy4[n, g], cols4[n - start, g])
            _col2im_cpu(cols, start, stop, plane, dx, geo)


def bwd_input_operands(w, dx, geo, buffers=worker_buffer):
    """``(w3, dx, cols, plane, dy_wide, geo, wide, step)``: what ``bwd_input_im2col_cpu``
    takes after ``dy``."""
    n_batch, _, height, width = dx.shape
    n_out = w.shape[0]
    rows = math.prod(w.shape[1:]) * geo.groups
    wide = _wide_rows(geo, n_out, dx.itemsize)
    span = geo.out_h * geo.wp if wide else geo.out_h * geo.out_w
    step = _chunk(n_batch, rows, n_out, span, dx.itemsize)
    cols = buffers("col2im:cols", (step, rows, span), dx.dtype)
    plane = buffers("col2im:plane", (geo.hp * geo.wp,), dx.dtype)
    dy_wide = buffers("col2im:dy", (step, n_out, span) if wide else (1, 1, 1), dx.dtype)
    w3 = _c(w).reshape(geo.groups, n_out // geo.groups, -1)
    return w3, dx, cols, plane, dy_wide, geo, wide, step


@jit
def bwd_params_im2col_cpu(x, dy, dw, db, bias, total, cols, products, xpad, geo, step):
    """``dw += sum_n (cols_n dy_n^T)`` per group, transposed, and ``db += sum(dy)`` (``dw``
    flat), in sample order: each chunk's products summed, then added to ``total``.

    Without groups the bias gradient is the GEMM's row of ones (``total``'s last
    row); with groups it is summed from ``dy`` apart.
    """
    n_groups, group_rows, group_out = total.shape
    n_batch, n_out = dy.shape[0], dy.shape[1]
    area = geo.out_h * geo.out_w
    dy4 = dy.reshape(n_batch, n_groups, group_out, area)
    cols4 = cols.reshape(cols.shape[0], n_groups, group_rows, area)
    total[:] = 0
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        im2col_cpu(x, start, stop, xpad, cols, geo)
        for n in range(start, stop):
            for g in range(n_groups):
                np.dot(cols4[n - start, g], dy4[n, g].T, products[n - start, g])
        acc = products[0]
        for k in range(1, stop - start):
            acc += products[k]
        total += acc
    bias_row = bias and n_groups == 1
    rows = group_rows - (1 if bias_row else 0)
    for g in range(n_groups):
        for k in range(group_out):
            o = g * group_out + k
            for r in range(rows):
                dw[o * rows + r] += total[g, r, k]
            if bias_row:
                db[o] += total[g, rows, k]
    if bias and not bias_row:  # lane-wise over the batch (vectorised), then one row sum
        dyf = dy.reshape(-1)
        lanes = np.empty(area, dtype=db.dtype)
        for o in range(n_out):
            fill_row(lanes, 0, area, 0.0)
            for n in range(n_batch):
                add_scatter_row(lanes, 0, 1, dyf, (n * n_out + o) * area, area)
            db[o] = row_sum(lanes, 0, area, db[o])


def bwd_params_operands(x, dw_shape, with_bias, dtype, geo, buffers=worker_buffer):
    """``(total, cols, products, xpad, geo, step)``: the worker's buffers, the geometry
    and the chunk size for ``bwd_params_im2col_cpu``."""
    n_out, groups = dw_shape[0], geo.groups
    group_rows = math.prod(dw_shape[1:]) + (1 if with_bias and groups == 1 else 0)
    cols, step = _columns(x, geo, groups * group_rows, n_out, buffers)
    products = buffers("im2col:products", (step, groups, group_rows, n_out // groups), dtype)
    total = buffers("im2col:total", (groups, group_rows, n_out // groups), dtype)
    return total, cols, products, _pad_buffer(x.shape, geo, x.dtype, buffers), geo, step


def params_operands(dw, db):
    """``(dw flat, db, bias)`` for ``bwd_params_im2col_cpu`` (``db`` may be None)."""
    flat = dw.reshape(-1)
    return flat, (flat[:0] if db is None else db), db is not None


def run_calls(calls):
    """Run prepared calls now (a variant called from Python)."""
    for kernel, args in calls:
        kernel(*args)


def views(dtype, *arrays) -> bool:
    """Whether every array (None: absent) is C-contiguous and of ``dtype``: a prepared
    call must hold views of the operands, never copies (a copy, or a conversion, would
    freeze one step's data)."""
    return all(a is None or (a.flags.c_contiguous and a.dtype == dtype) for a in arrays)
