"""The simulator: hand-computed schedules, graph capture, and ``hetero-nn simulate``."""

import json

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, RW, W
from hetero_nn.cli import main as cli_main
from hetero_nn.scheduler.policies.policies import make_policy
from hetero_nn.simulation.simulate import (Platform, SimHandle, SimTask, _Machine, capture,
                                          simulate_graph)


def _noop(*arrays):
    pass


def _task(i, codelet, handles, preds, cost):
    t = SimTask(i, codelet, handles, codelet.modes, preds, "fp", 1.0)
    for p in preds:
        p.succ.append(t)
    t.cost = dict(cost)
    return t


def _schedule(graph):
    return [(t.id, t.worker.name, t.start, t.end) for t in graph]


def _diamond(name):
    """A(3 s) -> B(2 s), C(4 s) -> D(1 s) on the CPU, each task writing its own handle."""
    cl = hn.Codelet(name, modes=(RW,), variants={"ref": _noop})
    h = [SimHandle(f"h{i}", 8, valid={0}) for i in range(4)]
    a = _task(0, cl, [h[0]], [], {"cpu": 3.0})
    b = _task(1, cl, [h[1]], [a], {"cpu": 2.0})
    c = _task(2, cl, [h[2]], [a], {"cpu": 4.0})
    d = _task(3, cl, [h[3]], [b, c], {"cpu": 1.0})
    return a, b, c, d


def test_eager_on_two_cores_gives_the_hand_computed_schedule():
    """A(3) -> B(2), C(4) -> D(1) on two CPU workers, no dispatch cost:
    A on cpu0 [0, 3]; cpu0 releases B and C and takes B [3, 5], cpu1 takes C [3, 7];
    C's worker releases D and takes it [7, 8]."""
    a, b, c, d = _diamond("sim_rw")
    machine = _Machine(Platform(workers={"cpu": 2}), None)
    moved = {}
    end = simulate_graph([a, b, c, d], machine, make_policy("eager", machine), 0.0, 0.0, moved)
    assert end == 8.0
    assert _schedule([a, b, c, d]) == [(0, "cpu0", 0.0, 3.0), (1, "cpu0", 3.0, 5.0),
                                       (2, "cpu1", 3.0, 7.0), (3, "cpu1", 7.0, 8.0)]
    assert moved == {}


@pytest.mark.parametrize("policy", sorted(hn.POLICIES))
def test_every_policy_replays_the_graph_between_its_bounds(policy):
    """Every task runs once, after its predecessors; the makespan lies between the
    critical path (A, C, D: 8 s) and the serial sum (10 s)."""
    a, b, c, d = _diamond("sim_rw2")
    machine = _Machine(Platform(workers={"cpu": 2}), None)
    end = simulate_graph([a, b, c, d], machine, make_policy(policy, machine), 0.0, 0.0, {})
    assert 8.0 <= end <= 10.0
    for t in (b, c, d):
        assert all(t.start >= p.end for p in t.preds)


def test_dmda_with_a_transfer_gives_the_hand_computed_schedule():
    """X reads h (2 bytes on the host): 5 s on the CPU, 1 s on the GPU plus a copy of
    1 s + 2 B / (1 B/s) = 3 s: finish 5 vs 4, so the GPU [0, 4], 2 bytes moved. Y reads h
    (now valid on both nodes), 2 s either way, released by the GPU worker: a tie, which
    goes to the releasing worker [4, 6]. A dispatch cost of 0.5 s per task on top
    gives X [0, 4.5] and Y [4.5, 7]."""
    cl = hn.Codelet("sim_read", modes=(R, W), variants={"ref": _noop, "cuda": _noop})
    platform = Platform(workers={"cpu": 1, "cuda": 1}, links={"host-cuda": (1.0, 1.0)})
    for dispatch, expected in ((0.0, [(0, "cuda0", 0.0, 4.0), (1, "cuda0", 4.0, 6.0)]),
                               (0.5, [(0, "cuda0", 0.0, 4.5), (1, "cuda0", 4.5, 7.0)])):
        h = SimHandle("h", 2, valid={0})
        out = [SimHandle("o0", 1), SimHandle("o1", 1)]
        x = _task(0, cl, [h, out[0]], [], {"cpu": 5.0, "cuda": 1.0})
        y = _task(1, cl, [h, out[1]], [x], {"cpu": 2.0, "cuda": 2.0})
        machine = _Machine(platform, None)
        moved = {}
        end = simulate_graph([x, y], machine, make_policy("dmda", machine), dispatch, 0.0,
                             moved)
        assert _schedule([x, y]) == expected and end == expected[-1][-1]
        assert moved == {("host0", "cuda0"): {"bytes": 2, "copies": 1}}
        assert h.valid == {0, 1} and out[1].valid == {1}


