"""experiments/energy.py end to end, tiny: the JSON it writes and its null-with-reason
readings where the machine has no energy counter."""

import json

import pytest
from helpers import load_script

from hetero_nn.energy import find_counters


def test_tiny_run_writes_rows_with_readings_or_reasons(tmp_path):
    pytest.importorskip("torch", reason="the experiment compares with PyTorch")
    study = load_script("experiments/energy.py")
    argv = ["--model", "dahl-basic", "--shape", "1", "12", "12", "--batch", "4", "--g", "2",
            "--steps", "2", "--warmup", "1", "--idle-seconds", "0.05", "--poll-seconds", "0",
            "--results", str(tmp_path)]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "energy-latest.json").read_text())
    assert doc["experiment"] == "energy" and doc["command"][-len(argv):] == argv
    assert [r["side"] for r in doc["rows"]] == ["hetero_nn", "pytorch"]
    counters, reasons = find_counters()
    for energy in [doc["idle"]] + [r["energy"] for r in doc["rows"]]:
        if counters:
            assert energy["joules"] is not None and energy["reason"] is None
        else:  # never an estimate: null, and why
            assert energy["joules"] is None and energy["joules_per_image"] is None
            assert energy["reason"] == "; ".join(reasons)
    for r in doc["rows"]:
        assert r["images"] == 8 and r["images_per_s"] > 0


def test_bad_option_is_one_line(capsys):
    study = load_script("experiments/energy.py")
    with pytest.raises(SystemExit) as exc:
        study.main(["--g", "9", "--batch", "4"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "energy.py: error: --g 9 is larger than --batch 4"]
