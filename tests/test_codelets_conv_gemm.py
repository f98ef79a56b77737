"""The ``cpu:gemm`` convolution variants (partition GEMMs) against their ``ref`` twins and
PyTorch: float64 to 1e-10, float32 to 1e-4 of the scale, over hypothesis geometries
(1x1 images, odd sizes, strides, dilation, padding modes, the direct 1x1 path, chunks
that do not divide the partition), and their prepared calls giving the variant's bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import conv, conv_gemm
from hetero_nn.codelets.prepared import WorkerBuffers, calls_of
from helpers import rel_err

TOL = {np.float64: 1e-10, np.float32: 1e-4}
CODELETS = (conv.conv2d_fwd, conv.conv2d_fwd_nobias, conv.conv2d_bwd_input,
            conv.conv2d_bwd_params, conv.conv2d_bwd_weight)


def problem(n, c, o, h, w, k, stride, padding, dilation, mode, dtype, seed=0):
    """``{codelet name: operands}`` of one geometry (outputs and REDUX partials filled)."""
    rng = np.random.default_rng(seed)
    params = dict(stride=stride, padding=padding, dilation=dilation, padding_mode=mode)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, k, k)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    shape = conv.conv2d_output_shape(x.shape, wt.shape, **params)
    dy = rng.standard_normal(shape).astype(dtype)
    dw0, db0 = rng.standard_normal(wt.shape).astype(dtype), rng.standard_normal(o).astype(dtype)
    return params, {
        "conv2d_fwd": (x, wt, b, np.full(shape, np.nan, dtype)),
        "conv2d_fwd_nobias": (x, wt, np.full(shape, np.nan, dtype)),
        "conv2d_bwd_input": (dy, wt, np.full(x.shape, np.nan, dtype)),
        "conv2d_bwd_params": (x, dy, dw0, db0),
        "conv2d_bwd_weight": (x, dy, dw0),
    }


def run(codelet, variant, operands, params):
    out = [a.copy() for a in operands]
    codelet.variants[variant](*out, **params)
    return out


def check_against_ref(dtype, *geometry):
    params, operands = problem(*geometry, dtype)
    for codelet in CODELETS:
        ref = run(codelet, "ref", operands[codelet.name], params)
        got = run(codelet, "cpu:gemm", operands[codelet.name], params)
        for a, b in zip(got, ref):
            assert rel_err(a, b) <= TOL[dtype], (codelet.name, geometry)


geometries = st.tuples(
    st.integers(1, 9), st.integers(1, 12), st.integers(1, 12),      # n, c, o
    st.integers(1, 11), st.integers(1, 11), st.sampled_from([1, 3]),  # h, w, k
    st.integers(1, 2), st.integers(0, 1), st.integers(1, 2),          # stride, pad, dilation
    st.sampled_from(["zeros", "reflect", "circular"]))


@settings(max_examples=30, deadline=None)
@given(geometries, st.sampled_from([np.float64, np.float32]))
def test_gemm_matches_its_ref_twin(geometry, dtype):
    n, c, o, h, w, k, stride, padding, dilation, mode = geometry
    try:
        conv.conv2d_geometry((n, c, h, w), (o, c, k, k), stride, padding, dilation, 1, mode)
    except ValueError:
        return  # refused before any variant runs (tested in test_codelets_conv.py)
    check_against_ref(dtype, *geometry)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("geometry", [
    (5, 6, 7, 16, 16, 1, 1, 0, 1, "zeros"),   # 1x1 on 256 pixels: GEMMs on the operands
    (3, 5, 4, 17, 19, 1, 1, 0, 1, "zeros"),   # the same, odd sizes
    (7, 8, 16, 1, 1, 3, 1, 1, 1, "zeros"),    # 1x1 images (ResNet's last layer, 32x32 in)
    (70, 3, 4, 4, 4, 3, 1, 1, 1, "zeros"),    # chunks of 64 samples, a partial last one
    (6, 8, 12, 7, 7, 1, 2, 0, 1, "zeros"),    # the strided 1x1 shortcut
    (2, 3, 4, 40, 40, 3, 1, 1, 1, "zeros"),   # large images: handed to im2col's kernels
], ids=str)
def test_gemm_paths_match_ref(geometry, dtype):
    check_against_ref(dtype, *geometry)


def test_paths_taken():
    geo = conv.conv2d_geometry((4, 8, 16, 16), (8, 8, 1, 1))
    assert conv_gemm.is_direct(geo, 16, 16) and conv_gemm.handles(geo, (4, 8, 16, 16))
    geo = conv.conv2d_geometry((64, 512, 4, 4), (512, 512, 3, 3), padding=1)
    assert conv_gemm.chunk_samples(64, 16) == 64 and conv_gemm.handles(geo, (64, 512, 4, 4))
    geo = conv.conv2d_geometry((4, 64, 32, 32), (64, 64, 3, 3), padding=1)
    assert not conv_gemm.handles(geo, (4, 64, 32, 32))
    geo = conv.conv2d_geometry((4, 64, 32, 32), (64, 64, 3, 3), stride=2, padding=1)
    assert not conv_gemm.handles(geo, (4, 64, 32, 32))  # 16x16 outputs: per sample
    geo = conv.conv2d_geometry((1, 64, 8, 8), (64, 64, 3, 3), padding=1)
    assert not conv_gemm.handles(geo, (1, 64, 8, 8))
    geo = conv.conv2d_geometry((4, 8, 4, 4), (8, 4, 3, 3), padding=1, groups=2)
    assert not conv_gemm.handles(geo, (4, 8, 4, 4))


def check_prepared_calls(variant, params, operands, buffers):
    """Each codelet's prepared calls of ``variant``, run twice on fresh copies of the
    operands (a replay), give the variant's bits."""
    for codelet in CODELETS:
        direct = run(codelet, variant, operands[codelet.name], params)
        prepared = [a.copy() for a in operands[codelet.name]]
        calls = calls_of(codelet.variants[variant], buffers, prepared, params)
        assert calls, codelet.name
        for _ in range(2):  # a replay runs the same calls again on new data
            for a, b in zip(prepared, operands[codelet.name]):
                a[...] = b
            for kernel, args in calls:
                kernel(*args)
            for a, b in zip(prepared, direct):
                assert a.tobytes() == b.tobytes(), codelet.name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_prepared_calls_give_the_variants_bits(dtype):
    params, operands = problem(9, 6, 8, 5, 5, 3, 1, 1, 1, "zeros", dtype, seed=3)
    check_prepared_calls("cpu:gemm", params, operands, WorkerBuffers())


