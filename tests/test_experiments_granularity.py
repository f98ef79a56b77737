"""experiments/granularity.py end to end on a tiny grid: the JSON it writes, its PNGs,
``--replot``, and its one-line errors."""

import json

import pytest
from helpers import load_script


def _script():
    return load_script("experiments/granularity.py")


def test_tiny_sweep_writes_provenance_rows_and_plots(tmp_path):
    pytest.importorskip("torch", reason="the study compares with PyTorch")
    pytest.importorskip("matplotlib", reason="the study draws PNGs")
    study = _script()
    results, plots = tmp_path / "results", tmp_path / "plots"
    argv = ["--models", "dahl-basic", "--sizes", "28", "--batches", "2", "--granularities",
            "1", "2", "4", "--workers", "1", "2", "--fuse", "on", "--rounds", "1",
            "--steps", "1", "--warmup", "1", "--results", str(results), "--plots", str(plots)]
    assert study.main(argv) == 0

    written = sorted(results.glob("granularity-2*.json"))
    assert len(written) == 1
    doc = json.loads(written[0].read_text())
    assert json.loads((results / "granularity-latest.json").read_text()) == doc
    assert doc["experiment"] == "granularity"
    assert doc["git_commit"] and doc["versions"]["torch"] and doc["machine"]["cpu_count"]
    assert doc["command"][-len(argv):] == argv
    # g=4 > batch 2 is skipped, for each worker count, with its reason
    assert [(s["workers"], s["g"], s["reason"]) for s in doc["skipped"]] == \
        [(1, 4, "g > batch"), (2, 4, "g > batch")]
    rows = doc["rows"]
    # per worker count: PyTorch, then g in (1, 2)
    assert [(r["workers"], r["side"], r["g"], r["fuse"]) for r in rows] == [
        (w, side, g, fuse) for w in (1, 2)
        for side, g, fuse in [("pytorch", None, None), ("hetero_nn", 1, True),
                              ("hetero_nn", 2, True)]]
    for r in rows:
        assert r["model"] == "dahl-basic" and r["shape"] == [1, 28, 28] and r["batch"] == 2
        assert r["step_ms"] > 0 and r["images_per_s"] == pytest.approx(2e3 / r["step_ms"])
        if r["side"] == "pytorch":
            assert r["ratio"] == 1.0 and r["tasks"] is None
            continue
        assert sorted(r["utilisation"]) == [f"cpu{i}" for i in range(r["workers"])]
        assert all(0 <= share <= 1 for share in r["utilisation"].values())
        assert r["overhead_share"] <= 1 and r["kernels_ms"]
    tasks = {r["g"]: r["tasks"] for r in rows if r["side"] == "hetero_nn"}
    assert tasks[2] > tasks[1] > 0

    names = ["overhead.png", "tasks.png", "throughput-dahl-basic.png", "utilisation.png"]
    assert sorted(p.name for p in plots.iterdir()) == names
    for name in names:
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = tmp_path / "replotted"
    assert study.main(["--replot", str(written[0]), "--plots", str(again)]) == 0
    assert sorted(p.name for p in again.iterdir()) == names


def test_bounds_skip_what_they_name():
    study = _script()
    args = study.parse(["--models", "lenet5", "cifar-small", "--sizes", "28", "256",
                        "--batches", "16", "256", "--granularities", "1", "--max-memory-gib",
                        "2"])
    todo, skipped = study.groups(args)
    assert [(name, size, batch, workers) for name, size, batch, workers, _, _ in todo] == [
        ("lenet5", 28, 16, 1), ("lenet5", 28, 16, 2), ("lenet5", 28, 256, 1),
        ("lenet5", 28, 256, 2), ("lenet5", 256, 16, 1), ("lenet5", 256, 16, 2),
        ("cifar-small", 28, 16, 1), ("cifar-small", 28, 16, 2), ("cifar-small", 28, 256, 1),
        ("cifar-small", 28, 256, 2)]
    reasons = {(s["model"], s["size"], s["batch"]): s["reason"] for s in skipped}
    assert reasons[("lenet5", 256, 256)] == "16777216 pixels per batch > --max-pixels 1048576"
    assert reasons[("cifar-small", 256, 16)] == "3145728 pixels per batch > --max-pixels 1048576"
    full = study.parse(["--full", "--models", "lenet5", "--sizes", "256", "--batches", "256",
                        "--max-memory-gib", "2"])
    assert (full.max_pixels, full.rounds) == (None, 5)
    _, skipped = study.groups(full)
    assert skipped[0]["reason"].startswith("estimated ") and "--max-memory-gib 2" in \
        skipped[0]["reason"]


@pytest.mark.parametrize("argv, words", [
    (["--granularities", "0"], "--granularities: expected a positive integer, got '0'"),
    (["--sizes", "4"], "--sizes 4: model 'lenet5' does not fit"),
    (["--models", "vgg"], "--models: invalid choice: 'vgg'"),
    (["--max-memory-gib", "0"], "--max-memory-gib: expected a positive number"),
    (["--replot", "/nonexistent.json"], "--replot /nonexistent.json: not a granularity"),
])
def test_bad_flags_are_one_line(argv, words, capsys):
    study = _script()
    with pytest.raises(SystemExit) as exit_:
        study.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
