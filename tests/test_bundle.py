"""Task-level fusion: chains of a captured graph predicted below the per-task overhead
run as one bundle task (``Graph.fuse_chains``, ``Runtime(fuse_chains=...)``).

The decisions here come from real ``PerfModel`` measurements: runs of the tasks
themselves, or runs given through the model's ``record_many`` with chosen times.

Fusion is decided for replays through the executor (``replay_engine="executor"``):
the compiled replay engine leaves nothing for it to save and runs bundles made
explicitly member by member (``tests/test_replay_engine.py``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, W
from hetero_nn.scheduler.executors.bundle import Bundle
from hetero_nn.scheduler.perfmodel.model import PerfModel
from test_replay import _copy, _square_rows, _sum_into, _zero

POLICIES = ("eager", "random", "ws", "dmda", "heft")
INPUT_SHAPE = (1, 28, 28)
BATCH = 12
STEPS = 6
ENGINE = "executor"  # the replays whose dispatch fusion saves


def _affine(y, a, b):
    y *= a
    y += b


def _checked(y):
    if np.isnan(y).any():
        raise ValueError("NaN in the partition")


COPY = hn.Codelet("bundle_copy", modes=(R, W), variants={"ref": _copy})
AFFINE = hn.Codelet("bundle_affine", modes=(RW,), variants={"ref": _affine})
CHECK = hn.Codelet("bundle_check", modes=(RW,), variants={"ref": _checked})
SQUARE_ROWS = hn.Codelet("bundle_square_rows", modes=(R, REDUX), variants={"ref": _square_rows},
                         init=_zero, redux=_sum_into)


def _program(rt, x, acc, parts=3):
    """Per partition: copy, affine, check, then a REDUX of column sums of squares."""
    y = rt.temporary(x.shape, x.dtype, name="y")
    for xp, yp in zip(x.split(0, parts), y.split(0, parts)):
        rt.submit(COPY, xp, yp)
        rt.submit(AFFINE, yp, a=2.0, b=1.0)
        rt.submit(CHECK, yp)
        rt.submit(SQUARE_ROWS, yp, acc)


def _captured(rt, data, parts=3):
    x = rt.register(data.copy(), name="x")
    acc = rt.register(np.zeros(data.shape[1]), name="acc")
    with rt.capture() as graph:
        _program(rt, x, acc, parts)
    return graph, x, acc


def _tasks(graph):
    return [t for segment in graph._segments for t, _, _ in segment]


def _measured(graph, times=3):
    """Replays that give the model measurements of every task (the first run of each
    variant is a warm-up and is not kept)."""
    for _ in range(times):
        graph.replay()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_fused_handle_program_equals_the_unfused_one_bit_for_bit(policy, tmp_path):
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((9, 5)).astype(np.float32) for _ in range(4)]
    results = {}
    for fuse in (False, True):
        with hn.Runtime(devices="cpu:2", replay_engine=ENGINE,
                        policy=policy, perfmodel=PerfModel(tmp_path / str(fuse)),
                        fuse_chains=False) as rt:
            graph, x, acc = _captured(rt, inputs[0])
            _measured(graph)
            if fuse:
                report = graph.fuse_chains(overhead=1.0)  # every measured task is "small"
                assert report.tasks_before == 3 * 4 + 3 and report.tasks_after < 3 * 4 + 3
                bundles = [t for t in _tasks(graph) if isinstance(t, Bundle)]
                assert len(bundles) == len(report.chains) >= 3
                assert [m.codelet.name for m in bundles[0].members][:3] == [
                    "bundle_copy", "bundle_affine", "bundle_check"]
            out = []
            for data in inputs:
                graph.write(x, data)
                graph.replay()
                out.append(rt.fetch(acc, copy=True))
            if fuse and policy == "heft":  # planned again after fusion: bundles included
                assert all(t.assigned is not None for t in _tasks(graph))
        results[fuse] = np.stack(out)
    assert results[True].tobytes() == results[False].tobytes()
    expected = np.zeros(5, np.float32)
    for data in [inputs[0]] * 4 + inputs:  # the capture's run, 3 measuring replays, 4 more
        expected += ((2 * data + 1) ** 2).sum(axis=0)
    np.testing.assert_allclose(results[True][-1], expected, rtol=1e-5)


def test_without_predictions_nothing_is_fused(tmp_path):
    with hn.Runtime(devices="cpu:1", replay_engine=ENGINE,
                    perfmodel=PerfModel(tmp_path), fuse_chains=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)), parts=1)  # one run each: a warm-up
        report = graph.fuse_chains(overhead=1.0)
        assert report.chains == [] and report.tasks_after == report.tasks_before
    with hn.Runtime(devices="cpu:1", replay_engine=ENGINE, perfmodel=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        assert "no performance model" in str(graph.fuse_chains())


def _predict_slow(rt, pm, graph, codelets, seconds=5.0):
    """Give the model 1000 runs of ``seconds`` for each task of ``codelets`` in ``graph``."""
    runs = []
    for t in _tasks(graph):
        if t.codelet in codelets:
            fp, size = rt.footprint(t)
            runs += [(t.codelet.name, "ref", "cpu", fp, size, seconds)] * 1000
    pm.record_many(runs)


def _chains(report):
    return [[name for name, _ in chain] for chain in report.chains]


def test_a_link_of_two_tasks_above_the_overhead_cuts_the_chain(tmp_path):
    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:1", replay_engine=ENGINE, perfmodel=pm, fuse_chains=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        _measured(graph)
        _predict_slow(rt, pm, graph, (AFFINE, CHECK))
        report = graph.fuse_chains(overhead=1.0)
        # copy (small) rides with affine, square_rows (small) with check; affine -> check
        # (both 5 s) is left to the policy
        assert _chains(report).count(["bundle_copy", "bundle_affine"]) == 3
        assert _chains(report).count(["bundle_check", "bundle_square_rows"]) == 3
        assert all(min(p for _, p in chain) < 1.0 for chain in report.chains)
        with pytest.raises(hn.SubmitError, match="already decided"):
            graph.fuse_chains()


def test_a_chain_predicted_above_the_overhead_is_not_fused(tmp_path):
    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:1", replay_engine=ENGINE, perfmodel=pm, fuse_chains=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        _measured(graph)
        _predict_slow(rt, pm, graph, (COPY, AFFINE, CHECK, SQUARE_ROWS), seconds=2e-3)
        report = graph.fuse_chains(overhead=1e-3)
        assert not report.measured and "1000.0 us/task (given)" in str(report)
        # only the REDUX tree's last two adds (microseconds) are left to fuse
        assert _chains(report) == [["bundle_square_rows.redux"] * 2]
        assert report.tasks_after == report.tasks_before - 1


def test_the_overhead_is_measured_and_fusion_happens_before_the_second_replay(tmp_path):
    with hn.Runtime(devices="cpu:2", replay_engine=ENGINE, perfmodel=PerfModel(tmp_path)) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        graph.replay()
        assert graph.bundles is None  # decided with the measurements of one replay
        graph.replay()
        report = graph.bundles
        assert report is not None and report.measured and report.overhead > 0
        assert "(measured)" in str(report)
        assert all(min(p for _, p in chain) < report.overhead for chain in report.chains)
        assert graph.num_tasks == report.tasks_after
    with hn.Runtime(devices="cpu:2", replay_engine=ENGINE,
                    perfmodel=PerfModel(tmp_path), fuse_chains=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        _measured(graph)
        assert graph.bundles is None and not any(isinstance(t, Bundle) for t in _tasks(graph))


def test_members_keep_their_trace_records_and_feed_the_model(tmp_path):
    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:2", replay_engine=ENGINE, perfmodel=pm, fuse_chains=False) as rt:
        graph, _, _ = _captured(rt, np.ones((6, 2)))
        _measured(graph)
        copy = next(t for t in _tasks(graph) if t.codelet is COPY)
        fp, _ = rt.footprint(copy)
        graph.fuse_chains(overhead=1.0)
        before = pm.count("bundle_copy", "ref", "cpu", fp)
        rt.trace(clear=True)
        graph.replay()
        trace = rt.trace()
        assert pm.count("bundle_copy", "ref", "cpu", fp) == before + 3
        names = sorted(r.codelet for r in trace.records)
        assert names.count("bundle_copy") == names.count("bundle_check") == 3
        assert len(trace.records) == 3 * 4 + 3 and len({r.task_id for r in trace.records}) == 15
        by_id = {r.task_id: r for r in trace.records}
        for r in trace.records:
            assert r.start <= r.end and r.variant == "ref"
            for d in r.deps:
                assert by_id[d].end <= r.start  # every dependency names a record that ran first
        stats = {(row["codelet"]): row["count"] for row in trace.stats()}
        assert stats["bundle_affine"] == 3


def test_an_error_in_a_member_names_that_member(tmp_path):
    with hn.Runtime(devices="cpu:2", replay_engine=ENGINE,
                    perfmodel=PerfModel(tmp_path), fuse_chains=False) as rt:
        graph, x, acc = _captured(rt, np.ones((6, 2)))
        _measured(graph)
        graph.fuse_chains(overhead=1.0)
        bad = np.ones((6, 2))
        bad[3, 1] = np.nan
        graph.write(x, bad)
        with pytest.raises(hn.TaskError, match="codelet 'bundle_check'.*NaN") as info:
            graph.replay()
        assert info.value.codelet == "bundle_check"
        failed = [r for r in rt.trace().records if r.error]
        assert [r.codelet for r in failed] == ["bundle_check"]
        graph.write(x, np.ones((6, 2)))
        graph.replay()  # the runtime and the graph stay usable
        assert np.isfinite(rt.fetch(acc)).all()


# --------------------------------------------------------------------------- the Trainer

def _batches():
    rng = np.random.default_rng(2024)
    return [(rng.standard_normal((BATCH, *INPUT_SHAPE)), rng.integers(0, 10, BATCH))
            for _ in range(STEPS)]


def _model():
    return hn.build_model("lenet5", INPUT_SHAPE, 10, dtype="float64", seed=3)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A PerfModel that predicts every task of the LeNet-5 steps at g = 1 and 3 below a
    microsecond: 1000 runs of 0.1 us each given to ``record_many``, for the footprints
    a first training run measured (so every chain of those graphs is fused). Each use is
    a fresh copy: a PerfModel predicts the median of a key's latest runs, which the
    training runs of the tests would otherwise replace with their real times."""
    pm = PerfModel(tmp_path_factory.mktemp("perfmodel"))
    runs = []
    for g in (1, 3):
        with hn.Runtime(devices="cpu:2", replay_engine=ENGINE,
                        perfmodel=pm, fuse_chains=False) as rt:
            trainer = hn.Trainer(_model(), runtime=rt, batch_size=BATCH, granularity=g,
                                 dtype="float64")
            for x, y in _batches()[:2]:
                trainer.train_step(x, y)
            for graph in trainer.graphs.values():
                for t in _tasks(graph):
                    fp, size = rt.footprint(t)
                    runs += [(t.codelet.name, rt.predict(t, "cpu")[0], "cpu", fp, size, 1e-7)] * 1000
    pm.record_many(runs)

    def fresh():
        copy = PerfModel(tmp_path_factory.mktemp("perfmodel"), load=False)
        copy.record_many(runs)
        return copy

    return fresh


def _train(policy, g, fuse, perfmodel):
    model = _model()
    with hn.Runtime(devices="cpu:2", replay_engine=ENGINE,
                    policy=policy, perfmodel=perfmodel, fuse_chains=fuse) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=rt,
                             batch_size=BATCH, granularity=g, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in _batches()]
        reports = [graph.bundles for graph in trainer.graphs.values()]
    arrays = {"losses": np.array(losses), **model.state_dict()}
    return {k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
            for k, a in arrays.items()}, reports


@pytest.mark.parametrize("g", (1, 3))
@pytest.mark.parametrize("policy", POLICIES)
def test_fused_training_steps_equal_unfused_steps_bit_for_bit(policy, g, small_model):
    fused, reports = _train(policy, g, True, small_model())
    unfused, none = _train(policy, g, False, small_model())
    assert fused == unfused
    assert none and set(none) == {None}
    *first, rest = reports  # a graph of SGD's first step alone is never replayed
    assert all(r is None for r in first)
    assert rest.chains and rest.tasks_after < rest.tasks_before
