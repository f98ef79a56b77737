"""``granularity="auto"`` decides from the performance models (hetero_nn/training/granularity.py),
re-checks that choice on measured steps (hetero_nn/training/recheck.py), and
``Sequential.granularities`` runs blocks at a g of their own.

The decision tests give the runtime a performance model already holding many
measurements per footprint (1000 each, so the few real runs calibration adds do
not move the medians): what the models say about g = 1 and g = 2 decides the
models' choice (``recheck["chosen_by_models"]``), not the wall clock. The footprints
are those of the real step graphs, captured without running them. The re-check
tests give it a model saved to disk that is wrong about the machine: the measured
steps, not the model, then decide.
"""

import json

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.cli import main
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.simulation.simulate import capture

SHAPE = (1, 12, 12)
BATCH = 8


def _lenet(seed=0):
    hn.manual_seed(seed)
    model = hn.Sequential(hn.Conv2D(1, 4, 3, padding=1), hn.ReLU(), hn.MaxPool2D(2),
                          hn.Conv2D(4, 6, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dense(24, 16), hn.ReLU(), hn.Dense(16, 10))
    model.build(SHAPE, "float32")
    return model


def _batch(seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, *SHAPE)).astype(np.float32), rng.integers(0, 10, batch)


def _step_keys(g, fuse, batch=BATCH):
    """``{(codelet, variant, footprint, size)}`` of one training step at ``(g, fuse)``."""
    x, y = _batch(batch=batch)
    model = _lenet()
    model.fuse = fuse
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=False) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=batch, granularity=g)
        trainer.train_step(x, y)  # bound and built: the captured steps are steady ones

        def submit():
            trainer.submit_step(x, y)
            rt.wait()

        (step,) = capture(rt, submit, steps=1)
        return {(t.codelet.name, rt.candidates(t.codelet, "cpu")[0], t.footprint, t.size)
                for graph in step.graphs for t in graph}


def _told(tmp_path, seconds, gs=(1, 2), batch=BATCH):
    """A performance model that says ``seconds(codelet, g, fuse)`` for the tasks of each
    g in ``gs`` (fused and not); a footprint in several graphs (the optimizer's, the
    gradients' adds) takes the figure of the last."""
    pm = PerfModel(tmp_path, load=False)
    runs = []
    for g in gs:
        for fuse in (True, False):
            for name, variant, fp, size in _step_keys(g, fuse, batch):
                runs += [(name, variant, "cpu", fp, size, seconds(name, g, fuse))] * 1000
    pm.record_many(runs)
    return pm


def _decide(pm, per_layer=True, policy="eager", candidates=(1, 2), batch=BATCH, replay=True):
    x, y = _batch(batch=batch)
    model = _lenet()
    with hn.Runtime(devices="cpu:2", perfmodel=pm, trace=False, policy=policy) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=batch, granularity="auto",
                             replay=replay)
        trainer.tune_granularity(x, y, candidates=list(candidates), per_layer=per_layer)
        return trainer.granularity_decision, model


@pytest.mark.parametrize("faster", [1, 2])
def test_the_granularity_the_models_say_is_faster_is_chosen(tmp_path, faster):
    decision, model = _decide(_told(tmp_path, lambda name, g, fuse: 1e-3 if g == faster
                                    else 1e-2))
    by_models = decision.recheck["chosen_by_models"]
    assert by_models["granularity"] == faster
    rows = {(r["granularity"], r["fuse"]): r["predicted_seconds"] for r in decision.candidates}
    assert set(rows) == {(1, True), (1, False), (2, True), (2, False)}
    slower = 3 - faster
    assert max(rows[faster, f] for f in (True, False)) < min(rows[slower, f]
                                                            for f in (True, False))
    assert by_models["layer_granularity"] is None and model.granularities is None
    # the decision record: predicted and measured step times, and how it was reached
    assert by_models["predicted_seconds"] == min(rows.values())
    assert decision.measured_seconds > 0 and decision.dispatch_seconds >= 0
    # the decision is the re-check's final configuration, measured
    final = decision.recheck["final"]
    assert (decision.granularity, decision.fuse) == (final["granularity"], final["fuse"])
    doc = json.loads(json.dumps(decision.to_json()))
    assert doc["granularity"] == decision.granularity and len(doc["candidates"]) == 4
    assert "predicted" in decision.format() and "measured" in decision.format()


