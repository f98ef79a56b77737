"""Partition-GEMM convolution kernels (Numba + BLAS): the ``cpu:gemm`` variants.

``cpu:im2col`` runs one GEMM per sample: on the late layers of real models
(512 channels on 4x4 or 1x1 images) that is a ``[4608, 16]`` by ``[16, 512]``
product per sample, and the weight gradient then adds up one ``[4608, 512]``
product per sample, a pass over 9 MB for 0.15 MFLOP. Here a chunk of the
partition's samples is unfolded into ONE column block ``[C*KH*KW, n*OH*OW]``
(sample after sample along the columns) and BLAS runs one well-shaped GEMM per
chunk: ``y = w @ cols`` (then scattered back to ``[n, O, OH, OW]``),
``cols = w^T @ dy`` (then folded back, col2im) and ``dw += dy @ cols^T``, where
``dy`` is gathered to ``[O, n*OH*OW]``. A chunk holds ``ceil(GEMM_COLUMNS /
(OH*OW))`` samples, so the GEMMs are at least ``GEMM_COLUMNS`` wide.

A 1x1 convolution with stride 1 and no padding (MobileNet's expansions and
projections) unfolds to its own input: on images of ``DIRECT_AREA`` pixels or
more its GEMMs read ``x``, ``dy`` and ``dx`` in place, one per sample, with no
column block; on smaller images (``is_planes``) a sample's block rows are its
planes, so the block is gathered and folded back by one copy per plane (the
same GEMMs and bits as unfolding row by row: 1.2-2.7x faster on MobileNetV2's
4x4 layers, ``benchmarks/bench_pointwise.py``).

The forward pass adds the bias and applies an activation (``conv2d_folded_fwd``'s ReLU or
ReLU6, ``with_activation``) in one epilogue on each GEMM's product while it is in the
cache: per sample on the direct path, on the block's rows (which vectorise) before the
planes are scattered. The same roundings in the same order as the bias pass and the
activation's kernel after the convolution, so the same bits.

The order of every sum depends only on the shapes (chunks in sample order, one
BLAS call each, the chunks' products added in order), so results are the same
bits whatever the policy or worker. Not whatever the granularity in float32: the chunks
follow the partition's size, and OpenBLAS's sgemm rounds a column by its place in the
call (float64's dgemm does not; ``benchmarks/partition_bits.py``, docs/architecture.md).
Groups other than 1, and output images of ``PER_SAMPLE_AREA`` pixels or more, are
not handled here (see ``handles``: the variants in ``conv.py`` hand them to
``cpu:im2col``'s kernels). ``geo`` is a
:class:`~hetero_nn.codelets.conv.Conv2dGeometry`; row ``(c*KH + p)*KW + q``,
column ``m*OH*OW + i*OW + j`` of a block is ``xpad[n0 + m, c, i*SH + p*DH,
j*SW + q*DW]``.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, jit_inline
from ._rows import START, add_scatter_row, fill_row, finish_row, gather_row, row_sum
from .conv_im2col import _pad_buffer, sample_source, worker_buffer
from .padding import fold_plane

GEMM_COLUMNS = 1024
"""Least width of a chunk's GEMM (``n*OH*OW``): OpenBLAS's sgemm runs at 55-75 GFLOP/s on
one core from 512-2048 columns at ResNet-18's channel counts, and at a fraction of that
on the 16 or 1 columns of one late-layer sample."""

PER_SAMPLE_AREA = 256
"""Least output image area (pixels) at which one GEMM per sample runs as fast as a
chunk's (``benchmarks/bench_conv_gemm.py``: 16x16 outputs 0.8-0.95x with chunks of
4); such layers stay with ``cpu:im2col``'s kernels."""

DIRECT_AREA = 256
"""Least image area at which a 1x1, stride-1, unpadded convolution runs one GEMM per
sample on its operands in place instead of a gathered block."""


