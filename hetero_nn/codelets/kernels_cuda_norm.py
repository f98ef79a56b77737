"""Whole-operation CUDA kernels of batch normalization's codelets (:mod:`.batchnorm`; the
mechanism: :mod:`.kernels_cuda`).

Batch norm is nine codelets per layer, each a chain of 2 to 18 array operations in
its ``cuda`` variant (casts to float64, broadcasts, sums): a ResNet-18 step spent
more than half its launches there. Here each is one kernel:

* the per-channel sums (``bn_sum``, ``bn_sqdev``, ``bn_bwd_sums``): one block per
  channel; each thread adds a strided share of the channel in float64, then the block
  adds the shares by a fixed tree (no atomics: the same bits on every run);
* the elementwise ones (``bn_fwd``, ``bn_bwd_input``) and the per-channel ones
  (``bn_mean``/``bn_var``, ``bn_running``, ``bn_param_grads``): one thread per element,
  each operation in the dtype (float64 or the data's) the array-module code uses.

The twins are :mod:`.batchnorm`'s array-module functions; the sums run in another
order than NumPy's pairwise ones, so they agree to rounding (in float64).

Owns: the batch-norm kernels' factories and :data:`LAUNCHERS`, by codelet name.
"""

from __future__ import annotations

import functools

from .kernels_cuda import BLOCK, Kernel, covers, launch, source

__all__ = ["LAUNCHERS", "FACTORIES"]

_REDUCE = r"""
extern "C" __global__ void bn_reduce_@(
    const T* x, const T* dy, const T* mean, T* out1, T* out2, const long long mode,
    const long long n, const long long channels, const long long plane)
{
    // mode 0: out1 += sum x; 1: out1 += sum (x - mean)^2; 2: out1 += sum dy and
    // out2 += sum (x - mean) dy; over channel blockIdx.x, in float64
    __shared__ double part1[128];
    __shared__ double part2[128];
    const long long c = blockIdx.x;
    const int t = threadIdx.x;
    const double m = mode != 0 ? (double)mean[c] : 0.0;
    double s1 = 0, s2 = 0;
    for (long long e = t; e < n * plane; e += blockDim.x) {
        const long long k = ((e / plane) * channels + c) * plane + e % plane;
        if (mode == 0) {
            s1 += (double)x[k];
        } else if (mode == 1) {
            const double d = (double)x[k] - m;
            s1 += d * d;
        } else {
            const double g = (double)dy[k];
            s1 += g;
            s2 += ((double)x[k] - m) * g;
        }
    }
    part1[t] = s1;
    part2[t] = s2;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) { part1[t] += part1[t + s]; part2[t] += part2[t + s]; }
        __syncthreads();
    }
    if (t == 0) {
        out1[c] += (T)part1[0];
        if (mode == 2) out2[c] += (T)part2[0];
    }
}
"""

_FWD = r"""
extern "C" __global__ void bn_fwd_@(
    const T* x, const T* mean, const T* var, const T* weight, const T* bias, T* y,
    const double eps, const long long total, const long long channels, const long long plane)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    const long long c = (e / plane) % channels;
    const double alpha = 1.0 / sqrt((double)var[c] + eps) * (double)weight[c];
    const double beta = (double)bias[c] - (double)mean[c] * alpha;
    y[e] = x[e] * (T)alpha + (T)beta;
}
"""

_BWD_INPUT = r"""
extern "C" __global__ void bn_bwd_input_@(
    const T* x, const T* dy, const T* mean, const T* var, const T* weight, const T* sum_dy,
    const T* dotp, T* dx, const double count, const double eps, const long long batch_stats,
    const long long total, const long long channels, const long long plane)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    const long long c = (e / plane) % channels;
    const double invstd = 1.0 / sqrt((double)var[c] + eps);
    const T scale = (T)(invstd * (double)weight[c]);
    if (!batch_stats) { dx[e] = dy[e] * scale; return; }
    const T grad_mean = sum_dy[c] / (T)count;
    const T k = (T)((double)dotp[c] * invstd * invstd / count);
    const T d = x[e] - mean[c];
    dx[e] = (dy[e] - grad_mean - d * k) * scale;
}
"""

_CHANNEL = r"""
extern "C" __global__ void bn_channel_@(
    const T* a, const T* b, const T* var, T* out1, T* out2, const double* momentum,
    const long long mode, const double count, const double eps, const long long channels)
{
    // mode 0: out1 = a / count (bn_mean, bn_var); 1: bn_running (a mean, b sqdev, out1/out2
    // the running mean/var); 2: bn_param_grads (a sum_dy, b dotp, out1/out2 dweight/dbias)
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    if (mode == 0) {
        out1[c] = a[c] / (T)count;
    } else if (mode == 1) {
        const double m = momentum[0];
        const T keep = (T)(1.0 - m);
        const double unbiased = (double)b[c] / (count - 1.0);
        out1[c] = (T)(m * (double)a[c] + (double)(keep * out1[c]));
        out2[c] = (T)(m * unbiased + (double)(keep * out2[c]));
    } else {
        out1[c] += (T)((double)b[c] * (1.0 / sqrt((double)var[c] + eps)));
        out2[c] += a[c];
    }
}
"""


