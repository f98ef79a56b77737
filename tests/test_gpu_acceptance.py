"""``benchmarks/gpu/acceptance.sh`` dry-runs on the emulated device: every stage but the
cuda test suite (CI runs that itself) runs quick on ``cuda-emu`` and passes, and the
folder holds each stage's log and the summary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO

pytest.importorskip("torch", reason="the training-step stage compares with PyTorch")


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
