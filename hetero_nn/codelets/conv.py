"""Convolution codelets: 2-D forward pass, input gradient and parameter gradients.

This module owns five codelets and every variant of them, the NumPy reference
beside the fast ones so the maths is read in one place:

===================  ==========================================  ===============
codelet              operands (access mode)                       params
===================  ==========================================  ===============
conv2d_fwd           x (R), w (R), b (R), y (W)                   stride, padding
conv2d_fwd_nobias    x (R), w (R), y (W)                          stride, padding
conv2d_bwd_input     dy (R), w (R), dx (W)                        stride, padding
conv2d_bwd_params    x (R), dy (R), dw (REDUX), db (REDUX)        stride, padding
conv2d_bwd_weight    x (R), dy (R), dw (REDUX)                    stride, padding
===================  ==========================================  ===============

Shapes are NCHW, C-contiguous: ``x[N, C, H, W]``, ``w[O, C, KH, KW]``,
``b[O]``, ``y[N, O, OH, OW]`` with ``OH = (H + 2*ph - KH) // sh + 1`` (zero
padding, PyTorch's ``conv2d`` without dilation or groups). ``stride`` and
``padding`` are an int or an ``(h, w)`` pair. Every variant keeps the input
dtype (float32 or float64) and accumulates in it, as PyTorch's CPU path does.

Variants
--------
``ref``
    NumPy: a sliding-window view of the padded input contracted with the
    weights by ``tensordot``.
``cpu:direct``
    Numba loops, one kernel tap at a time over "wide" rows of a zero-padded
    copy of the sample (see the kernels' section): no column buffer, long
    vectorised inner loops. Needs the least memory; at best on layers with
    few channels, where GEMMs are thin (the first layer of LeNet-5).
``cpu:im2col``
    A Numba kernel unfolds a chunk of samples into columns ``[n, C*KH*KW,
    OH*OW]`` (or folds them back, ``col2im``) and BLAS runs one GEMM per
    sample, straight into ``y`` (Numba's ``np.dot``, which calls SciPy's
    BLAS). The whole variant is one Numba call: one round trip through the
    interpreter lock per task, so two workers' kernels do not wait for each
    other's (``benchmarks/bench_gil.py``). The bias rides in the GEMM as one
    more column of weights against a row of ones, and so does its gradient.
    Chunks are sized to stay in the core's L2 cache; the buffers are the
    worker thread's own, reused from call to call. The fastest CPU variant on
    the layers of ``benchmarks/bench_codelets_conv_pool.py``; OpenBLAS's GEMM
    bounds it.
``cuda``
    The im2col/GEMM formulation written against the array module of its
    operands: CuPy on a GPU, NumPy in CI. No raw kernels.

The REDUX operands (``dw``, ``db``) arrive as private partials already filled
by ``init``; every variant *adds* its contribution to them, never overwrites.
"""

from __future__ import annotations

import math

import threading

import numpy as np
from numba import uintp
from numpy.lib.stride_tricks import sliding_window_view

from ._checks import pair, require_contiguous
from ._jit import jit, jit_inline
from .codelet import REDUX, R, W, Codelet
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = [
    "conv2d_fwd", "conv2d_fwd_nobias", "conv2d_bwd_input", "conv2d_bwd_params",
    "conv2d_bwd_weight", "conv2d_output_shape",
]

IM2COL_CHUNK_BYTES = 1 << 19
"""Target size of one chunk's columns plus its slice of ``y`` (or ``dy``): half of
one core's L2 cache, so the GEMM finds both there, beside its packed panels."""


# --------------------------------------------------------------------------- geometry

def _geometry(x_shape, w_shape, stride, padding):
    """Return ``(sh, sw, ph, pw, OH, OW)`` for a convolution, checking it is valid."""
    sh, sw = pair(stride, "stride", "conv2d")
    ph, pw = pair(padding, "padding", "conv2d")
    if sh < 1 or sw < 1 or ph < 0 or pw < 0:
        raise ValueError(f"conv2d: stride must be >= 1 and padding >= 0, "
                         f"got stride={stride!r}, padding={padding!r}")
    _, n_in, height, width = x_shape
    _, w_in, kh, kw = w_shape
    if n_in != w_in:
        raise ValueError(f"conv2d: input {tuple(x_shape)} has {n_in} channels but the "
                         f"weights {tuple(w_shape)} expect {w_in}")
    out_h = (height + 2 * ph - kh) // sh + 1
    out_w = (width + 2 * pw - kw) // sw + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"conv2d: kernel {kh}x{kw} does not fit the padded input "
                         f"{height}x{width} (padding {ph},{pw})")
    return sh, sw, ph, pw, out_h, out_w


def conv2d_output_shape(x_shape, w_shape, stride=1, padding=0):
    """Shape ``(N, O, OH, OW)`` of ``conv2d_fwd``'s output.

    >>> conv2d_output_shape((64, 1, 28, 28), (6, 1, 5, 5), stride=1, padding=2)
    (64, 6, 28, 28)
    """
    *_, out_h, out_w = _geometry(x_shape, w_shape, stride, padding)
    return (int(x_shape[0]), int(w_shape[0]), out_h, out_w)


def _macs(dy_shape, w_shape):
    """Multiply-adds of one convolution: each output element sums C*KH*KW products."""
    return math.prod(dy_shape) * math.prod(w_shape[1:])


def _fwd_flops(x, w, b, y, stride=1, padding=0):
    return 2.0 * _macs(y, w) + math.prod(y)


def _fwd_nobias_flops(x, w, y, stride=1, padding=0):
    return 2.0 * _macs(y, w)


def _bwd_input_flops(dy, w, dx, stride=1, padding=0):
    return 2.0 * _macs(dy, w)


def _bwd_params_flops(x, dy, dw, db, stride=1, padding=0):
    return 2.0 * _macs(dy, dw) + math.prod(dy)


def _bwd_weight_flops(x, dy, dw, stride=1, padding=0):
    return 2.0 * _macs(dy, dw)