def _scale(x, factor):
    x *= factor


SCALE = hn.Codelet("sim_scale", modes=(RW,), variants={"ref": _scale})


def test_capture_keeps_the_graph_the_runtime_would_run_without_running_it():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        h = rt.register(np.ones(6))
        parts = h.split(0, 3)

        def step():
            for p in parts:
                rt.submit(SCALE, p, factor=2.0)
            rt.submit(SCALE, h, factor=3.0)
            rt.wait()

        steps = capture(rt, step, steps=2)
        assert np.array_equal(rt.fetch(h), np.ones(6))  # nothing ran
        step()  # the runtime still runs graphs afterwards
        assert np.array_equal(rt.fetch(h), np.full(6, 6.0))
    assert [s.tasks for s in steps] == [4, 4]
    graph = steps[1].graphs[0]
    assert [t.codelet.name for t in graph] == ["sim_scale"] * 4
    assert [len(t.preds) for t in graph] == [0, 0, 0, 3]
    assert graph[0].handles[0].parent is graph[3].handles[0]  # the partition is kept
    assert steps[1].submit_seconds > 0


def test_platform_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"workers": {"tpu": 2}}')
    with pytest.raises(hn.ConfigError, match="p.json: unknown names .'tpu'."):
        Platform.load(bad)
    bad.write_text("{nope")
    with pytest.raises(hn.ConfigError, match="p.json: not JSON"):
        Platform.load(bad)


SIM_ARGS = ["simulate", "--model", "dahl-basic", "--image-size", "8", "--batch-size", "8",
            "--granularity", "2", "--policy", "heft"]


def test_cli_without_models_says_which_and_how(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path))
    assert cli_main(SIM_ARGS + ["--json"]) == 2
    err = capsys.readouterr().err
    assert "no performance model for conv2d_" in err and " on cpu (" in err  # fused or not
    assert "--calibrate" in err


def test_cli_calibrates_then_predicts_with_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path))
    assert cli_main(SIM_ARGS + ["--devices", "cpu:1,cuda-emu:1", "--calibrate", "--steps", "2",
                                "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step_seconds"] > doc["makespan_seconds"] > 0
    assert set(doc["utilisation"]) == {"cpu0", "cuda0"}
    assert doc["tasks"] > 10 and doc["policy"] == "heft"
    assert doc["dispatch_seconds"] > 0  # what --calibrate measured, and applied
    # the same models on another platform: a file with a scaled GPU kind, 4 GPUs
    platform = tmp_path / "four.json"
    platform.write_text(json.dumps({"name": "4 GPUs", "workers": {"cuda": 4},
                                    "links": {"host-cuda": {"latency": 1e-5,
                                                            "bandwidth": 1.2e10}},
                                    "scale": {"cuda": {"from": "cpu", "factor": 0.1}}}))
    assert cli_main(SIM_ARGS + ["--platform", str(platform)]) == 0
    out = capsys.readouterr().out
    assert "platform 4 GPUs, policy heft: predicted step" in out and "cuda3" in out
    # a platform's own dispatch is the one applied, and --json says so
    document = json.loads(platform.read_text())
    applied = {}
    for dispatch in (0.0, 1e-3):
        platform.write_text(json.dumps({**document, "dispatch": dispatch}))
        assert cli_main(SIM_ARGS + ["--platform", str(platform), "--json"]) == 0
        applied[dispatch] = json.loads(capsys.readouterr().out)
        assert applied[dispatch]["dispatch_seconds"] == dispatch
    # 1 ms per task on top of each of them: the prediction grows by about that much
    assert applied[1e-3]["makespan_seconds"] > applied[0.0]["makespan_seconds"] + 1e-3


def test_the_example_platforms_load_and_the_docs_show_them():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    paths = sorted((repo / "examples" / "platforms").glob("*.json"))
    assert {p.name for p in paths} >= {"four-gpus.json", "one-gpu.json"}
    for path in paths:
        if "machines" in json.loads(path.read_text()):
            continue  # machines described by datasheets: tests/test_planner.py
        platform = Platform.load(path)
        assert platform.workers.get("cuda", 0) >= 1 and platform.dispatch is not None
        assert platform.scale  # GPU run times scaled from this machine's CPU models
    shown = re.search(r"`one-gpu.json`:\n\n```json\n(.*?)```",
                      (repo / "docs" / "simulate.md").read_text(), re.S).group(1)
    assert json.loads(shown) == json.loads((repo / "examples/platforms/one-gpu.json").read_text())
