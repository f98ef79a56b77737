"""The ``cpu:winograd`` forward convolutions (``codelets/conv_winograd.py``) against their
``ref`` twins and PyTorch: float64 to 1e-10, float32 to 1e-4 of the scale, over
hypothesis geometries the Winograd kernels take (odd images, padding 0-2, partial last
tiles, chunks that do not divide the partition), the layers they hand to
``cpu:unrolled`` (and it to ``cpu:gemm``), and their prepared calls giving the variant's bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import conv, conv_winograd
from hetero_nn.codelets.prepared import WorkerBuffers, calls_of
from helpers import rel_err

TOL = {np.float64: 1e-10, np.float32: 1e-4}


def operands(n, c, o, h, w, k, dtype, bias, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, k, k)).astype(dtype)
    return x, wt, (rng.standard_normal(o).astype(dtype) if bias else None)


def forward(variant, x, wt, b, **params):
    y = np.full(conv.conv2d_output_shape(x.shape, wt.shape, **params), np.nan, x.dtype)
    if b is None:
        conv.conv2d_fwd_nobias.variants[variant](x, wt, y, **params)
    else:
        conv.conv2d_fwd.variants[variant](x, wt, b, y, **params)
    return y


def gradient_problem(n, c, o, h, w, padding, dtype):
    """``(x, wt, geo, dy)`` of a 3x3 layer without bias and its output gradient."""
    x, wt, _ = operands(n, c, o, h, w, 3, dtype, False)
    geo = conv.conv2d_geometry(x.shape, wt.shape, padding=padding)
    dy = np.random.default_rng(1).standard_normal(
        conv.conv2d_output_shape(x.shape, wt.shape, padding=padding)).astype(dtype)
    return x, wt, geo, dy


geometries = st.tuples(
    st.integers(1, 7), st.integers(16, 24), st.integers(1, 20),    # n, c, o
    st.integers(2, 11), st.integers(2, 11), st.integers(0, 2),     # h, w, padding
    st.booleans())                                                  # bias


@settings(max_examples=30, deadline=None)
@given(geometries, st.sampled_from([np.float64, np.float32]))
def test_winograd_matches_ref_twin_and_torch(geometry, dtype):
    n, c, o, h, w, padding, bias = geometry
    if min(h, w) + 2 * padding < 3:
        return
    x, wt, b = operands(n, c, o, h, w, 3, dtype, bias)
    geo = conv.conv2d_geometry(x.shape, wt.shape, padding=padding)
    assert conv_winograd.handles(geo, x.shape) == (min(geo.out_h, geo.out_w) >= 4)
    got = forward("cpu:winograd", x, wt, b, padding=padding)
    assert rel_err(got, forward("ref", x, wt, b, padding=padding)) <= TOL[dtype]
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt),
                                      None if b is None else torch.from_numpy(b),
                                      padding=padding).numpy()
    assert rel_err(got, want) <= TOL[dtype]


@pytest.mark.parametrize("params, c, k, h", [
    ({"stride": 2, "padding": 1}, 16, 3, 6),          # strided: partition GEMMs
    ({"padding": 1, "dilation": 2}, 16, 3, 6),        # dilated
    ({"padding": 1, "padding_mode": "reflect"}, 16, 3, 6),
    ({"padding": 1}, 8, 3, 6),                        # too few input channels
    ({}, 16, 1, 6),                                   # 1x1
    ({"padding": 1}, 16, 3, 2),                       # 2x2 images: unrolled filters
])
def test_other_layers_go_to_unrolled_or_partition_gemms(params, c, k, h):
    x, wt, b = operands(4, c, 16, h, h, k, np.float64, True)
    geo = conv.conv2d_geometry(x.shape, wt.shape, **params)
    assert not conv_winograd.handles(geo, x.shape)
    np.testing.assert_array_equal(forward("cpu:winograd", x, wt, b, **params),
                                  forward("cpu:unrolled", x, wt, b, **params))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, h", [(70, 8), (5, 32), (3, 4)])  # chunks of 64 and 6 samples
def test_prepared_calls_give_the_variant_bits(n, h, dtype):
    x, wt, b = operands(n, 16, 32, h, h, 3, dtype, True)
    want = forward("cpu:winograd", x, wt, b, padding=1)
    assert rel_err(want, forward("ref", x, wt, b, padding=1)) <= TOL[dtype]
    y = np.empty_like(want)
    calls = calls_of(conv.conv2d_fwd.variants["cpu:winograd"], WorkerBuffers(), [x, wt, b, y],
                     {"padding": 1})
    for kernel, args in calls:
        kernel(*args)
    np.testing.assert_array_equal(y, want)


@settings(max_examples=25, deadline=None)
@given(geometries, st.sampled_from([np.float64, np.float32]))
def test_input_gradient_matches_ref_twin_and_torch(geometry, dtype):
    n, o, c, h, w, padding, _ = geometry  # o >= 16: the gradient's convolution reads dy's o
    if min(h, w) + 2 * padding < 3:
        return
    x, wt, geo, dy = gradient_problem(n, c, o, h, w, padding, dtype)
    assert conv_winograd.handles_input(geo, dy.shape) == (min(h, w) >= 4)
    got, ref = (np.full(x.shape, np.nan, dtype) for _ in range(2))
    conv.conv2d_bwd_input.variants["cpu:winograd"](dy, wt, got, padding=padding)
    conv.conv2d_bwd_input.variants["ref"](dy, wt, ref, padding=padding)
    assert rel_err(got, ref) <= TOL[dtype]
    torch = pytest.importorskip("torch")
    want = torch.nn.grad.conv2d_input(x.shape, torch.from_numpy(wt), torch.from_numpy(dy),
                                      padding=padding).numpy()
    assert rel_err(got, want) <= TOL[dtype]
    calls = calls_of(conv.conv2d_bwd_input.variants["cpu:winograd"], WorkerBuffers(),
                     [dy, wt, ref], {"padding": padding})
    for kernel, args in calls or ():
        kernel(*args)
    np.testing.assert_array_equal(ref if calls else got, got)


@pytest.mark.parametrize("params", [{"padding": 3}, {"stride": 2, "padding": 1},
                                    {"padding": "same", "dilation": 2}])
def test_other_input_gradients_go_to_unrolled_or_partition_gemms(params):
    x, wt, _ = operands(3, 16, 16, 8, 8, 3, np.float64, False)
    dy = np.ones(conv.conv2d_output_shape(x.shape, wt.shape, **params))
    assert not conv_winograd.handles_input(conv.conv2d_geometry(x.shape, wt.shape, **params),
                                           dy.shape)
    got, want = np.empty_like(x), np.empty_like(x)
    conv.conv2d_bwd_input.variants["cpu:winograd"](dy, wt, got, **params)
    conv.conv2d_bwd_input.variants["cpu:unrolled"](dy, wt, want, **params)
    np.testing.assert_array_equal(got, want)


def weight_gradients(variant, x, wt, dy, bias, **params):
    """``(dw, db)`` added into partials that hold 1.5 and -2 (the REDUX contract), through
    ``conv2d_bwd_params`` with a bias and ``conv2d_bwd_weight`` without."""
    dw, db = np.full_like(wt, 1.5), np.full(wt.shape[0], -2.0, wt.dtype)
    if bias:
        conv.conv2d_bwd_params.variants[variant](x, dy, dw, db, **params)
    else:
        conv.conv2d_bwd_weight.variants[variant](x, dy, dw, **params)
    return dw, db


weight_geometries = st.tuples(
    st.integers(1, 3), st.sampled_from([16, 128, 130]), st.sampled_from([7, 128, 129]),
    st.integers(2, 9), st.integers(2, 9), st.integers(0, 2), st.booleans())


@settings(max_examples=10, deadline=None)
@given(weight_geometries, st.sampled_from([np.float64, np.float32]))
def test_weight_gradient_matches_ref_twin_and_torch(geometry, dtype):
    n, c, o, h, w, padding, bias = geometry  # 128 channels or more on both sides: Winograd
    if min(h, w) + 2 * padding < 3:
        return
    x, wt, geo, dy = gradient_problem(n, c, o, h, w, padding, dtype)
    got = weight_gradients("cpu:winograd", x, wt, dy, bias, padding=padding)
    ref = weight_gradients("ref", x, wt, dy, bias, padding=padding)
    for a, b in zip(got, ref):
        assert rel_err(a, b) <= TOL[dtype]
    assert conv_winograd.handles_weight(geo, x.shape, o) == (
        min(c, o) >= 128 and min(geo.out_h, geo.out_w) >= 4)
    if not conv_winograd.handles_weight(geo, x.shape, o):  # unrolled filters or GEMMs
        for a, b in zip(got, weight_gradients("cpu:unrolled", x, wt, dy, bias, padding=padding)):
            np.testing.assert_array_equal(a, b)
    torch = pytest.importorskip("torch")
    want = torch.nn.grad.conv2d_weight(torch.from_numpy(x), wt.shape, torch.from_numpy(dy),
                                       padding=padding).numpy()
    assert rel_err(got[0] - 1.5, want) <= TOL[dtype]


@pytest.mark.parametrize("n, h, dtype", [(65, 8, np.float32),   # chunks of 64 samples
                                         (5, 9, np.float64)])   # partial tiles
def test_weight_gradient_prepared_calls_give_the_variant_bits(n, h, dtype):
    x, wt, _ = operands(n, 128, 128, h, h, 3, dtype, False)
    dy = np.random.default_rng(2).standard_normal((n, 128, h, h)).astype(dtype)
    want = weight_gradients("cpu:winograd", x, wt, dy, True, padding=1)
    dw, db = np.full_like(wt, 1.5), np.full(128, -2.0, dtype)
    calls = calls_of(conv.conv2d_bwd_params.variants["cpu:winograd"], WorkerBuffers(),
                     [x, dy, dw, db], {"padding": 1})
    for kernel, args in calls:
        kernel(*args)
    np.testing.assert_array_equal(dw, want[0])
    np.testing.assert_array_equal(db, want[1])