# --------------------------------------------------------------------------- ref (NumPy)

def _windows_ref(x, kh, kw, sh, sw, ph, pw, out_h, out_w):
    """View ``[N, C, OH, OW, KH, KW]`` of the zero-padded input under each output."""
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = sliding_window_view(padded, (kh, kw), axis=(2, 3))
    return windows[:, :, ::sh, ::sw][:, :, :out_h, :out_w]


def conv2d_fwd_ref(x, w, b, y, stride=1, padding=0):
    """``y[n,o,i,j] = b[o] + sum_{c,p,q} w[o,c,p,q] * xpad[n,c,i*sh+p,j*sw+q]``."""
    conv2d_fwd_nobias_ref(x, w, y, stride=stride, padding=padding)
    y += b.reshape(1, -1, 1, 1)


def conv2d_fwd_nobias_ref(x, w, y, stride=1, padding=0):
    """``conv2d_fwd_ref`` without the bias term."""
    sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, w.shape, stride, padding)
    windows = _windows_ref(x, w.shape[2], w.shape[3], sh, sw, ph, pw, out_h, out_w)
    # [N, C, OH, OW, KH, KW] x [O, C, KH, KW] -> [N, OH, OW, O]
    y[...] = np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def conv2d_bwd_input_ref(dy, w, dx, stride=1, padding=0):
    """``dx = d(sum y*dy)/dx``: every output scatters ``dy * w`` back onto its window."""
    sh, sw, ph, pw, out_h, out_w = _geometry(dx.shape, w.shape, stride, padding)
    n_batch, n_in, height, width = dx.shape
    kh, kw = w.shape[2], w.shape[3]
    # [N, O, OH, OW] x [O, C, KH, KW] -> [N, OH, OW, C, KH, KW]
    contrib = np.tensordot(dy, w, axes=([1], [0]))
    padded = np.zeros((n_batch, n_in, height + 2 * ph, width + 2 * pw), dtype=dx.dtype)
    for p in range(kh):
        for q in range(kw):
            padded[:, :, p:p + sh * (out_h - 1) + 1:sh, q:q + sw * (out_w - 1) + 1:sw] += \
                contrib[:, :, :, :, p, q].transpose(0, 3, 1, 2)
    dx[...] = padded[:, :, ph:ph + height, pw:pw + width]


def conv2d_bwd_weight_ref(x, dy, dw, stride=1, padding=0):
    """``dw += sum_{n,i,j} dy[n,o,i,j] * xpad[n,c,i*sh+p,j*sw+q]`` (REDUX: accumulates)."""
    sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, dw.shape, stride, padding)
    windows = _windows_ref(x, dw.shape[2], dw.shape[3], sh, sw, ph, pw, out_h, out_w)
    # [N, O, OH, OW] x [N, C, OH, OW, KH, KW] -> [O, C, KH, KW]
    dw += np.tensordot(dy, windows, axes=([0, 2, 3], [0, 2, 3]))


def conv2d_bwd_params_ref(x, dy, dw, db, stride=1, padding=0):
    """``conv2d_bwd_weight_ref`` plus ``db += sum_{n,i,j} dy[n,o,i,j]`` (REDUX)."""
    conv2d_bwd_weight_ref(x, dy, dw, stride=stride, padding=padding)
    db += dy.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------- Numba kernels
#
# Kernels index flat views of C-contiguous arrays with unsigned offsets: Numba
# then emits no negative-index wraparound and the row loops vectorise (5-7x on
# short rows). The row helpers are ``jit_inline``: Numba inlines them into each
# kernel, as a call per row would cost more than the row.
#
# The direct kernels work on "wide" rows. With the input zero-padded to
# ``HP x WP`` and an output row kept ``WP`` long (only its first ``OW``
# entries are outputs), output ``t = i*WP + j`` reads input
# ``(i*SH + p)*WP + j*SW + q = base(p, q) + SW*t`` when ``SH == SW``: one
# tap of the kernel is then ONE long axpy over ``t < (OH-1)*WP + OW``
# instead of OH rows of OW (the tail entries ``j >= OW`` are computed and
# never read; every index stays inside the padded plane). When ``SH != SW``
# the same loops run one output row at a time (``runs = OH``).

@jit_inline
def _wide_runs(sh, sw, out_h, out_w, wp):
    """``(runs, run_len)`` of the wide layout: one long run if ``sh == sw``, else one per row."""
    if sh == sw:
        return 1, (out_h - 1) * wp + out_w
    return out_h, out_w


@jit_inline
def _fill_row(dst, start, count, value):
    """``dst[start:start+count] = value``."""
    d = uintp(start)
    for j in range(uintp(count)):
        dst[d + j] = value


@jit_inline
def _copy8(dst, d, src, s):
    """``dst[d:d+8] = src[s:s+8]``: eight loads, then eight stores, which LLVM merges
    into one vector load and one vector store (arithmetic written this way stays
    scalar: Numba leaves LLVM's SLP vectoriser off)."""
    a0 = src[s]
    a1 = src[s + uintp(1)]
    a2 = src[s + uintp(2)]
    a3 = src[s + uintp(3)]
    a4 = src[s + uintp(4)]
    a5 = src[s + uintp(5)]
    a6 = src[s + uintp(6)]
    a7 = src[s + uintp(7)]
    dst[d] = a0
    dst[d + uintp(1)] = a1
    dst[d + uintp(2)] = a2
    dst[d + uintp(3)] = a3
    dst[d + uintp(4)] = a4
    dst[d + uintp(5)] = a5
    dst[d + uintp(6)] = a6
    dst[d + uintp(7)] = a7


@jit_inline
def _copy_blocks(dst, d0, src, s0, count):
    """``dst[d0:d0+count] = src[s0:s0+count]`` by blocks of 8, for ``count >= 8``.

    LLVM's vectorised loop starts at 32 floats (8 lanes, unrolled 4 times), so
    a plain loop copies the short rows of a convolution one scalar at a time.
    The last block overlaps the one before it: ``dst`` and ``src`` must not.
    """
    d, s, n = uintp(d0), uintp(s0), uintp(count)
    eight = uintp(8)
    j = uintp(0)
    while j + eight < n:
        _copy8(dst, d + j, src, s + j)
        j += eight
    _copy8(dst, d + n - eight, src, s + n - eight)


