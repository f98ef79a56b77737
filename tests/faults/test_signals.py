"""SIGINT and SIGTERM during a run: a checkpoint at the next step boundary, one line that
gives the command resuming it, and that command ending on an uninterrupted run's bits.

A second signal stops the run at once; nothing on disk is torn and the folder still
resumes. A signal before training starts leaves nothing that blocks running again.
"""

import shlex
import signal
import subprocess
import sys
import time

import pytest

from harness import (LIMIT, REPO, assert_same_bits, env, hetero_nn, temporaries, uninterrupted,
                     wait_for, weights)
from hetero_nn.training.checkpoint import read_checkpoint

#: 2 epochs of 48 steps, a checkpoint after each: long enough to be interrupted mid-epoch.
LONG = ["train", "--dataset", "synthetic", "--limit", "1536", "--batch-size", "32",
        "--epochs", "2", "--model", "dahl-basic", "--devices", "cpu:2", "--granularity", "2",
        "--checkpoint-every", "1", "--seed", "3", "-q"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return uninterrupted(tmp_path_factory.mktemp("reference") / "run", LONG)


def _start(out):
    return subprocess.Popen([sys.executable, "-m", "hetero_nn", *LONG, "--out", str(out)],
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _global_step(out) -> int:
    try:
        return read_checkpoint(out / "checkpoint.npz").global_step
    except Exception:  # not there yet
        return -1


def _finish(proc):
    try:
        return proc.communicate(timeout=LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _interrupted(out, *signals):
    """A run into ``out`` sent ``signals`` once 5 steps are done: (return code, stderr)."""
    proc = _start(out)
    try:
        wait_for(lambda: _global_step(out) >= 5 or proc.poll() is not None, LIMIT, "5 steps")
        for signum in signals:
            proc.send_signal(signum)
    finally:
        _, stderr = _finish(proc)
    return proc.returncode, stderr


def _resume_as_printed(stderr: str):
    (line,) = stderr.strip().splitlines()
    assert line.startswith("hetero-nn: interrupted: stopped at step "), line
    command = shlex.split(line.split("; resume with: ", 1)[1])
    assert command[:2] == ["hetero-nn", "train"], line
    return hetero_nn(*command[1:])


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                    signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_checkpoints_the_step_and_the_printed_command_resumes(tmp_path, signum,
                                                                       reference):
    out = tmp_path / "run"
    returncode, stderr = _interrupted(out, signum)
    assert returncode == 128 + signum, stderr
    stopped = read_checkpoint(out / "checkpoint.npz")
    assert 5 <= stopped.global_step < 96 and str(out / "checkpoint.npz") in stderr
    assert f"at step {stopped.step} of epoch {stopped.epoch + 1}" in stderr
    assert temporaries(out) == []
    done = _resume_as_printed(stderr)
    assert done.returncode == 0, done.stderr
    assert_same_bits(weights(out / "checkpoint-final.npz"), reference, "resumed after a signal")


@pytest.mark.slow
def test_a_second_signal_stops_at_once_and_leaves_whole_files(tmp_path, reference):
    out = tmp_path / "run"
    # the second before the step in progress ends, most times
    returncode, stderr = _interrupted(out, signal.SIGINT, signal.SIGINT)
    assert returncode == 130, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert read_checkpoint(out / "checkpoint.npz").global_step >= 5
    assert temporaries(out) == []
    done = hetero_nn("train", "--out", out, "--resume", "-q")
    assert done.returncode == 0, done.stderr
    assert_same_bits(weights(out / "checkpoint-final.npz"), reference, "resumed after two signals")


@pytest.mark.slow
def test_a_signal_before_training_blocks_nothing(tmp_path, reference):
    """Ctrl-C while the command starts (imports, data): the same command runs again."""
    out = tmp_path / "run"
    proc = _start(out)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    finally:
        _finish(proc)
    # 130: interrupted by main() or while importing; -SIGINT: before Python's handler existed
    assert proc.returncode in (0, 130, -signal.SIGINT)
    if out.exists() and any(out.iterdir()):  # it got as far as the folder: resumable
        read_checkpoint(out / "checkpoint.npz")
        again = hetero_nn("train", "--out", out, "--resume", "-q")
    else:
        again = hetero_nn(*LONG, "--out", out)
    assert again.returncode == 0, again.stderr
    assert_same_bits(weights(out / "checkpoint-final.npz"), reference, "after an early Ctrl-C")