def against_torch(variant, geometry, dtype):
    """``[(got, torch's)]`` for ``y``, ``dx``, ``dw``, ``db`` of one zero-padded geometry."""
    torch = pytest.importorskip("torch", reason="PyTorch is optional")
    params, operands = problem(*geometry, dtype)
    x, w, b, _ = operands["conv2d_fwd"]
    dy = operands["conv2d_bwd_input"][0]
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, stride=params["stride"],
                                    padding=params["padding"], dilation=params["dilation"])
    yt.backward(torch.tensor(dy))
    y = run(conv.conv2d_fwd, variant, operands["conv2d_fwd"], params)[3]
    dx = run(conv.conv2d_bwd_input, variant, operands["conv2d_bwd_input"], params)[2]
    zeros = (x, dy, np.zeros_like(w), np.zeros_like(b))
    _, _, dw, db = run(conv.conv2d_bwd_params, variant, zeros, params)
    return [(got, ref.detach().numpy())
            for got, ref in ((y, yt), (dx, xt.grad), (dw, wt.grad), (db, bt.grad))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_matches_torch(dtype):
    for geometry in [(6, 10, 12, 4, 4, 3, 1, 1, 1, "zeros"), (5, 6, 8, 9, 9, 3, 2, 1, 1, "zeros"),
                     (3, 7, 5, 16, 16, 1, 1, 0, 1, "zeros"), (4, 9, 6, 1, 1, 3, 1, 1, 1, "zeros")]:
        for got, ref in against_torch("cpu:gemm", geometry, dtype):
            assert rel_err(got, ref) <= TOL[dtype], geometry


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", [
    (3, 5, 7, 4, 4),    # planes: one block, rows of 16 (the scatter's epilogue)
    (1, 5, 7, 4, 4),    # one sample: its block of y is the product
    (2, 3, 6, 16, 16),  # direct: per sample, in place
], ids=str)
def test_folded_activation_in_the_epilogue_gives_the_unfused_bits(geometry, dtype):
    """``conv2d_folded_fwd``'s ReLU/ReLU6 in ``fwd_gemm_cpu``'s epilogue: the bits of the
    convolution, then ``relu_fwd``/``relu6_fwd``'s kernels (NaN, signed zeros, 0 and 6)."""
    from hetero_nn.codelets import activation, fused_blocks
    n, c, o, h, w = geometry
    rng = np.random.default_rng(1)
    x = (4 * rng.standard_normal((n, c, h, w))).astype(dtype)
    x[0, :, 0, 0] = np.nan
    wt = rng.standard_normal((o, c, 1, 1)).astype(dtype)
    wt[0] = -0.0  # -0.0 products, + 0.0
    b = rng.standard_normal(o).astype(dtype)
    b[0], b[1] = 0.0, 6.0
    assert conv_gemm.handles(conv.conv2d_geometry(x.shape, wt.shape), x.shape) or n == 1
    for name, act in (("relu", activation.relu_fwd), ("relu6", activation.relu6_fwd)):
        got = np.full((n, o, h, w), np.nan, dtype)
        fused_blocks.conv2d_folded_fwd.variants["cpu"](x, wt, b, got, activation=name)
        want = np.full_like(got, np.nan)
        conv.conv2d_fwd.variants["cpu:winograd"](x, wt, b, want)
        act.variants["cpu"](want.copy(), want)
        assert np.array_equal(got, want, equal_nan=True) and np.array_equal(
            np.signbit(got), np.signbit(want)), name
        ref = np.full_like(got, np.nan)
        fused_blocks.conv2d_folded_fwd.variants["ref"](x, wt, b, ref, activation=name)
        assert rel_err(got[1:], ref[1:]) <= TOL[dtype]
