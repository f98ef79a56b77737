"""The CNN toolbox layers: BatchNorm2D, Dropout, AvgPool2D, GlobalAvgPool2D, LeakyReLU,
Sigmoid, Tanh, GELU and Residual through the runtime equal PyTorch's modules and autograd
(train and eval mode, granularity 1 and 3); train()/eval() modes; seeded dropout;
state_dict keys, shapes and buffers equal torch's; print(model) and summary; messages
that name the layer; checkpoints that carry the running statistics; resnet-small."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err
from twins import torch_module, torch_twin

torch = pytest.importorskip("torch")

TOL = {"float64": 1e-10, "float32": 1e-4}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def split(h, g):
    return list(h.split(0, g)) if g > 1 else [h]


def run_layer(layer, x, dy, g, dtype, training=True, policy="eager"):
    """Forward and backward of ``layer`` over ``g`` partitions: ``(y, dx, grads, state)``."""
    layer.build(x.shape[1:], dtype)
    layer.train(training)
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=True, perfmodel=False) as rt:
        layer.bind(rt)
        layer.zero_grad(rt)
        ys = layer.forward(rt, split(rt.register(np.ascontiguousarray(x, dtype)), g))
        dy = dy.reshape(x.shape[0], *ys[0].shape[1:])  # Flatten passes its input's handles
        dxs = layer.backward(rt, split(rt.register(np.ascontiguousarray(dy, dtype)), g),
                             need_input_grad=True)
        rt.wait()
        y = np.concatenate([rt.fetch(h, copy=True) for h in ys])
        dx = np.concatenate([rt.fetch(h, copy=True) for h in dxs])
        grads = {name: rt.fetch(p.grad, copy=True) for name, p in layer.named_parameters()}
        state = {name: np.array(b.host(), copy=True) for name, b in layer.named_buffers()}
    return y, dx, grads, state


def torch_reference(layer, x, dy, training=True):
    """The twin of ``layer`` with its weights and buffers, float64: ``(y, dx, grads, buffers)``."""
    module = torch_module(layer).double()
    module.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float64 if v.dtype.kind == "f"
                                                         else v.dtype))
                            for k, v in ((n, t.host()) for n, t in layer.named_state())})
    module.train(training)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = module(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64).reshape(yt.shape))
    return (yt.detach().numpy(), xt.grad.numpy(),
            {n: p.grad.numpy() for n, p in module.named_parameters()},
            {n: b.numpy() for n, b in module.named_buffers()})


def block():
    return hn.Residual([hn.Conv2D(3, 5, 3, stride=2, padding=1, bias=False), hn.BatchNorm2D(5),
                        hn.GELU(), hn.Conv2D(5, 5, 3, padding=1)],
                       [hn.Conv2D(3, 5, 1, stride=2, bias=False), hn.BatchNorm2D(5)])


LAYERS = {  # name: (constructor, input shape (N, C, H, W))
    "batchnorm": (lambda: hn.BatchNorm2D(3), (7, 3, 4, 5)),
    "batchnorm-momentum-eps": (lambda: hn.BatchNorm2D(3, eps=1e-3, momentum=0.3), (6, 3, 2, 3)),
    "batchnorm-cumulative": (lambda: hn.BatchNorm2D(2, momentum=None), (5, 2, 3, 3)),
    "batchnorm-no-affine": (lambda: hn.BatchNorm2D(3, affine=False), (5, 3, 3, 2)),
    "batchnorm-untracked": (lambda: hn.BatchNorm2D(3, track_running_stats=False), (4, 3, 3, 3)),
    "avgpool": (lambda: hn.AvgPool2D(3, 2, 1), (5, 2, 7, 6)),
    "avgpool-pairs": (lambda: hn.AvgPool2D((2, 3), (1, 2)), (4, 3, 5, 7)),
    "global-avgpool": (hn.GlobalAvgPool2D, (5, 4, 3, 5)),
    "leaky-relu": (lambda: hn.LeakyReLU(0.2), (6, 2, 3, 4)),
    "sigmoid": (hn.Sigmoid, (4, 3, 2, 2)),
    "tanh": (hn.Tanh, (4, 3, 2, 2)),
    "gelu": (hn.GELU, (5, 2, 4, 3)),
    "residual-identity": (lambda: hn.Residual([hn.Conv2D(2, 2, 3, padding=1), hn.BatchNorm2D(2),
                                               hn.ReLU()]), (6, 2, 5, 5)),
    "residual-shortcut": (block, (6, 3, 6, 7)),
}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_backward_equal_torch(name, dtype, g, training):
    make, x_shape = LAYERS[name]
    rng = np.random.default_rng(len(name) * 31 + g)
    hn.manual_seed(len(name))
    layer = make()
    layer.reset_parameters(np.random.default_rng(3))
    for _, p in layer.named_parameters():  # weights other than BatchNorm's 1 and 0
        p.data[...] = rng.uniform(0.5, 1.5, p.data.shape)
    for bname, b in layer.named_buffers():  # running statistics other than 0 and 1
        if b.data.dtype.kind == "f":
            b.data[...] = rng.uniform(0.5, 1.5, b.data.shape) * (1 if "var" in bname else -1)
    x = (rng.standard_normal(x_shape) * 2 + 0.5).astype(dtype)
    out_shape = layer.build(x_shape[1:], dtype)
    dy = rng.standard_normal((x_shape[0], *out_shape)).astype(dtype)
    y_ref, dx_ref, grads_ref, buffers_ref = torch_reference(layer, x.astype(np.float64),
                                                            dy.astype(np.float64), training)
    y, dx, grads, state = run_layer(layer, x, dy, g, dtype, training)
    assert y.dtype == np.dtype(dtype) and y.shape == y_ref.shape
    assert rel_err(y, y_ref) <= TOL[dtype]
    assert rel_err(dx, dx_ref) <= TOL[dtype]
    assert grads.keys() == grads_ref.keys()
    for key, grad in grads.items():  # a bias before batch norm has a zero gradient: abs scale
        scale = max(1.0, float(np.abs(grads_ref[key]).max()))
        assert np.abs(grad - grads_ref[key]).max() <= TOL[dtype] * scale, key
    assert state.keys() == buffers_ref.keys()
    for key, value in state.items():  # running statistics updated (train) or kept (eval)
        assert rel_err(value, buffers_ref[key]) <= TOL[dtype], key


def test_batch_statistics_do_not_depend_on_the_granularity_beyond_rounding():
    x = np.random.default_rng(0).standard_normal((12, 3, 4, 4)) * 5 + 2
    dy = np.random.default_rng(1).standard_normal(x.shape)
    runs = [run_layer(hn.BatchNorm2D(3), x, dy, g, "float64") for g in (1, 2, 5, 12)]
    for y, dx, grads, state in runs[1:]:
        assert rel_err(y, runs[0][0]) <= 1e-13 and rel_err(dx, runs[0][1]) <= 1e-13
        for key in state:
            assert rel_err(state[key], runs[0][3][key]) <= 1e-13


def test_policies_give_the_same_bits():
    x = np.random.default_rng(0).standard_normal((9, 3, 6, 7))
    dy = np.random.default_rng(1).standard_normal((9, 5, 3, 4))
    outs = []
    for policy in ("eager", "dmda", "heft"):
        hn.manual_seed(0)
        outs.append(run_layer(block(), x, dy, 3, "float64", policy=policy))
    for other in outs[1:]:
        assert np.array_equal(other[0], outs[0][0]) and np.array_equal(other[1], outs[0][1])
        assert all(np.array_equal(other[2][k], outs[0][2][k]) for k in outs[0][2])


# --------------------------------------------------------------------------- modes

def test_train_and_eval_return_the_model_and_reach_residual_bodies():
    model = hn.Sequential(hn.Conv2D(3, 5, 1), block(), hn.Dropout(0.3))
    assert model.eval() is model
    modes = [model.training, model[1].training, model[1].body[1].training,
             model[1].shortcut[1].training, model[2].training]
    assert modes == [False] * 5
    assert model.train() is model and model[1].shortcut[1].training
    with hn.layers.evaluating(model):
        assert not model[1].body[1].training
    assert model[1].body[1].training


def bn_net(p=0.5):
    """A seeded conv + batch norm + dropout network, and a batch of 8 for it."""
    hn.manual_seed(0)
    model = hn.Sequential(hn.Conv2D(3, 4, 3), hn.BatchNorm2D(4), hn.ReLU(), hn.Dropout(p),
                          hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(4, 4))
    rng = np.random.default_rng(0)
    return model, rng.standard_normal((8, 3, 6, 6)), rng.integers(0, 4, 8)


def test_trainer_evaluates_in_eval_mode_and_restores_the_mode():
    model, x, y = bn_net()
    model.build((3, 6, 6), "float64")
    twin = torch_twin(model).eval()
    expected = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
    with hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=8, granularity=2, dtype="float64")
        loss, _ = trainer.evaluate((x, y))
        before = model.state_dict()
        preds = trainer.predict(x)
        assert model.training and model[1].training
        after = model.state_dict()
    assert abs(loss - expected.item()) <= 1e-12 * abs(expected.item())
    np.testing.assert_array_equal(preds, twin(torch.from_numpy(x)).argmax(1).numpy())
    assert all(np.array_equal(before[k], after[k]) for k in before)  # eval updated nothing
    assert int(after["1.num_batches_tracked"]) == 0


def test_choosing_the_granularity_leaves_running_statistics_and_dropout_steps_alone():
    model, x, y = bn_net()
    with hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=8, granularity="auto", dtype="float64")
        trainer.train_step(x, y)  # tunes first, then one step
        assert len(trainer.granularity_decision.candidates) > 1
        state = model.state_dict()
    assert int(state["1.num_batches_tracked"]) == 1 and model[3].steps == 1
    fresh = bn_net()[0]
    fresh.build((3, 6, 6), "float64")
    twin = torch_twin(fresh).train()
    twin(torch.from_numpy(x))  # one batch's update of the running statistics
    expected = twin.state_dict()["1.running_mean"].numpy()
    assert rel_err(state["1.running_mean"], expected) <= 1e-10


# --------------------------------------------------------------------------- dropout

def run_dropout_net(seed, g, training=True, policy="eager"):
    model = hn.Sequential(hn.Conv2D(2, 3, 3), hn.Dropout(0.4, seed=seed), hn.Flatten())
    hn.manual_seed(1)
    model.build((2, 5, 5), "float64")
    model.reset_parameters(np.random.default_rng(0))
    x = np.random.default_rng(2).standard_normal((7, 2, 5, 5))
    dy = np.random.default_rng(3).standard_normal((7, 27))
    outs = []
    for _ in range(2):  # two steps: two masks
        y, dx, grads, _ = run_layer(model, x, dy, g, "float64", training, policy)
        outs.append((y, grads["0.weight"]))
    return outs


def test_dropout_is_seeded_reproducible_and_independent_of_granularity_and_policy():
    base = run_dropout_net(11, 1)
    assert not np.array_equal(base[0][0], base[1][0])  # a new mask each step
    assert np.mean(base[0][0] == 0) > 0.2  # elements were dropped
    for g, policy in ((1, "eager"), (3, "dmda"), (7, "heft")):
        other = run_dropout_net(11, g, policy=policy)
        for (y, gw), (y0, gw0) in zip(other, base):
            assert np.array_equal(y == 0, y0 == 0)  # the same mask
            assert rel_err(y, y0) <= 1e-14 and rel_err(gw, gw0) <= 1e-13
    assert not np.array_equal(run_dropout_net(12, 1)[0][0], base[0][0])


def test_dropout_is_the_identity_in_eval_mode():
    y, _ = run_dropout_net(11, 3, training=False)[0]
    model = hn.Sequential(hn.Conv2D(2, 3, 3), hn.Flatten())
    model.build((2, 5, 5), "float64")
    model.reset_parameters(np.random.default_rng(0))
    x = np.random.default_rng(2).standard_normal((7, 2, 5, 5))
    ref = torch_twin(model)(torch.from_numpy(x)).detach().numpy()
    assert rel_err(y.reshape(ref.shape), ref) <= 1e-12


# --------------------------------------------------------------------------- state, repr, errors

def test_state_dict_keys_shapes_and_buffers_equal_torch():
    model = hn.Sequential(hn.Conv2D(3, 5, 3), hn.BatchNorm2D(5), hn.LeakyReLU(), block_for(5),
                          hn.Dropout(0.1), hn.AvgPool2D(2), hn.GlobalAvgPool2D(), hn.Flatten(),
                          hn.Dense(5, 3))
    model.build((3, 12, 12), "float64")
    ours = model.state_dict()
    theirs = torch_module(model).double().state_dict()
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert ours[key].shape == tuple(value.shape), key
        assert ours[key].dtype == value.numpy().dtype, key
        if "running" in key or "num_batches" in key or key.endswith(("1.weight", "1.bias")):
            np.testing.assert_array_equal(ours[key], value.numpy())  # torch's initial values
    twin = torch_twin(model)  # loads without missing or unexpected keys
    model.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})


def block_for(c):
    return hn.Residual([hn.Conv2D(c, c, 3, padding=1, bias=False), hn.BatchNorm2D(c), hn.Tanh()],
                       [hn.Conv2D(c, c, 1), hn.BatchNorm2D(c)])


def test_resnet_small_has_torch_keys_and_fits_both_input_sizes():
    for shape in ((3, 32, 32), (1, 28, 28)):
        model = hn.build_model("resnet-small", shape, 10, seed=0)
        assert model.output_shape == (10,)
        assert list(model.state_dict()) == list(torch_module(model).state_dict())
        keys = list(model.state_dict())
        assert "5.shortcut.0.weight" in keys and "3.body.4.running_var" in keys
        assert not any(k.startswith("3.shortcut") for k in keys)  # identity shortcut


def test_print_model_and_summary_show_shapes_and_parameter_counts():
    model = hn.build_model("resnet-small", (1, 28, 28), 10, seed=0)
    text = repr(model)
    assert "(3): Residual(" in text and "(shortcut): Sequential(" in text
    assert "BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)" in text
    assert "# -> [64, 7, 7]" in text
    table = model.summary()
    rows = [line.split() for line in table.splitlines() if "[-1," in line]
    assert len(rows) == 31
    counts = {r[0]: int(r[-1].replace(",", "")) for r in rows}
    assert counts["7.body.3"] == 64 * 64 * 9 and counts["11"] == 650 and counts["7"] == 0
    total = sum(p.data.size for p in model.parameters())
    assert sum(counts.values()) == total and f"Total params: {total:,}" in table
    assert "[-1, 32, 14, 14]" in model.summary((1, 28, 28))
    assert "[-1, 32, 16, 16]" in model.summary((1, 32, 32))
    with pytest.raises(ValueError, match="not built"):
        hn.Sequential(hn.ReLU()).summary()


def test_cli_models_summary(capsys):
    from hetero_nn.cli import main

    assert main(["models", "--summary", "resnet-small", "--input-shape", "1x28x28"]) == 0
    out = capsys.readouterr().out
    assert "5.shortcut.0 (Conv2d)" in out and "[-1, 64, 7, 7]" in out
    assert main(["models", "--summary", "resnet-small", "--input-shape", "28x28"]) == 2
    assert "--input-shape" in capsys.readouterr().err


@pytest.mark.parametrize("make, match", [
    (lambda: hn.BatchNorm2D(0), "BatchNorm2d: num_features"),
    (lambda: hn.BatchNorm2D(3, eps=0), "BatchNorm2d: eps"),
    (lambda: hn.BatchNorm2D(3, momentum=2), "BatchNorm2d: momentum"),
    (lambda: hn.Dropout(1.5), "Dropout: p"),
    (lambda: hn.Dropout(0.5, seed=1.5), "Dropout: seed"),
    (lambda: hn.AvgPool2D(2, padding=2), "AvgPool2d: padding"),
    (lambda: hn.AvgPool2D(0), "AvgPool2d: kernel_size"),
    (lambda: hn.LeakyReLU("x"), "LeakyReLU: negative_slope"),
])
def test_constructor_errors_name_the_layer_and_argument(make, match):
    with pytest.raises(hn.ConfigError, match=match):
        make()


@pytest.mark.parametrize("model, shape, match", [
    (lambda: hn.Sequential(hn.BatchNorm2D(4)), (3, 5, 5), r"layer 0 \(BatchNorm2d.*\(4, H, W\)"),
    (lambda: hn.Sequential(hn.Residual([hn.Conv2D(3, 4, 1)])), (3, 5, 5),
     r"layer 0 \(Residual.*body gives \(4, 5, 5\) but the input \(identity shortcut\)"),
    (lambda: hn.Sequential(hn.Residual([hn.Conv2D(3, 4, 1)], [hn.Conv2D(3, 4, 1, stride=2)])),
     (3, 5, 5), r"but the shortcut gives \(4, 3, 3\)"),
    (lambda: hn.Sequential(hn.Residual([hn.Conv2D(2, 4, 1)])), (3, 5, 5),
     r"body: layer 0 \(Conv2d"),
    (lambda: hn.Sequential(hn.AvgPool2D(4)), (3, 2, 2), "AvgPool2d.*larger than"),
])
def test_shape_errors_name_the_layer(model, shape, match):
    with pytest.raises(hn.ShapeError, match=match):
        model().build(shape)


def test_batch_norm_on_one_value_per_channel_is_refused_in_training():
    x = np.ones((1, 2, 1, 1))
    with pytest.raises(hn.ShapeError, match="more than 1 value per channel"):
        run_layer(hn.BatchNorm2D(2), x, x, 1, "float64")
    y, *_ = run_layer(hn.BatchNorm2D(2), x, x, 1, "float64", training=False)  # eval is fine
    assert rel_err(y, x / np.sqrt(1 + 1e-5)) <= 1e-12


def test_residual_rejects_what_is_not_a_layer():
    with pytest.raises(TypeError, match="Residual: body"):
        hn.Residual(torch.nn.ReLU())


def test_checkpoint_carries_running_statistics_and_dropout_state_and_resume_is_bit_identical(
        tmp_path):
    _, x, y = bn_net()

    def model():
        return bn_net(p=0.3)[0]

    with hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True) as rt:
        trainer = hn.Trainer(model(), runtime=rt, batch_size=8, dtype="float64")
        trainer.train_step(x, y)
        trainer.train_step(x, y)
        path = trainer.save_checkpoint(tmp_path / "ck.npz")
        saved = trainer.model.state_dict()
        other = hn.Trainer(model(), runtime=rt, batch_size=8, dtype="float64")
        other.model[3].seed += 1  # as a model built in another process: its own dropout seed
        other.load_checkpoint(path)
        assert other.model[3].steps == 2
        loaded = other.model.state_dict()
        assert other.evaluate((x, y)) == trainer.evaluate((x, y))
        for t in (trainer, other):  # resumed: the same bits (and masks) as the run that went on
            t.train_step(x[::-1], y[::-1])
        ahead, resumed = trainer.model.state_dict(), other.model.state_dict()
        assert all(np.array_equal(ahead[k], resumed[k]) for k in ahead)
    assert int(saved["1.num_batches_tracked"]) == 2
    assert list(loaded) == list(saved)
    for key in saved:
        np.testing.assert_array_equal(loaded[key], saved[key])
        assert loaded[key].dtype == saved[key].dtype
