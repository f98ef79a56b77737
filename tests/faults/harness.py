"""The fault-injection harness: real ``hetero-nn`` processes, killed, starved, fed bad files.

Every run is ``python -m hetero_nn`` in a subprocess with a time limit, on the
``synthetic`` dataset (no download), with pinned variants, so two runs of the same
options give the same bits. :func:`reference` is an uninterrupted run; a fault test
damages a run and checks what the user is left with: a folder whose checkpoint
loads, a resume that ends on the reference's weights bit for bit, one line on
stderr naming what failed.

Kill moments (see ``killer.py``) are ``<stage>:<file>:<n>[:<bytes>]`` strings, or
``time:<seconds>`` for a SIGKILL sent by this process after a delay.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]



def train_args(epochs=2) -> list:
    """A small run: epochs of 6 steps, a checkpoint after every step."""
    return ["train", "--dataset", "synthetic", "--limit", "192", "--batch-size", "32",
            "--epochs", str(epochs), "--model", "dahl-basic", "--devices", "cpu:2",
            "--granularity", "2", "--checkpoint-every", "1", "--seed", "7", "-q"]


TRAIN = train_args()
STEPS = 12
#: How many atomic writes of each file a whole run makes (checkpoint.npz: every step
#: but the last of each epoch, and each epoch's end).
WRITES = {"checkpoint.npz": STEPS, "metrics.json": 3, "metrics.csv": 3,
          "checkpoint-final.npz": 1}
LIMIT = 240  # seconds any one process may take


def env(**extra) -> dict:
    """The environment of a child: this checkout first on the path, one BLAS thread."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    out.setdefault("OMP_NUM_THREADS", "1")
    out.update({k: str(v) for k, v in extra.items()})
    return out


def hetero_nn(*args, timeout=LIMIT, extra_env=None, preexec_fn=None, prefix=()):
    """Run ``python -m hetero_nn ARGS``; the CompletedProcess (text output)."""
    return subprocess.run([*prefix, sys.executable, "-m", "hetero_nn", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env(**(extra_env or {})), preexec_fn=preexec_fn)


def killed_run(out, moment: str, args=TRAIN, extra_env=None):
    """Start a run into ``out`` and SIGKILL it at ``moment``; the CompletedProcess.

    The return code is ``-SIGKILL`` when the kill happened; a moment the run never
    reached (a time after it finished) leaves it to finish normally.
    """
    command = [*map(str, args), "--out", str(out)]
    if moment.startswith("time:"):
        proc = subprocess.Popen([sys.executable, "-m", "hetero_nn", *command], cwd=REPO,
                                env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            try:
                stdout, stderr = proc.communicate(timeout=float(moment.split(":")[1]))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                stdout, stderr = proc.communicate(timeout=LIMIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return subprocess.run([sys.executable, str(HERE / "killer.py"), moment, "--", *command],
                          capture_output=True, text=True, timeout=LIMIT, cwd=REPO,
                          env=env(**(extra_env or {})))


def uninterrupted(out, args=TRAIN) -> dict:
    """The final weights of a run of ``args`` into ``out`` that nothing disturbs."""
    done = hetero_nn(*args, "--out", out)
    assert done.returncode == 0, done.stderr
    return weights(Path(out) / "checkpoint-final.npz")


def weights(path) -> dict:
    """The model's arrays of a checkpoint file, by name."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k].copy() for k in data.files if k.startswith("model/")}


def assert_same_bits(got: dict, expected: dict, what: str) -> None:
    assert sorted(got) == sorted(expected), what
    for name in expected:
        assert got[name].dtype == expected[name].dtype and \
            got[name].tobytes() == expected[name].tobytes(), f"{what}: {name} differs"


def run_files(out) -> list:
    """The run's files in ``out`` (what makes a folder 'hold a run')."""
    names = ("metrics.json", "metrics.csv", "trace.json", "checkpoint.npz", "checkpoint-final.npz")
    return [name for name in names if (Path(out) / name).exists()]


def temporaries(out) -> list:
    return sorted(p.name for p in Path(out).glob(".*.tmp"))


def recover(out, args=TRAIN, timeout=LIMIT):
    """What a user does after a crash: resume from the folder's checkpoint when it holds
    a run, else run the same command again. The CompletedProcess."""
    if run_files(out):
        return hetero_nn("train", "--out", out, "--resume", "-q", timeout=timeout)
    return hetero_nn(*args, "--out", out, timeout=timeout)


def with_tmpfs(mountpoint, options: str, then: str, timeout=2 * LIMIT):
    """Run the shell command ``then`` with a tmpfs (``-o options``) mounted at
    ``mountpoint`` in a private mount namespace (``unshare -m``: the mount is gone when
    the command ends and no other process sees it); skip the test where this user may
    not make one."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        pytest.skip("tmpfs in a private mount namespace needs Linux and unshare")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o {options} tmpfs /mnt"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this user cannot mount a tmpfs in a private mount namespace (unshare -m)")
    return subprocess.run(["unshare", "-m", "sh", "-c",
                           f"mount -t tmpfs -o {options} tmpfs {mountpoint} && {then}"],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env())


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)