@jit_inline
def _gather_row(dst, d0, src, s0, step, count):
    """``dst[d0 + j] = src[s0 + step*j]`` for ``j < count``; ``dst`` and ``src`` do not overlap."""
    d, s = uintp(d0), uintp(s0)
    if step == 1 and count >= 8:
        _copy_blocks(dst, d, src, s, count)
    elif step == 1:
        for j in range(uintp(count)):
            dst[d + j] = src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + j] = src[s + st * j]


@jit_inline
def _axpy_gather_row(dst, d0, alpha, src, s0, step, count):
    """``dst[d0 + j] += alpha * src[s0 + step*j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + st * j]


@jit_inline
def _axpy_scatter_row(dst, d0, step, alpha, src, s0, count):
    """``dst[d0 + step*j] += alpha * src[s0 + j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + st * j] += alpha * src[s + j]


@jit_inline
def _add_scatter_row(dst, d0, step, src, s0, count):
    """``dst[d0 + step*j] += src[s0 + j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + st * j] += src[s + j]


@jit_inline
def _mul_gather_row(lanes, l0, a, a0, b, b0, step, count):
    """``lanes[l0 + j] += a[a0 + j] * b[b0 + step*j]``: a dot product kept lane-wise."""
    m, s, t = uintp(l0), uintp(a0), uintp(b0)
    if step == 1:
        for j in range(uintp(count)):
            lanes[m + j] += a[s + j] * b[t + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            lanes[m + j] += a[s + j] * b[t + st * j]


@jit_inline
def _pad_sample(xf, x0, n_in, height, width, xpad, p0, ph, pw):
    """Copy one sample's planes (``xf[x0:]``) into the zero-bordered ``xpad[p0:]``."""
    hp, wp = height + 2 * ph, width + 2 * pw
    for c in range(n_in):
        for i in range(height):
            _gather_row(xpad, p0 + (c * hp + i + ph) * wp + pw, xf,
                        x0 + (c * height + i) * width, 1, width)


@jit_inline
def _widen_sample(gf, g0, n_planes, out_h, out_w, wide, w0, wp, span):
    """Copy ``n_planes`` output planes (``gf[g0:]``) into wide rows ``wide[w0 + k*span + i*wp]``."""
    for k in range(n_planes):
        for i in range(out_h):
            _gather_row(wide, w0 + k * span + i * wp, gf, g0 + (k * out_h + i) * out_w, 1, out_w)


@jit
def _conv2d_fwd_cpu(x, w, b, has_bias, y, sh, sw, ph, pw):
    """Direct convolution into ``y`` (overwritten), one wide output plane at a time."""
    n_batch, n_in, height, width = x.shape
    n_out, _, kh_size, kw_size = w.shape
    out_h, out_w = y.shape[2], y.shape[3]
    hp, wp = height + 2 * ph, width + 2 * pw
    runs, run_len = _wide_runs(sh, sw, out_h, out_w, wp)
    span = (out_h - 1) * wp + out_w
    xf, wf, yf = x.reshape(-1), w.reshape(-1), y.reshape(-1)
    xpad = np.zeros(n_in * hp * wp, dtype=x.dtype)  # borders stay zero
    acc = np.empty(span, dtype=y.dtype)
    for n in range(n_batch):
        _pad_sample(xf, n * n_in * height * width, n_in, height, width, xpad, 0, ph, pw)
        for o in range(n_out):
            _fill_row(acc, 0, span, b[o] if has_bias else 0.0)
            for c in range(n_in):
                for p in range(kh_size):
                    for q in range(kw_size):
                        wv = wf[((o * n_in + c) * kh_size + p) * kw_size + q]
                        base = (c * hp + p) * wp + q
                        for r in range(runs):
                            _axpy_gather_row(acc, r * wp, wv, xpad, base + r * sh * wp, sw, run_len)
            y0 = (n * n_out + o) * out_h * out_w
            for i in range(out_h):
                _gather_row(yf, y0 + i * out_w, acc, i * wp, 1, out_w)


@jit
def _conv2d_bwd_input_cpu(dy, w, dx, sh, sw, ph, pw):
    """Direct transposed convolution into ``dx`` (overwritten), one padded input plane at a time.

    The wide gradient rows are zero past ``OW``, so the tail entries add ``w * 0``.
    """
    n_batch, n_in, height, width = dx.shape
    n_out, _, kh_size, kw_size = w.shape
    out_h, out_w = dy.shape[2], dy.shape[3]
    hp, wp = height + 2 * ph, width + 2 * pw
    runs, run_len = _wide_runs(sh, sw, out_h, out_w, wp)
    span = (out_h - 1) * wp + out_w
    gf, wf, dxf = dy.reshape(-1), w.reshape(-1), dx.reshape(-1)
    gwide = np.zeros(n_out * span, dtype=dy.dtype)  # tails stay zero
    plane = np.empty(hp * wp, dtype=dx.dtype)
    for n in range(n_batch):
        _widen_sample(gf, n * n_out * out_h * out_w, n_out, out_h, out_w, gwide, 0, wp, span)
        for c in range(n_in):
            _fill_row(plane, 0, hp * wp, 0.0)
            for o in range(n_out):
                for p in range(kh_size):
                    for q in range(kw_size):
                        wv = wf[((o * n_in + c) * kh_size + p) * kw_size + q]
                        for r in range(runs):
                            _axpy_scatter_row(plane, (p + r * sh) * wp + q, sw, wv,
                                              gwide, o * span + r * wp, run_len)
            x0 = (n * n_in + c) * height * width
            for i in range(height):
                _gather_row(dxf, x0 + i * width, plane, (i + ph) * wp + pw, 1, width)


