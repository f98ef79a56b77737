"""experiments/memory.py end to end on a tiny sweep: the rows (arena, per-task, recompute,
PyTorch), the counts it reports, the recomputation saving, the live-bytes trace, the PNGs."""

import json

import pytest
from helpers import load_script


@pytest.mark.slow
def test_tiny_sweep_writes_rows_savings_and_plots(tmp_path):
    pytest.importorskip("torch", reason="the study compares with PyTorch")
    pytest.importorskip("matplotlib", reason="the study draws PNGs")
    study = load_script("experiments/memory.py")
    argv = ["--models", "dahl-basic", "resnet-small", "--batches", "4", "--rounds", "1",
            "--steps", "1", "--warmup", "1", "--workers", "1", "--results",
            str(tmp_path / "results"), "--plots", str(tmp_path / "plots")]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "results" / "memory-latest.json").read_text())
    assert doc["experiment"] == "memory" and doc["command"][-len(argv):] == argv
    sides = [(r["model"], r["side"]) for r in doc["rows"]]
    assert sides == [("dahl-basic", "arena"), ("dahl-basic", "per-task"), ("dahl-basic", "pytorch"),
                     ("resnet-small", "arena"), ("resnet-small", "per-task"),
                     ("resnet-small", "recompute"), ("resnet-small", "pytorch")]
    assert doc["skipped"][0]["reason"] == "no residual block"
    for r in doc["rows"]:
        assert r["step_ms"] > 0 and r["peak_rss_mib"] > 0
        if r["side"] == "pytorch":
            assert r["high_water"] is None
        elif r["side"] == "per-task":
            assert r["allocations_per_step"] > 0 and r["high_water"] > 0
        else:  # the arena grew at capture; replays allocate nothing
            assert r["allocations_per_step"] == 0 and r["high_water"] > 0
    (saving,) = doc["recomputation"]
    assert saving["model"] == "resnet-small" and 0 < saving["high_water_saved"] < 1
    live = doc["live_bytes"]["sides"]
    assert set(live) == {"arena", "recompute"}
    for nodes in live.values():
        series = nodes["host0"]
        assert series[-1][1] == 0 and max(b for _, b in series) > 0
    assert doc["energy"]["joules"] is not None or doc["energy"]["reason"]
    for name in ("high-water.png", "live-bytes.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