def chunk_samples(n_batch, area):
    """Samples per GEMM: ``ceil(GEMM_COLUMNS / area)``, at most the partition."""
    return max(1, min(n_batch, -(-GEMM_COLUMNS // area)))


def handles(geo, x_shape):
    """Whether these kernels take the convolution: one group, and output images under
    ``PER_SAMPLE_AREA`` pixels (with more than one sample), or a direct 1x1. Otherwise
    ``cpu:im2col``'s kernels run it: one sample's GEMM is as wide, and their unfolding
    (L2-sized chunks, vector copies per row) is tuned for large images."""
    n_batch, _, height, width = x_shape
    area = geo.out_h * geo.out_w
    return geo.groups == 1 and (is_direct(geo, height, width)
                                or (area < PER_SAMPLE_AREA and n_batch > 1))


def is_direct(geo, height, width):
    """Whether the GEMMs read the operands in place (see the module docstring)."""
    return is_planes.py_func(geo, height, width) and height * width >= DIRECT_AREA


@jit_inline
def is_planes(geo, height, width):
    """Whether a sample's block rows are its input planes (a 1x1 convolution with stride 1
    and no padding): unfolding and folding are then copies of whole planes."""
    return (geo.kh == 1 and geo.kw == 1 and geo.sh == 1 and geo.sw == 1
            and geo.hp == height and geo.wp == width)


# --------------------------------------------------------------------------- blocks

@jit
def unfold_block(x, n0, n1, xpad, colf, geo):
    """Samples ``n0 <= n < n1`` of ``x`` as the column block ``colf[:rows*k]`` (``[rows, k]``,
    ``k = (n1 - n0)*OH*OW``); ``xpad`` a flat padded-sample buffer (empty without padding)."""
    n_in = x.shape[1]
    hp, wp, out_h, out_w = geo.hp, geo.wp, geo.out_h, geo.out_w
    if is_planes(geo, x.shape[2], x.shape[3]):
        gather_planes(x, n0, n1, colf)
        return
    area = out_h * out_w
    k = (n1 - n0) * area
    xf = x.reshape(-1)
    for n in range(n0, n1):
        src, s0 = sample_source(x, xf, n, xpad, geo)
        row = 0
        for c in range(n_in):
            for p in range(geo.kh):
                for q in range(geo.kw):
                    b0 = s0 + (c * hp + p * geo.dh) * wp + q * geo.dw
                    d0 = row * k + (n - n0) * area
                    for i in range(out_h):
                        gather_row(colf, d0 + i * out_w, src, b0 + i * geo.sh * wp, geo.sw, out_w)
                    row += 1


@jit
def fold_block(colf, n0, n1, plane, dx, geo):
    """``dx[n] = col2im`` of the block ``colf[:rows*k]`` (laid out as by ``unfold_block``) for
    ``n0 <= n < n1``, overwritten; windows add up in ``plane`` (one padded plane), which is
    then folded onto the input (``padding.fold_plane``)."""
    _, n_in, height, width = dx.shape
    if is_planes(geo, height, width):
        scatter_planes(colf, n0, n1, dx.reshape(-1)[:0], dx, 0)
        return
    hp, wp, out_h, out_w = geo.hp, geo.wp, geo.out_h, geo.out_w
    area = out_h * out_w
    k = (n1 - n0) * area
    dxf = dx.reshape(-1)
    for n in range(n0, n1):
        row = 0
        for c in range(n_in):
            fill_row(plane, 0, hp * wp, 0.0)
            for p in range(geo.kh):
                for q in range(geo.kw):
                    r0 = row * k + (n - n0) * area
                    for i in range(out_h):
                        add_scatter_row(plane, (i * geo.sh + p * geo.dh) * wp + q * geo.dw,
                                        geo.sw, colf, r0 + i * out_w, out_w)
                    row += 1
            fold_plane(plane, START, hp, wp, dxf, (n * n_in + c) * height * width, height, width,
                       geo.pt, geo.pl, geo.mode)


@jit
def gather_planes(a, n0, n1, blockf):
    """``block[o, (n - n0)*area:][:area] = a[n, o]``: ``a[n0:n1]`` as ``[O, k]`` in ``blockf``."""
    _, n_out, h, w = a.shape
    area = h * w
    k = (n1 - n0) * area
    af = a.reshape(-1)
    for n in range(n0, n1):
        for o in range(n_out):
            gather_row(blockf, o * k + (n - n0) * area, af, (n * n_out + o) * area, 1, area)


@jit
def scatter_planes(blockf, n0, n1, bias, y, activation=0):
    """``y[n, o] = act(block[o, (n - n0)*area:][:area] (+ bias[o]))``: ``gather_planes``
    undone, the bias and the activation (``finish_row``) applied to the block's rows first,
    in place (rows of ``k`` entries vectorise; an image's ``area`` may be too short)."""
    _, n_out, h, w = y.shape
    area = h * w
    k = (n1 - n0) * area
    yf = y.reshape(-1)
    for o in range(n_out):  # the block read in order
        if bias.size or activation:
            finish_row(blockf, o * k, blockf, o * k, k, bias, o, activation)
        for n in range(n0, n1):
            gather_row(yf, (n * n_out + o) * area, blockf, o * k + (n - n0) * area, 1, area)


@jit
def _finish(y, n0, n1, bias, activation):
    """``y[n, o] = act(y[n, o] (+ bias[o]))`` in place for ``n0 <= n < n1`` (``finish_row``)."""
    _, n_out, h, w = y.shape
    area = h * w
    yf = y.reshape(-1)
    if bias.size == 0 and activation == 0:
        return
    for n in range(n0, n1):
        for o in range(n_out):
            d = (n * n_out + o) * area
            finish_row(yf, d, yf, d, area, bias, o, activation)


# --------------------------------------------------------------------------- kernels

@jit
def fwd_gemm_cpu(x, w2, bias, y, colf, outf, xpad, geo, step, direct, activation):
    """``y = act(conv2d(x, w) (+ bias))``: ``w2`` is ``w`` as ``[O, C*KH*KW]``, ``bias`` empty
    for none, ``activation`` as ``finish_row``'s; ``colf``/``outf`` flat buffers for ``step``
    samples' block and product. The bias and activation run on each GEMM's product while
    it is in the cache, in one pass."""
    n_batch, n_out = y.shape[0], y.shape[1]
    rows, area = w2.shape[1], geo.out_h * geo.out_w
    if direct:
        for n in range(n_batch):
            np.dot(w2, x[n].reshape(rows, area), y[n].reshape(n_out, area))
            _finish(y, n, n + 1, bias, activation)
        return
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * area
        unfold_block(x, start, stop, xpad, colf, geo)
        if k == area:  # one sample: its block of y is the product
            np.dot(w2, colf[:rows * k].reshape(rows, k), y[start].reshape(n_out, area))
            _finish(y, start, stop, bias, activation)
        else:
            np.dot(w2, colf[:rows * k].reshape(rows, k), outf[:n_out * k].reshape(n_out, k))
            scatter_planes(outf, start, stop, bias, y, activation)


@jit
def bwd_input_gemm_cpu(dy, w2, dx, colf, dyf, plane, geo, step, direct):
    """``dx = conv2d^T(dy, w)``: ``cols = w^T @ dy`` per chunk, then ``fold_block``."""
    n_batch, n_out = dy.shape[0], dy.shape[1]
    rows, area = w2.shape[1], geo.out_h * geo.out_w
    if direct:
        for n in range(n_batch):
            np.dot(w2.T, dy[n].reshape(n_out, area), dx[n].reshape(rows, area))
        return
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * area
        if k == area:
            np.dot(w2.T, dy[start].reshape(n_out, area), colf[:rows * k].reshape(rows, k))
        else:
            gather_planes(dy, start, stop, dyf)
            np.dot(w2.T, dyf[:n_out * k].reshape(n_out, k), colf[:rows * k].reshape(rows, k))
        fold_block(colf, start, stop, plane, dx, geo)


@jit
def bwd_params_gemm_cpu(x, dy, dw2, db, total, product, colf, dyf, xpad, geo, step, direct):
    """``dw2 += sum over chunks of dy @ cols^T`` (``dw2``: ``dw`` as ``[O, C*KH*KW]``), the
    chunks' products added in sample order into ``total`` first; ``db += sum(dy)`` per
    channel, sample after sample (``db`` empty: no bias)."""
    n_batch, n_out = dy.shape[0], dy.shape[1]
    rows, area = dw2.shape[1], geo.out_h * geo.out_w
    total[:] = 0
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        if direct:
            np.dot(dy[start].reshape(n_out, area), x[start].reshape(rows, area).T, product)
        else:
            k = (stop - start) * area
            unfold_block(x, start, stop, xpad, colf, geo)
            cols = colf[:rows * k].reshape(rows, k)
            if k == area:
                np.dot(dy[start].reshape(n_out, area), cols.T, product)
            else:
                gather_planes(dy, start, stop, dyf)
                np.dot(dyf[:n_out * k].reshape(n_out, k), cols.T, product)
        total += product
    dw2 += total
    if db.size:
        gf = dy.reshape(-1)
        for o in range(n_out):
            acc = db[o]
            for n in range(n_batch):
                acc = row_sum(gf, (n * n_out + o) * area, area, acc)
            db[o] = acc


# --------------------------------------------------------------------------- operands

def block_buffers(x_shape, rows, n_out, geo, dtype, buffers=worker_buffer, tag="gemm"):
    """``(colf, planef, xpad, step, direct)``: the worker's flat column block and ``[O, k]``
    block for ``step`` samples, the padded-sample buffer, the chunk size, whether direct."""
    n_batch, _, height, width = x_shape
    direct = is_direct(geo, height, width)
    step = 1 if direct else chunk_samples(n_batch, geo.out_h * geo.out_w)
    k = 0 if direct else step * geo.out_h * geo.out_w
    colf = buffers(f"{tag}:cols", (rows * k,), dtype)
    planef = buffers(f"{tag}:planes", (n_out * k,), dtype)
    return colf, planef, _pad_buffer(x_shape, geo, dtype, buffers), step, direct


def fwd_calls(buffers, x, w, b, y, geo, activation=0):
    """The call of ``fwd_gemm_cpu`` for ``y = act(conv2d(x, w) (+ b))`` (``b`` None: no bias;
    ``activation``: see ``finish_row``)."""
    n_out = w.shape[0]
    w2 = np.ascontiguousarray(w, dtype=y.dtype).reshape(n_out, -1)
    bias = np.empty(0, dtype=y.dtype) if b is None else np.ascontiguousarray(b, dtype=y.dtype)
    colf, outf, xpad, step, direct = block_buffers(x.shape, w2.shape[1], n_out, geo, y.dtype,
                                                   buffers)
    return [(fwd_gemm_cpu, (np.ascontiguousarray(x, dtype=y.dtype), w2, bias, y, colf, outf, xpad, geo, step,
                            direct, activation))]


def with_activation(calls, code):
    """``calls`` (a forward chain's) with the activation ``code`` applied in
    ``fwd_gemm_cpu``'s epilogue when they are its call, else None."""
    kernel, args = calls[-1]
    return calls[:-1] + [(kernel, (*args[:-1], code))] if kernel is fwd_gemm_cpu else None


def bwd_input_calls(buffers, dy, w, dx, geo):
    """The call of ``bwd_input_gemm_cpu`` for ``dx = conv2d^T(dy, w)``."""
    n_out = w.shape[0]
    w2 = np.ascontiguousarray(w, dtype=dx.dtype).reshape(n_out, -1)
    colf, dyf, _, step, direct = block_buffers(dx.shape, w2.shape[1], n_out, geo, dx.dtype,
                                               buffers)
    plane = buffers("gemm:plane", (geo.hp * geo.wp,), dx.dtype)
    return [(bwd_input_gemm_cpu, (np.ascontiguousarray(dy, dtype=dx.dtype), w2, dx, colf, dyf, plane, geo, step,
                                  direct))]


def bwd_params_calls(buffers, x, dy, dw, db, geo):
    """The call of ``bwd_params_gemm_cpu`` adding ``dL/dw`` into ``dw`` (and ``dL/db`` into
    ``db`` unless None)."""
    n_out = dw.shape[0]
    dw2 = dw.reshape(n_out, -1)
    colf, dyf, xpad, step, direct = block_buffers(x.shape, dw2.shape[1], n_out, geo, dw.dtype,
                                                  buffers)
    total = buffers("gemm:total", dw2.shape, dw.dtype)
    product = buffers("gemm:product", dw2.shape, dw.dtype)
    db = dw.reshape(-1)[:0] if db is None else db
    return [(bwd_params_gemm_cpu, (np.ascontiguousarray(x, dtype=dw.dtype),
                                   np.ascontiguousarray(dy, dtype=dw.dtype), dw2, db,
                                   total, product, colf, dyf, xpad, geo, step, direct))]
