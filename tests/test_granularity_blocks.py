"""The per-block pass of ``granularity="auto"`` (hetero_nn/training/granularity_blocks.py):
which block each task of a captured step belongs to, and a pass that simulates only
the trials its estimates keep; and the calibration's step budget and family counts
(hetero_nn/training/granularity.py)."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.codelets import conv
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.simulation.simulate import MissingModels, capture
from hetero_nn.training import granularity
from hetero_nn.training.granularity_blocks import block_tasks, per_block
from hetero_nn.training.granularity_family import CALIBRATION_STEPS

SHAPE = (1, 12, 12)
BATCH = 8


def _lenet(fuse=False):
    hn.manual_seed(0)
    model = hn.Sequential(hn.Conv2D(1, 4, 3, padding=1), hn.ReLU(), hn.MaxPool2D(2),
                          hn.Conv2D(4, 6, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dense(24, 16), hn.ReLU(), hn.Dense(16, 10), fuse=fuse)
    model.build(SHAPE, "float32")
    return model


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BATCH, *SHAPE)).astype(np.float32),
            rng.integers(0, 10, BATCH))


@pytest.mark.parametrize("g", [1, 2])
def test_each_task_of_a_step_belongs_to_the_block_whose_layer_submitted_it(g):
    model = _lenet()
    x, y = _batch()
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=False) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity=g)
        trainer.train_step(x, y)
        handles = {}
        (step,) = capture(rt, lambda: (trainer.submit_step(x, y), rt.wait()), steps=1,
                          handles=handles)
        found = block_tasks(model, step.graphs, handles)
    tasks = [t for graph in step.graphs for t in graph]
    assert set(found) == set(tasks)  # every task has a block
    by_name: dict = {}
    for t, first in found.items():
        by_name.setdefault(t.codelet.name.split(".")[0], set()).add(first)
    # a layer's own codelets (forward, both gradients, the weight gradients' REDUX trees,
    # the optimizer's step) in its block only
    assert by_name["conv2d_fwd"] == by_name["conv2d_bwd_params"] == {0, 3}
    dense = {n: b for n, b in by_name.items() if n.startswith("dense")}
    assert dense and set().union(*dense.values()) == {7, 9}
    assert by_name["sgd_step"] == {0, 3, 7, 9}
    # at g=2 each weight gradient's partial is combined by a REDUX task of its layer's
    redux = {t.codelet.name: found[t] for t in tasks if t.codelet.name.endswith("params.redux")}
    assert (g > 1) == bool(redux)
    assert set(redux.values()) <= {0, 3, 7, 9}
    # a block with no parameters (ReLU, pooling, Flatten) has no tasks of its own: they
    # are counted with the block before it
    assert set(found.values()) == {0, 3, 7, 9}


class _Trials:
    """``predict`` for :func:`per_block`: a step time per configuration, each call kept."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, []

    def __call__(self, g, fuse, layers):
        self.calls.append(layers)
        got = self.seconds(layers)
        if got is None:
            raise MissingModels([("c", "cpu", "fp")])
        return got, 0


def test_only_trials_whose_estimate_pays_are_simulated_and_the_simulation_decides():
    model = _lenet()  # unfused: ten blocks, one per layer
    blocks = [first for first, _, _ in model.blocks()]
    # block seconds of work at g: the dense layers (7, 9) 1, 4 and 8 ms at g = 1, 2, 4;
    # every other block 1 ms per partition
    dense = {1: 1e-3, 2: 4e-3, 4: 8e-3}
    costs = {h: {b: dense[h] if b in (7, 9) else h * 1e-3 for b in blocks}
             for h in (1, 2, 4)}
    trials = _Trials(lambda layers: 5e-3 if layers[9] == 1 else 9.8e-3)  # 7 at 1: no gain
    layers, predicted, rows = per_block(model, 2, False, [1, 2, 4], 10e-3, trials,
                                        costs.get, workers=2, tolerance=1.05)
    # 7 and 9 estimated at g=1: 10 + (1 - 4/2) = 9 ms; every other block estimated no
    # better at g=1 (1 ms alone against 2/2) or 4 (4/2 against 2/2): not simulated
    assert [tuple(i for i, h in enumerate(c) if h != 2) for c in trials.calls] == [(7,), (9,)]
    assert layers == (2,) * 9 + (1,) and predicted == 5e-3
    kept = [r for r in rows if r["kept"]]
    assert [(r["layer"], r["granularity"]) for r in kept] == [(9, 1)]
    assert all(r["estimated_seconds"] > 0 for r in rows)
    simulated = [r for r in rows if r["predicted_seconds"] is not None]
    assert [(r["layer"], r["predicted_seconds"]) for r in simulated] == [(7, 9.8e-3),
                                                                         (9, 5e-3)]
    assert len(rows) == 2 * len(blocks)  # every other g of every block estimated


def test_a_block_with_no_estimate_or_no_model_is_not_kept():
    model = _lenet()
    costs = {2: {7: 4e-3}, 1: {7: 1e-3}}  # the other blocks: no prediction at g=1
    trials = _Trials(lambda layers: None)  # the simulation finds a task of no model
    layers, predicted, rows = per_block(model, 2, False, [1, 2], 10e-3, trials, costs.get,
                                        workers=2, tolerance=1.05)
    assert len(trials.calls) == 1 and layers is None and predicted == 10e-3
    assert [r["layer"] for r in rows] == [7] and not rows[0]["kept"]


def test_a_footprint_is_known_from_its_family_at_another_size(tmp_path):
    pm = PerfModel(tmp_path, load=False)
    with hn.Runtime(devices="cpu:1", perfmodel=pm) as rt:
        fp = "{n}x16x8x8:<f4|16x16x3x3:<f4|{n}x16x8x8:<f4"
        for variant in rt.candidates(conv.conv2d_fwd_nobias, "cpu"):
            pm.record_many([("conv2d_fwd_nobias", variant, "cpu", fp.format(n=32), 3200.0,
                             1e-3)] * 3 + [("conv2d_fwd_nobias", variant, "cpu",
                                            fp.format(n=8), 800.0, 3e-4)])
        counts = granularity._family_counts(rt, {"conv2d_fwd_nobias"})
        known = [granularity._known(rt, conv.conv2d_fwd_nobias, fp.format(n=n), ["cpu"],
                                    counts, samples) for n, samples in
                 ((8, 3), (8, 5), (16, 3))]
    assert known == [True, False, False]  # 4 of its family; 16 never measured


def test_a_decision_calibrates_in_five_steps_and_records_the_steady_step(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(granularity, "CALIBRATION_BUDGET", 1e9)  # steps, not seconds, stop it
    model = _lenet(fuse=True)
    x, y = _batch()
    with hn.Runtime(devices="cpu:2", perfmodel=PerfModel(tmp_path, load=False),
                    trace=False) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity="auto")
        trainer.tune_granularity(x, y, candidates=[2, 4])
        decision = trainer.granularity_decision
    assert decision.calibration_steps <= CALIBRATION_STEPS
    assert decision.calibrated == [[2, True], [4, True]]  # the first two of the order
    # the measure beside the prediction: the steady steps of the final configuration,
    # not the re-check's interleaved rounds
    check = decision.recheck
    if not check["switched"]:
        assert decision.measured_seconds == pytest.approx(
            check["measured_over_predicted"] * decision.predicted_seconds)
    assert decision.measured_seconds != check["final"]["measured_seconds"]
    assert set(decision.predicted_codelets) and all(
        s > 0 for s in decision.predicted_codelets.values())
