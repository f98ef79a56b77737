"""benchmarks/task_bench.py: Task Bench's patterns, its METG, and a tiny run of every
pattern on every system, whose per-task checks would fail a missed dependence."""

import json

import numpy as np
import pytest
from helpers import load_script


@pytest.fixture(scope="module")
def tb():
    return load_script("benchmarks/task_bench.py")


def test_the_patterns_dependencies(tb):
    deps = tb.dependencies
    assert deps("trivial", 3, 1, 4) == [] and deps("no_comm", 3, 1, 4) == [1]
    assert deps("no_comm", 0, 1, 4) == []  # the first timestep reads nothing
    assert deps("stencil_1d", 2, 0, 4) == [0, 1] and deps("stencil_1d", 2, 2, 4) == [1, 2, 3]
    assert deps("nearest", 2, 2, 8, radix=5) == [0, 1, 2, 3, 4]
    assert deps("nearest", 2, 2, 8, radix=3) == deps("stencil_1d", 2, 2, 8)
    assert [deps("fft", t, 1, 4) for t in (1, 2, 3)] == [[0, 1], [1, 3], [0, 1]]
    assert deps("all_to_all", 1, 3, 4) == [0, 1, 2, 3]
    assert [len(tb.active_points("tree", t, 6)) for t in range(5)] == [1, 2, 4, 6, 6]
    assert deps("tree", 2, 3, 6) == [1] and deps("tree", 3, 5, 6) == [2]
    assert [len(tb.grid(p, 4, 3)) for p in ("trivial", "tree")] == [12, 1 + 2 + 4]
    with pytest.raises(ValueError, match="unknown pattern"):
        deps("ring", 1, 0, 4)


def test_metg_interpolates_the_crossing_of_fifty_percent(tb):
    pts = [(1e-3, 0.95), (1e-4, 0.8), (1e-5, 0.4), (1e-6, 0.05)]
    m = tb.metg(pts)
    assert 1e-5 < m < 1e-4
    assert abs(np.log(m / 1e-4) / np.log(1e-5 / 1e-4) - 0.75) < 1e-9  # 0.8 -> 0.4: 3/4 way
    assert tb.metg([(1e-3, 0.3)]) is None  # never efficient
    assert tb.metg([(1e-3, 0.9), (1e-4, 0.7)]) == 1e-4  # never drops: the finest measured


def test_a_task_whose_input_was_not_written_fails(tb):
    k = tb.kernel(1)
    out, epoch = np.zeros((1, 2)), np.array([2.0])
    good = np.array([[3 + 2 * 10, 0.0]])  # dependence 3, epoch 2, 10 points
    k(out, epoch, good, 5, 7, 10, (3,))
    assert out[0, 0] == 7 + 2 * 10 and out[0, 1] > 0
    with pytest.raises(ValueError, match="not written"):
        k(out, epoch, np.array([[3 + 1 * 10, 0.0]]), 5, 7, 10, (3,))  # last run's value


def test_every_pattern_runs_and_checks_on_every_system(tb, tmp_path, capsys):
    out, png = tmp_path / "tb.json", tmp_path / "tb.png"
    assert tb.main(["--width", "2", "--steps", "5", "--rounds", "1", "--max-iterations", "4",
                    "--peak-seconds", "0.05", "--json", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["metg_seconds"]) <= set(tb.PATTERNS)
    seen = {(p["pattern"], p["system"]) for p in doc["points"]}
    assert seen == {(p, s) for p in tb.PATTERNS for s in tb.SYSTEMS}
    assert {p["iterations"] for p in doc["points"]} == {4, 2, 1, 0}
    assert all(p["wall"] > 0 and p["efficiency"] >= 0 for p in doc["points"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "METG(50%)" in capsys.readouterr().out
