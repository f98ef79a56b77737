"""``--resume`` continues with the run's devices, policy, granularity, trace and every
other option unless given again, says which it took, and metrics.json keeps the truth
(issue 30, item 2)."""

import json

from hetero_nn.cli import main
from hetero_nn.scheduler.trace import Trace

RUN = ["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "32",
       "--model", "dahl-basic"]


def _resume_line(err) -> str:
    (line,) = [line for line in err.splitlines() if "resuming" in line]
    return line


def test_resume_takes_the_runs_launch_options_and_says_which(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*RUN, "--epochs", "1", "--devices", "cpu:2", "--policy", "dmda",
                 "--granularity", "auto", "--trace", "--trace-steps", "0", "--out", str(out),
                 "-q"]) == 0
    first = json.loads((out / "metrics.json").read_text())
    assert first["granularity_decision"] is not None
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2"]) == 0
    line = _resume_line(capsys.readouterr().err)
    for flag in ("--devices cpu:2", "--policy dmda", "--granularity auto", "--trace",
                 "--trace-steps 0", "--dataset synthetic", "--model dahl-basic", "--limit 64"):
        assert flag in line, line
    assert "--quiet" not in line and "give an option again to change it" in line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["devices"]["spec"] == "cpu:2" and metrics["devices"]["policy"] == "dmda"
    assert metrics["granularity"] == first["granularity"]
    assert metrics["granularity_decision"] == first["granularity_decision"]
    assert metrics["config"]["launch"]["trace"] is True
    assert Trace.from_json(out / "trace.json").metadata["global_steps"][-1] == 4
    # an option given again wins, the line no longer names it, and the sessions say so
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "--policy", "eager",
                 "--no-trace"]) == 0
    line = _resume_line(capsys.readouterr().err)
    assert "--policy" not in line and "--trace " not in line and "--devices cpu:2" in line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["devices"]["policy"] == "eager" and metrics["devices"]["spec"] == "cpu:2"
    assert [(s["global_step"], s["policy"]) for s in metrics["config"]["sessions"]] == \
        [(0, "dmda"), (2, "dmda"), (4, "eager")]
    assert metrics["config"]["launch"]["trace"] is False
