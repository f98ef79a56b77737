"""benchmarks/bench_auto_granularity.py on a tiny model: the busy neighbour it starts,
the decision, every candidate measured, and the verdict it prints and writes."""

import json
import os

import pytest
from helpers import load_script


def test_the_benchmark_measures_every_candidate_beside_its_neighbour(tmp_path, capsys):
    script = load_script("benchmarks/bench_auto_granularity.py")
    out = tmp_path / "auto.json"
    assert script.main(["--models", "dahl-basic", "--batch", "4", "--image-size", "12",
                        "--warmup", "1", "--rounds", "1", "--steps", "1",
                        "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["neighbour_core"] in os.sched_getaffinity(0)
    configs = {(r["granularity"], r["fuse"]) for r in row["measured"]}
    assert configs == {(g, f) for g in (1, 2, 4) for f in (True, False)}  # every candidate
    assert row["chosen"] in [r["config"] for r in row["measured"]]
    best = min(r["step_ms"] for r in row["measured"])
    assert row["best_ms"] == best and row["chosen_over_best"] == row["chosen_ms"] / best
    assert row["within"] == (row["chosen_over_best"] <= 1.10)
    assert row["predicted_ms"] > 0 and row["decision"]["recheck"]["measured"]
    printed = capsys.readouterr().out
    assert "neighbour spinning on core" in printed and "chosen/best" in printed


def test_the_neighbour_spins_on_one_core_and_is_ended():
    script = load_script("benchmarks/bench_auto_granularity.py")
    with script.neighbour() as proc:
        assert proc.poll() is None and len(os.sched_getaffinity(proc.pid)) == 1
    assert proc.returncode is not None
    with script.neighbour(enabled=False) as none:
        assert none is None


@pytest.mark.slow  # a whole decision: 2 s after the test above, 34 s alone at load 10
def test_decision_only_reports_the_calibration_and_the_chosen_prediction(tmp_path, capsys):
    script = load_script("benchmarks/bench_auto_granularity.py")
    out = tmp_path / "auto.json"
    assert script.main(["--models", "dahl-basic", "--batch", "4", "--image-size", "12",
                        "--no-neighbour", "--decision-only", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "measured" not in row and row["neighbour_core"] is None  # no candidate measured
    decision = row["decision"]
    assert row["calibration_seconds"] == decision["calibration_seconds"] > 0
    assert row["calibration_steps"] == decision["calibration_steps"] >= 2
    assert row["chosen_ms"] == 1e3 * decision["measured_seconds"]
    assert row["measured_over_predicted"] == row["chosen_ms"] / row["chosen_predicted_ms"]
    # the steady step of training on after the decision, and where the prediction misses
    assert len(row["steady_steps_ms"]) == 5 and row["steady_ms"] > 0
    assert row["steady_over_predicted"] == row["steady_ms"] / row["chosen_predicted_ms"]
    assert row["repredicted_ms"] > 0 and row["per_block_simulations"] >= 0
    assert "sgd_step" in {c["codelet"] for c in row["codelets"]}
    assert set(decision["phase_seconds"]) == {"calibration", "predictions", "per_block",
                                              "measure", "recheck"}
    assert "calibration" in capsys.readouterr().out
