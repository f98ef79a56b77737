"""Unrolled-filter convolution kernels (Numba + BLAS): the ``cpu:unrolled`` variants, for
images no larger than the kernel.

On the last layers of real models the images are tiny: at 32x32 input, torchvision's
ResNet-18 runs its layer3 on 2x2 and its layer4 on 1x1 images. There a padded 3x3
window is mostly zeros (8 of its 9 taps at 1x1), and ``cpu:gemm``'s column block is
9x the input, gathered and scattered for a GEMM a few columns per sample wide.

A convolution is a linear map from a sample's ``C*H*W`` inputs to its ``O*OH*OW``
outputs: the *unrolled filters* ``U[O*OH*OW, C*H*W]``, with ``U[(o, i, j), (c, h, x)] =
w[o, c, p, q]`` for the tap ``(p, q)`` that output ``(i, j)`` reads at input ``(h, x)``
(``h = i*SH + p*DH - PT``, ``x = j*SW + q*DW - PL``; zero where no tap lands; in
padding modes other than zeros, a tap landing in the border adds onto the input
position the mode copies, ``padding.source``). NCHW already lays each sample out as
one row of ``X[N, C*H*W]``, so each pass is ONE GEMM over the partition on the operands
in place, with the batch as the GEMM's rows: no column block, no scatter, no col2im:

- forward: ``Y = X @ U^T`` (then ``+ b`` per output channel);
- input gradient: ``dX = dY @ U``;
- weight gradient: ``dU = dY^T @ X``, then ``dw[o, c, p, q] += sum_{i, j} dU[(o, i, j),
  (c, h, x)]`` over the positions the tap reads (the sum over ``(i, j)`` in order, then
  added to ``dw``); ``db += sum(dy)`` per channel, sample after sample.

``U`` has ``H*W / (KH*KW)`` times the multiply-adds of the im2col GEMM, so ``handles``
takes the layers whose input image has at most ``KH*KW`` pixels: a 3x3 layer on 1x1
images is the GEMM of its centre taps (1/9 of ``cpu:gemm``'s), on 2x2 images 4/9; a
1x1 convolution on 1x1 images is a plain GEMM. ``U`` is built per task from ``w`` (the
weights change every step) into a worker buffer, at most ``MAX_ELEMENTS`` entries. With
zero padding the entries no tap reaches are the same for every task of one geometry,
so the buffer is tagged by the geometry, made zeros once, and each task writes only
the taps.

Where an output reads only some of the inputs (3x3 images), ``U``'s zeros multiply the
others: an inf or NaN input then reaches every output of its sample (``0 * inf`` is NaN),
where a direct convolution keeps it to the outputs that read it. The order of every sum
depends only on the shapes (one BLAS call per pass, the fold in a fixed order), so
results are the same bits whatever the policy or worker. ``geo`` is a
:class:`~hetero_nn.codelets.conv_geometry.Conv2dGeometry`.
"""

from __future__ import annotations

import functools

import numpy as np

from ._jit import jit
from ._rows import row_sum
from .padding import ZEROS, source

MAX_ELEMENTS = 1 << 22
"""Most entries of one unrolled filter matrix (16 MB in float32): ResNet-18's largest at
32x32 input is 256 channels on 2x2 images, ``1024 x 1024``."""


def handles(geo, x_shape, n_out) -> bool:
    """Whether these kernels take the convolution: one group, an input image of at most
    ``KH*KW`` pixels, and unrolled filters of at most ``MAX_ELEMENTS`` entries."""
    _, n_in, height, width = x_shape
    area_in, area_out = height * width, geo.out_h * geo.out_w
    return (geo.groups == 1 and area_in <= geo.kh * geo.kw
            and n_out * area_out * n_in * area_in <= MAX_ELEMENTS)


# --------------------------------------------------------------------------- kernels

@functools.lru_cache(maxsize=256)
def tap_table(geo, height, width):
    """``[entries, 3]`` (intp; shared, never written): for each output ``(i, j)`` and each tap ``(p,
    q)`` that lands on an input ``(h, x)``, in that order, ``(i*OW + j, h*W + x, p*KW +
    q)``."""
    entries = []
    for i in range(geo.out_h):
        for j in range(geo.out_w):
            for p in range(geo.kh):
                h = source(i * geo.sh + p * geo.dh - geo.pt, height, geo.mode)
                for q in range(geo.kw):
                    s = source(j * geo.sw + q * geo.dw - geo.pl, width, geo.mode)
                    if h >= 0 and s >= 0:
                        entries.append((i * geo.out_w + j, h * width + s, p * geo.kw + q))
    return np.array(entries, dtype=np.intp).reshape(-1, 3)


@jit
def unroll_filters(w, u, taps, zeros):
    """``u = U`` of ``w`` (module docstring) from the ``tap_table``: with zero padding
    (``zeros``) only the taps' entries are written (the others are zeros already); in
    another mode ``u`` is zeroed and taps that land on one input position add up, in
    tap order."""
    n_out, n_in = w.shape[0], w.shape[1]
    area_out, area_in = u.shape[0] // n_out, u.shape[1] // n_in
    w3 = w.reshape(n_out, n_in, -1)
    if not zeros:
        u[:, :] = 0
    for o in range(n_out):
        for e in range(taps.shape[0]):
            row, col, tap = o * area_out + taps[e, 0], taps[e, 1], taps[e, 2]
            if zeros:
                for c in range(n_in):
                    u[row, c * area_in + col] = w3[o, c, tap]
            else:
                for c in range(n_in):
                    u[row, c * area_in + col] += w3[o, c, tap]


