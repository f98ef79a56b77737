"""experiments/pipedream.py end to end, tiny: the three sides trained through the CLI on
the first samples of the real MNIST, no pipeline and 1f1b equal (synchronous), pipedream
recording its pipeline."""

import json
from pathlib import Path

import pytest

from helpers import load_script

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.mark.skipif(not (SHARED / "mnist").is_dir(),
                    reason=f"the shared datasets folder {SHARED} is not on this machine")
def test_tiny_run_writes_every_side(tmp_path):
    study = load_script("experiments/pipedream.py")
    argv = ["--data-dir", str(SHARED), "--limit", "256", "--epochs", "1", "--batch-size", "32",
            "--out", str(tmp_path / "runs"), "--results", str(tmp_path)]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "pipedream-latest.json").read_text())
    runs = {r["name"]: r for r in doc["runs"]}
    assert list(runs) == ["none", "1f1b", "pipedream"]
    assert runs["none"]["test_accuracy"] == runs["1f1b"]["test_accuracy"]
    assert runs["none"]["pipeline"] is None
    assert runs["pipedream"]["pipeline"]["schedule"] == "pipedream"
    assert 0 <= runs["pipedream"]["pipeline"]["bubble"] < 1
