"""Compile the convolution kernels into Numba's on-disk cache, in a background process.

In a fresh clone (CI) most of the suite's time is Numba compiling kernels on first use,
in the test process, one after another; the convolution variants (direct, im2col, gemm,
Winograd, unrolled, the stacked depthwise ones, float32 and float64) are the largest of
them, seconds each. ``conftest.py`` starts this script at ``nice 19`` when the session
holds convolution tests, so the machine's other core compiles them while the first tests
run; a test that calls a kernel the script has written loads it from the cache (Numba's
``cache=True``), one the script has not reached yet is compiled by the test as before.
The code loaded is the code the test would have compiled: the tests prove the same thing.

The calls are the tests' own, on tiny operands; their results are not looked at.
``HETERO_NN_WARM=0`` turns the script off.
"""

import numpy as np

from hetero_nn.codelets import conv, depthwise

#: conv2d variants the tests call (``ref`` and ``cuda`` compile nothing here)
CONV_VARIANTS = ("cpu:direct", "cpu:im2col", "cpu:gemm", "cpu:winograd", "cpu:unrolled")


def warm_conv(dtype, variant):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 6)).astype(dtype)
    w = rng.standard_normal((4, 3, 3, 3)).astype(dtype)  # 3x3 stride 1: Winograd's case too
    b = rng.standard_normal(4).astype(dtype)
    dy = rng.standard_normal((2, 4, 6, 6)).astype(dtype)
    params = {"stride": 1, "padding": 1}
    conv.conv2d_fwd.variants[variant](x, w, b, np.empty_like(dy), **params)
    conv.conv2d_fwd_nobias.variants[variant](x, w, np.empty_like(dy), **params)
    conv.conv2d_bwd_input.variants[variant](dy, w, np.empty_like(x), **params)
    conv.conv2d_bwd_params.variants[variant](x, dy, np.zeros_like(w), np.zeros_like(b), **params)
    conv.conv2d_bwd_weight.variants[variant](x, dy, np.zeros_like(w), **params)


def warm_depthwise(dtype, variant):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 6)).astype(dtype)
    w = rng.standard_normal((4, 1, 3, 3)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    params = {"stride": 1, "padding": 1, "dilation": 1, "padding_mode": "zeros"}
    dy = rng.standard_normal((2, 4, 6, 6)).astype(dtype)
    depthwise.conv2d_depthwise_fwd.variants[variant](x, w, b, np.empty_like(dy), **params)
    depthwise.conv2d_depthwise_fwd_nobias.variants[variant](x, w, np.empty_like(dy), **params)
    depthwise.conv2d_depthwise_bwd_input.variants[variant](dy, w, np.empty_like(x), **params)
    depthwise.conv2d_depthwise_bwd_params.variants[variant](x, dy, np.zeros_like(w),
                                                           np.zeros_like(b), **params)
    depthwise.conv2d_depthwise_bwd_weight.variants[variant](x, dy, np.zeros_like(w), **params)


def main():
    # float64 first: the first tests to need these kernels (the benchmarks' runs) are float64
    for dtype in (np.float64, np.float32):
        for variant in CONV_VARIANTS:
            warm_conv(dtype, variant)
        for variant in ("cpu", "cpu:stacked"):
            warm_depthwise(dtype, variant)


if __name__ == "__main__":
    main()
