"""Which convolution and dense kernels give an image the same bits whatever partition it
is computed in (granularity 1, 2 or 4 of one batch), float32 and float64.

Per-image outputs (forward, input gradient) are the same bits at every granularity for
kernels whose sums never span two images: the per-sample ``cpu:direct`` and
``cpu:im2col`` convolutions and the dense layers' Numba ``cpu`` loops, in both
precisions. The kernels that run one BLAS GEMM over several images of a partition
(``cpu:gemm``, and ``cpu:winograd``/``cpu:unrolled``, which hand small images to it; the
dense layers' ``cpu:blas``) are the same bits in float64 only: OpenBLAS's sgemm rounds a
column differently by where it falls in the call's tiles and by the call's shape
(``benchmarks/partition_bits.py``, ``docs/architecture.md``), so in float32 they agree
to rounding (6e-7 of the scale seen; 1e-5 checked here). The shapes are those of the
first report: 1x1 and 3x3 convolutions on 4x4 and 8x8 images.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv, dense
from helpers import rel_err

#: (n, c, o, h, w, k, stride, padding): the 1x1 expansion on 4x4 images, 3x3 on 4x4 and 8x8.
SHAPES = [(8, 32, 96, 4, 4, 1, 1, 0), (8, 16, 24, 4, 4, 3, 1, 1), (8, 16, 24, 8, 8, 3, 1, 1)]
PER_SAMPLE = ("cpu:direct", "cpu:im2col")
PARTITION_GEMM = ("cpu:gemm", "cpu:winograd", "cpu:unrolled")


def operands(n, c, o, h, w, k, stride, padding, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, k, k)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    params = dict(stride=stride, padding=padding)
    dy = rng.standard_normal(conv.conv2d_output_shape(x.shape, wt.shape, **params)).astype(dtype)
    return x, wt, b, dy, params


def by_partition(kernel, g, batched, shared, out_shape, dtype):
    """``kernel`` run on each of ``g`` partitions of the batch, outputs concatenated."""
    outs = []
    with threadpool_limits(1, user_api="blas"):  # as inside a runtime
        for part in np.array_split(np.arange(out_shape[0]), g):
            rows = slice(part[0], part[-1] + 1)
            out = np.full((len(part), *out_shape[1:]), np.nan, dtype)
            kernel(*(a[rows] for a in batched), *shared, out)
            outs.append(out)
    return np.concatenate(outs)


def conv_runs(variant, shape, dtype):
    """``{codelet name: [outputs at g = 1, 2, 4]}`` of the forward and input gradient."""
    x, wt, b, dy, params = operands(*shape, dtype)
    fwd = lambda *a: conv.conv2d_fwd.variants[variant](*a, **params)  # noqa: E731
    bwd = lambda *a: conv.conv2d_bwd_input.variants[variant](*a, **params)  # noqa: E731
    fwd_b = lambda x_, out: fwd(x_, wt, b, out)  # noqa: E731
    bwd_w = lambda dy_, out: bwd(dy_, wt, out)  # noqa: E731
    return {"conv2d_fwd": [by_partition(fwd_b, g, (x,), (), dy.shape, dtype) for g in (1, 2, 4)],
            "conv2d_bwd_input": [by_partition(bwd_w, g, (dy,), (), x.shape, dtype)
                                 for g in (1, 2, 4)]}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", PER_SAMPLE + PARTITION_GEMM)
def test_convolution_bits_across_partitions(variant, dtype):
    exact = dtype == np.float64 or variant in PER_SAMPLE
    for shape in SHAPES:
        for name, (one, two, four) in conv_runs(variant, shape, dtype).items():
            for other in (two, four):
                if exact:
                    assert np.array_equal(one, other), (variant, name, shape)
                else:
                    assert rel_err(other, one) <= 1e-5, (variant, name, shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_bits_across_partitions(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 1280)).astype(dtype)
    w = rng.standard_normal((10, 1280)).astype(dtype)
    b = rng.standard_normal(10).astype(dtype)
    for variant in ("cpu", "cpu:blas"):
        kernel = dense.dense_fwd.variants[variant]
        one, two, four = (by_partition(kernel, g, (x,), (w, b), (32, 10), dtype)
                          for g in (1, 2, 4))
        for other in (two, four):
            if dtype == np.float64 or variant == "cpu":
                assert np.array_equal(one, other), variant
            else:
                assert rel_err(other, one) <= 1e-5, variant
