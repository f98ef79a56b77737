"""Batch norm + ReLU/ReLU6 in training (``codelets/batchnorm_act.py``, ``layers/bn_activation.py``):
each variant gives the unfused chain's bits (``bn_fwd`` then the activation; the
activation's backward then ``bn_bwd_sums``, ``bn_bwd_input``) over hypothesis shapes
(1x1 planes, uneven partitions, values on the activation's kinks), equals PyTorch (float64
1e-10, float32 1e-4), and a model's training step gives the same bits fused or not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero_nn as hn
from hetero_nn.codelets import activation as act
from hetero_nn.codelets import batchnorm as bn
from hetero_nn.codelets import batchnorm_act as bna
from hetero_nn.layers import (BatchNorm2d, Conv2d, Dense, Flatten, GlobalAvgPool2D, ReLU, ReLU6,
                              Sequential)
from helpers import rel_err

EPS = 1e-5
TOL = {np.float64: 1e-10, np.float32: 1e-4}
UNFUSED = {"relu": (act.relu_fwd, act.relu_bwd, "output"),
           "relu6": (act.relu6_fwd, act.relu6_bwd, "input")}


def make(n, c, h, w, dtype, seed):
    """A batch whose normalised values hit 0 and 6 exactly in places, its statistics and
    parameters, and an output gradient."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    x.reshape(-1)[::5] = 0  # mean 0, weight 1, bias 0 below: u = x exactly here
    x.reshape(-1)[1::7] = 6
    mean = (x.mean(axis=(0, 2, 3)) * (rng.random(c) < 0.5)).astype(dtype)
    var = rng.uniform(0.5, 2, c).astype(dtype)
    weight, bias = rng.uniform(0.5, 2, c).astype(dtype), rng.standard_normal(c).astype(dtype)
    weight[0], bias[0], mean[0], var[0] = 1, 0, 0, 1 - EPS
    dy = rng.standard_normal(x.shape).astype(dtype)
    return x, mean, var, weight, bias, dy


def fused(variant, activation, parts, x, mean, var, weight, bias, dy):
    """``y``, ``sum_dy``, ``dotp``, ``dx`` of the fused codelets over ``parts`` partitions."""
    c, count = x.shape[1], x.size // x.shape[1]
    stats = (mean, var, weight, bias)
    y, dx = np.full_like(x, np.nan), np.full_like(x, np.nan)
    sums = [np.zeros(c, x.dtype), np.zeros(c, x.dtype)]
    for xp, yp, g in zip(*(np.array_split(a, parts) for a in (x, y, dy))):
        bna.bn_act_fwd.variants[variant](xp, *stats, yp, eps=EPS, activation=activation)
        partial = [np.zeros(c, x.dtype), np.zeros(c, x.dtype)]
        bna.bn_act_bwd_sums.variants[variant](xp, g, *stats, *partial, eps=EPS,
                                              activation=activation)
        sums = [s + p for s, p in zip(sums, partial)]
    for xp, g, dxp in zip(*(np.array_split(a, parts) for a in (x, dy, dx))):
        bna.bn_act_bwd_input.variants[variant](xp, g, *stats, *sums, dxp, count=count, eps=EPS,
                                               activation=activation)
    return y, *sums, dx


