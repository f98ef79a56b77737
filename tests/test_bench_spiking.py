"""benchmarks/bench_spiking.py and experiments/spiking.py on runs of a step or two: every part
writes its rows with provenance, the recomputation rows count the arena's bytes, the
crossover is found where the measured times cross; and the experiment's command lines."""

import json

import pytest
from helpers import load_script

TINY = ["--models", "snn-mlp", "--batch", "4", "--time-steps", "3", "--warmup", "1",
        "--rounds", "1", "--steps", "1"]


def test_every_part_writes_its_rows(tmp_path):
    pytest.importorskip("torch", reason="the benchmark compares with snnTorch")
    pytest.importorskip("snntorch", reason="the benchmark compares with snnTorch")
    out = tmp_path / "rows.json"
    script = load_script("benchmarks/bench_spiking.py")
    assert script.main([*TINY, "--encodings", "rate", "--snntorch-layout", "same",
                        "--rates", "0.05", "0.5", "--recompute", "1", "3",
                        "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["git_commit"] and doc["versions"]["numba"] and doc["machine"]
    assert [r["config"] for r in doc["steps"]] == [
        "snntorch 2 thread(s), same layout", "hetero_nn g=2", "hetero_nn g=2 events off"]
    assert doc["steps"][0]["ratio"] == 1.0 and all(r["step_ms"] > 0 for r in doc["steps"])
    assert all(0 < rate < 1 for rate in doc["steps"][1]["input_spike_rates"][:1])
    assert {r["layer"] for r in doc["sparse"]} == {"784->1000", "1000->10"}
    assert set(doc["crossover_rate"]) == {"784->1000", "1000->10"}
    high = [r["arena_high_water_bytes"] for r in doc["recompute"]]
    assert [r["recompute"] for r in doc["recompute"]] == [1, 3]
    assert high[0] - high[1] == 4 * 3 * 1000 * 4 * 2 // 3  # the membranes not kept


def test_crossover_interpolates_where_the_times_cross():
    script = load_script("benchmarks/bench_spiking.py")
    rows = [{"rate": 0.1, "events_ms": 1.0, "dense_ms": 3.0},
            {"rate": 0.3, "events_ms": 5.0, "dense_ms": 3.0}]
    assert script.crossover(rows, "dense") == pytest.approx(0.2)
    assert script.crossover(rows[:1], "dense") is None


def test_experiment_commands_follow_the_recipe(tmp_path):
    exp = load_script("experiments/spiking.py")
    args = exp.argparse.Namespace(epochs=None, data_dir="data", devices=None, policy=None,
                                  granularity="auto", seed=None)
    cmd = exp.command(exp.RUNS["mnist-conv"], args, tmp_path / "run")
    text = " ".join(cmd)
    for part in ("train --dataset mnist --model snn-conv --encoding direct --time-steps 25 "
                 "--epochs 3 --batch-size 128 --optimizer adam --lr 0.002 --schedule cosine",
                 "--data-dir data", "--granularity auto"):
        assert part in text
    assert exp.RUNS["mnist-mlp"]["target"] == 0.96 and exp.RUNS["mnist-conv"]["target"] == 0.98


def test_the_readme_snn_conv_benchmark_times_the_readme_command(tmp_path, capsys):
    """Issue 30, item 10: the README's snn-conv example has a step-time benchmark."""
    out = tmp_path / "readme.json"
    script = load_script("benchmarks/bench_readme_snn.py")
    assert script.main(["--dataset", "synthetic", "--limit", "64", "--time-steps", "2",
                        "--devices", "cpu:2", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["command"].startswith("hetero-nn train --model snn-conv --time-steps 2 "
                                     "--encoding rate --optimizer adam --lr 5e-4 --epochs 1")
    assert row["images_per_second"] > 0 and row["step_ms"] > 0
    assert row["full_epoch_minutes"] == pytest.approx(60000 / row["images_per_second"] / 60)
    assert row["git_commit"] and row["machine"] and len(row["loadavg"]) == 3
    assert "a full MNIST epoch ~" in capsys.readouterr().out
