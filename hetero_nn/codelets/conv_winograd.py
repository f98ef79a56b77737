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

The transformed filters, tiles and products (and the weight gradient's sums) are flat
buffers of 16 planes, ``plane_stride`` apart: ``PLANE_PAD`` elements between planes keep
them out of each other's cache sets, as the transforms read or write all 16 at once, each
tile or filter in registers.

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

from ._jit import jit, jit_inline
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


PLANE_PAD = 32
"""Elements left between the 16 planes of a transformed buffer (``u``, ``v``, ``m``, the
weight gradient's sums): planes a power of two apart (512x512 filters: 1 MB) share their
cache sets, and the transforms, which write or read all 16 planes at once, then miss on
nearly every access (``transform_filters`` 3-6x slower on ResNet-18's and VGG's layers)."""


def plane_stride(size):
    """Elements from one plane of ``size`` elements to the next (``PLANE_PAD`` between)."""
    return size + PLANE_PAD


@jit_inline
def _plane(buf, xi, stride, rows, cols):
    """Plane ``xi`` of the flat buffer ``buf`` (planes ``stride`` apart) as ``[rows, cols]``."""
    return buf[xi * stride:xi * stride + rows * cols].reshape(rows, cols)


@jit_inline
def _runs(buf, e, ps, length):
    """The 16 runs ``buf[xi*ps + e:][:length]``: one row (or part) of each plane."""
    return (buf[e:e + length], buf[ps + e:ps + e + length], buf[2 * ps + e:2 * ps + e + length],
            buf[3 * ps + e:3 * ps + e + length], buf[4 * ps + e:4 * ps + e + length],
            buf[5 * ps + e:5 * ps + e + length], buf[6 * ps + e:6 * ps + e + length],
            buf[7 * ps + e:7 * ps + e + length], buf[8 * ps + e:8 * ps + e + length],
            buf[9 * ps + e:9 * ps + e + length], buf[10 * ps + e:10 * ps + e + length],
            buf[11 * ps + e:11 * ps + e + length], buf[12 * ps + e:12 * ps + e + length],
            buf[13 * ps + e:13 * ps + e + length], buf[14 * ps + e:14 * ps + e + length],
            buf[15 * ps + e:15 * ps + e + length])


@jit
def transform_filters(w, u, ps, flipped):
    """Plane ``xi = 4*i + j`` of ``u`` (planes ``ps`` apart, each ``[O, C]``) ``= (G g G^T)[i,
    j]`` for each 3x3 filter ``g = w[o, c]``: a filter's taps and ``G g`` in registers, an
    output channel's filters along the 16 planes' rows. ``flipped``: the filters of the
    input gradient instead (``handles_input``), ``g = w[c, o]`` turned by 180 degrees at row
    ``o`` (an input channel of ``w``) and column ``c``."""
    n_in = w.shape[1]
    n_rows, n_cols = (n_in, w.shape[0]) if flipped else (w.shape[0], n_in)
    half = w.dtype.type(0.5)
    wf = w.reshape(-1)
    for o in range(n_rows):
        u0, u1, u2, u3, u4, u5, u6, u7, u8, u9, u10, u11, u12, u13, u14, u15 = _runs(
            u, o * n_cols, ps, n_cols)
        for c in range(n_cols):
            if flipped:
                b = 9 * (c * n_in + o)
                g00, g01, g02 = wf[b + 8], wf[b + 7], wf[b + 6]
                g10, g11, g12 = wf[b + 5], wf[b + 4], wf[b + 3]
                g20, g21, g22 = wf[b + 2], wf[b + 1], wf[b]
            else:
                b = 9 * (o * n_in + c)
                g00, g01, g02 = wf[b], wf[b + 1], wf[b + 2]
                g10, g11, g12 = wf[b + 3], wf[b + 4], wf[b + 5]
                g20, g21, g22 = wf[b + 6], wf[b + 7], wf[b + 8]
            t10, t11, t12 = ((g00 + g10 + g20) * half, (g01 + g11 + g21) * half,
                             (g02 + g12 + g22) * half)                          # G g: row 1
            t20, t21, t22 = ((g00 - g10 + g20) * half, (g01 - g11 + g21) * half,
                             (g02 - g12 + g22) * half)                          # row 2
            u0[c], u1[c] = g00, (g00 + g01 + g02) * half                        # (G g) G^T
            u2[c], u3[c] = (g00 - g01 + g02) * half, g02
            u4[c], u5[c] = t10, (t10 + t11 + t12) * half
            u6[c], u7[c] = (t10 - t11 + t12) * half, t12
            u8[c], u9[c] = t20, (t20 + t21 + t22) * half
            u10[c], u11[c] = (t20 - t21 + t22) * half, t22
            u12[c], u13[c] = g20, (g20 + g21 + g22) * half
            u14[c], u15[c] = (g20 - g21 + g22) * half, g22


@jit
def transform_tiles(x, n0, n1, plane, v, ps, geo):
    """Plane ``xi`` of ``v`` (planes ``ps`` apart, each ``[C, k]``, ``k = (n1 - n0)*T``)
    ``= (B^T d B)[xi]`` at column ``(n - n0)*T + ty*TW + tx`` for the 4x4 input tile ``d``
    of every output tile of samples ``n0 <= n < n1``; ``plane`` is a zeroed-border buffer
    ``[2*TH + 2, 2*TW + 2]`` holding one padded channel at a time. Each tile is transformed in
    registers: rows ``B^T d``, then each row times ``B``."""
    n_in, height, width = x.shape[1], x.shape[2], x.shape[3]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    hq, wq = plane.shape
    area = th * tw
    k = (n1 - n0) * area
    for n in range(n0, n1):
        for c in range(n_in):
            plane[:, :] = 0
            for i in range(min(height, hq - geo.pt)):
                for j in range(min(width, wq - geo.pl)):
                    plane[i + geo.pt, j + geo.pl] = x[n, c, i, j]
            e = c * k + (n - n0) * area
            (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15) = _runs(
                v, e, ps, area)
            for ty in range(th):
                p0, p1, p2, p3 = (plane[2 * ty], plane[2 * ty + 1], plane[2 * ty + 2],
                                  plane[2 * ty + 3])
                for tx in range(tw):
                    q, t = 2 * tx, ty * tw + tx
                    a00, a01 = p0[q] - p2[q], p0[q + 1] - p2[q + 1]             # B^T d
                    a02, a03 = p0[q + 2] - p2[q + 2], p0[q + 3] - p2[q + 3]
                    a10, a11 = p1[q] + p2[q], p1[q + 1] + p2[q + 1]
                    a12, a13 = p1[q + 2] + p2[q + 2], p1[q + 3] + p2[q + 3]
                    a20, a21 = p2[q] - p1[q], p2[q + 1] - p1[q + 1]
                    a22, a23 = p2[q + 2] - p1[q + 2], p2[q + 3] - p1[q + 3]
                    a30, a31 = p1[q] - p3[q], p1[q + 1] - p3[q + 1]
                    a32, a33 = p1[q + 2] - p3[q + 2], p1[q + 3] - p3[q + 3]
                    v0[t], v1[t], v2[t], v3[t] = a00 - a02, a01 + a02, a02 - a01, a01 - a03
                    v4[t], v5[t], v6[t], v7[t] = a10 - a12, a11 + a12, a12 - a11, a11 - a13
                    v8[t], v9[t], v10[t], v11[t] = a20 - a22, a21 + a22, a22 - a21, a21 - a23
                    v12[t], v13[t], v14[t], v15[t] = a30 - a32, a31 + a32, a32 - a31, a31 - a33


@jit
def untransform_tiles(m, n0, n1, bias, y, ps):
    """``y[n, o]``'s 2x2 tiles ``= A^T m A (+ bias[o])`` from plane ``xi`` of ``m`` (planes
    ``ps`` apart, each ``[O, k]``), the part of each tile inside the output image; each tile
    in registers."""
    n_out, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    th, tw = (out_h + 1) // 2, (out_w + 1) // 2
    area = th * tw
    k = (n1 - n0) * area
    for n in range(n0, n1):
        for o in range(n_out):
            b0 = bias[o] if bias.size else y.dtype.type(0)
            e = o * k + (n - n0) * area
            (m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15) = _runs(
                m, e, ps, area)
            yo = y[n, o]
            for ty in range(th):
                i = 2 * ty
                for tx in range(tw):
                    t, j = ty * tw + tx, 2 * tx
                    s00, s01 = m0[t] + m4[t] + m8[t], m1[t] + m5[t] + m9[t]      # A^T m
                    s02, s03 = m2[t] + m6[t] + m10[t], m3[t] + m7[t] + m11[t]
                    s10, s11 = m4[t] - m8[t] - m12[t], m5[t] - m9[t] - m13[t]
                    s12, s13 = m6[t] - m10[t] - m14[t], m7[t] - m11[t] - m15[t]
                    yo[i, j] = s00 + s01 + s02 + b0                               # (A^T m) A
                    if j + 1 < out_w:
                        yo[i, j + 1] = s01 - s02 - s03 + b0
                    if i + 1 < out_h:
                        yo[i + 1, j] = s10 + s11 + s12 + b0
                        if j + 1 < out_w:
                            yo[i + 1, j + 1] = s11 - s12 - s13 + b0


@jit
def fwd_winograd_cpu(x, w, bias, y, u, v, m, plane, geo, step, flipped):
    """``y = conv2d(x, w) (+ bias)`` (``bias`` empty: none; ``flipped``: ``w``'s flipped,
    transposed filters, ``transform_filters``), ``step`` samples at a time; ``u``, ``v``,
    ``m`` flat buffers of 16 planes (``plane_stride`` apart) for the transformed filters,
    tiles and products."""
    n_batch, n_in, n_out = x.shape[0], x.shape[1], y.shape[1]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    psu, k_step = n_out * n_in + PLANE_PAD, step * th * tw
    psv, psm = n_in * k_step + PLANE_PAD, n_out * k_step + PLANE_PAD
    transform_filters(w, u, psu, flipped)
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * th * tw
        transform_tiles(x, start, stop, plane, v, psv, geo)
        for xi in range(16):
            np.dot(_plane(u, xi, psu, n_out, n_in), _plane(v, xi, psv, n_in, k),
                   _plane(m, xi, psm, n_out, k))
        untransform_tiles(m, start, stop, bias, y, psm)


def _chunk_buffers(buffers, geo, n_batch, n_in, n_out, dtype):
    """``(step, v, m, plane)``: samples per chunk and the worker's buffers for a chunk's
    transformed tiles ``V`` and products ``M`` (16 planes each, ``plane_stride`` apart), and
    ``transform_tiles``'s padded channel."""
    th, tw = tiles(geo)
    step = chunk_samples(n_batch, th * tw)
    k = step * th * tw
    return (step, buffers("winograd:v", (16 * plane_stride(n_in * k),), dtype),
            buffers("winograd:m", (16 * plane_stride(n_out * k),), dtype),
            buffers("winograd:plane", (2 * th + 2, 2 * tw + 2), dtype))


def fwd_calls(buffers, x, w, b, y, geo, flipped=False):
    """The call of ``fwd_winograd_cpu`` for ``y = conv2d(x, w) (+ b)`` (``b`` None: no bias;
    ``flipped``: with ``w``'s flipped, transposed filters)."""
    n_batch, n_in = x.shape[0], x.shape[1]
    n_out = y.shape[1]
    step, v, m, plane = _chunk_buffers(buffers, geo, n_batch, n_in, n_out, y.dtype)
    u = buffers("winograd:u", (16 * plane_stride(n_out * n_in),), y.dtype)
    bias = np.empty(0, dtype=y.dtype) if b is None else np.ascontiguousarray(b, dtype=y.dtype)
    return [(fwd_winograd_cpu, (np.ascontiguousarray(x, dtype=y.dtype),
                                np.ascontiguousarray(w, dtype=y.dtype), bias, y, u, v, m,
                                plane, geo, step, flipped))]


def bwd_input_calls(buffers, dy, w, dx, geo):
    """The call for ``dx = conv2d^T(dy, w)`` as the convolution of ``dy`` with the flipped,
    transposed filters (``handles_input``); ``geo`` the layer's geometry."""
    return fwd_calls(buffers, dy, w, None, dx, transposed(geo), flipped=True)


def run(x, w, b, y, geo):
    """``fwd_calls`` run now, on the calling thread's buffers."""
    for kernel, args in fwd_calls(worker_buffer, x, w, b, y, geo):
        kernel(*args)


# --------------------------------------------------------------------------- weight gradient

@jit
def transform_grads(dy, n0, n1, m, ps):
    """Plane ``xi`` of ``m`` (planes ``ps`` apart, each ``[O, k]``) ``= (A dY A^T)[xi]`` for
    the 2x2 tile ``dY`` of ``dy`` (zeros past the image) at each column of
    ``transform_tiles``: the adjoint of ``untransform_tiles``."""
    n_out, out_h, out_w = dy.shape[1], dy.shape[2], dy.shape[3]
    th, tw = (out_h + 1) // 2, (out_w + 1) // 2
    area = th * tw
    k = (n1 - n0) * area
    zero = dy.dtype.type(0)
    for n in range(n0, n1):
        for o in range(n_out):
            e = o * k + (n - n0) * area
            for ty in range(th):
                i = 2 * ty
                for tx in range(tw):
                    j, t = 2 * tx, e + ty * tw + tx
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
                        m[4 * a * ps + t] = p0
                        m[(4 * a + 1) * ps + t] = p0 + p1
                        m[(4 * a + 2) * ps + t] = p0 - p1
                        m[(4 * a + 3) * ps + t] = -p1


@jit
def untransform_filters(total, dw, ps):
    """``dw[o, c] += G^T T G`` for the 4x4 ``T`` at ``[o, c]`` of the 16 planes of ``total``
    (``ps`` apart, each ``[O, C]``): the adjoint of ``transform_filters``."""
    half = dw.dtype.type(0.5)
    s = np.empty((3, 4), dtype=dw.dtype)
    n_in = dw.shape[1]
    for o in range(dw.shape[0]):
        for c in range(n_in):
            e = o * n_in + c
            for j in range(4):  # G^T T
                t0, t1 = total[j * ps + e], total[(4 + j) * ps + e]
                t2, t3 = total[(8 + j) * ps + e], total[(12 + j) * ps + e]
                s[0, j] = t0 + (t1 + t2) * half
                s[1, j] = (t1 - t2) * half
                s[2, j] = (t1 + t2) * half + t3
            g = dw[o, c]
            for r in range(3):  # (G^T T) G
                g[r, 0] += s[r, 0] + (s[r, 1] + s[r, 2]) * half
                g[r, 1] += (s[r, 1] - s[r, 2]) * half
                g[r, 2] += (s[r, 1] + s[r, 2]) * half + s[r, 3]


@jit
def bwd_params_winograd_cpu(x, dy, dw, db, v, m, product, total, plane, geo, step):
    """``dw += dL/dw`` (and ``db += sum(dy)`` per channel unless ``db`` is empty): per chunk,
    ``M'[xi] @ V[xi]^T`` (``M'`` the transformed gradient tiles, ``V`` the input's), the
    first chunk's straight into ``total``, the later ones' into ``product`` then added in
    order, then ``G^T total G`` per filter (all flat buffers of 16 planes, ``plane_stride``
    apart)."""
    n_batch, n_in, n_out = x.shape[0], x.shape[1], dy.shape[1]
    th, tw = (geo.out_h + 1) // 2, (geo.out_w + 1) // 2
    pst, k_step = n_out * n_in + PLANE_PAD, step * th * tw
    psv, psm = n_in * k_step + PLANE_PAD, n_out * k_step + PLANE_PAD
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        k = (stop - start) * th * tw
        transform_tiles(x, start, stop, plane, v, psv, geo)
        transform_grads(dy, start, stop, m, psm)
        for xi in range(16):
            grads, tiles_t = _plane(m, xi, psm, n_out, k), _plane(v, xi, psv, n_in, k).T
            if start == 0:
                np.dot(grads, tiles_t, _plane(total, xi, pst, n_out, n_in))
            else:
                np.dot(grads, tiles_t, _plane(product, xi, pst, n_out, n_in))
        if start > 0:
            for xi in range(16):
                sums = _plane(total, xi, pst, n_out, n_in)
                sums += _plane(product, xi, pst, n_out, n_in)
    untransform_filters(total, dw, pst)
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
    step, v, m, plane = _chunk_buffers(buffers, geo, n_batch, n_in, n_out, dtype)
    sums = 16 * plane_stride(n_out * n_in)
    product = buffers("winograd:product", (sums if step < n_batch else 0,), dtype)
    total = buffers("winograd:total", (sums,), dtype)
    db = dw.reshape(-1)[:0] if db is None else db
    return [(bwd_params_winograd_cpu, (np.ascontiguousarray(x, dtype=dtype),
                                       np.ascontiguousarray(dy, dtype=dtype), dw, db, v, m,
                                       product, total, plane, geo, step))]