@jit
def _conv2d_bwd_params_cpu(x, dy, dw, db, has_bias, sh, sw, ph, pw):
    """Direct weight (and bias) gradient, added into ``dw`` (and ``db``).

    Each ``dw[o, c, p, q]`` is a dot product over ``(n, i, j)``. Without
    fastmath a scalar reduction does not vectorise, so for one ``(o, c)`` the
    products of every tap are summed lane-wise over the batch into
    ``lanes[p, q, t]`` (vector loads and stores, no reassociation) and each
    tap's lanes are summed once at the end, over the real outputs only.
    """
    n_batch, n_in, height, width = x.shape
    n_out, _, kh_size, kw_size = dw.shape
    out_h, out_w = dy.shape[2], dy.shape[3]
    hp, wp = height + 2 * ph, width + 2 * pw
    runs, run_len = _wide_runs(sh, sw, out_h, out_w, wp)
    span = (out_h - 1) * wp + out_w
    taps = kh_size * kw_size
    xf, gf, dwf = x.reshape(-1), dy.reshape(-1), dw.reshape(-1)
    xpad = np.zeros(n_batch * n_in * hp * wp, dtype=x.dtype)
    gwide = np.zeros(n_batch * n_out * span, dtype=dy.dtype)
    lanes = np.empty(taps * span, dtype=dw.dtype)
    for n in range(n_batch):
        _pad_sample(xf, n * n_in * height * width, n_in, height, width,
                    xpad, n * n_in * hp * wp, ph, pw)
        _widen_sample(gf, n * n_out * out_h * out_w, n_out, out_h, out_w,
                      gwide, n * n_out * span, wp, span)
    for o in range(n_out):
        if has_bias:
            _fill_row(lanes, 0, span, 0.0)
            for n in range(n_batch):
                _add_scatter_row(lanes, 0, 1, gwide, (n * n_out + o) * span, span)
            total = db[o]
            for i in range(out_h):
                for j in range(out_w):
                    total += lanes[i * wp + j]
            db[o] = total
        for c in range(n_in):
            _fill_row(lanes, 0, taps * span, 0.0)
            for n in range(n_batch):
                g0 = (n * n_out + o) * span
                x0 = (n * n_in + c) * hp * wp
                for p in range(kh_size):
                    for q in range(kw_size):
                        l0 = (p * kw_size + q) * span
                        for r in range(runs):
                            _mul_gather_row(lanes, l0 + r * wp, gwide, g0 + r * wp,
                                            xpad, x0 + (p + r * sh) * wp + q, sw, run_len)
            for k in range(taps):
                total = dwf[(o * n_in + c) * taps + k]
                for i in range(out_h):
                    for j in range(out_w):
                        total += lanes[k * span + i * wp + j]
                dwf[(o * n_in + c) * taps + k] = total


@jit
def _unfold_sample(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size, sh, sw, out_h, out_w):
    """Rows ``colf[r0 + ((c*KH + p)*KW + q)*OH*OW + i*OW:]`` of one padded sample ``src[s0:]``.

    The general case (any stride, any width). This and the two functions
    below are kernels of their own, not inlined: one loop nest per kernel
    keeps LLVM's code for the fast ones 20-30% faster.
    """
    area = out_h * out_w
    for c in range(n_in):
        for p in range(kh_size):
            for q in range(kw_size):
                b0 = s0 + (c * hp + p) * wp + q
                for i in range(out_h):
                    _gather_row(colf, r0 + i * out_w, src, b0 + i * sh * wp, sw, out_w)
                r0 += area


@jit
def _unfold_sample_short(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size, sh, out_h, out_w):
    """``_unfold_sample`` for unit column stride and ``8 <= OW <= 16``: two blocks per row."""
    d, tail, ow, row_step = uintp(r0), uintp(out_w - 8), uintp(out_w), uintp(sh * wp)
    for c in range(n_in):
        for p in range(kh_size):
            for q in range(kw_size):
                s = uintp(s0 + (c * hp + p) * wp + q)
                for i in range(out_h):
                    _copy8(colf, d, src, s)
                    _copy8(colf, d + tail, src, s + tail)
                    d += ow
                    s += row_step


@jit
def _unfold_sample_long(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size, sh, out_h, out_w):
    """``_unfold_sample`` for unit column stride and ``OW > 16``: blocks of 8 per row."""
    d, tail, ow, row_step = uintp(r0), uintp(out_w - 8), uintp(out_w), uintp(sh * wp)
    eight = uintp(8)
    for c in range(n_in):
        for p in range(kh_size):
            for q in range(kw_size):
                s = uintp(s0 + (c * hp + p) * wp + q)
                for i in range(out_h):
                    j = uintp(0)
                    while j < tail:
                        _copy8(colf, d + j, src, s + j)
                        j += eight
                    _copy8(colf, d + tail, src, s + tail)
                    d += ow
                    s += row_step


@jit
def _im2col_cpu(x, n0, n1, xpad, cols, kh_size, kw_size, sh, sw, ph, pw, out_h, out_w):
    """Unfold samples ``n0 <= n < n1`` of ``x`` into ``cols[n - n0, :C*KH*KW, :OH*OW]``.

    ``cols[k, (c*KH + p)*KW + q, i*OW + j] = xpad[c, i*SH + p, j*SW + q]``, with
    ``xpad`` the zero-padded sample: every row is then a plain strided copy.
    ``xpad`` is a flat ``C*HP*WP`` buffer whose borders are zero (only its
    interior is written here); it is unused without padding. Rows of ``cols``
    past ``C*KH*KW`` are left as they are (the caller's row of ones for the bias).
    """
    _, n_in, height, width = x.shape
    hp, wp = height + 2 * ph, width + 2 * pw
    per_sample = cols.shape[1] * out_h * out_w
    xf, colf = x.reshape(-1), cols.reshape(-1)
    padded = ph > 0 or pw > 0
    for n in range(n0, n1):
        x0 = n * n_in * height * width
        if padded:
            _pad_sample(xf, x0, n_in, height, width, xpad, 0, ph, pw)
            src, s0 = xpad, 0
        else:
            src, s0 = xf, x0
        r0 = (n - n0) * per_sample
        if sw != 1 or out_w < 8:
            _unfold_sample(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size,
                           sh, sw, out_h, out_w)
        elif out_w <= 16:
            _unfold_sample_short(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size,
                                 sh, out_h, out_w)
        else:
            _unfold_sample_long(src, s0, colf, r0, n_in, hp, wp, kh_size, kw_size,
                                sh, out_h, out_w)


