"""benchmarks/bench_training.py's options beyond the defaults: ``--image-size``,
``--rss`` (every configuration in a process of its own) and the workers' busy shares,
on runs of a step or two; and its one-line errors."""

import json

import pytest
from helpers import load_script


def _script():
    return load_script("benchmarks/bench_training.py")


TINY = ["--models", "dahl-basic", "--batches", "4", "--granularities", "1", "2", "--fuse", "on",
        "--warmup", "1", "--rounds", "1", "--steps", "1"]


def test_image_size_and_busy_shares(tmp_path, capsys):
    pytest.importorskip("torch", reason="the benchmark compares with PyTorch")
    out = tmp_path / "rows.json"
    assert _script().main([*TINY, "--image-size", "36", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["git_commit"] and doc["versions"]["torch"] and doc["machine"]["cpus"]
    rows = doc["rows"]
    assert [r["config"] for r in rows] == ["pytorch 2 threads", "hetero_nn g=1 fused",
                                           "hetero_nn g=2 fused"]
    assert all(r["shape"] == [1, 36, 36] and r["batch"] == 4 for r in rows)
    assert rows[0]["utilisation"] is None and "peak_rss_mib" not in rows[0]
    for r in rows[1:]:
        assert sorted(r["utilisation"]) == ["cpu0", "cpu1"]
        assert all(0 <= share <= 1 for share in r["utilisation"].values())
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[-2:] == ["busy", "%"]
    busy = printed[2].split()[-1]  # "NN/NN": one share per worker
    assert [int(p) for p in busy.split("/")] == \
        [round(100 * s) for s in rows[1]["utilisation"].values()]


def test_policies_give_a_row_each(tmp_path):
    pytest.importorskip("torch", reason="the benchmark compares with PyTorch")
    out = tmp_path / "rows.json"
    args = ["--models", "dahl-basic", "--batches", "4", "--granularities", "2", "--fuse", "on",
            "--warmup", "1", "--rounds", "1", "--steps", "1"]
    assert _script().main([*args, "--policies", "dmda", "eager", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == ["pytorch 2 threads", "hetero_nn g=2 fused",
                                           "hetero_nn g=2 fused eager"]
    assert all(r["tasks"] > 0 for r in rows[1:])


@pytest.mark.slow
def test_rss_runs_each_configuration_in_its_own_process(tmp_path):
    pytest.importorskip("torch", reason="the benchmark compares with PyTorch")
    out = tmp_path / "rows.json"
    assert _script().main([*TINY, "--rss", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == ["pytorch 2 threads", "hetero_nn g=1 fused",
                                           "hetero_nn g=2 fused"]
    for r in rows:
        assert 0 < r["setup_rss_mib"] <= r["peak_rss_mib"]
    assert rows[1]["tasks"] > 0 and sorted(rows[1]["utilisation"]) == ["cpu0", "cpu1"]


def test_a_failing_side_process_says_why():
    Remote = _script().Remote
    side = Remote({"kind": "hetero_nn", "model": "vgg", "shape": [1, 28, 28], "batch": 4,
                   "g": 1, "fuse": True, "workers": 1})
    try:
        with pytest.raises(RuntimeError,
                           match="hetero_nn side process: ConfigError: unknown model 'vgg'"):
            side.run(1, 1, timed=False)
    finally:
        side.close()


@pytest.mark.parametrize("argv, words", [
    (["--image-size", "0"], "argument --image-size: expected a positive integer, got '0'"),
    (["--image-size", "4"], "--image-size 4: model 'lenet5' does not fit"),
    (["--batches", "x"], "argument --batches: expected a positive integer, got 'x'"),
])
def test_bad_flags_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        _script().main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