def test_blocks_get_their_own_granularity_where_the_models_say_so(tmp_path):
    def seconds(name, g, fuse):  # convolutions pay at g = 2, the dense tail at g = 1
        if "conv" in name:
            return 1e-3 if g == 2 else 1e-2
        if "dense" in name:
            return 1e-3 if g == 1 else 1e-2
        return 1e-5

    decision, model = _decide(_told(tmp_path, seconds), policy="dmda")
    by_models = decision.recheck["chosen_by_models"]
    layers = by_models["layer_granularity"]
    assert layers is not None
    assert model.granularities == (None if decision.layer_granularity is None
                                   else tuple(decision.layer_granularity))
    assert [layers[i] for i in (0, 3)] == [2, 2]          # the convolutions' blocks
    assert [layers[i] for i in (7, 9)] == [1, 1]          # the dense layers' blocks
    assert by_models["predicted_seconds"] * 1.05 < min(r["predicted_seconds"]
                                                       for r in decision.candidates)
    assert any(row["kept"] for row in decision.blocks)
    model.fuse = by_models["fuse"]
    assert all(len(set(layers[first:last])) == 1 for first, last, _ in model.blocks())


def _train(granularity, layers, policy, steps=4, fuse=True):
    model = _lenet(seed=3)
    model.build(SHAPE, "float64")
    model.fuse = fuse
    model.granularities = layers
    rng = np.random.default_rng(5)
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False, trace=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=rt,
                             batch_size=BATCH, granularity=granularity)
        losses = [trainer.train_step(rng.standard_normal((BATCH, *SHAPE)),
                                     rng.integers(0, 10, BATCH)) for _ in range(steps)]
        return losses, model.state_dict()


def test_per_layer_granularity_is_bit_identical_across_policies_and_replay():
    layers = (3, 3, 3, 2, 2, 2, 1, 1, 1, 1)
    base = _train(2, layers, "eager")
    for policy in ("ws", "dmda", "heft"):
        losses, state = _train(2, layers, policy)
        assert losses == base[0]
        assert all(np.array_equal(state[k], base[1][k]) for k in state)


def test_granularities_are_checked_and_refused_with_a_cluster():
    model = _lenet()
    with pytest.raises(hn.ConfigError, match="layer 2"):
        model.granularities = (1, 1, 0, 1, 1, 1, 1, 1, 1, 1)
    with pytest.raises(hn.ConfigError, match="3 values for 10 layers"):
        model.granularities = (1, 2, 3)
    model.granularities = [2] * 10
    assert model.granularities == (2,) * 10
    with (hn.Runtime(devices="cpu:1", perfmodel=False) as rt,
          pytest.raises(hn.ConfigError, match="per-layer granularities")):
        hn.Trainer(model, runtime=rt, granularity=2, cluster="local:1")


def test_a_checkpoint_keeps_the_per_layer_choice(tmp_path):
    layers = (2, 2, 2, 2, 2, 2, 1, 1, 1, 1)
    x, y = _batch()
    model = _lenet()
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=False) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity="auto")
        trainer.granularity, model.granularities, model.fuse = 2, layers, False  # as if chosen
        trainer.train_step(x, y)
        path = trainer.save_checkpoint(tmp_path / "c.npz")
        again = _lenet()
        resumed = hn.Trainer(again, runtime=rt, batch_size=BATCH, granularity="auto")
        resumed.load_checkpoint(path)
        assert (resumed.granularity, again.granularities, again.fuse) == (2, layers, False)
        assert resumed.train_step(x, y) == trainer.train_step(x, y)


def test_the_cli_prints_the_decision_and_records_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "16",
                 "--model", "dahl-basic", "--devices", "cpu:2", "--granularity", "auto",
                 "--epochs", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "granularity auto" in err and "predicted" in err and "measured" in err
    assert len([line for line in err.splitlines() if "re-checked on measured steps" in line]) == 1
    doc = json.loads((out / "metrics.json").read_text())
    decision = doc["granularity_decision"]
    assert decision["granularity"] == doc["granularity"]
    check = decision["recheck"]  # the models' choice against measured steps
    assert check["final"]["granularity"] == decision["granularity"]
    assert len(check["measured"]) >= 2 and check["measured"][0] == check["chosen_by_models"]
    assert all(r["measured_seconds"] > 0 and r["predicted_seconds"] > 0
               for r in check["measured"])
    assert decision["measured_seconds"] > 0 and decision["predicted_seconds"] > 0
    assert {r["granularity"] for r in decision["candidates"]} == {1, 2, 4, 8}
    assert "epochs" in doc and "variants_run" in doc  # the existing keys stay