@jit
def _col2im_cpu(cols, n0, n1, plane, dx, kh_size, kw_size, sh, sw, ph, pw, out_h, out_w):
    """Fold ``cols[n - n0]`` (laid out as by ``_im2col_cpu``) onto ``dx[n]``, overwritten.

    Overlapping windows add up in ``plane``, one zero-padded ``HP*WP`` input
    plane, whose interior is then copied out.
    """
    _, n_in, height, width = dx.shape
    hp, wp = height + 2 * ph, width + 2 * pw
    area = out_h * out_w
    per_sample = cols.shape[1] * area
    colf, dxf = cols.reshape(-1), dx.reshape(-1)
    for n in range(n0, n1):
        r0 = (n - n0) * per_sample
        for c in range(n_in):
            _fill_row(plane, 0, hp * wp, 0.0)
            for p in range(kh_size):
                for q in range(kw_size):
                    for i in range(out_h):
                        _add_scatter_row(plane, (i * sh + p) * wp + q, sw,
                                         colf, r0 + i * out_w, out_w)
                    r0 += area
            x0 = (n * n_in + c) * height * width
            for i in range(height):
                _gather_row(dxf, x0 + i * width, plane, (i + ph) * wp + pw, 1, width)


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
                _gather_row(wf, d0 + i * wp, gf, s0 + i * out_w, 1, out_w)
                _fill_row(wf, d0 + i * wp + out_w, wp - out_w, 0.0)


@jit
def _col2im_wide_cpu(cols, n0, n1, plane, dx, kh_size, kw_size, ph, pw, out_h):
    """``_col2im_cpu`` for stride 1 on wide rows: ``cols[n - n0, (c, p, q), i*WP + j]``.

    The columns come from a widened gradient, so they are zero for ``j >= OW``
    and each tap is ONE add of ``(OH-1)*WP + OW`` entries at ``plane[p*WP + q:]``
    (no short rows); ``plane`` is one zero-padded ``HP*WP`` input plane.
    """
    _, n_in, height, width = dx.shape
    hp, wp = height + 2 * ph, width + 2 * pw
    span = out_h * wp
    run = span - kw_size + 1  # up to the last output, (OH-1)*WP + OW: inside the plane
    per_sample = cols.shape[1] * span
    colf, dxf = cols.reshape(-1), dx.reshape(-1)
    for n in range(n0, n1):
        r0 = (n - n0) * per_sample
        for c in range(n_in):
            _fill_row(plane, 0, hp * wp, 0.0)
            for p in range(kh_size):
                for q in range(kw_size):
                    _add_scatter_row(plane, p * wp + q, 1, colf, r0, run)
                    r0 += span
            x0 = (n * n_in + c) * height * width
            for i in range(height):
                _gather_row(dxf, x0 + i * width, plane, (i + ph) * wp + pw, 1, width)


# --------------------------------------------------------------------------- cpu:direct

_c = np.ascontiguousarray


def conv2d_fwd_cpu_direct(x, w, b, y, stride=1, padding=0):
    """``conv2d_fwd`` by direct Numba loops."""
    sh, sw, ph, pw, _, _ = _geometry(x.shape, w.shape, stride, padding)
    require_contiguous("conv2d_fwd", y=y)
    _conv2d_fwd_cpu(_c(x), _c(w), _c(b), True, y, sh, sw, ph, pw)


def conv2d_fwd_nobias_cpu_direct(x, w, y, stride=1, padding=0):
    """``conv2d_fwd_nobias`` by direct Numba loops."""
    sh, sw, ph, pw, _, _ = _geometry(x.shape, w.shape, stride, padding)
    require_contiguous("conv2d_fwd_nobias", y=y)
    _conv2d_fwd_cpu(_c(x), _c(w), np.empty(0, dtype=y.dtype), False, y, sh, sw, ph, pw)


def conv2d_bwd_input_cpu_direct(dy, w, dx, stride=1, padding=0):
    """``conv2d_bwd_input`` by direct Numba loops."""
    sh, sw, ph, pw, _, _ = _geometry(dx.shape, w.shape, stride, padding)
    require_contiguous("conv2d_bwd_input", dx=dx)
    _conv2d_bwd_input_cpu(_c(dy), _c(w), dx, sh, sw, ph, pw)


def conv2d_bwd_params_cpu_direct(x, dy, dw, db, stride=1, padding=0):
    """``conv2d_bwd_params`` by direct Numba loops (adds into ``dw``, ``db``)."""
    sh, sw, ph, pw, _, _ = _geometry(x.shape, dw.shape, stride, padding)
    require_contiguous("conv2d_bwd_params", dw=dw)
    _conv2d_bwd_params_cpu(_c(x), _c(dy), dw, db, True, sh, sw, ph, pw)


def conv2d_bwd_weight_cpu_direct(x, dy, dw, stride=1, padding=0):
    """``conv2d_bwd_weight`` by direct Numba loops (adds into ``dw``)."""
    sh, sw, ph, pw, _, _ = _geometry(x.shape, dw.shape, stride, padding)
    require_contiguous("conv2d_bwd_weight", dw=dw)
    _conv2d_bwd_params_cpu(_c(x), _c(dy), dw, np.empty(0, dtype=dw.dtype), False,
                           sh, sw, ph, pw)


# --------------------------------------------------------------------------- cpu:im2col

_worker = threading.local()
_WORKER_BUFFERS = 16
"""Most scratch arrays one worker thread keeps (the oldest goes first)."""


