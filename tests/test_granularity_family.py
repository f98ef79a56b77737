"""Shape families of ``granularity="auto"`` (issue 28): the family key, the calibration
order, predictions for footprints never measured, and a decision that calibrates one
configuration and predicts the rest."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.codelets import conv
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.simulation.simulate import SimTask
from hetero_nn.training import granularity
from hetero_nn.training.granularity_family import FamilyModel, calibration_order, family_of


def test_a_family_drops_each_operands_leading_dimension_and_keeps_parameters():
    fp = "32x64x8x8:<f4|128x64x3x3:<f4|32x128x4x4:<f4|conv2d_fwd=(2, 2)"
    assert family_of(fp) == "64x8x8:<f4|64x3x3:<f4|128x4x4:<f4|conv2d_fwd=(2, 2)"
    assert family_of(fp.replace("32x", "8x")) == family_of(fp)
    assert family_of("64:<f4|:<f8") == ":<f4|:<f8"


def test_the_calibration_order_takes_a_partition_per_worker_then_another_size():
    configs = [(g, f) for g in (1, 2, 4, 8) for f in (True, False)]
    order = calibration_order(configs, workers=2)
    # one partition per worker, the largest g (a second size of the same fusion's
    # families), the smallest g with the other fusion, then the rest from large to small
    assert order[:3] == [(2, True), (8, True), (1, False)]
    assert sorted(order) == sorted(configs)
    assert [g for g, _ in order[3:]] == [8, 4, 4, 2, 1]
    assert calibration_order(configs, workers=16)[:2] == [(8, True), (1, True)]
    assert calibration_order([(1, None), (2, None)]) == [(1, None), (2, None)]
    assert calibration_order([(4, None)], workers=2) == [(4, None)]


def _task(fp, size):
    return SimTask(0, conv.conv2d_fwd_nobias, (), (), [], fp, size)


def test_an_unmeasured_footprint_is_predicted_from_its_family(tmp_path):
    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:1", perfmodel=pm) as rt:
        variant = rt.candidates(conv.conv2d_fwd_nobias, "cpu")[0]
        fp = "{n}x16x8x8:<f4|16x16x3x3:<f4|{n}x16x8x8:<f4"
        for n, seconds in ((8, 1.0e-3), (32, 3.4e-3)):
            pm.record("conv2d_fwd_nobias", variant, "cpu", fp.format(n=n), n * 100.0, seconds)
        family = FamilyModel(rt)
        assert family(_task(fp.format(n=8), 800.0), "cpu") is None  # measured: not ours
        seconds, how = family(_task(fp.format(n=16), 1600.0), "cpu")
        assert how == "family" and seconds == pytest.approx(1.8e-3)  # on the line
        seconds, _ = family(_task(fp.format(n=64), 6400.0), "cpu")
        assert seconds == pytest.approx(6.6e-3)  # the line extended
        seconds, _ = family(_task(fp.format(n=1), 100.0), "cpu")
        assert seconds == pytest.approx(0.3e-3)  # the line, above the floor
        other = "{n}x32x8x8:<f4|32x32x3x3:<f4|{n}x32x8x8:<f4"
        assert family(_task(other.format(n=8), 800.0), "cpu") is None  # no family
        pm.record("conv2d_fwd_nobias", variant, "cpu", other.format(n=4), 400.0, 2e-3)
        family = FamilyModel(rt)
        seconds, _ = family(_task(other.format(n=8), 800.0), "cpu")
        assert seconds == pytest.approx(4e-3)  # one size: in proportion
        assert family.used == 1


def _decided_past_budget(name, shape, tmp_path, monkeypatch, per_layer, captures=None):
    """``granularity="auto"`` on a batch of 8 with g in {1, 4} and no calibration budget:
    the first configuration of the order calibrated, the rest predicted or left out;
    ``captures`` (a list) gets one entry per step graph captured without running."""
    monkeypatch.setattr("hetero_nn.training.granularity.CALIBRATION_BUDGET", 0.0)
    if captures is not None:
        real = granularity.capture
        monkeypatch.setattr(granularity, "capture",
                            lambda *a, **k: captures.append(1) or real(*a, **k))
    model = hn.build_model(name, shape, 10, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, *shape), dtype=np.float32)
    y = rng.integers(0, 10, 8)
    with hn.Runtime(devices="cpu:2", perfmodel=PerfModel(tmp_path)) as rt:
        tr = hn.Trainer(model, runtime=rt, batch_size=8, granularity="auto", replay=False,
                        optimizer=hn.optim.SGD(model.parameters(), lr=0.01))
        tr.tune_granularity(x, y, candidates=[1, 4], per_layer=per_layer)
        decision = tr.granularity_decision
        tr.close()
    return decision


def test_a_decision_past_its_budget_calibrates_one_and_predicts_the_rest(tmp_path,
                                                                          monkeypatch):
    captures = []
    decision = _decided_past_budget("lenet5", (1, 28, 28), tmp_path, monkeypatch, False,
                                    captures)
    # the first of the order calibrated, no more steps than it takes to measure each
    # footprint once (past the budget); the same fusion at every other g predicted by
    # shape family; the other fusion's codelets never ran, so it is left out
    assert decision.calibrated == [[4, True]] and decision.calibration_steps <= 3
    assert sorted(decision.left_out) == [[1, False], [4, False]]
    rows = decision.candidates
    assert sorted((r["granularity"], r["fuse"]) for r in rows) == [(1, True), (4, True)]
    assert all(r["predicted_seconds"] > 0 for r in rows)
    text = decision.format()
    assert "predicted by shape family" in text and "left out" in text
    assert decision.to_json()["left_out"] == decision.left_out
    # each configuration's graphs captured once: for the calibration or the check of its
    # families, then reused by its prediction
    assert len(captures) == 4


def test_a_block_granularity_no_family_covers_is_not_tried(tmp_path, monkeypatch):
    """At g=1 batch norm runs as two one-partition codelets that a calibration at g=4
    never ran: the per-block pass skips those trials rather than fail the decision."""
    decision = _decided_past_budget("resnet-small", (3, 8, 8), tmp_path, monkeypatch, True)
    assert decision.calibrated == [[4, True]]
    tried = {(t["block"], t["granularity"]) for t in decision.blocks}
    assert ("Conv2d", 1) in tried  # its family was calibrated at g=4
    assert ("BatchNorm2d", 1) not in tried  # its one-partition codelets never ran

