"""Spiking layers in networks: the time axis at build, per-step layers through folding,
RateEncode's draws, learnable beta and threshold, recomputation's memory, and the errors.

The whole-network comparisons with snnTorch are in test_spiking_vs_snntorch.py; here a
network with the other per-step layers (AvgPool2D, ReLU) and learnable LIF parameters
trains against the float64 twin, and the properties the runtime promises are checked:
RateEncode's spikes independent of granularity, policy and replay, Dropout's masks per
step independent of granularity, and ``recompute=k`` lowering the arena's high water.
"""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers import LIF, RateEncode, Repeat
from helpers import rel_err

SHAPE = (1, 12, 12)


def rate_net(seed=3, dropout=0.0, **lif):
    hn.manual_seed(seed)
    layers = [RateEncode(6, seed=11), hn.Conv2D(1, 4, 3), hn.AvgPool2D(2), hn.ReLU(),
              LIF(0.7, **lif), hn.Flatten(), hn.Dense(100, 10)]
    if dropout:
        layers.append(hn.Dropout(dropout, seed=5))
    return hn.Sequential(*layers, LIF(0.8, output="membrane", learn_beta=bool(lif)))


def data(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, *SHAPE)), rng.integers(0, 10, n)


def train(model, g, steps=3, policy="eager", replay=True, dtype="float64", lr=5e-3):
    model.build(SHAPE, dtype)
    losses = []
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.MembraneCrossEntropy(), hn.optim.Adam(lr=lr), rt,
                             batch_size=6, granularity=g, replay=replay)
        for step in range(steps):
            losses.append(trainer.train_step(*data(seed=step)))
    return np.array(losses), model.state_dict()


# --------------------------------------------------------------------------- build

def test_time_axis_shapes_and_summary():
    model = rate_net()
    assert model.build(SHAPE) == (6, 10)
    assert [layer.output_shape for layer in model] == [
        (6, 1, 12, 12), (6, 4, 10, 10), (6, 4, 5, 5), (6, 4, 5, 5), (6, 4, 5, 5), (6, 100),
        (6, 10), (6, 10)]
    assert model[1].per_step == 6 and model[4].per_step is None
    assert "[-1, 6, 4, 10, 10]" in model.summary()
    keys = list(model.state_dict())
    assert keys == ["1.weight", "1.bias", "4.beta", "4.threshold", "6.weight", "6.bias",
                    "7.beta", "7.threshold"]
    assert [n for n, _ in model.named_parameters()] == ["1.weight", "1.bias", "6.weight",
                                                        "6.bias"]
    assert repr(LIF(0.5, reset="zero", output="membrane", learn_beta=True)) == \
        "LIF(beta=0.5, reset='zero', output='membrane', learn_beta=True)"


@pytest.mark.parametrize("layers, message", [
    ([hn.Flatten(), LIF(0.5)], r"layer 1 \(LIF\(beta=0.5\)\): LIF needs inputs \(N, T, \.\.\.\)"),
    ([Repeat(4), hn.BatchNorm2D(1)], r"layer 1 .*BatchNorm2[dD] after the time axis"),
    ([Repeat(4), RateEncode(3, seed=0)], r"layer 1 .*RateEncode makes a time axis, but its "
                                         r"input \(4, 1, 12, 12\) already has one"),
])
def test_misplaced_layers_are_named_at_build(layers, message):
    with pytest.raises(hn.ShapeError, match=message):
        hn.Sequential(*layers).build(SHAPE)


@pytest.mark.parametrize("kwargs, message", [
    ({"reset": "none"}, "LIF: reset must be one of 'subtract', 'zero', got 'none'"),
    ({"output": "both"}, "LIF: output must be one of"),
    ({"slope": 0}, "LIF: slope must be a finite positive number, got 0"),
    ({"recompute": 0}, "LIF: recompute must be an integer >= 1, got 0"),
    ({"output": "membrane", "recompute": 5}, "recompute applies to output='spikes'"),
])
def test_lif_arguments_are_checked(kwargs, message):
    with pytest.raises(hn.ConfigError, match=message):
        LIF(0.5, **kwargs)
    with pytest.raises(hn.ConfigError, match="RateEncode: seed must be an integer"):
        RateEncode(5, seed=1.5)


# --------------------------------------------------------------------------- against the twin

def test_avgpool_relu_and_learnable_beta_threshold_train_as_the_float64_twin():
    torch = pytest.importorskip("torch", reason="the twin needs PyTorch")
    pytest.importorskip("snntorch")
    from snn_twins import snn_twin

    model = rate_net(learn_beta=True, learn_threshold=True, reset="zero")
    model.build(SHAPE, "float64")
    twin = snn_twin(model, "float64")
    opt = torch.optim.Adam(twin.parameters(), lr=5e-3)
    reference = []
    for step in range(3):
        x, y = data(seed=step)
        spikes = np.empty((6, 6, *SHAPE))
        hn.codelets.encode.rate_encode.variants["ref"](x, model[0].replayed(), spikes, start=0)
        opt.zero_grad()
        out, _ = twin(torch.from_numpy(x), torch.from_numpy(spikes))
        loss = sum(torch.nn.functional.cross_entropy(out[:, t], torch.from_numpy(y))
                   for t in range(6))
        loss.backward()
        opt.step()
        reference.append(loss.item())
    model[0].steps = 0
    losses, state = train(model, 3, lr=5e-3)
    assert rel_err(losses, reference) <= 1e-9
    params = {k.split(".", 1)[1]: v.detach().numpy() for k, v in twin.named_parameters()}
    assert set(params) >= {"4.beta", "4.threshold", "7.beta"}
    for key, value in params.items():
        assert rel_err(state[key], value) <= 1e-9, key
    assert state["4.beta"] != 0.7 and state["4.threshold"] != 1.0  # they did learn