def _worker_buffer(tag, shape, dtype, zero=False):
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


def _pad_buffer(x_shape, ph, pw, dtype):
    """The zero-padded sample ``_im2col_cpu`` copies into (empty without padding).

    Made zero once: ``_im2col_cpu`` writes only the interior, which the key
    (padding and padded shape) pins down, so the borders stay zero for good.
    """
    _, n_in, height, width = x_shape
    if ph == 0 and pw == 0:
        return np.empty(0, dtype=dtype)
    padded = _worker_buffer(("im2col:xpad", ph, pw),
                            (n_in, height + 2 * ph, width + 2 * pw), dtype, zero=True)
    return padded.reshape(-1)


def _columns(x, kh, kw, n_rows, n_out, geometry):
    """Column buffer ``[chunk, n_rows, OH*OW]`` and chunk size for ``x``; rows past
    ``C*KH*KW`` (the bias row) are set to one."""
    sh, sw, ph, pw, out_h, out_w = geometry
    rows, area = x.shape[1] * kh * kw, out_h * out_w
    step = _chunk(x.shape[0], n_rows, n_out, area, x.itemsize)
    cols = _worker_buffer("im2col:cols", (step, n_rows, area), x.dtype)
    cols[:, rows:] = 1
    return cols, step


@jit
def _gemm_columns_cpu(x, n0, n1, w2d, out, cols, xpad, geo, step):
    """``out[n - n0] = w2d @ im2col(x[n])`` for ``n0 <= n < n1``, ``step`` samples
    unfolded at a time; ``geo`` is ``(KH, KW, SH, SW, PH, PW, OH, OW)``. BLAS through
    Numba's ``np.dot``."""
    kh, kw, sh, sw, ph, pw, out_h, out_w = geo
    for start in range(n0, n1, step):
        stop = min(start + step, n1)
        _im2col_cpu(x, start, stop, xpad, cols, kh, kw, sh, sw, ph, pw, out_h, out_w)
        for n in range(start, stop):
            np.dot(w2d, cols[n - start], out[n - n0])


def _fwd_operands(x, w, b, dtype, stride, padding):
    """``(x, w2d, cols, xpad, geo, step)`` for ``_gemm_columns_cpu`` to compute
    ``conv2d(x, w) + b``: the contiguous input, ``[w | b]`` as rows, the worker's
    column and padding buffers, the geometry and the chunk size."""
    geometry = _geometry(x.shape, w.shape, stride, padding)
    sh, sw, ph, pw, out_h, out_w = geometry
    x = _c(x)
    n_out, _, kh, kw = w.shape
    w2d = w.reshape(n_out, -1)
    if b is not None:
        w2d = np.concatenate([w2d, np.reshape(b, (n_out, 1))], axis=1)
    cols, step = _columns(x, kh, kw, w2d.shape[1], n_out, geometry)
    xpad = _pad_buffer(x.shape, ph, pw, x.dtype)
    return x, _c(w2d, dtype=dtype), cols, xpad, (kh, kw, sh, sw, ph, pw, out_h, out_w), step


def _conv2d_fwd_im2col(x, w, b, y, stride, padding):
    """im2col then one GEMM per sample straight into ``y``, in one Numba call.

    With a bias, ``[w | b]`` multiplies the columns plus a row of ones.
    """
    require_contiguous("conv2d_fwd", y=y)
    x, w2d, cols, xpad, geo, step = _fwd_operands(x, w, b, y.dtype, stride, padding)
    n_batch, n_out, out_h, out_w = y.shape
    _gemm_columns_cpu(x, 0, n_batch, w2d, y.reshape(n_batch, n_out, out_h * out_w), cols, xpad,
                      geo, step)


def conv2d_fwd_cpu_im2col(x, w, b, y, stride=1, padding=0):
    """``conv2d_fwd`` as im2col + GEMM, the bias inside the GEMM."""
    _conv2d_fwd_im2col(x, w, b, y, stride, padding)


def conv2d_fwd_nobias_cpu_im2col(x, w, y, stride=1, padding=0):
    """``conv2d_fwd_nobias`` as im2col + GEMM."""
    _conv2d_fwd_im2col(x, w, None, y, stride, padding)


def _wide_rows(sh, sw, out_w, wp, n_out, itemsize):
    """Whether ``conv2d_bwd_input_cpu_im2col`` should widen ``dy`` (stride 1 only).

    Widening pays when col2im's rows are short enough for LLVM's loop to run
    them scalar (under 4 vectors: ``OW * itemsize < 128``) and the GEMM's extra
    work per row, ``O * (WP - OW)`` multiply-adds, stays small (measured: LeNet's
    second layer in float32 gains 20%; wider layers and float64 lose).
    """
    return (sh == 1 and sw == 1 and out_w * itemsize < 128
            and n_out * (wp - out_w) * itemsize <= 256)


@jit
def _bwd_input_im2col_cpu(dy, w2d_t, dx, cols, plane, dy_wide, geo, wide, wp, step):
    """``dx = col2im(w^T dy)``, ``step`` samples at a time; on wide rows ``dy`` is first
    widened into ``dy_wide`` (see ``_wide_rows``)."""
    kh, kw, sh, sw, ph, pw, out_h, out_w = geo
    n_batch, n_out = dy.shape[0], dy.shape[1]
    dy3d = dy.reshape(n_batch, n_out, out_h * out_w)
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        if wide:
            _widen_cpu(dy, start, stop, wp, dy_wide)
            for n in range(start, stop):
                np.dot(w2d_t, dy_wide[n - start], cols[n - start])
            _col2im_wide_cpu(cols, start, stop, plane, dx, kh, kw, ph, pw, out_h)
        else:
            for n in range(start, stop):
                np.dot(w2d_t, dy3d[n], cols[n - start])
            _col2im_cpu(cols, start, stop, plane, dx, kh, kw, sh, sw, ph, pw, out_h, out_w)


