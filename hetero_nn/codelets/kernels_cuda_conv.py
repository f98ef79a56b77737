"""Whole-operation CUDA kernels around the GEMMs of a plain convolution's ``cuda``
variants (:mod:`.conv`; the mechanism: :mod:`.kernels_cuda`).

A ``cuda`` convolution is one batched GEMM (cuBLAS, through ``xp.matmul``) plus the
moves of data around it. In array operations those moves are several launches (a pad,
a gather by an index table; after the input gradient's GEMM a concatenate, a gather, a
sum, the fold of the padding, a copy). Here each is one kernel, for zero padding:

* ``conv_im2col``: the columns ``[N, C, KH, KW, OH, OW]`` of ``x``, one thread per
  entry, zero where a tap reads the padding (a copy: the same bits as the twin);
* ``conv_col2im``: ``dx`` from the columns of the input gradient, one thread per input
  element, adding the entries of the taps that read it in tap order (no atomics; the
  twin adds them in the same order: the same bits).

Other padding modes, dtypes or strided operands keep the array-module path. The twins
(:func:`im2col_xp`, :func:`col2im_xp`) state the kernels' semantics in array operations.

Owns: the two kernels' factories, :func:`im2col` and :func:`col2im` (launch or decline),
and :func:`grouped`, the grouped view the ``cuda`` convolutions work on.
"""

from __future__ import annotations

from .kernels_cuda import covers, launch
from .kernels_cuda_norm import _factory

__all__ = ["im2col", "col2im", "im2col_xp", "col2im_xp", "grouped", "FACTORIES"]

_GEOMETRY = r"""const long long n, const long long c, const long long h, const long long w,
    const long long kh, const long long kw, const long long sh, const long long sw,
    const long long pt, const long long pl, const long long dh, const long long dw,
    const long long oh, const long long ow)"""

_IM2COL = r"""
extern "C" __global__ void conv_im2col_@(const T* x, T* cols, """ + _GEOMETRY + r"""
{
    // cols[r, p, q, i, j] = x[r, i*sh + p*dh - pt, j*sw + q*dw - pl] (r = sample * c +
    // channel), 0 where that is padding
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * c * kh * kw * oh * ow) return;
    long long r = e;
    const long long j = r % ow; r /= ow;
    const long long i = r % oh; r /= oh;
    const long long q = r % kw; r /= kw;
    const long long p = r % kh; r /= kh;
    const long long y = i * sh + p * dh - pt, x0 = j * sw + q * dw - pl;
    cols[e] = (y >= 0 && y < h && x0 >= 0 && x0 < w) ? x[(r * h + y) * w + x0] : (T)0;
}
"""

_COL2IM = r"""
extern "C" __global__ void conv_col2im_@(const T* cols, T* dx, """ + _GEOMETRY + r"""
{
    // dx[r, y, x] = the sum, taps (p, q) in order, of cols[r, p, q, i, j] over the
    // outputs (i, j) whose tap (p, q) reads (y, x)
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * c * h * w) return;
    const long long x0 = e % w, y = (e / w) % h, r = e / (h * w);
    T s = 0;
    for (long long p = 0; p < kh; ++p) {
        const long long ty = y + pt - p * dh;
        if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
        for (long long q = 0; q < kw; ++q) {
            const long long tx = x0 + pl - q * dw;
            if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
            s += cols[(((r * kh + p) * kw + q) * oh + ty / sh) * ow + tx / sw];
        }
    }
    dx[e] = s;
}
"""


im2col_kernel = _factory(_IM2COL, "conv_im2col")
col2im_kernel = _factory(_COL2IM, "conv_col2im")
FACTORIES = [im2col_kernel, col2im_kernel]


def _taps(geo):
    """``(p, q, rows, cols)``: each tap and the slices of the padded plane it reads."""
    for p in range(geo.kh):
        for q in range(geo.kw):
            yield p, q, (slice(p * geo.dh, p * geo.dh + geo.sh * (geo.out_h - 1) + 1, geo.sh),
                         slice(q * geo.dw, q * geo.dw + geo.sw * (geo.out_w - 1) + 1, geo.sw))


def im2col_xp(xp, x, cols, geo):
    """The twin of ``conv_im2col``: ``cols [N, C, KH, KW, OH, OW]`` of ``x``, zero padded."""
    n, c, h, w = x.shape
    padded = xp.zeros((n, c, geo.hp, geo.wp), x.dtype)
    padded[:, :, geo.pt:geo.pt + h, geo.pl:geo.pl + w] = x
    for p, q, (rows, columns) in _taps(geo):
        cols[:, :, p, q] = padded[:, :, rows, columns]


def col2im_xp(xp, cols, dx, geo):
    """The twin of ``conv_col2im``: the taps' columns added onto the padded plane in tap
    order, the padding dropped."""
    n, c, h, w = dx.shape
    padded = xp.zeros((n, c, geo.hp, geo.wp), dx.dtype)
    for p, q, (rows, columns) in _taps(geo):
        padded[:, :, rows, columns] += cols[:, :, p, q]
    dx[...] = padded[:, :, geo.pt:geo.pt + h, geo.pl:geo.pl + w]


def grouped(a, groups):
    """``a[N, C, ...]`` as ``[N, G, C/G, rest]`` (a view of a contiguous ``a``)."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, -1)


def _fits(geo, *arrays):
    return geo.mode_name == "zeros" and covers(*arrays)


def _args(geo, shape):
    return (*shape, geo.kh, geo.kw, geo.sh, geo.sw, geo.pt, geo.pl, geo.dh, geo.dw,
            geo.out_h, geo.out_w)


def im2col(xp, x, geo):
    """The columns ``[N, C, KH, KW, OH, OW]`` of ``x`` by one ``conv_im2col`` launch, or
    ``None`` where the kernel does not take ``x`` (then the caller's path runs)."""
    if x.ndim != 4 or not _fits(geo, x):
        return None
    cols = xp.empty((*x.shape[:2], geo.kh, geo.kw, geo.out_h, geo.out_w), x.dtype)
    launch(xp, im2col_kernel(x.dtype.name), cols.size, (x, cols, *_args(geo, x.shape)),
           im2col_xp, xp, x, cols, geo)
    return cols


def col2im(xp, cols, dx, geo):
    """``dx`` from the input gradient's columns ``[N, C, KH, KW, OH, OW]`` (any shape of
    that size) by one ``conv_col2im`` launch; False where the kernel does not take them."""
    if dx.ndim != 4 or not _fits(geo, cols, dx):
        return False
    cols = cols.reshape(*dx.shape[:2], geo.kh, geo.kw, geo.out_h, geo.out_w)
    launch(xp, col2im_kernel(dx.dtype.name), dx.size, (cols, dx, *_args(geo, dx.shape)),
           col2im_xp, xp, cols, dx, geo)
    return True
