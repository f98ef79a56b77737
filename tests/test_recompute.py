"""Checkpoint (activation recomputation): bit-identical training to the same model without
it (weights, running statistics, losses, dropout masks), on replayed and submitted steps,
on CPU workers and on an emulated GPU; the same state_dict keys and module paths; and
the arena's high-water lower."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.errors import SubmitError
from hetero_nn.layers import Checkpoint, Residual
from hetero_nn.layers.dropout import dropout_state


def checkpointed(model, kinds=(Residual,)):
    """``model`` with each of its top-level layers of ``kinds`` wrapped in a Checkpoint."""
    model.layers = [Checkpoint(layer) if isinstance(layer, kinds) else layer
                    for layer in model.layers]
    return model


def resnet(dtype="float64", check=False):
    model = hn.build_model("resnet-small", (3, 12, 12), 10, dtype=dtype, seed=0)
    return checkpointed(model) if check else model


def dropout_net(dtype="float64", check=False):
    hn.manual_seed(3)
    body = hn.Sequential(hn.Dense(48, 32), hn.ReLU(), hn.Dropout(0.3), hn.Dense(32, 32),
                         hn.ReLU())
    layers = [hn.Flatten(), Checkpoint(body) if check else body, hn.Dropout(0.2),
              hn.Dense(32, 10)]
    model = hn.Sequential(*layers)
    model.build((3, 4, 4), dtype)
    return model


def train(model, devices="cpu:2", g=2, steps=3, replay=True, batch=8, arenas=True):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *model.input_shape))
    y = rng.integers(0, 10, batch)
    with (hn.Runtime(devices=devices, perfmodel=False, arenas=arenas) as rt,
          hn.Trainer(model, runtime=rt, batch_size=batch, granularity=g, replay=replay,
                     optimizer=hn.optim.SGD(lr=0.05, momentum=0.9)) as trainer):
        losses = [trainer.train_step(x, y) for _ in range(steps)]
        graphs = list(trainer.graphs.values())
        stats = graphs[0].arena_stats() if graphs else None
        return {"state": model.state_dict(), "losses": losses, "stats": stats,
                "dropout": dropout_state(model)}


def assert_same(a, b):
    assert list(a["state"]) == list(b["state"])
    for key in a["state"]:
        np.testing.assert_array_equal(a["state"][key], b["state"][key], err_msg=key)
    assert a["losses"] == b["losses"]
    assert list(a["dropout"].values()) == list(b["dropout"].values())


@pytest.mark.parametrize("devices,g,replay", [("cpu:2", 2, True), ("cpu:2", 3, False),
                                              ("cuda-emu:1", 2, True)])
def test_resnet_bit_identical_with_checkpointed_blocks(devices, g, replay):
    plain = train(resnet(), devices, g, replay=replay)
    again = train(resnet(check=True), devices, g, replay=replay)
    assert_same(plain, again)
    # the running statistics were updated once per step, not once more per recomputation
    assert all(int(v) == 3 for k, v in again["state"].items() if k.endswith("num_batches_tracked"))


def test_dropout_masks_recomputed_identically():
    plain = train(dropout_net(), g=2)
    again = train(dropout_net(check=True), g=2)
    assert_same(plain, again)
    assert [steps for _, steps in again["dropout"].values()] == [3, 3]


def test_state_dict_keys_and_module_paths_unchanged():
    plain, wrapped = resnet(), resnet(check=True)
    assert list(plain.state_dict()) == list(wrapped.state_dict())
    paths = [p for p, m in plain.named_modules()]
    assert [p for p, m in wrapped.named_modules() if not isinstance(m, Checkpoint)] == paths
    wrapped.load_state_dict(plain.state_dict())  # strict: the same keys
    assert "Checkpoint" in repr(wrapped)


def test_arena_high_water_lower_and_zero_allocations_after_capture():
    plain = train(resnet(dtype="float32"), g=1, batch=16)
    again = train(resnet(dtype="float32", check=True), g=1, batch=16)
    before, after = plain["stats"]["host0"], again["stats"]["host0"]
    assert after.high_water < 0.7 * before.high_water
    # one region per node, taken at capture: replays allocate nothing
    assert before.block_allocations == after.block_allocations == 1


def test_per_task_allocation_gives_the_same_bits():
    arena = train(resnet(check=True), g=2)
    plain = train(resnet(check=True), g=2, arenas=False)
    assert_same(arena, plain)
    assert plain["stats"] == {}  # nothing taken from the graph's arenas


def test_checkpoint_rejects_a_non_layer_and_release_a_non_temporary():
    with pytest.raises(TypeError, match="Checkpoint: block must be a Layer"):
        Checkpoint([hn.ReLU()])
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        h = rt.register(np.zeros(3))
        with pytest.raises(SubmitError, match="not a temporary"):
            rt.release(h)


def test_trace_has_live_bytes_per_node_and_they_round_trip(tmp_path):
    model = resnet(dtype="float32", check=True)
    x = np.random.default_rng(0).standard_normal((8, 3, 12, 12)).astype(np.float32)
    y = np.arange(8) % 10
    with (hn.Runtime(devices="cpu:1,cuda-emu:1", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=8, granularity=2) as trainer):
        trainer.train_step(x, y)
        rt.trace(clear=True)
        trainer.train_step(x, y)  # a replay
        trace = rt.trace()
        (graph,) = trainer.graphs.values()
        peaks = {node: s.high_water for node, s in graph.arena_stats().items()}
    live = trace.live_bytes()
    assert set(live) <= set(peaks) and live
    for node, series in live.items():
        assert series[-1][1] == 0 and 0 < max(b for _, b in series) <= peaks[node]
    again = hn.Trace.from_json(trace.to_json(tmp_path / "t.json"))
    assert again.live_bytes() == live
    assert any(e.get("ph") == "C" for e in trace.chrome_events())


def test_sequential_releases_activations_after_their_backward():
    model = hn.Sequential(hn.Conv2D(1, 4, 3), hn.ReLU(), hn.Dropout(0.2), hn.Flatten(),
                          hn.Dense(4 * 6 * 6, 10), hn.Flatten(), fuse=False)
    model.build((1, 8, 8), "float64")
    x = np.random.default_rng(0).standard_normal((8, 1, 8, 8))
    y = np.arange(8) % 10
    with (hn.Runtime(devices="cpu:2", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=8, granularity=2) as trainer):
        trainer.train_step(x, y)
        (graph,) = trainer.graphs.values()
        lifetimes = graph._lifetimes[0]
        outputs = model._outputs  # each block's output root, in the captured step
        # the conv's, ReLU's and Dropout's outputs die in the backward; the logits (the
        # Dense's output, passed through by the last Flatten) live to the end of the step
        assert all(r in lifetimes.released for r in outputs[:3])
        assert outputs[4] is outputs[5] and outputs[5] not in lifetimes.released
        everything = sum(r.nbytes for r in lifetimes.roots)
        assert graph.arena_stats()["host0"].high_water < everything