def _bwd_input_operands(w, dx, stride, padding):
    """``(w2d_t, dx, cols, plane, dy_wide, geo, wide, wp, step)``: what
    ``_bwd_input_im2col_cpu`` takes after ``dy``."""
    sh, sw, ph, pw, out_h, out_w = _geometry(dx.shape, w.shape, stride, padding)
    n_batch, _, height, width = dx.shape
    n_out, _, kh, kw = w.shape
    rows = math.prod(w.shape[1:])
    hp, wp = height + 2 * ph, width + 2 * pw
    wide = _wide_rows(sh, sw, out_w, wp, n_out, dx.itemsize)
    span = out_h * wp if wide else out_h * out_w
    step = _chunk(n_batch, rows, n_out, span, dx.itemsize)
    cols = _worker_buffer("col2im:cols", (step, rows, span), dx.dtype)
    plane = _worker_buffer("col2im:plane", (hp * wp,), dx.dtype)
    dy_wide = _worker_buffer("col2im:dy", (step, n_out, span) if wide else (1, 1, 1), dx.dtype)
    return (_c(w).reshape(n_out, rows).T, dx, cols, plane, dy_wide,
            (kh, kw, sh, sw, ph, pw, out_h, out_w), wide, wp, step)


def conv2d_bwd_input_cpu_im2col(dy, w, dx, stride=1, padding=0):
    """``conv2d_bwd_input`` as one GEMM per sample (``w^T dy``) then col2im, in one Numba call.

    On narrow images (see ``_wide_rows``) ``dy`` is first widened to rows of
    ``WP`` (zeros past ``OW``): the GEMM does ``WP/OW`` times the work but
    col2im then adds one long row per tap instead of ``OH`` short ones.
    """
    require_contiguous("conv2d_bwd_input", dx=dx)
    _bwd_input_im2col_cpu(_c(dy), *_bwd_input_operands(w, dx, stride, padding))


@jit
def _bwd_params_im2col_cpu(x, dy, dw, db, bias, total, cols, products, xpad, geo, step):
    """``dw += sum_n (cols_n dy_n^T)[:rows].T`` and ``db += ...[rows]`` (``dw`` flat), in
    sample order: each chunk's products summed, then added to ``total``."""
    kh, kw, sh, sw, ph, pw, out_h, out_w = geo
    n_batch, n_out = dy.shape[0], dy.shape[1]
    dy3d = dy.reshape(n_batch, n_out, out_h * out_w)
    total[:] = 0
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        _im2col_cpu(x, start, stop, xpad, cols, kh, kw, sh, sw, ph, pw, out_h, out_w)
        for n in range(start, stop):
            np.dot(cols[n - start], dy3d[n].T, products[n - start])
        acc = products[0]
        for k in range(1, stop - start):
            acc += products[k]
        total += acc
    rows = total.shape[0] - bias
    for o in range(n_out):
        for r in range(rows):
            dw[o * rows + r] += total[r, o]
        if bias:
            db[o] += total[rows, o]


def _bwd_params_operands(x, dw_shape, with_bias, dtype, stride, padding):
    """``(total, cols, products, xpad, geo, step)``: the worker's buffers, the
    geometry and the chunk size for ``_bwd_params_im2col_cpu``."""
    geometry = _geometry(x.shape, dw_shape, stride, padding)
    sh, sw, ph, pw, out_h, out_w = geometry
    n_out, _, kh, kw = dw_shape
    n_rows = math.prod(dw_shape[1:]) + with_bias
    cols, step = _columns(x, kh, kw, n_rows, n_out, geometry)
    xpad = _pad_buffer(x.shape, ph, pw, x.dtype)
    products = _worker_buffer("im2col:products", (step, n_rows, n_out), dtype)
    total = _worker_buffer("im2col:total", (n_rows, n_out), dtype)
    return total, cols, products, xpad, (kh, kw, sh, sw, ph, pw, out_h, out_w), step


def _params_operands(dw, db):
    """``(dw flat, db, bias)`` for ``_bwd_params_im2col_cpu`` (``db`` may be None)."""
    require_contiguous("conv2d_bwd_params", dw=dw)
    flat = dw.reshape(-1)
    return flat, (flat[:0] if db is None else db), db is not None


def _conv2d_bwd_params_im2col(x, dy, dw, db, stride, padding):
    """im2col then one GEMM per sample, ``cols_n dy_n^T``, summed into ``dw`` (and ``db``),
    in one Numba call.

    With ``db``, the row of ones under the columns makes the GEMM's last row
    the bias gradient. ``cols_n dy_n^T`` ([C*KH*KW, O]) rather than ``dy_n
    cols_n^T``: OpenBLAS runs this orientation 10-40% faster on these shapes.
    """
    x = _c(x)
    dw_flat, db, bias = _params_operands(dw, db)
    _bwd_params_im2col_cpu(x, _c(dy), dw_flat, db, bias,
                           *_bwd_params_operands(x, dw.shape, bias, dw.dtype, stride, padding))


def conv2d_bwd_weight_cpu_im2col(x, dy, dw, stride=1, padding=0):
    """``conv2d_bwd_weight`` as im2col then one GEMM per sample, summed into ``dw``."""
    _conv2d_bwd_params_im2col(x, dy, dw, None, stride, padding)


def conv2d_bwd_params_cpu_im2col(x, dy, dw, db, stride=1, padding=0):
    """``conv2d_bwd_params`` as im2col + GEMM, ``db`` from the GEMM's row of ones."""
    _conv2d_bwd_params_im2col(x, dy, dw, db, stride, padding)


# --------------------------------------------------------------------------- cuda (array module)

def _im2col_xp(xp, x, kh, kw, sh, sw, ph, pw, out_h, out_w):
    """Columns ``[N, C, KH, KW, OH, OW]`` of ``x`` by strided slicing (NumPy or CuPy)."""
    n_batch, n_in, height, width = x.shape
    if ph or pw:
        padded = xp.zeros((n_batch, n_in, height + 2 * ph, width + 2 * pw), dtype=x.dtype)
        padded[:, :, ph:ph + height, pw:pw + width] = x
    else:
        padded = x
    cols = xp.empty((n_batch, n_in, kh, kw, out_h, out_w), dtype=x.dtype)
    for p in range(kh):
        for q in range(kw):
            cols[:, :, p, q] = padded[:, :, p:p + sh * (out_h - 1) + 1:sh,
                                      q:q + sw * (out_w - 1) + 1:sw]
    return cols


