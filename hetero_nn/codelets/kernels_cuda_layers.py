"""Whole-operation CUDA kernels of the layer chains: convolution + ReLU + max pooling,
dense (+ ReLU), and ReLU alone, forward and backward (see :mod:`.kernels_cuda` for the mechanism).

Each kernel computes its outputs directly, one thread per output element, each sum
over its terms in one fixed order (so no atomics and the same bits on every run), in
place of the array-module chain of im2col, GEMM, bias, ReLU and pooling (5 to 50
launches). One thread's work grows with the layer, so the kernels are for the layers
whose step is bound by launches, not arithmetic: a variant takes its kernel while
the multiply-adds stay under :data:`WORK_LIMIT` (and each thread's under
:data:`THREAD_LIMIT`), else its array-module path (cuBLAS GEMMs).

A gradient the chain adds into (``dw``, ``db``: REDUX) gets its sum added once, as
the chain's ``dw += matmul(...)`` does. The twins are the variants' array-module
paths (:mod:`.fused`, :mod:`.dense`); the kernels sum in another order than their
GEMMs, so the two agree to rounding (checked against ``ref`` on a GPU).

Owns: the layer kernels' factories (:data:`FACTORIES`), their launchers and
:func:`all_kernels`.
"""

from __future__ import annotations

import functools

import numpy as np

from . import kernels_cuda, kernels_cuda_norm
from .kernels_cuda import Kernel, covers, launch, source

__all__ = ["FACTORIES", "all_kernels", "WORK_LIMIT", "THREAD_LIMIT", "relu", "conv_relu_pool_fwd",
           "conv_relu_pool_bwd", "dense_fwd", "dense_bwd"]

WORK_LIMIT = 1 << 28
"""Most multiply-adds a layer kernel takes on (else the GEMM path)."""

THREAD_LIMIT = 1 << 16
"""Most multiply-adds one thread of a layer kernel does in sequence."""

_CONV_ARGS = r"""
    const long long n_batch, const long long c_in, const long long height, const long long width,
    const long long c_out, const long long kh, const long long kw, const long long sh,
    const long long sw, const long long pt, const long long pl, const long long dil_h,
    const long long dil_w, const long long out_h, const long long out_w,
    const long long pkh, const long long pkw, const long long psh, const long long psw,
    const long long pph, const long long ppw, const long long pdh, const long long pdw,
    const long long pool_h, const long long pool_w"""

_CONV_RELU_POOL_FWD = r"""
extern "C" __global__ void conv_relu_pool_fwd_@(
    const T* x, const T* w, const T* b, T* y, long long* argmax, """ + _CONV_ARGS + r""")
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_batch * c_out * pool_h * pool_w) return;
    const long long pj = e % pool_w, pi = (e / pool_w) % pool_h;
    const long long o = (e / (pool_w * pool_h)) % c_out, n = e / (pool_w * pool_h * c_out);
    T best = -(T)__longlong_as_double(0x7ff0000000000000LL);  // -inf
    long long where = -1;
    for (long long p = 0; p < pkh; ++p) {
        const long long zi = pi * psh - pph + p * pdh;
        if (zi < 0 || zi >= out_h) continue;
        for (long long q = 0; q < pkw; ++q) {
            const long long zj = pj * psw - ppw + q * pdw;
            if (zj < 0 || zj >= out_w) continue;
            T acc = 0;
            for (long long c = 0; c < c_in; ++c)
                for (long long u = 0; u < kh; ++u) {
                    const long long xi = zi * sh - pt + u * dil_h;
                    if (xi < 0 || xi >= height) continue;
                    for (long long v = 0; v < kw; ++v) {
                        const long long xj = zj * sw - pl + v * dil_w;
                        if (xj < 0 || xj >= width) continue;
                        acc += x[((n * c_in + c) * height + xi) * width + xj]
                             * w[((o * c_in + c) * kh + u) * kw + v];
                    }
                }
            T z = acc + b[o];
            z = (z >= (T)0 || z != z) ? z : (T)0;          // NumPy's maximum(z, 0)
            if (where < 0) where = zi * out_w + zj;        // the window's first valid element
            if (z > best || z != z) { best = z; where = zi * out_w + zj; }
        }
    }
    y[e] = best;
    argmax[e] = where;
}
"""

