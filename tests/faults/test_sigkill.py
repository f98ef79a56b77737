"""SIGKILL of a training run at random moments, inside checkpoint and metrics writes too.

Every time: the folder's checkpoint (when it holds a run) loads, no file of the run
is torn, and what the user does next — ``--resume``, or the same command again when
the kill came before anything was written — ends on weights bit-identical to an
uninterrupted run's, with no temporary file left behind.
"""

import json
import random

import pytest

from harness import (STEPS, WRITES, assert_same_bits, killed_run, recover, run_files,
                     temporaries, uninterrupted, weights)
from hetero_nn.training.checkpoint import read_checkpoint

#: Bytes of each file a run writes, at most (a kill mid-write must come before the end).
SIZES = {"checkpoint.npz": 60_000, "checkpoint-final.npz": 60_000, "metrics.json": 2_000,
         "metrics.csv": 150}
STAGES = ("write", "fsync", "replace", "renamed")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The final weights of the uninterrupted run."""
    return uninterrupted(tmp_path_factory.mktemp("reference") / "run")


def random_moments(rng: random.Random, n: int) -> list[str]:
    """``n`` kill moments: most inside a write of a random file (random stage, random
    occurrence, random byte), every fifth at a random time since the start."""
    moments = []
    for i in range(n):
        if i % 5 == 4:
            moments.append(f"time:{rng.uniform(0.2, 2.5):.3f}")
            continue
        name = rng.choice(sorted(WRITES))
        stage = rng.choice(STAGES)
        moment = f"{stage}:{name}:{rng.randint(1, WRITES[name])}"
        if stage == "write":
            moment += f":{rng.randint(1, SIZES[name])}"
        moments.append(moment)
    return moments


def check_kill_and_recovery(folder, moment, reference):
    out = folder / moment.replace(":", "-")
    killed = killed_run(out, moment)
    if not moment.startswith("time:"):
        assert killed.returncode == -9, f"{moment}: the run was not killed ({killed.stderr})"
    files = run_files(out)
    if files:  # a folder that holds a run holds a checkpoint that loads
        assert "checkpoint.npz" in files, f"{moment}: {files} without checkpoint.npz"
        ckpt = read_checkpoint(out / "checkpoint.npz")
        assert 0 <= ckpt.global_step <= STEPS
        for name in ("metrics.json",):
            if (out / name).exists():
                json.loads((out / name).read_text())  # never torn
    done = recover(out)
    assert done.returncode == 0, f"{moment}: recovery failed: {done.stderr}"
    assert_same_bits(weights(out / "checkpoint-final.npz"), reference, moment)
    assert temporaries(out) == [], f"{moment}: left {temporaries(out)}"


@pytest.mark.parametrize("moment", ["write:checkpoint.npz:3:700",
                                    pytest.param("fsync:metrics.json:1", marks=pytest.mark.slow)])
def test_a_kill_inside_a_checkpoint_or_metrics_write_loses_nothing(tmp_path, moment, reference):
    check_kill_and_recovery(tmp_path, moment, reference)


@pytest.mark.slow
def test_sigkill_at_20_random_moments_loses_nothing(tmp_path, reference):
    seed = random.SystemRandom().randrange(2**32)
    for i, moment in enumerate(random_moments(random.Random(seed), 20)):
        try:
            check_kill_and_recovery(tmp_path / str(i), moment, reference)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from None