def _factory(template, name):
    @functools.lru_cache(maxsize=None)
    def factory(dtype: str) -> Kernel:
        suffix, text = source(template, dtype)
        return Kernel(f"{name}_{suffix}", text)
    factory.__name__ = f"{name}_kernel"
    return factory


reduce_kernel = _factory(_REDUCE, "bn_reduce")
fwd_kernel = _factory(_FWD, "bn_fwd")
bwd_input_kernel = _factory(_BWD_INPUT, "bn_bwd_input")
channel_kernel = _factory(_CHANNEL, "bn_channel")
FACTORIES = [reduce_kernel, fwd_kernel, bwd_input_kernel, channel_kernel]


def _shape(x):
    n, c = x.shape[:2]
    return n, c, x.size // max(n * c, 1)


def _reduce(mode):
    def launcher(xp, twin, x, *rest, **params):
        dy = rest[0] if mode == 2 else x
        mean = rest[-3] if mode == 2 else (rest[0] if mode == 1 else x)
        outs = rest[-2:] if mode == 2 else rest[-1:]
        if x.ndim < 2 or not covers(x, dy, mean, *outs):
            return False
        n, c, plane = _shape(x)
        launch(xp, reduce_kernel(x.dtype.name), c * BLOCK,
               (x, dy, mean, outs[0], outs[-1], mode, n, c, plane), twin, xp, x, *rest, **params)
        return True
    return launcher


def _fwd(xp, twin, x, mean, var, weight, bias, y, *, eps):
    if x.ndim < 2 or not covers(x, mean, var, weight, bias, y):
        return False
    launch(xp, fwd_kernel(x.dtype.name), x.size,
           (x, mean, var, weight, bias, y, eps, x.size, *_shape(x)[1:]),
           twin, xp, x, mean, var, weight, bias, y, eps=eps)
    return True


def _bwd_input(xp, twin, x, dy, mean, var, weight, sum_dy, dotp, dx, *, count, eps,
               batch_stats=True):
    if x.ndim < 2 or not covers(x, dy, mean, var, weight, sum_dy, dotp, dx):
        return False
    launch(xp, bwd_input_kernel(x.dtype.name), x.size,
           (x, dy, mean, var, weight, sum_dy, dotp, dx, count, eps, batch_stats, x.size,
            *_shape(x)[1:]),
           twin, xp, x, dy, mean, var, weight, sum_dy, dotp, dx, count=count, eps=eps,
           batch_stats=batch_stats)
    return True


def _divide(xp, twin, total, out, *, count):
    if not covers(total, out) or total.shape != out.shape:
        return False
    launch(xp, channel_kernel(out.dtype.name), out.size,
           (total, total, total, out, out, total, 0, count, 0.0, out.size), twin, xp, total, out,
           count=count)
    return True


def _running(xp, twin, mean, sqdev, running_mean, running_var, momentum, *, count):
    if not (covers(mean, sqdev, running_mean, running_var) and momentum.dtype.name == "float64"
            and mean.shape == sqdev.shape == running_mean.shape == running_var.shape):
        return False
    launch(xp, channel_kernel(mean.dtype.name), mean.size,
           (mean, sqdev, mean, running_mean, running_var, momentum, 1, count, 0.0, mean.size),
           twin, xp, mean, sqdev, running_mean, running_var, momentum, count=count)
    return True


def _param_grads(xp, twin, sum_dy, dotp, var, dweight, dbias, *, eps):
    if not covers(sum_dy, dotp, var, dweight, dbias):
        return False
    launch(xp, channel_kernel(var.dtype.name), var.size,
           (sum_dy, dotp, var, dweight, dbias, var, 2, 0.0, eps, var.size),
           twin, xp, sum_dy, dotp, var, dweight, dbias, eps=eps)
    return True


LAUNCHERS = {"bn_sum": _reduce(0), "bn_sqdev": _reduce(1), "bn_bwd_sums": _reduce(2),
             "bn_fwd": _fwd, "bn_bwd_input": _bwd_input, "bn_mean": _divide, "bn_var": _divide,
             "bn_running": _running, "bn_param_grads": _param_grads}
"""Codelet name -> ``launcher(xp, twin, *operands, **params)``: runs the kernel (or, off a
GPU, ``twin(xp, *operands, **params)`` as one launch) and returns ``True``, or returns
``False`` where the operands are not the kernel's."""
