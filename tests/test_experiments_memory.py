"""experiments/memory_flat.py runs (tiny sizes) and writes what the goal needs."""

import json

from helpers import load_script


def test_memory_flat_runs_and_records_the_goal(tmp_path, capsys):
    script = load_script("experiments/memory_flat.py")
    status = script.main(["--steps", "160", "--baseline", "100", "--every", "30",
                          "--samples", "512", "--results", str(tmp_path), "--quiet"])
    document = json.loads((tmp_path / "memory-flat-latest.json").read_text())
    assert document["baseline_step"] == 100 and document["samples"][-1]["step"] == 160
    assert document["goal_met"] == (status == 0) and document["goal_bytes"] == 2 << 20
    held = [s["trace_records"] for s in document["samples"] if s["step"] > 100]
    assert len(set(held)) == 1 and held[0] > 0  # the trace full and no longer growing
    assert document["git_commit"] and document["versions"]["numpy"]
    assert "RSS growth after step 100" in capsys.readouterr().out
