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

from hetero_nn.training.checkpoint import CHECKPOINT_NAME, FINAL_NAME, read_checkpoint
from hetero_nn.cli import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATA = Path(os.environ.get("HETERO_NN_DATA") or SHARED)
needs_mnist = pytest.mark.skipif(not (DATA / "mnist").is_dir(),
                                 reason=f"real MNIST not found in {DATA}")
REPO = Path(__file__).resolve().parents[1]


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
    (["train", "--resume", "--overwrite", "--out", "somewhere"], "--overwrite"),
    (["train", "--connect-timeout", "0"], "--connect-timeout"),
]


@pytest.mark.parametrize("argv, named", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_invalid_options_stop_with_one_line_naming_the_option(argv, named, capsys):
    assert main(argv) == 2
    assert named in _error_line(capsys)


def test_missing_dataset_files_name_the_dataset_and_the_folder(tmp_path, capsys):
    assert main(["train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)]) == 2
    line = _error_line(capsys)
    assert "--dataset fashion-mnist" in line and str(tmp_path) in line and "--data-dir" in line
    assert line.count("fashion-mnist:") == 1 and "hetero-nn datasets download fashion-mnist" in line


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


@pytest.mark.parametrize("content", ["garbage", "pickled", "npy"])
def test_a_garbage_checkpoint_is_not_a_hetero_nn_checkpoint(tmp_path, capsys, content):
    bad = tmp_path / "bad.npz"
    if content == "garbage":
        bad.write_bytes(np.random.default_rng(0).bytes(1000))
    elif content == "pickled":
        with open(bad, "wb") as f:
            np.savez(f, config=np.array([{"a": 1}], dtype=object))
    else:
        with open(bad, "wb") as f:
            np.save(f, np.arange(3))
    for argv in (["evaluate", "--checkpoint", str(bad)], ["train", "--resume", str(bad)]):
        assert main(argv) == 2
        line = _error_line(capsys)
        assert f"{bad}: not a hetero_nn checkpoint" in line and "pickle=" not in line, line


def test_bare_commands_print_their_usage(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hetero-nn") and "train" in out and "datasets" in out
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hetero-nn datasets") and "download" in out


# --------------------------------------------------------------------------- --out and --executor

SYNTHETIC = ["--dataset", "synthetic", "--limit", "64", "--batch-size", "32", "--epochs", "1",
             "--model", "dahl-basic", "--devices", "cpu:1", "-q"]


def _synthetic_run(out, *extra):
    return main(["train", *SYNTHETIC, "--out", str(out), *extra])


def test_an_out_that_is_a_file_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("mine")
    for target in (out, out / "below"):
        assert _synthetic_run(target) == 2
        line = _error_line(capsys)
        assert f"--out {target}: " in line and "is not a folder" in line
    assert out.read_text() == "mine"
    # a refused run leaves nothing behind, not even the folder it would have made
    missing = tmp_path / "new" / "run"
    assert main(["train", *SYNTHETIC, "--dataset", "mnist", "--data-dir", str(tmp_path),
                 "--out", str(missing)]) == 2
    assert "--dataset mnist" in _error_line(capsys) and not (tmp_path / "new").exists()


def test_a_read_only_out_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("this user writes through read-only permissions (root)")
        assert _synthetic_run(out) == 2
        assert f"--out {out}: cannot write there" in _error_line(capsys)
    finally:
        out.chmod(0o755)
    assert list(out.iterdir()) == []


def test_an_immutable_out_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "frozen"
    out.mkdir()
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE)")
    try:
        for target in (out, out / "new" / "run"):  # a folder to create below it: the same
            assert _synthetic_run(target) == 2
            assert f"--out {target}: cannot write there" in _error_line(capsys)
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    assert list(out.iterdir()) == []


def test_a_new_run_into_another_runs_out_refuses_and_touches_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert _synthetic_run(out) == 0
    capsys.readouterr()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert {"metrics.json", CHECKPOINT_NAME, FINAL_NAME} <= set(before)
    assert _synthetic_run(out, "--seed", "3") == 2
    line = _error_line(capsys)
    assert f"--out {out} holds another run" in line and "metrics.json" in line
    assert "--resume" in line and "--overwrite" in line
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    # --overwrite replaces it: the new run's config, and no file of the old run left over
    (out / "trace.json").write_text("{}")  # as an earlier run with --trace would have left
    assert _synthetic_run(out, "--seed", "3", "--overwrite") == 0
    assert json.loads((out / "metrics.json").read_text())["config"]["seed"] == 3
    assert not (out / "trace.json").exists()
    # only one checkpoint of the old run: refused too
    only = tmp_path / "only"
    only.mkdir()
    (only / CHECKPOINT_NAME).write_bytes(before[CHECKPOINT_NAME][0])
    assert _synthetic_run(only) == 2
    assert CHECKPOINT_NAME in _error_line(capsys)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_at_the_first_steps_keeps_the_starting_checkpoint(tmp_path, capsys):
    """A run writes its starting state first: diverging before any step's checkpoint
    still leaves a folder that resumes (here, with the same bad lr, to the same end)."""
    out = tmp_path / "nan"
    assert main(["train", *SYNTHETIC, "--limit", "256", "--batch-size", "16", "--lr", "1e6",
                 "--out", str(out)]) == 1
    line = _error_line(capsys)
    assert "training diverged" in line and f"last good checkpoint is {out / CHECKPOINT_NAME}" in line
    assert "--out to keep one" not in line
    assert read_checkpoint(out / CHECKPOINT_NAME).global_step == 0
    assert json.loads((out / "metrics.json").read_text())["status"] == "diverged"


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_scheduler_fails_at_start_within_the_connect_timeout(capsys):
    address = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    assert main(["train", *SYNTHETIC, "--executor", f"distributed={address}",
                 "--connect-timeout", "1"]) == 2
    elapsed = time.monotonic() - t0
    line = _error_line(capsys)
    assert f"--executor distributed={address}" in line and "--connect-timeout" in line
    assert elapsed < 30, elapsed  # 1 s to connect; the bound is generous for a loaded machine


@pytest.mark.parametrize("scheduler", ["local-cluster", "address"])
def test_ctrl_c_under_the_distributed_executor_prints_one_line(tmp_path, request, scheduler):
    """SIGINT to the process group, as a terminal's Ctrl-C: Dask's workers stay quiet.

    ``local-cluster``: the CLI's own LocalCluster, whose workers are in the group;
    ``address``: the session's cluster, reached as ``distributed=ADDRESS``.
    """
    executor = "distributed"
    if scheduler == "address":
        executor += "=" + request.getfixturevalue("dist_client").scheduler.address
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetero_nn", "train", "--dataset", "synthetic", "--limit", "2048",
         "--batch-size", "16", "--epochs", "20", "--model", "dahl-basic", "--devices", "cpu:1",
         "--executor", executor, "--checkpoint-every", "1", "--out", str(out), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _global_step(out / CHECKPOINT_NAME) < 1:  # training steps are running on Dask
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no step's checkpoint after 120 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr  # what else was printed, when a run says more
    (line,) = lines
    assert line.startswith("hetero-nn: interrupted: stopped at step "), stderr
    assert f"resume with: hetero-nn train --out {out} --resume --devices cpu:1" in line
    assert json.loads((out / "metrics.json").read_text())["status"] == "interrupted"


def _global_step(path) -> int:
    """The global step of the checkpoint at ``path``; -1 while there is none."""
    try:
        return read_checkpoint(path).global_step
    except Exception:
        return -1


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

    # the variants that ran, per codelet, from the runtime's task records: one each when pinned
    ran = metrics["variants_run"]
    assert {"conv2d_relu_pool_fwd", "conv2d_relu_pool_bwd_params", "sgd_step",
            "softmax_xent"} <= set(ran)  # the model's Conv2D, ReLU, MaxPool2D run fused
    from hetero_nn.codelets import fused
    assert set(ran["conv2d_relu_pool_fwd"]) <= set(fused.conv2d_relu_pool_fwd.variants)
    assert all(len(variants) == 1 and min(variants.values()) > 0 for variants in ran.values())
    assert sum(ran["sgd_step"].values()) % 16 == 0  # one task per weight per step
    # the first step (kernel compilation) is timed apart from epoch 1's images/s
    first = metrics["epochs"][0]
    assert 0 < first["warmup_seconds"] < first["seconds"]
    assert first["images_per_second"] == pytest.approx((256 - 32) / (first["seconds"]
                                                                     - first["warmup_seconds"]))
    assert metrics["epochs"][1]["warmup_seconds"] == 0

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


@needs_mnist
def test_datasets_download_takes_mirrors_and_list_checks_sizes_and_checksums(tmp_path, capsys):
    data = tmp_path / "data"
    mirrors = ["--mirror", (tmp_path / "absent").as_uri() + "/", "--mirror",
               (DATA / "mnist").as_uri() + "/"]
    assert main(["datasets", "download", "mnist", "--data-dir", str(data), *mirrors]) == 0
    assert f"mnist: ready in {data / 'mnist'}" in capsys.readouterr().out
    files = sorted((data / "mnist").iterdir())
    assert len(files) == 4 and all(p.stat().st_mode & 0o777 == 0o644 for p in files)
    assert main(["datasets", "list", "--data-dir", str(data), "--verify"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:]}
    assert rows["mnist"][1:4] == ["yes", "60000", "10000"] and rows["cifar10"][1] == "no"

    labels = data / "mnist" / "t10k-labels-idx1-ubyte.gz"
    good = labels.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # the same size: only the checksum tells
    labels.write_bytes(bytes(damaged))
    assert main(["datasets", "list", "--data-dir", str(data)]) == 0
    assert "mnist          yes" in capsys.readouterr().out
    assert main(["datasets", "list", "--data-dir", str(data), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "mnist          damaged" in out and f"mnist: {labels}: MD5 checksum differs" in out
    labels.write_bytes(good[:-100])  # truncated: the size check finds it
    assert main(["datasets", "list", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "mnist          damaged" in out and f"mnist: {labels}" in out


def test_perfmodel_shows_the_models_and_exits_1_for_a_codelet_without_one(tmp_path, capsys):
    from hetero_nn.cli.perfmodel import format_perfmodel
    from hetero_nn.scheduler.perfmodel.model import PerfModel

    pm = PerfModel(tmp_path)
    assert "no performance model yet" in format_perfmodel(pm)
    assert main(["perfmodel", "--cache-dir", str(tmp_path)]) == 0
    assert "no performance model yet" in capsys.readouterr().out
    key = ("conv2d_fwd", "cpu", "cpu")
    for size in (100, 1000, 10000):
        pm.record(*key, f"f32[{size}]", float(size), size * 1e-9)
    pm.record("pool_fwd", "ref", "cpu", "f64[2,2]", 4.0, 2.5e-6)
    pm.record_transfer("host0", "cuda0", 1 << 20, 1e-4)
    table = format_perfmodel(pm)
    for text in ("codelet", "footprint", "mean (us)", "stddev (us)", "f32[1000]", "1.000",
                 "pool_fwd", "2.500", "regression", "need >= 2 distinct sizes",
                 "transfers", "host0", "cuda0", "bandwidth (GB/s)"):
        assert text in table, text
    only = format_perfmodel(pm, "pool_fwd")
    assert "pool_fwd" in only and "conv2d_fwd" not in only and "transfers" not in only
    pm.save()
    assert main(["perfmodel", "--cache-dir", str(tmp_path), "--list"]) == 0
    assert capsys.readouterr().out.split() == ["conv2d_fwd", "pool_fwd"]
    assert main(["perfmodel", "--cache-dir", str(tmp_path), "conv2d_fwd"]) == 0
    out = capsys.readouterr().out
    assert "f32[10000]" in out and "pool_fwd" not in out
    assert main(["perfmodel", "--cache-dir", str(tmp_path), "nope"]) == 1
    line = _error_line(capsys)
    assert "no performance model for codelet 'nope'" in line and str(tmp_path) in line


# --------------------------------------------------------------------------- resume after SIGKILL

def _final_state(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: (npz[k].dtype.str, npz[k].shape, npz[k].tobytes()) for k in npz.files
                if k.startswith(("model/", "optimizer/"))}


def _history_without_timing(path):
    timing = {"seconds", "images_per_second", "eval_seconds", "warmup_seconds"}
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
            while _global_step(ckpt_path) < 1:  # past the starting checkpoint (step 0)
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
