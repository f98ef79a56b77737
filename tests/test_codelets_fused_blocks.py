"""The fused block codelets (``codelets/fused_blocks.py``): convolution + batch norm folded
(+ ReLU / ReLU6) and the residual join + ReLU, each variant against its ``ref`` twin and
PyTorch's eval-mode chain (float64 1e-10, float32 1e-4 of the scale) over hypothesis
geometries (1x1 images, odd sizes, strides, groups), their prepared calls giving the
variant's bits, the fold as a task of its own then the convolution on its output giving
the one-task codelets' bits, and ``add2_relu`` giving the unfused pair's bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import conv
from hetero_nn.codelets.activation import relu_fwd
from hetero_nn.codelets import depthwise_fused
from hetero_nn.codelets.fused_blocks import (add2_relu, bn_fold_eval, bn_nobias_fold_eval,
                                             conv2d_bn_eval_fwd, conv2d_folded_fwd,
                                             conv2d_nobias_bn_eval_fwd)
from hetero_nn.codelets.prepared import WorkerBuffers, calls_of
from hetero_nn.codelets.residual import add2
from helpers import rel_err

TOL = {np.float64: 1e-10, np.float32: 1e-4}


def problem(n, c, o, h, w, k, stride, padding, groups, bias, dtype, seed=0):
    rng = np.random.default_rng(seed)
    params = dict(stride=stride, padding=padding, groups=groups)
    x = rng.standard_normal((n, c * groups, h, w)).astype(dtype)
    wt = rng.standard_normal((o * groups, c, k, k)).astype(dtype)
    b = rng.standard_normal(o * groups).astype(dtype) if bias else None
    stats = [rng.standard_normal(o * groups).astype(dtype),      # running mean
             rng.uniform(0.2, 3.0, o * groups).astype(dtype),    # running var
             rng.uniform(0.5, 2.0, o * groups).astype(dtype),    # weight
             rng.standard_normal(o * groups).astype(dtype)]      # bias
    shape = conv.conv2d_output_shape(x.shape, wt.shape, **params)
    operands = [x, wt, *([b] if bias else []), *stats, np.full(shape, np.nan, dtype)]
    return params, operands


def run(codelet, variant, operands, params):
    out = [a.copy() for a in operands]
    codelet.variants[variant](*out, **params)
    return out[-1]


def torch_chain(operands, params, bias, activation, eps):
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(a) for a in operands]
    x, w, b = t[0], t[1], (t[2] if bias else None)
    mean, var, weight, beta = t[2 + bias:6 + bias]
    z = torch.nn.functional.conv2d(x, w, b, **params)
    y = torch.nn.functional.batch_norm(z, mean, var, weight, beta, training=False, eps=eps)
    if activation == "relu":
        y = torch.relu(y)
    elif activation == "relu6":
        y = torch.nn.functional.relu6(y)
    return y.numpy()


geometries = st.tuples(
    st.integers(1, 6), st.integers(1, 9), st.integers(1, 9),        # n, c, o (per group)
    st.integers(1, 9), st.integers(1, 9), st.sampled_from([1, 3]),  # h, w, k
    st.integers(1, 2), st.integers(0, 1), st.sampled_from([1, 1, 2]),  # stride, pad, groups
    st.booleans())                                                  # conv bias


@settings(max_examples=25, deadline=None)
@given(geometries, st.sampled_from([np.float64, np.float32]),
       st.sampled_from(["none", "relu", "relu6"]))
def test_conv_bn_eval_matches_ref_twin_and_torch(geometry, dtype, activation):
    n, c, o, h, w, k, stride, padding, groups, bias = geometry
    if h + 2 * padding < k or w + 2 * padding < k:
        return
    params, operands = problem(*geometry, dtype)
    codelet = conv2d_bn_eval_fwd if bias else conv2d_nobias_bn_eval_fwd
    kw = dict(params, eps=1e-3, activation=activation)
    ref = run(codelet, "ref", operands, kw)
    got = run(codelet, "cpu", operands, kw)
    assert rel_err(got, ref) <= TOL[dtype]
    assert rel_err(got, torch_chain(operands, params, bias, activation, 1e-3)) <= TOL[dtype]
    assert rel_err(run(codelet, "cuda", operands, kw), ref) <= TOL[dtype]  # NumPy in CI


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("geometry", [
    (4, 64, 64, 8, 8, 3, 1, 1, 1, False),   # a ResNet body convolution (partition GEMMs)
    (4, 16, 32, 16, 16, 3, 1, 1, 1, False),  # 256 pixels: im2col, [w | b] packed per call
    (3, 8, 16, 1, 1, 3, 1, 1, 1, True),      # a 1x1 image
    (5, 8, 12, 7, 7, 1, 2, 0, 1, False),     # the strided 1x1 shortcut
])
def test_prepared_calls_give_the_variant_bits(geometry, dtype):
    params, operands = problem(*geometry, dtype)
    codelet = conv2d_bn_eval_fwd if geometry[-1] else conv2d_nobias_bn_eval_fwd
    kw = dict(params, eps=1e-5, activation="relu")
    want = run(codelet, "cpu", operands, kw)
    assert rel_err(want, torch_chain(operands, params, geometry[-1], "relu", 1e-5)) <= TOL[dtype]
    arrays = [a.copy() for a in operands]
    calls = calls_of(codelet.variants["cpu"], WorkerBuffers(), arrays, kw)
    assert calls is not None
    for _ in range(2):  # the fold is redone per call: new parameters are read
        for kernel, args in calls:
            kernel(*args)
    np.testing.assert_array_equal(arrays[-1], want)
    arrays[2 + geometry[-1]][...] += 1  # the running mean changes between replays
    for kernel, args in calls:
        kernel(*args)
    moved = [a.copy() for a in operands]
    moved[2 + geometry[-1]] += 1
    np.testing.assert_array_equal(arrays[-1], run(codelet, "cpu", moved, kw))


@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_fold_task_then_folded_convolution_give_the_one_task_bits(depthwise, bias):
    """``bn_[nobias_]fold_eval`` once, then ``conv2d[_depthwise]_folded_fwd`` per partition:
    the bits of ``conv2d[_depthwise][_nobias]_bn_eval_fwd`` per partition, each variant and
    the prepared calls."""
    dtype = np.float32
    params, operands = problem(4, 1, 1, 5, 5, 3, 1, 1, 6, bias, dtype) if depthwise else \
        problem(4, 5, 6, 5, 5, 3, 2, 1, 1, bias, dtype)
    if depthwise:
        del params["groups"]
        one = (depthwise_fused.conv2d_depthwise_bn_eval_fwd if bias
               else depthwise_fused.conv2d_depthwise_nobias_bn_eval_fwd)
        folded = depthwise_fused.conv2d_depthwise_folded_fwd
    else:
        one, folded = (conv2d_bn_eval_fwd if bias else conv2d_nobias_bn_eval_fwd), conv2d_folded_fwd
    fold = bn_fold_eval if bias else bn_nobias_fold_eval
    x, *ins, y = operands
    kw = dict(params, eps=1e-3, activation="relu6")
    folds = {}
    for variant in ("ref", "cpu", "prepared"):
        wf, bf = np.full_like(ins[0], np.nan), np.full(ins[0].shape[0], np.nan, dtype)
        if variant == "prepared":
            for kernel, args in calls_of(fold.variants["cpu"], WorkerBuffers(),
                                         [*ins, wf, bf], {"eps": 1e-3}):
                kernel(*args)
        else:
            fold.variants[variant](*ins, wf, bf, eps=1e-3)
        folds[variant] = wf, bf
    for variant in ("ref", "cpu"):
        wf, bf = folds[variant]
        for part in (slice(0, 1), slice(1, 4)):
            want, got = np.empty_like(y[part]), np.empty_like(y[part])
            one.variants[variant](x[part], *ins, want, **kw)
            folded.variants[variant](x[part], wf, bf, got, **kw)
            np.testing.assert_array_equal(got, want)
    for a, b in zip(folds["cpu"], folds["prepared"]):
        np.testing.assert_array_equal(a, b)


def test_unknown_activation_is_refused():
    params, operands = problem(1, 2, 2, 3, 3, 1, 1, 0, 1, False, np.float64)
    with pytest.raises(ValueError, match="activation must be one of"):
        run(conv2d_nobias_bn_eval_fwd, "cpu", operands, dict(params, activation="gelu"))


@pytest.mark.parametrize("variant", ["ref", "cpu", "cuda"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_add2_relu_gives_the_unfused_pair_bits(variant, dtype):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((3, 5, 4, 4)).astype(dtype) for _ in range(2))
    a[0, 0, 0, :2] = [np.nan, -0.0]
    s = np.empty_like(a)
    add2.variants["cpu"](a, b, s)
    want = np.empty_like(a)
    relu_fwd.variants["cpu"](s, want)
    got = np.full_like(a, 7)
    add2_relu.variants[variant](a, b, got)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="add2_relu: operands must have one shape"):
        add2_relu.variants[variant](a, b[:1], got)
