"""Whole-operation CUDA kernels of the one-partition batch-norm codelets
(:mod:`.batchnorm_step`; the mechanism: :mod:`.kernels_cuda`).

A training step of a batch-norm layer over one partition is two kernels, one block per
channel (no atomics: each block adds its threads' float64 shares by a fixed tree):

* ``bn_train_fwd``: the channel's sum, its mean, the sum of squared deviations from it,
  the variance, the running statistics (thread 0), then ``y = x * alpha + beta``;
* ``bn_train_bwd``: ``sum(dy)`` and ``sum((x - mean) dy)``, the parameter gradients
  (thread 0, added into ``dweight`` and ``dbias``), then ``dx``.

Each step rounds as the split codelets' kernels (:mod:`.kernels_cuda_norm`) do, in the
same order; the twins are :mod:`.batchnorm_step`'s array-module compositions of
:mod:`.batchnorm`'s functions, which sum in NumPy's order, so the two agree to rounding.

Owns: the two kernels' factories, :data:`FACTORIES` and :data:`LAUNCHERS`.
"""

from __future__ import annotations

from .kernels_cuda import BLOCK, covers, launch
from .kernels_cuda_norm import _factory

__all__ = ["LAUNCHERS", "FACTORIES"]

_CHANNEL_SUM = r"""
// the sum of the block's ``part`` by a fixed tree, left in part[0] (every thread calls it)
__device__ void block_sum(double* part)
{
    const int t = threadIdx.x;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        __syncthreads();
    }
}
"""

_FWD = _CHANNEL_SUM + r"""
extern "C" __global__ void bn_train_fwd_@(
    const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
    const double* momentum, T* mean, T* var, T* y, const double count, const double eps,
    const long long n, const long long channels, const long long plane)
{
    __shared__ double part[128];
    __shared__ T stats[2];
    const long long c = blockIdx.x;
    const int t = threadIdx.x;
    const long long items = n * plane;
    double s = 0;
    for (long long e = t; e < items; e += blockDim.x)
        s += (double)x[((e / plane) * channels + c) * plane + e % plane];
    part[t] = s;
    block_sum(part);
    if (t == 0) stats[0] = (T)part[0] / (T)count;
    __syncthreads();
    const double m = (double)stats[0];
    s = 0;
    for (long long e = t; e < items; e += blockDim.x) {
        const double d = (double)x[((e / plane) * channels + c) * plane + e % plane] - m;
        s += d * d;
    }
    part[t] = s;
    block_sum(part);
    if (t == 0) {
        const T sqdev = (T)part[0];
        stats[1] = sqdev / (T)count;
        mean[c] = stats[0];
        var[c] = stats[1];
        const double mo = momentum[0];
        const T keep = (T)(1.0 - mo);
        const double unbiased = (double)sqdev / (count - 1.0);
        running_mean[c] = (T)(mo * (double)stats[0] + (double)(keep * running_mean[c]));
        running_var[c] = (T)(mo * unbiased + (double)(keep * running_var[c]));
    }
    __syncthreads();
    const double alpha = 1.0 / sqrt((double)stats[1] + eps) * (double)weight[c];
    const T a = (T)alpha;
    const T b = (T)((double)bias[c] - (double)stats[0] * alpha);
    for (long long e = t; e < items; e += blockDim.x) {
        const long long k = ((e / plane) * channels + c) * plane + e % plane;
        y[k] = x[k] * a + b;
    }
}
"""

_BWD = _CHANNEL_SUM + r"""
extern "C" __global__ void bn_train_bwd_@(
    const T* x, const T* dy, const T* mean, const T* var, const T* weight, T* dx,
    T* dweight, T* dbias, const double count, const double eps, const long long n,
    const long long channels, const long long plane)
{
    __shared__ double part1[128];
    __shared__ double part2[128];
    __shared__ T sums[2];
    const long long c = blockIdx.x;
    const int t = threadIdx.x;
    const long long items = n * plane;
    const double m = (double)mean[c];
    double s1 = 0, s2 = 0;
    for (long long e = t; e < items; e += blockDim.x) {
        const long long k = ((e / plane) * channels + c) * plane + e % plane;
        const double g = (double)dy[k];
        s1 += g;
        s2 += ((double)x[k] - m) * g;
    }
    part1[t] = s1;
    part2[t] = s2;
    block_sum(part1);
    block_sum(part2);
    const double invstd = 1.0 / sqrt((double)var[c] + eps);
    if (t == 0) {
        sums[0] = (T)part1[0];
        sums[1] = (T)part2[0];
        dweight[c] += (T)((double)sums[1] * invstd);
        dbias[c] += sums[0];
    }
    __syncthreads();
    const T scale = (T)(invstd * (double)weight[c]);
    const T grad_mean = sums[0] / (T)count;
    const T kk = (T)((double)sums[1] * invstd * invstd / count);
    const T mc = mean[c];
    for (long long e = t; e < items; e += blockDim.x) {
        const long long k = ((e / plane) * channels + c) * plane + e % plane;
        dx[k] = (dy[k] - grad_mean - (x[k] - mc) * kk) * scale;
    }
}
"""


train_fwd_kernel = _factory(_FWD, "bn_train_fwd")
train_bwd_kernel = _factory(_BWD, "bn_train_bwd")
FACTORIES = [train_fwd_kernel, train_bwd_kernel]


def _shape(x):
    n, c = x.shape[:2]
    return n, c, x.size // max(n * c, 1)


def _train_fwd(xp, twin, x, weight, bias, running_mean, running_var, momentum, mean, var, y,
               *, count, eps):
    if (x.ndim < 2 or momentum.dtype.name != "float64"
            or not covers(x, weight, bias, running_mean, running_var, mean, var, y)):
        return False
    n, c, plane = _shape(x)
    launch(xp, train_fwd_kernel(x.dtype.name), c * BLOCK,
           (x, weight, bias, running_mean, running_var, momentum, mean, var, y, count, eps,
            n, c, plane),
           twin, xp, x, weight, bias, running_mean, running_var, momentum, mean, var, y,
           count=count, eps=eps)
    return True


def _train_bwd(xp, twin, x, dy, mean, var, weight, dx, dweight, dbias, *, count, eps):
    if x.ndim < 2 or not covers(x, dy, mean, var, weight, dx, dweight, dbias):
        return False
    n, c, plane = _shape(x)
    launch(xp, train_bwd_kernel(x.dtype.name), c * BLOCK,
           (x, dy, mean, var, weight, dx, dweight, dbias, count, eps, n, c, plane),
           twin, xp, x, dy, mean, var, weight, dx, dweight, dbias, count=count, eps=eps)
    return True


LAUNCHERS = {"bn_train_fwd": _train_fwd, "bn_train_bwd": _train_bwd}
"""Codelet name -> ``launcher(xp, twin, *operands, **params)`` (as
:data:`.kernels_cuda_norm.LAUNCHERS`)."""
