"""``benchmarks/gpu/acceptance.sh`` dry-runs on the emulated device: every stage but the
cuda test suite (CI runs that itself) runs quick on ``cuda-emu`` and passes, and the
folder holds each stage's log and the summary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile

import pytest

from helpers import REPO

pytest.importorskip("torch", reason="the training-step stage compares with PyTorch")


@pytest.mark.slow  # about 20 s on 2 cores: run it (-m slow) before a device session
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
def test_the_acceptance_script_dry_runs_on_the_emulated_device(tmp_path):
    env = {**os.environ, "HETERO_NN_GPU_EMULATE": "1", "PYTHON": sys.executable,
           "HETERO_NN_WHEELS": str(tmp_path / "no-wheels")}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/acceptance.sh"), str(out),
                           "env", "variants", "steps", "speed"], env=env, capture_output=True,
                          text=True, timeout=240)
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout[-2000:] + done.stderr[-2000:]
    assert "acceptance: GPU=no" in summary and summary.rstrip().endswith("acceptance: PASSED")
    for stage in ("env", "variants", "steps", "speed"):
        assert f"stage {stage}: rc=0" in summary, summary
        assert (out / f"{stage}.txt").stat().st_size > 0
    variants = (out / "variants.txt").read_text()
    assert "FAIL" not in variants and " 0 failed" in variants
    assert "bit-identical across policies and runs" in (out / "steps.txt").read_text()


def test_an_unknown_stage_fails_the_run(tmp_path):
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/acceptance.sh"), str(tmp_path),
                           "nonsense"], env={**os.environ, "HETERO_NN_GPU_EMULATE": "1",
                                             "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "unknown stage nonsense" in (tmp_path / "summary.txt").read_text()


@pytest.mark.slow  # ~16 s on 2 cores, and the 40 s budget it dry-runs in is load-sensitive
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
def test_the_mixed_experiment_dry_runs_and_its_rows_simulate_and_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    cache = tmp_path / "cache"
    env = {**os.environ, "HETERO_NN_GPU_EMULATE": "1", "PYTHON": sys.executable,
           "HETERO_NN_WHEELS": str(tmp_path / "no-wheels"), "HETERO_NN_CACHE": str(cache),
           "HETERO_NN_PACK": str(tmp_path / "pack.tgz"),
           "MIXED_ARGS": "--budget 40 --no-auto --fixed gpu=1,mixed=2,cpu=2 --phases 1"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/acceptance.sh"), str(out),
                           "launch", "mixed"], env=env, capture_output=True, text=True,
                          timeout=240)
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout[-2000:] + done.stderr[-2000:]
    assert "stage launch: rc=0" in summary and "stage mixed: rc=0" in summary, summary
    rows = [json.loads(line) for line in (out / "mixed" / "mixed_rows.jsonl").open()]
    assert {r["platform"] for r in rows} == {"gpu", "mixed", "cpu"}
    assert all(r["seconds"] > 0 and r["costs"]["path"] for r in rows)
    with tarfile.open(tmp_path / "pack.tgz") as tar:  # the archive a device run returns
        names = tar.getnames()
    assert "./mixed/mixed_rows.jsonl" in names and any(n.startswith("perfmodels/") for n in names)
    sim = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/simulate_rows.py"),
                          str(out / "mixed" / "mixed_rows.jsonl"), "--models", str(cache),
                          "--hostname", socket.gethostname()], env=env, capture_output=True,
                         text=True, timeout=120)
    # a mixed row whose placement left a codelet unmeasured on one kind is named, not guessed
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "| cuda-emu:1 | dmda | 1 |" in sim.stdout and "| cpu:1 | dmda | 2 |" in sim.stdout
    assert re.search(r"# [23] rows: median \|error\|", sim.stdout), sim.stdout
    plots = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/plot_mixed.py"),
                            str(out / "mixed"), "--out", str(tmp_path / "plots")], env=env,
                           capture_output=True, text=True, timeout=120)
    assert plots.returncode == 0, plots.stderr
    assert (tmp_path / "plots" / "images_per_s_vs_g.png").stat().st_size > 0
    assert list((tmp_path / "plots").glob("gantt_*.png"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_device_run_keeps_its_deadline_and_packs_what_it_has(tmp_path):
    # no stage has time left: the timed stage is not started, said so, and packed
    env = {**os.environ, "PYTHON": "true", "CHECKS": "", "TIMED": "mixed", "DEADLINE": "0",
           "HETERO_NN_WHEELS": str(tmp_path / "no-wheels")}
    out, pack = tmp_path / "out", tmp_path / "run.tgz"
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/device_run.sh"), str(out),
                           str(pack)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mixed: not started" in (out / "env.txt").read_text()
    with tarfile.open(pack) as tar:
        assert "./env.txt" in tar.getnames()