_POOL_RELU_BWD = r"""
extern "C" __global__ void pool_relu_bwd_@(
    const T* y, const long long* argmax, const T* dy, T* dz, """ + _CONV_ARGS + r""")
{
    // dz[n, o, zi, zj]: the gradients of the windows whose max it was, in row-major
    // window order (the ref variant's sequential scatter), dy masked by y > 0 (ReLU)
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_batch * c_out * out_h * out_w) return;
    const long long zj = e % out_w, zi = (e / out_w) % out_h, plane = e / (out_w * out_h);
    const long long target = zi * out_w + zj;
    T acc = 0;
    for (long long pi = 0; pi < pool_h; ++pi) {
        const long long top = zi + pph - pi * psh;
        if (top < 0 || top > (pkh - 1) * pdh || top % pdh) continue;
        for (long long pj = 0; pj < pool_w; ++pj) {
            const long long left = zj + ppw - pj * psw;
            if (left < 0 || left > (pkw - 1) * pdw || left % pdw) continue;
            const long long k = (plane * pool_h + pi) * pool_w + pj;
            if (argmax[k] == target) acc += y[k] <= (T)0 ? (T)0 : dy[k];
        }
    }
    dz[e] = acc;
}
"""

_CONV_BWD = r"""
extern "C" __global__ void conv_bwd_@(
    const T* x, const T* w, const T* dz, T* dx, T* dw, T* db, const long long with_dx,
""" + _CONV_ARGS + r""")
{
    // threads [0, O*C*KH*KW): dw; then O: db; then N*C*H*W (with_dx): dx
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n_dw = c_out * c_in * kh * kw, plane = out_h * out_w;
    if (e < n_dw) {
        const long long v = e % kw, u = (e / kw) % kh, c = (e / (kw * kh)) % c_in;
        const long long o = e / (kw * kh * c_in);
        T acc = 0;
        for (long long n = 0; n < n_batch; ++n)
            for (long long i = 0; i < out_h; ++i) {
                const long long xi = i * sh - pt + u * dil_h;
                if (xi < 0 || xi >= height) continue;
                for (long long j = 0; j < out_w; ++j) {
                    const long long xj = j * sw - pl + v * dil_w;
                    if (xj < 0 || xj >= width) continue;
                    acc += dz[(n * c_out + o) * plane + i * out_w + j]
                         * x[((n * c_in + c) * height + xi) * width + xj];
                }
            }
        dw[e] += acc;
        return;
    }
    e -= n_dw;
    if (e < c_out) {
        T acc = 0;
        for (long long n = 0; n < n_batch; ++n)
            for (long long k = 0; k < plane; ++k) acc += dz[(n * c_out + e) * plane + k];
        db[e] += acc;
        return;
    }
    e -= c_out;
    if (!with_dx || e >= n_batch * c_in * height * width) return;
    const long long xj = e % width, xi = (e / width) % height, c = (e / (width * height)) % c_in;
    const long long n = e / (width * height * c_in);
    T acc = 0;
    for (long long o = 0; o < c_out; ++o)
        for (long long u = 0; u < kh; ++u) {
            const long long top = xi + pt - u * dil_h;
            if (top < 0 || top % sh || top / sh >= out_h) continue;
            for (long long v = 0; v < kw; ++v) {
                const long long left = xj + pl - v * dil_w;
                if (left < 0 || left % sw || left / sw >= out_w) continue;
                acc += dz[(n * c_out + o) * plane + (top / sh) * out_w + left / sw]
                     * w[((o * c_in + c) * kh + u) * kw + v];
            }
        }
    dx[e] = acc;
}
"""

_DENSE_FWD = r"""
extern "C" __global__ void dense_fwd_@(
    const T* x, const T* w, const T* b, T* y, const long long with_bias, const long long relu,
    const long long n, const long long c_in, const long long c_out)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * c_out) return;
    const long long o = e % c_out, r = e / c_out;
    T acc = 0;
    for (long long i = 0; i < c_in; ++i) acc += x[r * c_in + i] * w[o * c_in + i];
    if (with_bias) acc += b[o];
    if (relu) acc = (acc >= (T)0 || acc != acc) ? acc : (T)0;
    y[e] = acc;
}
"""