# --------------------------------------------------------------------------- runtime properties

def test_rate_encode_draws_the_same_spikes_at_any_granularity_policy_or_replay():
    runs = [train(rate_net(), g, policy=policy, replay=replay)[0]
            for g, policy, replay in ((1, "eager", True), (3, "dmda", False), (6, "heft", True))]
    for other in runs[1:]:  # partitions add in another order: equal to rounding
        assert rel_err(other, runs[0]) <= 1e-12
    again = train(rate_net(), 3, policy="ws", replay=True)[0]
    submitted = train(rate_net(), 3, policy="ws", replay=False)[0]
    assert np.array_equal(again, submitted)


def spikes_of(model, x, g, training=True):
    """RateEncode's output for ``x`` split into ``g`` partitions (a forward of layer 0 only)."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        enc = model[0]
        enc.train(training)
        h = rt.register(x)
        parts = list(h.split(0, g)) if g > 1 else [h]
        outs = enc.forward(rt, parts)
        rt.wait()
        return np.concatenate([rt.fetch(o, copy=True) for o in outs])


def test_rate_encode_steps_in_training_and_draws_one_fixed_set_in_eval():
    model = rate_net()
    model.build(SHAPE)
    x = data()[0].astype(np.float32)
    first, second = spikes_of(model, x, 1), spikes_of(model, x, 3)
    assert model[0].steps == 2 and not np.array_equal(first, second)
    model[0].steps = 1
    assert np.array_equal(spikes_of(model, x, 2), second)
    evals = [spikes_of(model, x, g, training=False) for g in (1, 3)]
    assert np.array_equal(*evals) and model[0].steps == 2


def test_dropout_per_step_masks_do_not_depend_on_granularity():
    a = train(rate_net(dropout=0.3), 1, steps=2)[0]
    b = train(rate_net(dropout=0.3), 3, steps=2)[0]
    assert rel_err(a, b) <= 1e-12
    assert rel_err(a, train(rate_net(), 1, steps=2)[0]) > 1e-6  # the mask does act


def test_recompute_lowers_the_arena_high_water():
    high = {}
    for k in (1, 5, 25):
        model = hn.build_model("snn-mlp", (1, 28, 28), 10, seed=0)
        model[3].recompute = k
        with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
            trainer = hn.Trainer(model, hn.losses.MembraneCrossEntropy(), runtime=rt,
                                 batch_size=8, replay=False)
            x = np.random.default_rng(0).random((8, 1, 28, 28))
            trainer.train_step(x, np.arange(8))
            high[k] = rt.nodes[0].arena.stats.high_water
    saved = 8 * 25 * 1000 * 4  # the hidden layer's membranes, float32, with k = 1
    assert high[1] - high[5] >= saved * (1 - 5 / 25) * 0.99
    assert high[5] - high[25] >= saved * (5 / 25 - 1 / 25) * 0.99


def emulated(devices, steps=3):
    model = rate_net(learn_beta=True)
    model.build(SHAPE, "float64")
    with hn.Runtime(devices=devices, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.MembraneCrossEntropy(), hn.optim.Adam(lr=5e-3), rt,
                             batch_size=6, granularity=2)
        losses = [trainer.train_step(*data(seed=step)) for step in range(steps)]
        ran = {(r.codelet, r.device) for r in rt.trace().records}
        return losses, model.state_dict(), ran  # read while the device's copies are there


def test_an_emulated_gpu_trains_as_the_cpu():
    """The ``cuda`` variants (NumPy as their array module) on ``cuda-emu`` workers, alone and
    beside a CPU worker: the same training to rounding (their GEMMs are other calls)."""
    reference = emulated("cpu:1")
    for devices in ("cuda-emu:1", "cpu:1,cuda-emu:1"):
        losses, state, ran = emulated(devices)
        assert ("lif_bwd_beta.overwrite", "cuda-emu") in ran or ("lif_bwd_beta", "cuda-emu") in ran
        assert rel_err(losses, reference[0]) <= 1e-10, devices
        for key, value in reference[1].items():
            assert rel_err(state[key], value) <= 1e-9, (devices, key)


def test_a_cluster_refuses_rate_coding():
    model = rate_net()
    with pytest.raises(hn.ConfigError, match="cluster: the model has RateEncode layers"):
        hn.Trainer(model, hn.losses.MembraneCrossEntropy(), batch_size=6, cluster="local:1")
