"""Winograd F(2x2, 3x3) convolution kernels (Numba + BLAS): the forward pass, the input
gradient and the weight gradient of 3x3, stride-1 convolutions, the ``cpu:winograd``
variants of the five convolution codelets. The input gradient of such a layer with
padding ``p`` is the same kind of convolution of ``dy`` with the filters flipped and
transposed, at padding ``2 - p`` (``bwd_input_calls``). The weight gradient is the
adjoint of the forward pass: the gradient tiles transformed by ``A dY A^T``, 16 GEMMs
``dU[xi] = M'[xi] @ V[xi]^T`` summed over the chunks, then ``G^T dU G`` per filter
(``bwd_params_calls``; layers of ``WEIGHT_MIN_CHANNELS`` channels or more).

Lavin and Gray's minimal filtering: each 2x2 output tile is ``A^T [(G g G^T) * (B^T d
B)] A`` for the 4x4 input tile ``d`` around it and the 3x3 filter ``g``, 16
multiplications where direct convolution takes 36. Summed over input channels the
elementwise products become 16 GEMMs, ``M[xi] = U[xi] @ V[xi]`` with ``U[xi]`` the
transformed filters ``[O, C]`` and ``V[xi]`` the transformed tiles ``[C, k]``: 2.25x
fewer multiply-adds than ``cpu:gemm``'s one GEMM on a 9x larger column block, and a
transformed input 4x (not 9x) the image. ResNet-18 and VGG run nearly all their
FLOPs in such layers.

As in ``conv_gemm.py`` a chunk of the partition's samples (``chunk_samples``: GEMMs at
least ``GEMM_COLUMNS`` tiles wide) is transformed at a time, tile columns sample after
sample; the order of every sum depends only on the shapes, so results are the same
bits whatever the policy or worker. The transforms add and halve, so the rounding
differs from a direct convolution's by a few units of the last place (float32 within
1e-5 of the scale on ResNet-18's layers; the tests bound it at 1e-4, 1e-10 in float64).

``handles`` says which convolutions these kernels take: one group, a 3x3 kernel, stride
and dilation 1, zero padding, at least ``MIN_CHANNELS`` input channels and output images of at least
``MIN_SIDE`` pixels a side (elsewhere the GEMMs are too thin to pay for the transforms). ``geo`` is a
:class:`~hetero_nn.codelets.conv.Conv2dGeometry`.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._rows import row_sum
from .conv_gemm import chunk_samples
from .conv_im2col import worker_buffer

MIN_CHANNELS = 16
"""Fewest input channels the Winograd kernels take."""

MIN_SIDE = 4
"""Least output height and width they take: on 2x2 and 1x1 images the filter transform
and a GEMM one tile per sample wide cost more than they save (0.2-0.6x ``cpu:gemm`` on
ResNet-18's late layers at 32x32 torchvision input, ``benchmarks/bench_conv_gemm.py``)."""


def handles(geo, x_shape) -> bool:
    """Whether ``fwd_winograd_cpu`` takes the convolution (module docstring)."""
    return (geo.groups == 1 and geo.kh == geo.kw == 3 and geo.sh == geo.sw == 1
            and geo.dh == geo.dw == 1 and geo.mode == 0 and x_shape[1] >= MIN_CHANNELS
            and geo.out_h >= MIN_SIDE and geo.out_w >= MIN_SIDE)


WEIGHT_MIN_CHANNELS = 128
"""Fewest input and output channels at which the weight gradient runs here: its 16 GEMMs
are ``[O, k]`` by ``[k, C]``, too thin at 64 channels (1.2-1.7x ``cpu:gemm``'s time on
ResNet-18's 64-channel layers, 0.75-0.9x on its 128- to 512-channel ones:
``benchmarks/bench_conv_shapes.py``)."""


def handles_weight(geo, x_shape, n_out) -> bool:
    """Whether ``bwd_params_calls`` takes the weight gradient: a layer ``handles`` takes,
    with at least ``WEIGHT_MIN_CHANNELS`` input and output channels."""
    return handles(geo, x_shape) and min(x_shape[1], n_out) >= WEIGHT_MIN_CHANNELS


def handles_input(geo, dy_shape) -> bool:
    """Whether ``bwd_input_calls`` takes the input gradient: the layer's padding symmetric and
    at most 2, so that the gradient is the 3x3 stride-1 convolution of ``dy`` with the
    flipped, transposed filters at padding ``2 - p`` (``transposed``), one ``handles`` takes."""
    return (geo.kh == geo.kw == 3 and geo.pt == geo.pb <= 2 and geo.pl == geo.pr <= 2
            and geo.sh == geo.sw == 1 and handles(transposed(geo), dy_shape))


def transposed(geo):
    """The geometry of the input gradient as a convolution of ``dy`` (see ``handles_input``)."""
    pt, pl = 2 - geo.pt, 2 - geo.pl
    height, width = geo.hp - 2 * geo.pt, geo.wp - 2 * geo.pl
    return geo._replace(pt=pt, pb=pt, pl=pl, pr=pl, hp=geo.out_h + 2 * pt,
                        wp=geo.out_w + 2 * pl, out_h=height, out_w=width)


def tiles(geo):
    """``(tiles down, tiles across)``: 2x2 output tiles covering the output image."""
    return (geo.out_h + 1) // 2, (geo.out_w + 1) // 2


@jit
def transform_filters(w, u):
    """``u[xi, o, c] = (G g G^T)[xi]`` for each 3x3 filter ``g = w[o, c]`` (``xi = 4*i + j``)."""
    n_out, n_in = w.shape[0], w.shape[1]
    half = w.dtype.type(0.5)
    t = np.empty((4, 3), dtype=w.dtype)
    for o in range(n_out):
        for c in range(n_in):
            g = w[o, c]
            for q in range(3):  # t = G g
                t[0, q] = g[0, q]
                t[1, q] = (g[0, q] + g[1, q] + g[2, q]) * half
                t[2, q] = (g[0, q] - g[1, q] + g[2, q]) * half
                t[3, q] = g[2, q]
            for i in range(4):  # (G g) G^T
                u[4 * i, o, c] = t[i, 0]
                u[4 * i + 1, o, c] = (t[i, 0] + t[i, 1] + t[i, 2]) * half
                u[4 * i + 2, o, c] = (t[i, 0] - t[i, 1] + t[i, 2]) * half
                u[4 * i + 3, o, c] = t[i, 2]


@jit
def transform_tiles(x, n0, n1, plane, rows, v, geo):
    """``v[xi, c, col] = (B^T d B)[xi]`` for the 4x4 input tile ``d`` of every output tile of
    samples ``n0 <= n < n1`` (``col = (n - n0)*T + ty*TW + tx``); ``plane`` is a zeroed-border
    buffer ``[2*TH + 2, 2*TW + 2]`` holding one padded channel at a time, ``rows`` a
    ``[4, 2*TW + 2]`` buffer for ``B^T`` applied to a band of four of its rows."""
    n_in, height, width = x.shape[1], x.shape[2], x.shape[3]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    hq, wq = plane.shape
    area = th * tw
    for n in range(n0, n1):
        for c in range(n_in):
            plane[:, :] = 0
            for i in range(min(height, hq - geo.pt)):
                for j in range(min(width, wq - geo.pl)):
                    plane[i + geo.pt, j + geo.pl] = x[n, c, i, j]
            for ty in range(th):
                p0, p1, p2, p3 = (plane[2 * ty], plane[2 * ty + 1], plane[2 * ty + 2],
                                  plane[2 * ty + 3])
                for j in range(wq):  # B^T d, a band at a time
                    rows[0, j] = p0[j] - p2[j]
                    rows[1, j] = p1[j] + p2[j]
                    rows[2, j] = p2[j] - p1[j]
                    rows[3, j] = p1[j] - p3[j]
                col = (n - n0) * area + ty * tw
                for a in range(4):  # (B^T d) B, tile after tile along the band
                    r = rows[a]
                    v0, v1 = v[4 * a, c], v[4 * a + 1, c]
                    v2, v3 = v[4 * a + 2, c], v[4 * a + 3, c]
                    for tx in range(tw):
                        q = 2 * tx
                        v0[col + tx] = r[q] - r[q + 2]
                        v1[col + tx] = r[q + 1] + r[q + 2]
                        v2[col + tx] = r[q + 2] - r[q + 1]
                        v3[col + tx] = r[q + 1] - r[q + 3]


@jit
def untransform_tiles(m, n0, n1, bias, band, y):
    """``y[n, o]``'s 2x2 tiles ``= A^T m A (+ bias[o])`` from ``m[xi, o, col]``, the part of
    each tile inside the output image; ``band`` a ``[2, 4, TW]`` buffer for ``A^T m``."""
    n_out, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    th, tw = (out_h + 1) // 2, (out_w + 1) // 2
    full = out_w // 2  # tiles whose two columns are inside the image
    area = th * tw
    for n in range(n0, n1):
        for o in range(n_out):
            b0 = bias[o] if bias.size else y.dtype.type(0)
            for ty in range(th):
                col = (n - n0) * area + ty * tw
                for b in range(4):  # A^T m
                    m0, m1 = m[b, o, col:col + tw], m[4 + b, o, col:col + tw]
                    m2, m3 = m[8 + b, o, col:col + tw], m[12 + b, o, col:col + tw]
                    s0, s1 = band[0, b], band[1, b]
                    for tx in range(tw):
                        s0[tx] = m0[tx] + m1[tx] + m2[tx]
                        s1[tx] = m1[tx] - m2[tx] - m3[tx]
                for a in range(min(2, out_h - 2 * ty)):  # (A^T m) A
                    s = band[a]
                    out = y[n, o, 2 * ty + a]
                    for tx in range(full):
                        out[2 * tx] = s[0, tx] + s[1, tx] + s[2, tx] + b0
                        out[2 * tx + 1] = s[1, tx] - s[2, tx] - s[3, tx] + b0
                    if full < tw:
                        out[2 * full] = s[0, full] + s[1, full] + s[2, full] + b0


@jit
def fwd_winograd_cpu(x, w, bias, y, u, v, m, plane, rows, band, geo, step):
    """``y = conv2d(x, w) (+ bias)`` (``bias`` empty: none), ``step`` samples at a time;
    ``u``, ``v``, ``m`` flat buffers for the transformed filters, tiles and products."""
    n_batch, n_in, n_out = x.shape[0], x.shape[1], w.shape[0]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    u3 = u.reshape(16, n_out, n_in)
    transform_filters(w, u3)
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * th * tw
        v3 = v[:16 * n_in * k].reshape(16, n_in, k)
        m3 = m[:16 * n_out * k].reshape(16, n_out, k)
        transform_tiles(x, start, stop, plane, rows, v3, geo)
        for xi in range(16):
            np.dot(u3[xi], v3[xi], m3[xi])
        untransform_tiles(m3, start, stop, bias, band, y)


def _chunk_buffers(buffers, geo, n_batch, n_in, n_out, dtype):
    """``(step, v, m, plane, rows)``: samples per chunk and the worker's buffers for a
    chunk's transformed tiles ``V`` and products ``M`` (flat), and ``transform_tiles``'s."""
    th, tw = tiles(geo)
    step = chunk_samples(n_batch, th * tw)
    k = step * th * tw
    return (step, buffers("winograd:v", (16 * n_in * k,), dtype),
            buffers("winograd:m", (16 * n_out * k,), dtype),
            buffers("winograd:plane", (2 * th + 2, 2 * tw + 2), dtype),
            buffers("winograd:rows", (4, 2 * tw + 2), dtype))


def fwd_calls(buffers, x, w, b, y, geo):
    """The call of ``fwd_winograd_cpu`` for ``y = conv2d(x, w) (+ b)`` (``b`` None: no bias)."""
    n_batch, n_in = x.shape[0], x.shape[1]
    n_out = w.shape[0]
    step, v, m, plane, rows = _chunk_buffers(buffers, geo, n_batch, n_in, n_out, y.dtype)
    u = buffers("winograd:u", (16 * n_out * n_in,), y.dtype)
    band = buffers("winograd:band", (2, 4, tiles(geo)[1]), y.dtype)
    bias = np.empty(0, dtype=y.dtype) if b is None else np.ascontiguousarray(b, dtype=y.dtype)
    return [(fwd_winograd_cpu, (np.ascontiguousarray(x, dtype=y.dtype),
                                np.ascontiguousarray(w, dtype=y.dtype), bias, y, u, v, m,
                                plane, rows, band, geo, step))]


@jit
def flip_filters(w, flipped):
    """``flipped[c, o, i, j] = w[o, c, 2 - i, 2 - j]``: the filters of the input gradient."""
    for o in range(w.shape[0]):
        for c in range(w.shape[1]):
            for i in range(3):
                for j in range(3):
                    flipped[c, o, i, j] = w[o, c, 2 - i, 2 - j]


def bwd_input_calls(buffers, dy, w, dx, geo):
    """The calls for ``dx = conv2d^T(dy, w)`` as the convolution of ``dy`` with the flipped
    filters (``handles_input``); ``geo`` the layer's geometry."""
    flipped = buffers("winograd:flipped", (w.shape[1], w.shape[0], 3, 3), dx.dtype)
    return [(flip_filters, (np.ascontiguousarray(w, dtype=dx.dtype), flipped)),
            *fwd_calls(buffers, dy, flipped, None, dx, transposed(geo))]


def run(x, w, b, y, geo):
    """``fwd_calls`` run now, on the calling thread's buffers."""
    for kernel, args in fwd_calls(worker_buffer, x, w, b, y, geo):
        kernel(*args)


# --------------------------------------------------------------------------- weight gradient

@jit
def transform_grads(dy, n0, n1, m):
    """``m[xi, o, col] = (A dY A^T)[xi]`` for the 2x2 tile ``dY`` of ``dy`` (zeros past the
    image) at each column of ``transform_tiles``: the adjoint of ``untransform_tiles``."""
    n_out, out_h, out_w = dy.shape[1], dy.shape[2], dy.shape[3]
    th, tw = (out_h + 1) // 2, (out_w + 1) // 2
    zero = dy.dtype.type(0)
    for n in range(n0, n1):
        for o in range(n_out):
            for ty in range(th):
                i = 2 * ty
                col = (n - n0) * th * tw + ty * tw
                for tx in range(tw):
                    j = 2 * tx
                    right = j + 1 < out_w
                    d00 = dy[n, o, i, j]
                    d01 = dy[n, o, i, j + 1] if right else zero
                    d10 = dy[n, o, i + 1, j] if i + 1 < out_h else zero
                    d11 = dy[n, o, i + 1, j + 1] if right and i + 1 < out_h else zero
                    for a in range(4):  # row a of A dY, then that row times A^T
                        if a == 0:
                            p0, p1 = d00, d01
                        elif a == 1:
                            p0, p1 = d00 + d10, d01 + d11
                        elif a == 2:
                            p0, p1 = d00 - d10, d01 - d11
                        else:
                            p0, p1 = -d10, -d11
                        m[4 * a, o, col + tx] = p0
                        m[4 * a + 1, o, col + tx] = p0 + p1
                        m[4 * a + 2, o, col + tx] = p0 - p1
                        m[4 * a + 3, o, col + tx] = -p1


@jit
def untransform_filters(total, dw):
    """``dw[o, c] += G^T T G`` for the 4x4 ``T = total[:, o, c]``: the adjoint of
    ``transform_filters``."""
    half = dw.dtype.type(0.5)
    s = np.empty((3, 4), dtype=dw.dtype)
    for o in range(dw.shape[0]):
        for c in range(dw.shape[1]):
            for j in range(4):  # G^T T
                t0, t1 = total[j, o, c], total[4 + j, o, c]
                t2, t3 = total[8 + j, o, c], total[12 + j, o, c]
                s[0, j] = t0 + (t1 + t2) * half
                s[1, j] = (t1 - t2) * half
                s[2, j] = (t1 + t2) * half + t3
            g = dw[o, c]
            for r in range(3):  # (G^T T) G
                g[r, 0] += s[r, 0] + (s[r, 1] + s[r, 2]) * half
                g[r, 1] += (s[r, 1] - s[r, 2]) * half
                g[r, 2] += (s[r, 1] + s[r, 2]) * half + s[r, 3]


@jit
def bwd_params_winograd_cpu(x, dy, dw, db, v, m, product, total, plane, rows, geo, step):
    """``dw += dL/dw`` (and ``db += sum(dy)`` per channel unless ``db`` is empty): per chunk,
    ``M'[xi] @ V[xi]^T`` (``M'`` the transformed gradient tiles, ``V`` the input's), the
    first chunk's straight into ``total``, the later ones' into ``product`` then added in
    order, then ``G^T total G`` per filter."""
    n_batch, n_in, n_out = x.shape[0], x.shape[1], dy.shape[1]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    total3 = total.reshape(16, n_out, n_in)
    product3 = product.reshape(16, n_out, n_in) if product.size else total3  # one chunk
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * th * tw
        v3 = v[:16 * n_in * k].reshape(16, n_in, k)
        m3 = m[:16 * n_out * k].reshape(16, n_out, k)
        transform_tiles(x, start, stop, plane, rows, v3, geo)
        transform_grads(dy, start, stop, m3)
        for xi in range(16):
            if start == 0:
                np.dot(m3[xi], v3[xi].T, total3[xi])
            else:
                np.dot(m3[xi], v3[xi].T, product3[xi])
        if start > 0:
            total += product
    untransform_filters(total3, dw)
    area = geo.out_h * geo.out_w
    gf = dy.reshape(-1)
    for o in range(db.size):
        acc = db[o]
        for n in range(n_batch):
            acc = row_sum(gf, (n * n_out + o) * area, area, acc)
        db[o] = acc


def bwd_params_calls(buffers, x, dy, dw, db, geo):
    """The call of ``bwd_params_winograd_cpu`` adding ``dL/dw`` into ``dw`` (and ``dL/db``
    into ``db`` unless None); ``geo`` the layer's geometry (``handles_weight``)."""
    n_batch, n_in = x.shape[0], x.shape[1]
    n_out, dtype = dw.shape[0], dw.dtype
    step, v, m, plane, rows = _chunk_buffers(buffers, geo, n_batch, n_in, n_out, dtype)
    product = buffers("winograd:product", (16 * n_out * n_in if step < n_batch else 0,), dtype)
    total = buffers("winograd:total", (16 * n_out * n_in,), dtype)
    db = dw.reshape(-1)[:0] if db is None else db
    return [(bwd_params_winograd_cpu, (np.ascontiguousarray(x, dtype=dtype),
                                       np.ascontiguousarray(dy, dtype=dtype), dw, db, v, m,
                                       product, total, plane, rows, geo, step))]
