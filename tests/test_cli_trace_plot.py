"""``hetero-nn trace`` and ``hetero-nn plot``: from ``train --trace`` to a Gantt chart and
training curves, a resumed run's own trace, and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hetero_nn.cli import main
from hetero_nn.cli.plot import figure, read_run
from hetero_nn.cli.roofline import codelet_flops, roofline_rows, step_records, step_sums
from hetero_nn.scheduler.trace.views import Trace

pytest.importorskip("matplotlib")

RUN = ["train", "--dataset", "synthetic", "--limit", "96", "--batch-size", "32",
       "--model", "dahl-basic", "--devices", "cpu:2", "--granularity", "2", "-q"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    if not os.environ.get("HETERO_NN_CACHE"):
        monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path_factory.mktemp("cache")))


def _error_line(capsys):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetero-nn: error: "), err
    return lines[0]


def test_from_train_trace_to_every_view(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*RUN, "--epochs", "2", "--trace", "--trace-steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{out}: " in text and "training steps 5..6 and the validation pass" in text
    assert "util %" in text and "cpu0" in text and "cpu1" in text
    files = {name: tmp_path / name for name in ("gantt.png", "dag.dot", "perfetto.json")}
    assert main(["trace", str(out / "trace.json"), "--stats", "--links", "--gantt",
                 str(files["gantt.png"]), "--dot", str(files["dag.dot"]), "--perfetto",
                 str(files["perfetto.json"]), "--window", "0:5", "--title", "dahl-basic"]) == 0
    captured = capsys.readouterr()
    assert "share %" in captured.out  # the statistics table
    assert "no copies between memory nodes were recorded" in captured.out  # cpu workers only
    assert files["gantt.png"].read_bytes()[:8] == PNG
    assert files["dag.dot"].read_text().startswith("digraph trace {")
    original, copy = Trace.from_json(out / "trace.json"), Trace.from_json(files["perfetto.json"])
    assert len(copy) == len(original) > 0 and copy.metadata == original.metadata
    for name in files.values():
        assert f"wrote {name}" in captured.err
    assert main(["trace", str(out), "--roofline"]) == 0  # FLOPs from the run's model
    printed = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in printed}
    assert "roofline:" in rows and int(rows["conv2d_relu_pool_fwd"][1]) > 0
    assert float(rows["total"][2]) > 0 and rows["total"][-1].endswith("%")
    assert " ".join(rows["over"]).startswith("over training steps 5..6 (") \
        and "the validation pass's" in " ".join(rows["over"])
    # the step sums are the convolutions' rows of the training steps, summed by pass
    records, _ = step_records(original)
    assert len(records) == original.metadata["step_tasks"] < len(original)
    by_name = {r["codelet"]: r for r in roofline_rows(records, codelet_flops(out), 2.0)}
    sums = {r["codelet"]: r for r in step_sums(list(by_name.values()), 2.0)}
    backward = [by_name[n] for n in by_name if n.startswith("conv2d_relu_pool_bwd")]
    assert len(backward) >= 1 and set(sums) == {"conv forward", "conv backward"}
    for name, parts in (("conv forward", [by_name["conv2d_relu_pool_fwd"]]),
                        ("conv backward", backward)):
        for key in ("tasks", "gflop", "seconds"):
            assert sums[name][key] == pytest.approx(sum(r[key] for r in parts), rel=1e-12)
        assert sums[name]["share"] == pytest.approx(sums[name]["gflop"]
                                                    / sums[name]["seconds"] / 2.0)
    assert [line.split()[:3] for line in printed if line.startswith("conv ")] == [
        ["conv", p, str(sums[f"conv {p}"]["tasks"])] for p in ("forward", "backward")]
    os.remove(out / "checkpoint.npz")
    os.remove(out / "checkpoint-final.npz")
    assert main(["trace", str(out), "--roofline"]) == 2
    assert "--roofline: no checkpoint-final.npz or checkpoint.npz in" in _error_line(capsys)


def test_a_resumed_run_writes_its_own_trace(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*RUN, "--epochs", "1", "--trace", "--out", str(out)]) == 0
    first = Trace.from_json(out / "trace.json").metadata["global_steps"]
    assert first == [1, 3]
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "--trace", "-q"]) == 0
    assert Trace.from_json(out / "trace.json").metadata["global_steps"] == [4, 6]
    # resumed with --no-trace: the trace is now older than the metrics, and says so
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "--no-trace",
                 "-q"]) == 0
    capsys.readouterr()
    assert main(["trace", str(out)]) == 0
    assert "metrics.json is at global step 9: this trace is from an earlier session" \
        in capsys.readouterr().out


def test_a_diverging_run_still_writes_the_trace_of_its_steps(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*RUN, "--epochs", "3", "--lr", "1e6", "--trace", "--out", str(out)]) == 1
    assert "training diverged" in capsys.readouterr().err
    trace = Trace.from_json(out / "trace.json")
    assert len(trace) > 0 and trace.metadata["validation"] is False


def test_trace_errors_are_one_line(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "nowhere")]) == 2
    assert "no such run folder or trace file" in _error_line(capsys)
    assert main(["trace", str(tmp_path)]) == 2
    assert f"{tmp_path}: no trace.json (train with --trace" in _error_line(capsys)
    (tmp_path / "notes.txt").write_text("not json")
    assert main(["trace", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt: not a hetero_nn trace" in _error_line(capsys)
    assert main(["trace", str(tmp_path), "--window", "5:1"]) == 2
    assert "--window" in _error_line(capsys)


def test_plot_draws_every_run_on_one_figure(tmp_path, capsys):
    runs = []
    for name, optimizer in (("sgd", "sgd"), ("adam", "adam")):
        runs.append(tmp_path / name)
        assert main([*RUN, "--epochs", "2", "--optimizer", optimizer, "--out",
                     str(runs[-1])]) == 0
    empty = tmp_path / "empty"  # a run still in its first epoch (--epochs 0 is refused)
    empty.mkdir()
    begun = json.loads((runs[0] / "metrics.json").read_text())
    (empty / "metrics.json").write_text(json.dumps({**begun, "status": "running", "epochs": []}))
    capsys.readouterr()
    png = tmp_path / "curves.png"
    assert main(["plot", *map(str, runs), str(empty), "-o", str(png), "--title", "two"]) == 0
    assert png.read_bytes()[:8] == PNG
    assert f"{empty}: no finished epoch yet; left out" in capsys.readouterr().err
    fig = figure([(str(r), read_run(r)) for r in runs])
    loss, accuracy, speed = fig.axes
    assert [ax.get_title() for ax in fig.axes] == ["loss", "accuracy (%)", "training images/s"]
    assert len(loss.lines) == len(accuracy.lines) == 4  # train and test per run
    assert len(speed.lines) == 2
    for line in loss.lines + accuracy.lines + speed.lines:
        assert list(line.get_xdata()) == [1, 2]
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert list(loss.lines[0].get_ydata()) == [r["train_loss"] for r in metrics["epochs"]]


def test_plot_errors_are_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.png")]) == 2
    assert "no such run folder" in _error_line(capsys)
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 2
    assert f"{tmp_path}: no metrics.json" in _error_line(capsys)
    (tmp_path / "metrics.json").write_text("{broken")
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 2
    assert "not readable as JSON" in _error_line(capsys)
    assert not (tmp_path / "x.png").exists()


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    """``hetero-nn trace FILE --stats | head -1``: exit status 141, nothing on stderr."""
    import subprocess
    import sys

    from hetero_nn.scheduler.trace.records import TaskRecord

    records = [TaskRecord(i, f"codelet_{i:04d}", "cpu", "cpu0", "cpu", "host0", 0.0, 0.0,
                          1e-4 * i, 1e-4 * i + 5e-5) for i in range(2000)]
    path = Trace(records, ["cpu0"]).to_json(tmp_path / "big.json")  # stats: ~200 kB of text
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-m", "hetero_nn", "trace", str(path), "--stats"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout.readline().startswith(str(path).encode())
    child.stdout.close()  # as head does after its line
    try:
        err = child.stderr.read()
        assert child.wait(timeout=120) == 141
    finally:
        child.kill()
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