_DENSE_BWD = r"""
extern "C" __global__ void dense_bwd_@(
    const T* x, const T* w, const T* y, const T* dy, T* dx, T* dw, T* db,
    const long long relu, const long long with_dw, const long long with_db,
    const long long with_dx, const long long n, const long long c_in, const long long c_out)
{
    // dz = dy (masked by y > 0 with relu); threads [0, O*I): dw; then O: db; then N*I: dx
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < c_out * c_in) {
        if (!with_dw) return;
        const long long i = e % c_in, o = e / c_in;
        T acc = 0;
        for (long long r = 0; r < n; ++r) {
            const long long k = r * c_out + o;
            acc += (relu && y[k] <= (T)0 ? (T)0 : dy[k]) * x[r * c_in + i];
        }
        dw[e] += acc;
        return;
    }
    e -= c_out * c_in;
    if (e < c_out) {
        if (!with_db) return;
        T acc = 0;
        for (long long r = 0; r < n; ++r) {
            const long long k = r * c_out + e;
            acc += relu && y[k] <= (T)0 ? (T)0 : dy[k];
        }
        db[e] += acc;
        return;
    }
    e -= c_out;
    if (!with_dx || e >= n * c_in) return;
    const long long i = e % c_in, r = e / c_in;
    T acc = 0;
    for (long long o = 0; o < c_out; ++o) {
        const long long k = r * c_out + o;
        acc += (relu && y[k] <= (T)0 ? (T)0 : dy[k]) * w[o * c_in + i];
    }
    dx[e] = acc;
}
"""


_RELU = r"""
extern "C" __global__ void relu_@(const T* a, const T* dy, T* out, const long long backward,
                                  const long long n)
{
    // forward: out = NumPy's maximum(a, 0); backward: out = dy where a (y) > 0 else 0
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const T v = a[e];
    if (backward) out[e] = v <= (T)0 ? (T)0 : dy[e];
    else out[e] = (v >= (T)0 || v != v) ? v : (T)0;
}
"""


def _factory(template, name, doc):
    @functools.lru_cache(maxsize=None)
    def factory(dtype: str) -> Kernel:
        suffix, text = source(template, dtype)
        return Kernel(f"{name}_{suffix}", text)
    factory.__name__ = f"{name}_kernel"
    factory.__doc__ = doc
    return factory


conv_relu_pool_fwd_kernel = _factory(_CONV_RELU_POOL_FWD, "conv_relu_pool_fwd",
                                     "max_pool(relu(conv2d(x, w) + b)) and its argmax.")
pool_relu_bwd_kernel = _factory(_POOL_RELU_BWD, "pool_relu_bwd",
                                "The convolution's output gradient of conv + ReLU + max pool.")
conv_bwd_kernel = _factory(_CONV_BWD, "conv_bwd", "A convolution's dw, db (added) and dx.")
dense_fwd_kernel = _factory(_DENSE_FWD, "dense_fwd", "x @ w.T (+ b) (then ReLU).")
dense_bwd_kernel = _factory(_DENSE_BWD, "dense_bwd", "A dense layer's dw, db (added) and dx.")

relu_kernel = _factory(_RELU, "relu", "ReLU forward or backward, elementwise.")

FACTORIES = [relu_kernel, conv_relu_pool_fwd_kernel, pool_relu_bwd_kernel, conv_bwd_kernel,
             dense_fwd_kernel, dense_bwd_kernel]



def all_kernels() -> list[Kernel]:
    """Every kernel the factories make (these and :mod:`.kernels_cuda`'s), for float32 and
    float64: what the NVRTC check compiles."""
    return [factory(dtype) for factory in (*kernels_cuda.FACTORIES, *FACTORIES,
                                           *kernels_cuda_norm.FACTORIES)
            for dtype in ("float32", "float64")]


# --------------------------------------------------------------------------- launchers

def _conv_args(geo, pool_geo, x_shape, c_out):
    n_batch, c_in, height, width = x_shape
    return (n_batch, c_in, height, width, c_out, geo.kh, geo.kw, geo.sh, geo.sw, geo.pt,
            geo.pl, geo.dh, geo.dw, geo.out_h, geo.out_w, pool_geo.kh, pool_geo.kw,
            pool_geo.sh, pool_geo.sw, pool_geo.ph, pool_geo.pw, pool_geo.dh, pool_geo.dw,
            pool_geo.out_h, pool_geo.out_w)


def _conv_covered(geo, x_shape, w_shape, *arrays) -> bool:
    n_batch, c_in = x_shape[:2]
    taps = c_in * geo.kh * geo.kw
    return (geo.groups == 1 and geo.mode_name == "zeros" and covers(*arrays)
            and n_batch * w_shape[0] * geo.out_h * geo.out_w * taps <= WORK_LIMIT
            and n_batch * geo.out_h * geo.out_w <= THREAD_LIMIT)


