"""The fused block runs (``layers/fused_blocks.py``) in whole models: where the plan puts
them (convolution + batch norm only in evaluation), ResNet's and MobileNetV2's eval-mode outputs
equal to PyTorch (float64 1e-10), to the unfused layers and across granularities (1e-12,
as unfused: the partition GEMMs' widths change), with the same bits across policies; training steps with ``Residual, ReLU`` fused give the unfused steps' bits;
an input gradient through an eval-mode run equals the unfused one; a pass of several
partitions folds each layer once, with the bits of the fold inside each partition's task,
and folds the new values after a training step and after ``load_state_dict``."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers import BatchNorm2d, Conv2d, ReLU, ReLU6, Sequential
from hetero_nn.models import build_model
from helpers import rel_err


def set_fuse(model, fuse):
    for layer in model.modules():
        if isinstance(layer, Sequential):
            layer.fuse = fuse


def block_names(model):
    return [name for _, _, name in model.blocks()]


def test_plan_fuses_conv_bn_only_in_evaluation():
    model = build_model("resnet18", (3, 8, 8), 10, seed=0)
    body = model.layers[3].body
    assert block_names(model)[:4] == ["Conv2d", "BNActivation", "ResidualReLU", "ResidualReLU"]
    assert block_names(body) == ["Conv2d", "BNActivation", "Conv2d", "BatchNorm2d"]
    model.eval()
    assert block_names(model)[:3] == ["ConvBNEval", "ResidualReLU", "ResidualReLU"]
    assert block_names(body) == ["ConvBNEval", "ConvBNEval"]
    assert block_names(model.layers[7].shortcut) == ["ConvBNEval"]
    mobile = build_model("mobilenetv2", (3, 16, 16), 10, seed=0).eval()
    names = block_names(mobile)
    assert names[:4] == ["ConvBNEval"] * 4 and "Conv2d" not in names  # depthwise ones too
    assert [mobile.layers[i].depthwise for i, _, _ in mobile.blocks()[1:3]] == [True, False]
    untracked = Sequential(Conv2d(3, 4, 3), BatchNorm2d(4, track_running_stats=False), ReLU6())
    assert block_names(untracked.eval()) == ["Conv2d", "BatchNorm2d", "ReLU6"]


def predict(model, x, policy="eager", granularity=2):
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        model.bind(rt)
        xs = rt.register(x, name="x")
        outs = model.forward(rt, list(xs.split(0, granularity)) if granularity > 1 else [xs])
        rt.wait()
        return np.concatenate([rt.fetch(o, copy=True) for o in outs])


@pytest.mark.parametrize("name, shape", [("resnet18", (3, 8, 8)), ("mobilenetv2", (3, 8, 8))])
def test_eval_outputs_equal_torch_and_unfused(name, shape, one_torch_thread):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-check needs it")
    model = build_model(name, shape, 10, dtype="float64", seed=3)
    rng = np.random.default_rng(4)
    for _, buf in model.named_buffers():  # running statistics other than 0 and 1
        if buf.data.dtype.kind == "f":
            buf.data[...] = rng.uniform(0.5, 1.5, buf.data.shape) if "var" in buf.name \
                else rng.standard_normal(buf.data.shape)
    twin = hn.to_torch(model).eval()
    model.eval()
    x = rng.standard_normal((6, *shape))
    fused = predict(model, x)
    with torch.no_grad():
        want = twin(torch.from_numpy(x)).numpy()
    assert rel_err(fused, want) <= 1e-10
    assert np.array_equal(predict(model, x, "heft"), fused)
    for g in (1, 3):  # GEMMs of other widths: equal to rounding, fused or not
        assert rel_err(predict(model, x, granularity=g), fused) <= 1e-12
    set_fuse(model, False)
    assert rel_err(predict(model, x), fused) <= 1e-12


def test_training_steps_with_residual_relu_fused_give_unfused_bits():
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((4, 3, 8, 8)), rng.integers(0, 10, 4)) for _ in range(2)]
    states = []
    for fuse in (True, False):
        model = build_model("resnet-small", (3, 8, 8), 10, dtype="float64", seed=6)
        set_fuse(model, fuse)
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
                hn.Trainer(model, optimizer=hn.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9),
                           runtime=rt, batch_size=4, granularity=2) as trainer:
            losses = [trainer.train_step(x, y) for x, y in batches]
        states.append((losses, model.state_dict()))
    assert states[0][0] == states[1][0]
    assert all(np.array_equal(a, states[1][1][k]) for k, a in states[0][1].items())


def test_input_gradient_through_an_eval_run_equals_unfused():
    grads = []
    x = np.random.default_rng(7).standard_normal((4, 3, 6, 6))
    dy = np.random.default_rng(8).standard_normal((4, 5, 6, 6))
    for fuse in (True, False):
        hn.manual_seed(9)
        model = Sequential(Conv2d(3, 5, 3, padding=1, bias=False), BatchNorm2d(5), ReLU6(),
                           fuse=fuse)
        model.build((3, 6, 6), "float64")
        model.layers[1]._buffers["running_var"].data[...] = 0.7
        model.eval()
        assert (block_names(model) == ["ConvBNEval"]) == fuse
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
            model.bind(rt)
            model.zero_grad(rt)
            model.forward(rt, [rt.register(x, name="x")])
            dxs = model.backward(rt, [rt.register(dy, name="dy")], need_input_grad=True)
            rt.wait()
            grads.append([rt.fetch(dxs[0], copy=True)] + [
                rt.fetch(p.grad, copy=True) for p in model.parameters()])
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 1e-12


def folding_model(groups=6, activation=ReLU6):
    """A convolution without bias, then one with (depthwise by default), each + BN + act."""
    hn.manual_seed(10)
    model = Sequential(Conv2d(3, 6, 3, padding=1, bias=False), BatchNorm2d(6), ReLU(),
                       Conv2d(6, 6, 3, padding=1, groups=groups), BatchNorm2d(6), activation(),
                       hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(6, 3))
    model.build((3, 6, 6), "float64")
    rng = np.random.default_rng(11)
    for bn in (model.layers[1], model.layers[4]):
        bn._buffers["running_var"].data[...] = rng.uniform(0.5, 1.5, 6)
        bn._buffers["running_mean"].data[...] = rng.standard_normal(6)
    return model.eval()


def per_task_fold(model, x):
    """``x`` in two halves, each one partition: the fold inside each convolution task."""
    return np.concatenate([predict(model, half, granularity=1) for half in (x[:3], x[3:])])


def test_eval_pass_folds_once_per_layer_with_the_per_task_fold_bits():
    model = folding_model()
    x = np.random.default_rng(12).standard_normal((6, 3, 6, 6))
    want = per_task_fold(model, x)
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=True) as rt:
        model.bind(rt)
        for _ in range(2):  # two passes of two partitions each
            ys = model.forward(rt, list(rt.register(x, name="x").split(0, 2)))
            assert np.array_equal(np.concatenate([rt.fetch(y, copy=True) for y in ys]), want)
        names = [r.codelet for r in rt.trace()]
    assert names.count("bn_nobias_fold_eval") == names.count("bn_fold_eval") == 2
    assert names.count("conv2d_folded_fwd") == names.count("conv2d_depthwise_folded_fwd") == 4
    assert not any(n.endswith("bn_eval_fwd") for n in names)


def test_tiny_images_fold_into_unrolled_filters_with_the_per_task_fold_bits():
    """On images no larger than the kernel the fold writes the unrolled filters once
    (``bn_[nobias_]fold_unrolled_eval``) and each partition runs ``conv2d_unrolled_fwd``:
    the bits of the fold inside each partition's task."""
    hn.manual_seed(14)
    model = Sequential(Conv2d(3, 4, 3, padding=1, bias=False), BatchNorm2d(4), ReLU(),
                       Conv2d(4, 5, 3, padding=1), BatchNorm2d(5),
                       hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(5, 3))
    model.build((3, 2, 2), "float64")
    rng = np.random.default_rng(15)
    for bn in (model.layers[1], model.layers[4]):
        bn._buffers["running_var"].data[...] = rng.uniform(0.5, 1.5, bn.num_features)
    model.eval()
    x = np.random.default_rng(16).standard_normal((6, 3, 2, 2))
    want = per_task_fold(model, x)
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=True) as rt:
        model.bind(rt)
        ys = model.forward(rt, list(rt.register(x, name="x").split(0, 2)))
        assert np.array_equal(np.concatenate([rt.fetch(y, copy=True) for y in ys]), want)
        names = [r.codelet for r in rt.trace()]
    assert names.count("bn_nobias_fold_unrolled_eval") == names.count("bn_fold_unrolled_eval") == 1
    assert names.count("conv2d_unrolled_fwd") == 4 and "conv2d_folded_fwd" not in names


def test_fold_follows_a_training_step_and_load_state_dict():
    model = folding_model(groups=1, activation=ReLU)  # training kernels other tests load
    rng = np.random.default_rng(13)
    x, labels = rng.standard_normal((6, 3, 6, 6)), np.arange(6) % 3
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
            hn.Trainer(model, runtime=rt, batch_size=6, dtype="float64") as trainer:
        trainer.train_step(x, labels)  # binds the model to rt
        before = model(x)
        model.train()
        trainer.train_step(x, labels)  # weights and running statistics written in place
        model.eval()
        after, trained = model(x), model.state_dict()
        model.load_state_dict({k: v * 0.5 for k, v in trained.items()})
        loaded = model(x)
    assert not np.array_equal(before, after) and not np.array_equal(after, loaded)
    assert np.array_equal(loaded, per_task_fold(model, x))
    twin = folding_model(groups=1, activation=ReLU)
    twin.load_state_dict(trained)
    assert np.array_equal(after, per_task_fold(twin, x))
