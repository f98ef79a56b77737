"""The ``hetero-nn`` command: option errors, a real training run, evaluate, resume after SIGKILL.

Every invalid option stops with one line ``hetero-nn: error: ...`` naming the
option and exit status 2; a tiny run on real MNIST writes metrics, trace and
checkpoints; ``evaluate`` agrees with the run's own final figures; a run killed
with SIGKILL mid-epoch and resumed ends with the same bytes as one never
interrupted; a diverging run exits 1 and keeps its last good checkpoint.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_nn.checkpoint import CHECKPOINT_NAME, FINAL_NAME, read_checkpoint
from hetero_nn.cli import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATA = Path(os.environ.get("HETERO_NN_DATA") or SHARED)
needs_mnist = pytest.mark.skipif(not (DATA / "mnist").is_dir(),
                                 reason=f"real MNIST not found in {DATA}")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    if not os.environ.get("HETERO_NN_CACHE"):
        monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path_factory.mktemp("cache")))


def _cuda_available():
    from hetero_nn.codelets.xp import cupy_or_none
    return cupy_or_none() is not None


def _error_line(capsys):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hetero-nn: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- option errors

BAD_OPTIONS = [
    (["train", "--batch-size", "0"], "--batch-size"),
    (["train", "--batch-size", "eight"], "--batch-size"),
    (["train", "--batch-size", "8", "--granularity", "16"], "--granularity 16 is larger than --batch-size 8"),
    (["train", "--granularity", "0"], "--granularity"),
    (["train", "--granularity", "fast"], "--granularity"),
    (["train", "--model", "resnet50"], "--model"),
    (["train", "--policy", "fifo"], "--policy"),
    (["train", "--devices", "tpu:1"], "--devices"),
    (["train", "--devices", "cpu:many"], "--devices"),
    (["train", "--executor", "spark"], "--executor"),
    (["train", "--dataset", "imagenet"], "--dataset"),
    (["train", "--dtype", "float16"], "--dtype"),
    (["train", "--optimizer", "rmsprop"], "--optimizer"),
    (["train", "--lr", "-0.1"], "--lr"),
    (["train", "--momentum", "1.5"], "--momentum"),
    (["train", "--optimizer", "adam", "--momentum", "0.5"], "--momentum"),
    (["train", "--epochs", "-1"], "--epochs"),
    (["train", "--limit", "0"], "--limit"),
    (["train", "--checkpoint-every", "5"], "--checkpoint-every needs --out"),
    (["train", "--trace"], "--trace needs --out"),
    (["train", "--resume"], "--resume"),
    (["train", "--calibrate", "--deterministic"], "--calibrate"),
    (["evaluate"], "--checkpoint"),
    (["datasets", "download", "imagenet"], "name"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize("argv, named", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_invalid_options_stop_with_one_line_naming_the_option(argv, named, capsys):
    assert main(argv) == 2
    assert named in _error_line(capsys)


def test_missing_dataset_files_name_the_dataset_and_the_folder(tmp_path, capsys):
    assert main(["train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)]) == 2
    line = _error_line(capsys)
    assert "--dataset fashion-mnist" in line and str(tmp_path) in line and "--data-dir" in line


@pytest.mark.skipif(_cuda_available(), reason="this machine has a GPU with CuPy")
def test_cuda_without_gpu_or_cupy_names_the_devices_option(capsys):
    argv = ["train", "--dataset", "synthetic", "--limit", "64", "--devices", "cpu:1,cuda:0"]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert "--devices" in line and "CUDA" in line


def test_resume_from_a_missing_or_corrupt_checkpoint(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope.npz")]) == 2
    assert "--resume: no checkpoint at" in _error_line(capsys)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["train", "--resume", str(bad)]) == 2
    assert str(bad) in _error_line(capsys)
    assert main(["evaluate", "--checkpoint", str(bad)]) == 2
    assert str(bad) in _error_line(capsys)


def test_the_installed_entry_point_prints_one_line_and_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hetero_nn", "train", "--dataset", "mnist",
                          "--data-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("hetero-nn: error: --dataset")
    assert "Traceback" not in out.stderr


# --------------------------------------------------------------------------- a real run

TINY = ["--dataset", "mnist", "--data-dir", str(DATA), "--limit", "256", "--batch-size", "32",
        "--model", "dahl-basic", "--devices", "cpu:2", "--granularity", "2"]


@needs_mnist
def test_train_writes_metrics_trace_and_checkpoints_and_evaluate_agrees(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--epochs", "2", "--checkpoint-every", "3", "--trace",
            "--trace-steps", "4", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "final test accuracy" in captured.out and "images/s" in captured.out
    assert "epoch 1/2: train loss" in captured.err and "epoch 2/2: train loss" in captured.err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["metrics.json", "metrics.csv", "trace.json", CHECKPOINT_NAME, FINAL_NAME])

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["error"] is None
    assert metrics["config"]["model"] == "dahl-basic" and metrics["config"]["limit"] == 256
    assert metrics["config"]["lr"] == 0.02 and metrics["config"]["momentum"] == 0.9
    assert metrics["devices"]["spec"] == "cpu:2" and len(metrics["devices"]["workers"]) == 2
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for e in metrics["epochs"]:
        assert {"train_loss", "train_accuracy", "test_loss", "test_accuracy", "seconds",
                "images_per_second"} <= set(e)
    assert metrics["test_accuracy"] == metrics["epochs"][-1]["test_accuracy"]
    assert metrics["test_accuracy"] > 0.3  # 2 epochs of 256 digits; chance is 0.1
    assert metrics["global_step"] == 16 and metrics["versions"]["numpy"] == np.__version__

    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert float(rows[1]["test_accuracy"]) == metrics["test_accuracy"]

    trace = json.loads((out / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"conv2d_relu_pool_fwd", "conv2d_relu_pool_bwd_params", "sgd_step", "softmax_xent"} <= names

    with np.load(out / FINAL_NAME, allow_pickle=False) as npz:
        assert json.loads(npz["config"][()])["run"]["model"] == "dahl-basic"
    final = read_checkpoint(out / FINAL_NAME)
    assert (final.epoch, final.step, final.global_step) == (2, 0, 16)

    assert main(["evaluate", "--checkpoint", str(out / FINAL_NAME), "--limit", "256",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dataset"] == "mnist" and result["samples"] == 256
    assert result["accuracy"] == metrics["test_accuracy"]
    assert result["loss"] == pytest.approx(metrics["test_loss"], rel=1e-6)

    # resuming with an option that changes the numbers is refused, naming it
    assert main(["train", "--out", str(out), "--resume", "--lr", "0.5"]) == 2
    assert "--lr 0.5 differs" in _error_line(capsys)
    # a finished run resumed with more epochs continues from its last checkpoint
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "-q"]) == 0
    assert read_checkpoint(out / FINAL_NAME).global_step == 24


@needs_mnist
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_run_exits_1_and_keeps_its_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "nan"
    assert main(["train", *TINY, "--lr", "1e6", "--checkpoint-every", "1", "--out", str(out),
                 "-q"]) == 1
    line = _error_line(capsys)
    assert "training diverged" in line and str(out / CHECKPOINT_NAME) in line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "diverged" and "training diverged" in metrics["error"]
    ckpt = read_checkpoint(out / CHECKPOINT_NAME)
    assert all(np.isfinite(v).all() for v in ckpt.model_state.values())
    assert f"global step {ckpt.global_step + 1})" in line or \
        f"global step {ckpt.global_step}" in line
    assert not (out / FINAL_NAME).exists()


@needs_mnist
def test_datasets_list_and_perfmodel_delegate(capsys):
    assert main(["datasets", "list", "--data-dir", str(DATA)]) == 0
    out = capsys.readouterr().out
    mnist = next(line for line in out.splitlines() if line.startswith("mnist "))
    assert "yes" in mnist and "60000" in mnist and "10000" in mnist
    assert main(["perfmodel", "--list"]) == 0
    assert capsys.readouterr().out.strip()


# --------------------------------------------------------------------------- resume after SIGKILL

def _final_state(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: (npz[k].dtype.str, npz[k].shape, npz[k].tobytes()) for k in npz.files
                if k.startswith(("model/", "optimizer/"))}


def _history_without_timing(path):
    timing = {"seconds", "images_per_second", "eval_seconds"}
    return [{k: v for k, v in r.items() if k not in timing} for r in read_checkpoint(path).history]


@needs_mnist
def test_a_run_killed_mid_epoch_and_resumed_ends_bit_identical(tmp_path):
    common = ["train", "--dataset", "mnist", "--data-dir", str(DATA), "--limit", "512",
              "--batch-size", "32", "--epochs", "2", "--checkpoint-every", "5",
              "--model", "dahl-basic", "--granularity", "4", "--devices", "cpu:2", "-q"]
    reference = tmp_path / "reference"
    assert main([*common, "--out", str(reference)]) == 0

    for attempt in range(3):  # a kill that lands after the last mid-epoch checkpoint retries
        killed = tmp_path / f"killed{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "hetero_nn", *common, "--out", str(killed)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
        ckpt_path = killed / CHECKPOINT_NAME
        deadline = time.monotonic() + 180
        try:
            while not ckpt_path.exists():
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "no checkpoint after 180 s"
                time.sleep(0.001)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
        if proc.returncode == -signal.SIGKILL and not (killed / FINAL_NAME).exists():
            ckpt = read_checkpoint(ckpt_path)
            if ckpt.step > 0:
                break
    else:
        pytest.fail("could not kill the run in the middle of an epoch in 3 attempts")
    assert 0 < ckpt.global_step < 32 and 0 < ckpt.step < 16

    # resumed on other workers and another policy: the numbers do not depend on them
    resume = ["train", "--out", str(killed), "--resume", "--devices", "cpu:1", "--policy", "ws",
              "-q"]
    assert main(resume) == 0
    assert not [p.name for p in killed.iterdir() if p.name.endswith(".tmp")]
    assert _final_state(killed / FINAL_NAME) == _final_state(reference / FINAL_NAME)
    assert _history_without_timing(killed / FINAL_NAME) == \
        _history_without_timing(reference / FINAL_NAME)
    assert read_checkpoint(killed / FINAL_NAME).global_step == 32