def conv_relu_pool_fwd(xp, x, w, b, y, argmax, geo, pool_geo, twin, *twin_args, **kw) -> bool:
    """``y, argmax`` of conv + ReLU + max pool by one kernel; ``False`` if not covered."""
    if not (_conv_covered(geo, x.shape, w.shape, x, w, b, y, argmax)
            and argmax.dtype == np.int64 and b is not None):
        return False
    launch(xp, conv_relu_pool_fwd_kernel(y.dtype.name), y.size,
           (x, w, b, y, argmax, *_conv_args(geo, pool_geo, x.shape, w.shape[0])),
           twin, *twin_args, **kw)
    return True


def conv_relu_pool_bwd(xp, x, w, y, argmax, dy, dx, dw, db, geo, pool_geo, twin, *twin_args,
                       **kw) -> bool:
    """The gradients of conv + ReLU + max pool by two kernels (``dz``, then ``dw``, ``db``
    and ``dx`` unless it is ``None``); ``False`` if not covered."""
    if not (_conv_covered(geo, x.shape, dw.shape, x, w, y, argmax, dy, dx, dw, db)
            and argmax.dtype == np.int64 and db is not None):
        return False
    args = _conv_args(geo, pool_geo, x.shape, dw.shape[0])
    dz = xp.empty((x.shape[0], dw.shape[0], geo.out_h, geo.out_w), dy.dtype)  # no launch
    launch(xp, pool_relu_bwd_kernel(dy.dtype.name), dz.size,
           (y, argmax, dy, dz, *args), twin, *twin_args, **kw)  # the twin: the whole chain
    work = dw.size + db.size + (x.size if dx is not None else 0)
    launch(xp, conv_bwd_kernel(dy.dtype.name), work,
           (x, w if w is not None else dw, dz, dx if dx is not None else dz, dw, db,
            dx is not None, *args), _nothing)
    return True


def relu(xp, a, dy, out, twin, *twin_args) -> bool:
    """ReLU forward (``dy`` None: ``out = max(a, 0)``) or backward (``out = dy`` where
    ``a > 0``) by one kernel; ``False`` if not covered."""
    if not (covers(a, dy, out) and a.shape == out.shape and (dy is None or dy.shape == a.shape)):
        return False
    launch(xp, relu_kernel(a.dtype.name), a.size,
           (a, a if dy is None else dy, out, dy is not None, a.size), twin, *twin_args)
    return True


def _nothing():
    pass


def _dense_covered(x, w_shape, n_out, *arrays) -> bool:
    return (x.ndim == 2 and covers(x, *arrays) and x.shape[0] * x.shape[1] * n_out <= WORK_LIMIT
            and max(x.shape[0], x.shape[1], n_out) <= THREAD_LIMIT)


def dense_fwd(xp, x, w, b, y, relu, twin, *twin_args, **kw) -> bool:
    """``y = x @ w.T (+ b)`` (then ReLU) by one kernel; ``False`` if not covered."""
    if not _dense_covered(x, w.shape, w.shape[0], w, b, y):
        return False
    launch(xp, dense_fwd_kernel(y.dtype.name), y.size,
           (x, w, b if b is not None else w, y, b is not None, relu, x.shape[0], x.shape[1],
            w.shape[0]), twin, *twin_args, **kw)
    return True


def dense_bwd(xp, x, w, y, dy, dx, dw, db, relu, twin, *twin_args, **kw) -> bool:
    """A dense layer's ``dw``, ``db`` (added into, where given) and ``dx`` (written, where
    given) from ``dy`` (masked by ``y > 0`` with ``relu``) by one kernel; ``False`` if not
    covered."""
    n_in = x.shape[1] if x is not None else dx.shape[1]
    ref = x if x is not None else dx
    if not (ref.ndim == 2 and _dense_covered(ref, None, dy.shape[1], x, w, y, dy, dx, dw, db)):
        return False
    dummy = dy
    launch(xp, dense_bwd_kernel(dy.dtype.name), dy.shape[1] * (n_in + 1) + ref.shape[0] * n_in,
           (x if x is not None else dummy, w if w is not None else dummy,
            y if y is not None else dummy, dy, dx if dx is not None else dummy,
            dw if dw is not None else dummy, db if db is not None else dummy, relu,
            dw is not None, db is not None, dx is not None, ref.shape[0], n_in, dy.shape[1]),
           twin, *twin_args, **kw)
    return True
