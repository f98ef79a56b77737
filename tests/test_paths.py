"""The paths a step runs on (``hetero_nn.simulation.paths``): the engine's schedule in the
simulator, with its handoff between workers, and the costs measured from real records."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.simulation.paths import (PathCosts, EnginePlan, engine_serves, flush_seconds,
                                       path_costs, step_path)
from hetero_nn.scheduler.engine.replay import engine_refusal, unavailable
from hetero_nn.scheduler.policies import POLICIES
from hetero_nn.simulation.simulate import Platform, _Machine, simulate_graph
from hetero_nn.scheduler.trace.records import TaskRecord
from test_simulate import _diamond, _schedule


def test_the_engine_plan_keeps_a_cheap_fork_on_one_worker_and_pays_handoffs():
    """A(3) -> B(2), C(4) -> D(1): the plan runs A, C, D on one worker and B beside
    them; D waits for B across workers: with a handoff of 0.5 s, B's end (5) + 0.5 does
    not delay D (C ends at 7), and C follows A on its worker with no handoff."""
    a, b, c, d = _diamond("paths_rw")
    machine = _Machine(Platform(workers={"cpu": 2}), None)
    end = simulate_graph([a, b, c, d], machine, EnginePlan(machine, "eager"), 0.0, 0.0, {},
                         handoff=0.5)
    assert end == 8.0
    assert {t.worker.name for t in (a, c, d)} == {a.worker.name} != {b.worker.name}
    assert b.start == 3.5  # B's one predecessor ran on the other worker


def test_the_engine_plan_runs_each_worker_in_its_planned_order():
    """Under heft's plan, as the engine takes it; every task after its predecessors."""
    a, b, c, d = _diamond("paths_rw2")
    machine = _Machine(Platform(workers={"cpu": 2}), None)
    end = simulate_graph([a, b, c, d], machine, EnginePlan(machine, "heft"), 0.1, 0.0, {})
    assert 8.0 <= end <= 10.5
    for t in (b, c, d):
        assert all(t.start >= p.end for p in t.preds)
    assert engine_serves(Platform(workers={"cpu": 4}))
    assert not engine_serves(Platform(workers={"cpu": 4, "cuda": 1}))


def test_the_runtime_and_the_simulator_ask_one_rule_for_the_engine():
    """engine_serves (the simulator's, ``hetero-nn simulate``, ``granularity="auto"``) is
    engine_refusal, which the runtime asks too: heft's plan serves CPU and CUDA workers
    together, a dynamic policy does not."""
    for policy in POLICIES:
        with hn.Runtime(devices="cpu:2", policy=policy, trace=False) as rt:
            assert (unavailable(rt) is None) == engine_serves(Platform.from_devices("cpu:2"),
                                                              policy)
        mixed = engine_serves(Platform(workers={"cpu": 2, "cuda": 1}), policy)
        assert mixed == (policy == "heft")
        assert mixed == (engine_refusal({"cpu", "cuda"}, policy) is None)
    assert "several kinds under 'dmda'" in engine_refusal({"cpu", "cuda"}, "dmda")


def test_the_engine_plan_runs_heft_s_plan_over_cpu_and_cuda_workers():
    """With workers of two kinds the engine runs heft's assignment (as a compiled
    segment does): each task on the worker heft gave it, after its predecessors."""
    a, b, c, d = _diamond("paths_mixed")
    for t, cuda in zip((a, b, c, d), (1.0, 0.5, 1.0, 0.5)):
        t.cost["cuda"] = cuda
    machine = _Machine(Platform(workers={"cpu": 1, "cuda": 1}), None)
    plan = EnginePlan(machine, "heft")
    end = simulate_graph([a, b, c, d], machine, plan, 0.0, 0.0, {})
    assert end > 0
    for t in (a, b, c, d):
        assert t.worker is t.assigned
        assert all(t.start >= p.end for p in t.preds)