@jit
def fwd_unrolled_cpu(x2, w, bias, y2, u, taps, zeros):
    """``y2 = x2 @ U^T (+ bias)``: ``x2``, ``y2`` the partition as ``[N, C*H*W]``, ``[N,
    O*OH*OW]``; ``bias`` empty for none."""
    unroll_filters(w, u, taps, zeros)
    unrolled_gemm(x2, bias, y2, u, w.shape[0])


@jit
def unrolled_gemm(x2, bias, y2, u, n_out):
    """``y2 = x2 @ u^T (+ bias)`` on unrolled filters ``u`` of ``n_out`` output channels
    (``bias`` empty for none)."""
    np.dot(x2, u.T, y2)
    area = u.shape[0] // n_out
    for n in range(y2.shape[0]):
        for o in range(bias.size):
            b = bias[o]
            for k in range(o * area, (o + 1) * area):
                y2[n, k] += b


@jit
def bwd_input_unrolled_cpu(dy2, w, dx2, u, taps, zeros):
    """``dx2 = dy2 @ U``, overwritten."""
    unroll_filters(w, u, taps, zeros)
    np.dot(dy2, u, dx2)


@jit
def bwd_params_unrolled_cpu(x2, dy2, dw, db, du, acc, taps):
    """``dw += fold(dy2^T @ x2)`` (module docstring; ``acc`` a ``C*KH*KW`` buffer) and ``db +=
    sum(dy)`` per channel (``db`` empty: no bias)."""
    np.dot(dy2.T, x2, du)
    n_out, n_in = dw.shape[0], dw.shape[1]
    area_out, area_in = du.shape[0] // n_out, du.shape[1] // n_in
    per_channel = acc.size // n_in
    dw2 = dw.reshape(n_out, -1)
    for o in range(n_out):
        acc[:] = 0
        for e in range(taps.shape[0]):
            row, col, tap = o * area_out + taps[e, 0], taps[e, 1], taps[e, 2]
            for c in range(n_in):
                acc[c * per_channel + tap] += du[row, c * area_in + col]
        for k in range(acc.size):
            dw2[o, k] += acc[k]
    gf = dy2.reshape(-1)
    for o in range(db.size):
        total = db[o]
        for n in range(dy2.shape[0]):
            total = row_sum(gf, (n * n_out + o) * area_out, area_out, total)
        db[o] = total


# --------------------------------------------------------------------------- calls

def _shape(geo, x_shape, n_out):
    """``U``'s shape, ``[O*OH*OW, C*H*W]``."""
    return (n_out * geo.out_h * geo.out_w, x_shape[1] * x_shape[2] * x_shape[3])


def filters_buffer(buffers, geo, x_shape, n_out, dtype):
    """The worker's buffer for ``U``, tagged by the geometry and made zeros once (see the
    module docstring)."""
    return buffers(("unrolled:u", geo, *x_shape[2:]), _shape(geo, x_shape, n_out), dtype,
                   zero=True)


def fwd_calls(buffers, x, w, b, y, geo):
    """The call of ``fwd_unrolled_cpu`` for ``y = conv2d(x, w) (+ b)`` (``b`` None: no bias)."""
    n_batch, _, height, width = x.shape
    dtype = y.dtype
    bias = np.empty(0, dtype) if b is None else np.ascontiguousarray(b, dtype=dtype)
    u = filters_buffer(buffers, geo, x.shape, w.shape[0], dtype)
    return [(fwd_unrolled_cpu, (np.ascontiguousarray(x, dtype=dtype).reshape(n_batch, -1),
                                np.ascontiguousarray(w, dtype=dtype), bias,
                                y.reshape(n_batch, -1), u, tap_table(geo, height, width),
                                geo.mode == ZEROS))]


def bwd_input_calls(buffers, dy, w, dx, geo):
    """The call of ``bwd_input_unrolled_cpu`` for ``dx = conv2d^T(dy, w)``."""
    n_batch, _, height, width = dx.shape
    dtype = dx.dtype
    u = filters_buffer(buffers, geo, dx.shape, w.shape[0], dtype)
    return [(bwd_input_unrolled_cpu, (np.ascontiguousarray(dy, dtype=dtype).reshape(n_batch, -1),
                                      np.ascontiguousarray(w, dtype=dtype),
                                      dx.reshape(n_batch, -1), u, tap_table(geo, height, width),
                                      geo.mode == ZEROS))]


def bwd_params_calls(buffers, x, dy, dw, db, geo):
    """The call of ``bwd_params_unrolled_cpu`` adding ``dL/dw`` into ``dw`` (and ``dL/db``
    into ``db`` unless None)."""
    n_batch, _, height, width = x.shape
    dtype = dw.dtype
    du = buffers("unrolled:du", _shape(geo, x.shape, dw.shape[0]), dtype)
    acc = buffers("unrolled:acc", (dw[0].size,), dtype)
    db = dw.reshape(-1)[:0] if db is None else db
    return [(bwd_params_unrolled_cpu, (np.ascontiguousarray(x, dtype=dtype).reshape(n_batch, -1),
                                       np.ascontiguousarray(dy, dtype=dtype).reshape(n_batch, -1),
                                       dw, db, du, acc, tap_table(geo, height, width)))]