def unfused(variant, activation, parts, x, mean, var, weight, bias, dy):
    """The same from ``bn_fwd``, the activation's codelets, ``bn_bwd_sums``, ``bn_bwd_input``."""
    fwd, bwd, saves = UNFUSED[activation]
    c, count = x.shape[1], x.size // x.shape[1]
    u, y, g, dx = (np.full_like(x, np.nan) for _ in range(4))
    sums = [np.zeros(c, x.dtype), np.zeros(c, x.dtype)]
    for xp, up, yp, dyp, gp in zip(*(np.array_split(a, parts) for a in (x, u, y, dy, g))):
        bn.bn_fwd.variants[variant](xp, mean, var, weight, bias, up, eps=EPS)
        fwd.variants[variant](up, yp)
        bwd.variants[variant](up if saves == "input" else yp, dyp, gp)
        partial = [np.zeros(c, x.dtype), np.zeros(c, x.dtype)]
        bn.bn_bwd_sums.variants[variant](xp, gp, mean, *partial)
        sums = [s + p for s, p in zip(sums, partial)]
    for xp, gp, dxp in zip(*(np.array_split(a, parts) for a in (x, g, dx))):
        bn.bn_bwd_input.variants[variant](xp, gp, mean, var, weight, *sums, dxp, count=count,
                                          eps=EPS)
    return y, *sums, dx


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 3), st.sampled_from(["relu", "relu6"]),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 99))
def test_fused_gives_the_unfused_bits(n, c, h, w, parts, activation, dtype, seed):
    data = make(n, c, h, w, dtype, seed)
    for variant in ("ref", "cpu", "cuda"):  # cuda: the array-module code on NumPy
        got = fused(variant, activation, min(parts, n), *data)
        want = unfused(variant, activation, min(parts, n), *data)
        for name, a, b in zip(("y", "sum_dy", "dotp", "dx"), got, want):
            assert a.tobytes() == b.tobytes(), (variant, name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_training_step_matches_torch(activation, dtype):
    torch = pytest.importorskip("torch")
    x, _, _, weight, bias, dy = make(6, 3, 3, 1, dtype, 5)
    x = x * 3 + 2  # across 0 and 6
    c, count = x.shape[1], x.size // x.shape[1]
    mean = np.zeros(c, dtype)
    bn.bn_sum.variants["cpu"](x, mean)
    mean /= dtype(count)
    sqdev = np.zeros(c, dtype)
    bn.bn_sqdev.variants["cpu"](x, mean, sqdev)
    var = sqdev / dtype(count)
    y, sum_dy, dotp, dx = fused("cpu", activation, 2, x, mean, var, weight, bias, dy)
    dweight, dbias = np.zeros(c, dtype), np.zeros(c, dtype)
    bn.bn_param_grads.variants["cpu"](sum_dy, dotp, var, dweight, dbias, eps=EPS)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    u = torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True, eps=EPS)
    yt = torch.relu(u) if activation == "relu" else torch.nn.functional.relu6(u)
    yt.backward(torch.from_numpy(dy))
    for name, a, e in (("y", y, yt), ("dx", dx, xt.grad), ("dweight", dweight, wt.grad),
                       ("dbias", dbias, bt.grad)):
        assert rel_err(a, e.detach().numpy()) <= TOL[dtype], name


def test_bad_activation_is_named():
    x = np.zeros((2, 1, 1, 1))
    with pytest.raises(ValueError, match="bn_act_fwd: activation must be one of"):
        bna.bn_act_fwd.variants["cpu"](x, *np.ones((4, 1)), x.copy(), eps=EPS, activation="gelu")


def small_model(fuse):
    hn.manual_seed(3)
    m = Sequential(Conv2d(2, 4, 3, padding=1, bias=False), BatchNorm2d(4), ReLU6(),
                   Conv2d(4, 3, 1, bias=False), BatchNorm2d(3), ReLU(), GlobalAvgPool2D(),
                   Flatten(), Dense(3, 3), fuse=fuse)
    m.build((2, 5, 5), "float64")
    return m


def test_plan_fuses_batch_norm_and_activation_in_training():
    m = small_model(True)
    assert [name for _, _, name in m.blocks()][:4] == ["Conv2d", "BNActivation", "Conv2d",
                                                       "BNActivation"]
    assert [name for _, _, name in m.eval().blocks()][:2] == ["ConvBNEval", "ConvBNEval"]


@pytest.mark.slow  # the default run has it from test_layers_fused_blocks (ReLU, g=2) and
@pytest.mark.parametrize("granularity", [1, 3])  # test_models_builtin (MobileNetV2's ReLU6)
def test_training_steps_fused_or_not_give_the_same_bits(granularity):
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((5, 2, 5, 5)), rng.integers(0, 3, 5)) for _ in range(2)]
    states = []
    for fuse in (True, False):
        m = small_model(fuse)
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
                hn.Trainer(m, optimizer=hn.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                           runtime=rt, batch_size=5, granularity=granularity) as trainer:
            losses = [trainer.train_step(x, y) for x, y in batches]
        states.append((losses, m.state_dict()))
    assert states[0][0] == states[1][0]
    assert all(np.array_equal(a, states[1][1][k]) for k, a in states[0][1].items())
