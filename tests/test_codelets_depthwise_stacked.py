"""The depthwise variants for small images (``cpu:stacked``, ``codelets/depthwise_stacked.py``)
and the folded depthwise + batch norm codelets (``codelets/depthwise_fused.py``): the same bits as the ``cpu`` variants over
hypothesis geometries (odd sizes, 1x1 images, strides, dilations, the four
padding modes, channel multipliers), against PyTorch in float64 (1e-10) and float32, and
the fused codelets against their ``ref`` and PyTorch's eval-mode conv + batch norm +
ReLU6."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import depthwise, depthwise_fused
from helpers import draw_window, rel_err

TOL = {np.float64: 1e-10, np.float32: 1e-5}

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


@st.composite
def geometries(draw):
    """``(n, c, multiplier, h, w, kernel, stride, padding, dilation, mode)`` that fits."""
    k, stride, pad, dilation, mode, h, w = draw_window(draw, 3, 2, 2, 2, 9)
    return (draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 2)), h, w,
            k, stride, pad, dilation, mode)


def operands(case, dtype, seed=0):
    n, c, m, h, w, k, stride, pad, dilation, mode = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((c * m, 1, *k)).astype(dtype)
    b = rng.standard_normal(c * m).astype(dtype)
    params = {"stride": stride, "padding": pad, "dilation": dilation, "padding_mode": mode}
    geo = depthwise.geometry(x.shape, wt.shape, params)
    dy = rng.standard_normal((n, c * m, geo.out_h, geo.out_w)).astype(dtype)
    return x, wt, b, dy, params


def run(fast, x, w, b, dy, params):
    """``y, y_nobias, dx, dw, db, dw_alone`` of the ``cpu`` variants (``fast``: their twins
    instead); outputs start as NaN (every entry is written), gradients as REDUX partials
    that hold a value already (they are added onto)."""
    y = np.full(dy.shape, np.nan, x.dtype)
    forward = backward = "cpu:stacked" if fast else "cpu"
    depthwise.conv2d_depthwise_fwd.variants[forward](x, w, b, y, **params)
    y0 = np.full(dy.shape, np.nan, x.dtype)
    depthwise.conv2d_depthwise_fwd_nobias.variants[forward](x, w, y0, **params)
    dx = np.full(x.shape, np.nan, x.dtype)
    depthwise.conv2d_depthwise_bwd_input.variants[forward](dy, w, dx, **params)
    dw, db, dw_alone = np.full_like(w, 0.5), np.full_like(b, 0.25), np.full_like(w, 0.5)
    depthwise.conv2d_depthwise_bwd_params.variants[backward](x, dy, dw, db, **params)
    depthwise.conv2d_depthwise_bwd_weight.variants[backward](x, dy, dw_alone, **params)
    return y, y0, dx, dw, db, dw_alone


def torch_conv(x, w, b, dy, params):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-check needs it")
    module = torch.nn.Conv2d(x.shape[1], w.shape[0], w.shape[2:], stride=params["stride"],
                             padding=params["padding"], dilation=params["dilation"],
                             groups=x.shape[1], padding_mode=params["padding_mode"])
    module = module.to(torch.float64 if x.dtype == np.float64 else torch.float32)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(w))
        module.bias.copy_(torch.from_numpy(b))
    xt = torch.tensor(x, requires_grad=True)
    yt = module(xt)
    yt.backward(torch.from_numpy(dy))
    return (yt.detach().numpy(), xt.grad.numpy(), module.weight.grad.numpy(),
            module.bias.grad.numpy())


@settings(max_examples=8, deadline=None)
@given(case=geometries(), dtype=st.sampled_from([np.float64, np.float32]))
def test_fast_variants_give_the_bits_of_cpu_and_match_torch(case, dtype):
    x, w, b, dy, params = operands(case, dtype)
    fast = run(True, x, w, b, dy, params)
    for got, want in zip(fast, run(False, x, w, b, dy, params)):
        assert np.array_equal(got, want)
    y, dx, dw, db = torch_conv(x, w, b, dy, params)
    tol = TOL[dtype]
    for got, want in zip(fast, (y, y - b[:, None, None], dx, dw + 0.5, db + 0.25, dw + 0.5)):
        assert rel_err(got, want) <= tol


@pytest.mark.parametrize("case", [
    (2, 300, 1, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1), "zeros"),  # blocks of channels
    (3, 267, 1, 9, 7, (3, 3), (2, 2), (1, 1), (1, 1), "zeros"),  # odd sizes, stride 2
    (2, 9, 1, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1), "zeros"),   # 1x1 images
], ids=str)
def test_fast_variants_on_mobilenet_like_layers(case):
    x, w, b, dy, params = operands(case, np.float32)
    for got, want in zip(run(True, x, w, b, dy, params), run(False, x, w, b, dy, params)):
        assert np.array_equal(got, want)


def test_fast_variants_are_declared_same_bits_beside_the_pinned_cpu():
    for codelet in (depthwise.conv2d_depthwise_fwd, depthwise.conv2d_depthwise_fwd_nobias,
                    depthwise.conv2d_depthwise_bwd_input, depthwise.conv2d_depthwise_bwd_params,
                    depthwise.conv2d_depthwise_bwd_weight):
        assert codelet.same_bits == ("cpu", "cpu:stacked")


def bn_eval_torch(x, w, b, mean, var, weight, bias, params, eps, activation):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-check needs it")
    F = torch.nn.functional
    t = torch.from_numpy
    y = F.conv2d(t(x), t(w), None if b is None else t(b), stride=params["stride"],
                 padding=params["padding"], dilation=params["dilation"], groups=x.shape[1])
    y = F.batch_norm(y, t(mean), t(var), t(weight), t(bias), False, 0.1, eps)
    return {"none": y, "relu": F.relu(y), "relu6": F.relu6(y)}[activation].numpy()


@settings(max_examples=12, deadline=None)
@given(case=geometries(), dtype=st.sampled_from([np.float64, np.float32]),
       activation=st.sampled_from(["none", "relu", "relu6"]),
       bias=st.booleans())
def test_folded_bn_eval_matches_ref_and_torch(case, dtype, activation, bias):
    case = (*case[:-1], "zeros")  # F.conv2d pads with zeros
    x, w, b, _, params = operands(case, dtype, seed=1)
    params["padding_mode"] = "zeros"
    rng = np.random.default_rng(2)
    c = w.shape[0]
    stats = [rng.standard_normal(c).astype(dtype), rng.uniform(0.5, 2, c).astype(dtype),
             rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)]
    x *= 4  # outputs beyond 6 and below 0
    codelet = (depthwise_fused.conv2d_depthwise_bn_eval_fwd if bias
               else depthwise_fused.conv2d_depthwise_nobias_bn_eval_fwd)
    ops = (x, w, b) if bias else (x, w)
    geo = depthwise.geometry(x.shape, w.shape, params)
    outs = {}
    for variant in ("ref", "cpu", "cuda"):
        y = np.full((x.shape[0], c, geo.out_h, geo.out_w), np.nan, dtype)
        codelet.variants[variant](*ops, *stats, y, **params, eps=1e-5, activation=activation)
        outs[variant] = y
    want = bn_eval_torch(x, w, b if bias else None, *stats, params, 1e-5, activation)
    tol = TOL[dtype]
    for variant, y in outs.items():
        assert rel_err(y, want) <= tol, variant
    assert rel_err(outs["cpu"], outs["ref"]) <= (1e-13 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu6_kernel_gives_the_clamp_bits_with_nan_and_signed_zeros(dtype):
    from hetero_nn.codelets import activation
    x = np.array([np.nan, -0.0, 0.0, 6.0, 6.5, -1.0, np.inf, -np.inf, 5.99, 1e-30, -1e-30] * 5,
                 dtype)
    got, want = np.empty_like(x), np.empty_like(x)
    activation.relu6_fwd.variants["cpu"](x, got)
    activation.relu6_fwd.variants["ref"](x, want)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 passes, as a clamp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride", [1, 2])
def test_stacked_activation_gives_the_bits_of_the_activation_after(dtype, stride):
    """``fwd_stacked``'s ReLU/ReLU6, applied to a stack's sums in place, against its output
    without one then ``relu_fwd``/``relu6_fwd``'s kernels (NaN, signed zeros, 0 and 6)."""
    from hetero_nn.codelets import activation
    from hetero_nn.codelets.conv_im2col import run_calls, worker_buffer
    rng = np.random.default_rng(2)
    x = (4 * rng.standard_normal((3, 5, 4, 5))).astype(dtype)
    x[0, 1] = np.nan
    w = rng.standard_normal((5, 1, 3, 3)).astype(dtype)
    w[2] = -0.0
    b = rng.standard_normal(5).astype(dtype)
    b[3] = 6.0
    params = {"stride": stride, "padding": 1}
    shape = (3, 5, (4 - 1) // stride + 1, (5 - 1) // stride + 1)
    for code, act in ((1, activation.relu_fwd), (2, activation.relu6_fwd)):
        for bias in (None, b):
            got, want = np.full(shape, np.nan, dtype), np.full(shape, np.nan, dtype)
            run_calls(depthwise.fwd_stacked_calls(worker_buffer, x, w, bias, got, params, code))
            run_calls(depthwise.fwd_stacked_calls(worker_buffer, x, w, bias, want, params))
            act.variants["cpu"](want.copy(), want)
            assert np.array_equal(got, want, equal_nan=True)
            assert np.array_equal(np.signbit(got), np.signbit(want))