def _record(i, worker, start, end, deps=(), submit=0.0):
    return TaskRecord(i, "c", "cpu", worker, "cpu", "host0", submit, submit, start, end, 0,
                      tuple(deps), None)


def test_path_costs_tell_a_worker_s_own_wait_from_an_edge_between_workers():
    records = [_record(0, "w0", 1.0, 2.0), _record(1, "w0", 2.1, 3.0, [0]),
               _record(2, "w1", 3.5, 4.0, [1]), _record(3, "w0", 3.2, 3.5, [1]),
               _record(4, "w1", 4.3, 5.0, [2])]
    dispatch, handoff = path_costs(records)
    assert dispatch == pytest.approx(0.2)  # medians of 0.1 (1), 0.2 (3), 0.3 (4)
    assert handoff == pytest.approx(0.5)   # 2 waited for 1 on w0: 3.5 - 3.0
    assert flush_seconds(records) == 5.0
    assert flush_seconds([_record(0, "w0", 1.0, 2.0, submit=0.5),
                          _record(1, "w0", 3.0, 4.0, submit=2.5)]) == 1.5 + 1.5


def test_steps_the_engine_replayed_on_one_thread_make_a_serial_path():
    """A serial replay's records all name its first worker: where most steps measured
    were so, ``serial`` is set and ``granularity="auto"`` predicts on one worker."""
    def step(workers):
        return [_record(i, workers[i % len(workers)], 0.5 * i, 0.5 * i + 0.4,
                        [i - 2] if i > 1 else []) for i in range(6)]

    parallel, serial = step(["w0", "w1"]), step(["w0"])
    assert not PathCosts.measure("compiled", [[(4.0, parallel), (4.0, serial)],
                                              [(4.0, parallel)]]).serial
    costs = PathCosts.measure("compiled", [[(4.0, serial), (4.0, parallel)], [(4.0, serial)]])
    assert costs.serial and costs.to_json()["serial"]
    assert not PathCosts.measure("replayed", [[(4.0, serial)]]).serial  # no serial mode


def test_path_costs_measured_from_steps_and_the_path_of_a_trainer():
    records = [_record(0, "w0", 1.0, 2.0), _record(1, "w1", 2.5, 3.0, [0])]
    runs = [[(4.0, records), (3.5, records)]]  # flushes 3 s: host 1 s and 0.5 s
    costs = PathCosts.measure("compiled", runs)
    assert (costs.handoff, costs.host) == (0.5, 0.5)
    assert PathCosts.measure("submitted", runs).host is None
    with pytest.raises(ValueError, match="path"):
        PathCosts.measure("fast", runs)
    model = hn.build_model("dahl-basic", (1, 8, 8), 10, seed=0)
    for kwargs, replay, path in (({}, True, "compiled"), ({}, False, "submitted"),
                                 ({"replay_engine": "executor"}, True, "replayed")):
        with hn.Runtime(devices="cpu:2", perfmodel=False, **kwargs) as rt:
            trainer = hn.Trainer(model, runtime=rt, batch_size=4, replay=replay)
            assert step_path(trainer) == path


def test_a_compiled_step_is_predicted_from_its_measured_costs(tmp_path, monkeypatch):
    """simulate_step on a CPU platform with measured compiled-path costs: the engine's
    schedule, its handoff and host time; the prediction is a step's order of magnitude."""
    from hetero_nn.cli.simulate import measure_step, simulate_step

    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path))
    common = dict(model="dahl-basic", shape=(1, 12, 12), batch_size=8, granularity=2)
    measured, costs = measure_step(**common, devices="cpu:2", policy="eager", steps=4,
                                   warmup=3)
    assert costs.path == "compiled" and costs.host is not None and costs.host >= 0
    result = simulate_step(**common, devices="cpu:2", policy="eager", costs=costs)
    assert result.submit_seconds == costs.host
    assert 0 < result.step_seconds < 100 * measured
    assert np.isfinite(result.makespan)