def conv2d_fwd_nobias_cuda(x, w, y, stride=1, padding=0):
    """``conv2d_fwd_nobias`` as im2col by slicing + one batched GEMM, in ``xp``."""
    xp = array_module(x, w, y)
    sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, w.shape, stride, padding)
    n_batch = x.shape[0]
    n_out, _, kh, kw = w.shape
    cols = _im2col_xp(xp, x, kh, kw, sh, sw, ph, pw, out_h, out_w)
    y[...] = xp.matmul(w.reshape(n_out, -1),
                       cols.reshape(n_batch, -1, out_h * out_w)).reshape(y.shape)


def conv2d_fwd_cuda(x, w, b, y, stride=1, padding=0):
    """``conv2d_fwd`` as im2col + batched GEMM + bias, in ``xp``."""
    conv2d_fwd_nobias_cuda(x, w, y, stride=stride, padding=padding)
    y += b.reshape(1, -1, 1, 1)


def conv2d_bwd_input_cuda(dy, w, dx, stride=1, padding=0):
    """``conv2d_bwd_input`` as a batched GEMM ``w^T dy`` then col2im by slicing, in ``xp``."""
    xp = array_module(dy, w, dx)
    sh, sw, ph, pw, out_h, out_w = _geometry(dx.shape, w.shape, stride, padding)
    n_batch, n_in, height, width = dx.shape
    n_out, _, kh, kw = w.shape
    cols = xp.matmul(w.reshape(n_out, -1).T, dy.reshape(n_batch, n_out, out_h * out_w))
    cols = cols.reshape(n_batch, n_in, kh, kw, out_h, out_w)
    padded = xp.zeros((n_batch, n_in, height + 2 * ph, width + 2 * pw), dtype=dx.dtype)
    for p in range(kh):
        for q in range(kw):
            padded[:, :, p:p + sh * (out_h - 1) + 1:sh,
                   q:q + sw * (out_w - 1) + 1:sw] += cols[:, :, p, q]
    dx[...] = padded[:, :, ph:ph + height, pw:pw + width]


def conv2d_bwd_weight_cuda(x, dy, dw, stride=1, padding=0):
    """``conv2d_bwd_weight`` as im2col + one GEMM over batch and pixels, in ``xp``."""
    xp = array_module(x, dy, dw)
    sh, sw, ph, pw, out_h, out_w = _geometry(x.shape, dw.shape, stride, padding)
    n_batch = x.shape[0]
    n_out, _, kh, kw = dw.shape
    cols = _im2col_xp(xp, x, kh, kw, sh, sw, ph, pw, out_h, out_w)
    area = out_h * out_w
    dw += xp.tensordot(dy.reshape(n_batch, n_out, area), cols.reshape(n_batch, -1, area),
                       axes=([0, 2], [0, 2])).reshape(dw.shape)


def conv2d_bwd_params_cuda(x, dy, dw, db, stride=1, padding=0):
    """``conv2d_bwd_params`` in ``xp``: the weight GEMM plus a bias sum."""
    conv2d_bwd_weight_cuda(x, dy, dw, stride=stride, padding=padding)
    db += dy.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------- codelets

conv2d_fwd = Codelet(
    "conv2d_fwd", modes=(R, R, R, W),
    variants={"ref": conv2d_fwd_ref, "cpu:direct": conv2d_fwd_cpu_direct,
              "cpu:im2col": conv2d_fwd_cpu_im2col, "cuda": conv2d_fwd_cuda},
    flops=_fwd_flops)
"""``y = conv2d(x, w) + b``: operands ``(x R, w R, b R, y W)``."""

conv2d_fwd_nobias = Codelet(
    "conv2d_fwd_nobias", modes=(R, R, W),
    variants={"ref": conv2d_fwd_nobias_ref, "cpu:direct": conv2d_fwd_nobias_cpu_direct,
              "cpu:im2col": conv2d_fwd_nobias_cpu_im2col, "cuda": conv2d_fwd_nobias_cuda},
    flops=_fwd_nobias_flops)
"""``y = conv2d(x, w)``: operands ``(x R, w R, y W)``."""

conv2d_bwd_input = Codelet(
    "conv2d_bwd_input", modes=(R, R, W),
    variants={"ref": conv2d_bwd_input_ref, "cpu:direct": conv2d_bwd_input_cpu_direct,
              "cpu:im2col": conv2d_bwd_input_cpu_im2col, "cuda": conv2d_bwd_input_cuda},
    flops=_bwd_input_flops)
"""``dx = conv2d^T(dy, w)``: operands ``(dy R, w R, dx W)``."""

conv2d_bwd_params = Codelet(
    "conv2d_bwd_params", modes=(R, R, REDUX, REDUX),
    variants={"ref": conv2d_bwd_params_ref, "cpu:direct": conv2d_bwd_params_cpu_direct,
              "cpu:im2col": conv2d_bwd_params_cpu_im2col, "cuda": conv2d_bwd_params_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_params_flops)
"""``dw += dL/dw, db += dL/db``: operands ``(x R, dy R, dw REDUX, db REDUX)``."""

conv2d_bwd_weight = Codelet(
    "conv2d_bwd_weight", modes=(R, R, REDUX),
    variants={"ref": conv2d_bwd_weight_ref, "cpu:direct": conv2d_bwd_weight_cpu_direct,
              "cpu:im2col": conv2d_bwd_weight_cpu_im2col, "cuda": conv2d_bwd_weight_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_weight_flops)
"""``dw += dL/dw`` for a convolution without bias: operands ``(x R, dy R, dw REDUX)``."""
