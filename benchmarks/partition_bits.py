"""Which kernels give an image the same bits whatever partition computes it?

Runs each CPU variant of the convolution's forward and input gradient, and of the dense
layer's forward and input gradient, on one batch split into 1, 2 and 4 partitions (as
``granularity`` 1, 2, 4 do; BLAS held to one thread as inside a runtime), and prints,
per dtype, variant and shape, whether the outputs are the same bits (``same``) or only
equal to rounding (the largest difference relative to the scale). Then it probes
OpenBLAS's sgemm and dgemm through Numba's ``np.dot`` (the kernels' BLAS) directly: one
``[O, R] @ [R, k]`` product against the same product over two column halves. A check,
not a timing (about a minute, mostly compilation)::

    python benchmarks/partition_bits.py
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

#: (n, c, o, h, w, k, stride, padding): MobileNetV2's 320 -> 1280 expansion on 4x4 images,
#: ResNet-18's 3x3 layers on 8x8 and 4x4 images, a stride-2 3x3.
CONV = [(32, 320, 1280, 4, 4, 1, 1, 0), (32, 64, 64, 8, 8, 3, 1, 1),
        (32, 128, 128, 4, 4, 3, 1, 1), (16, 32, 64, 8, 8, 3, 2, 1)]
#: (n, in features, out features): the classifiers of MobileNetV2 and a CIFAR CNN.
DENSE = [(32, 1280, 10), (64, 4096, 10), (32, 400, 120)]
GRANULARITIES = (1, 2, 4)


def split_run(kernel, n, batched, shared, out_tail, dtype, g):
    outs = []
    for part in np.array_split(np.arange(n), g):
        rows = slice(part[0], part[-1] + 1)
        out = np.empty((len(part), *out_tail), dtype)
        kernel(*(a[rows] for a in batched), *shared, out)
        outs.append(out)
    return np.concatenate(outs)


def verdict(runs):
    worst = max(float(np.max(np.abs(r - runs[0]))) for r in runs[1:])
    return "same" if worst == 0 else f"{worst / float(np.max(np.abs(runs[0]))):.1e}"


def conv_rows(dtype):
    from hetero_nn.codelets import conv
    rng = np.random.default_rng(0)
    for n, c, o, h, w, k, stride, padding in CONV:
        params = dict(stride=stride, padding=padding)
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        wt = rng.standard_normal((o, c, k, k)).astype(dtype)
        b = rng.standard_normal(o).astype(dtype)
        y_shape = conv.conv2d_output_shape(x.shape, wt.shape, **params)
        dy = rng.standard_normal(y_shape).astype(dtype)
        for variant in ("cpu:direct", "cpu:im2col", "cpu:gemm", "cpu:winograd", "cpu:unrolled",
                        "ref"):
            fwd = conv.conv2d_fwd.variants[variant]
            bwd = conv.conv2d_bwd_input.variants[variant]
            yield (f"conv {c}->{o} {k}x{k}/{stride} on {h}x{w}, n={n}", variant,
                   verdict([split_run(lambda *a: fwd(*a, **params), n, (x,), (wt, b),
                                      y_shape[1:], dtype, g) for g in GRANULARITIES]),
                   verdict([split_run(lambda *a: bwd(*a, **params), n, (dy,), (wt,),
                                      x.shape[1:], dtype, g) for g in GRANULARITIES]))


def dense_rows(dtype):
    from hetero_nn.codelets import dense
    rng = np.random.default_rng(1)
    for n, i, o in DENSE:
        x = rng.standard_normal((n, i)).astype(dtype)
        w = rng.standard_normal((o, i)).astype(dtype)
        b = rng.standard_normal(o).astype(dtype)
        dy = rng.standard_normal((n, o)).astype(dtype)
        for variant in ("cpu", "cpu:blas", "ref"):
            fwd, bwd = dense.dense_fwd.variants[variant], dense.dense_bwd_input.variants[variant]
            yield (f"dense {i}->{o}, n={n}", variant,
                   verdict([split_run(fwd, n, (x,), (w, b), (o,), dtype, g)
                             for g in GRANULARITIES]),
                   verdict([split_run(bwd, n, (dy,), (w,), (i,), dtype, g)
                             for g in GRANULARITIES]))


def blas_probe():
    """``(dtype, (O, R, k), columns that differ)``: ``w @ cols`` in one call against two."""
    import numba

    @numba.njit
    def product(a, b, out):
        np.dot(a, b, out)

    rng = np.random.default_rng(2)
    for dtype in (np.float32, np.float64):
        for o, r, k in [(1280, 320, 512), (64, 576, 512), (512, 4608, 256), (96, 24, 1024)]:
            w = rng.standard_normal((o, r)).astype(dtype)
            cols = rng.standard_normal((r, k)).astype(dtype)
            whole, halves = np.empty((o, k), dtype), np.empty((o, k), dtype)
            product(w, cols, whole)
            for lo, hi in ((0, k // 2), (k // 2, k)):
                part = np.empty((o, hi - lo), dtype)
                product(w, np.ascontiguousarray(cols[:, lo:hi]), part)
                halves[:, lo:hi] = part
            yield dtype.__name__, (o, r, k), int(np.any(whole != halves, axis=0).sum())


def main():
    import scipy.linalg  # noqa: F401  (loads SciPy's BLAS, the one Numba's np.dot calls)
    libs = [f"{i['internal_api']} {i['version']} {i.get('architecture')}"
            for i in threadpool_info() if i["user_api"] == "blas"]
    print("BLAS:", "; ".join(libs))
    with threadpool_limits(1, user_api="blas"):
        for dtype in (np.float32, np.float64):
            print(f"\n{dtype.__name__}: outputs at g = 1, 2, 4 (same, or largest relative "
                  "difference)")
            print(f"{'layer':<36} {'variant':<13} {'forward':>9} {'input grad':>10}")
            for layer, variant, fwd, bwd in [*conv_rows(dtype), *dense_rows(dtype)]:
                print(f"{layer:<36} {variant:<13} {fwd:>9} {bwd:>10}")
        print("\nBLAS through Numba's np.dot: [O, R] @ [R, k] in one call against two halves")
        for dtype, shape, differ in blas_probe():
            print(f"{dtype:<8} {str(shape):<20} {differ:>5} of {shape[2]} columns differ")


if __name__ == "__main__":
    main()