WRONG = 16  # the batch of the re-check tests, and the g the wrong model favours


def _wrong(tmp_path):
    """A performance model saved to disk that says every task of g = 1 takes 100 ms (some
    thousand times what it does) and those of g = 16 a microsecond. The calibration's real
    runs correct g = 16's figures (16 of a footprint per step outvote the median's
    window), not g = 1's (one per step), so the models choose g = 16, whose 16 partitions
    of one image submit 16 times the tasks of g = 1, and take several times its step.
    The steps are submitted (``replay=False``): the replay engine plans its fixed
    schedule from the models' figures, and replayed g = 1 steps under this model ran
    about 10 times slower than under a true one (9.0 ms against 0.9 ms)."""
    _told(tmp_path, lambda name, g, fuse: 1e-1 if g == 1 else 1e-6, gs=(1, WRONG),
          batch=WRONG).save()
    return PerfModel(tmp_path)


def test_a_choice_the_measured_steps_contradict_is_switched(tmp_path):
    decision, model = _decide(_wrong(tmp_path), candidates=(1, WRONG), batch=WRONG,
                              replay=False)
    check = decision.recheck
    first = check["chosen_by_models"]
    assert first["granularity"] == WRONG  # what the wrong model says
    assert check["switched"] and decision.granularity == 1, decision.format()  # measured
    mixed = first["layer_granularity"] is not None  # a per-block mix beside the uniform ones
    assert len(check["measured"]) == 4 + mixed  # every candidate's steps
    best = min(check["measured"], key=lambda r: r["measured_seconds"])
    assert check["final"] == best and best["measured_seconds"] * 1.1 < first["measured_seconds"]
    assert (decision.granularity, decision.fuse) == (best["granularity"], best["fuse"])
    assert model.fuse == decision.fuse and decision.layer_granularity is None
    assert decision.predicted_seconds == best["predicted_seconds"]
    assert decision.measured_seconds > 0  # its own steady steps, after the rounds
    assert "switched to g=1" in decision.format()
    # the choice that stood in the models is gone from the trainer, not from the record
    doc = json.loads(json.dumps(decision.to_json()))
    assert doc["recheck"]["chosen_by_models"]["granularity"] == WRONG


def test_the_recheck_leaves_out_what_its_budget_cannot_pay_for(tmp_path, monkeypatch):
    """With no time to spend, the re-check measures only the models' choice (already run),
    names every other candidate as left out, and so cannot switch: a model whose steps
    take seconds is never re-checked at the price of minutes."""
    from hetero_nn.training import recheck
    monkeypatch.setattr(recheck, "BUDGET", 0.0)
    decision, _ = _decide(_wrong(tmp_path), candidates=(1, WRONG), batch=WRONG, replay=False)
    check = decision.recheck
    assert [r["granularity"] for r in check["measured"]] == [WRONG]
    assert check["not_measured"] and not check["switched"]
    assert decision.granularity == WRONG  # the wrong models' choice stands, unchecked
    assert "left out by the 0 s budget" in decision.format()


def test_a_switched_auto_run_is_the_same_bits_as_a_run_given_its_choice(tmp_path):
    pm = _wrong(tmp_path)
    batches = [_batch(seed, WRONG) for seed in range(4)]
    results = []
    for granularity in ("auto", None):
        model = _lenet(seed=4)
        with hn.Runtime(devices="cpu:2", perfmodel=pm, trace=False) as rt:
            if granularity is None:  # the configuration the auto run ended at
                model.fuse = decision.fuse
                granularity = decision.granularity
            trainer = hn.Trainer(model, runtime=rt, batch_size=WRONG, granularity=granularity,
                                 replay=False)
            if granularity == "auto":
                trainer.tune_granularity(*batches[0], candidates=[1, WRONG])
                decision = trainer.granularity_decision
                assert decision.recheck["switched"]
            losses = [trainer.train_step(x, y) for x, y in batches]
            results.append((losses, model.state_dict()))
    (auto_losses, auto_state), (losses, state) = results
    assert auto_losses == losses
    assert all(np.array_equal(auto_state[k], state[k]) for k in state)
