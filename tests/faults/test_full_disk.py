"""A full disk while a checkpoint is written: one line naming the file, a non-zero exit,
the previous checkpoint intact (and still loading), no temporary file left.

Two ways to fill the disk: a file-size limit on the process
(``resource.setrlimit(RLIMIT_FSIZE)``, SIGXFSZ ignored so ``write`` fails with
EFBIG instead of killing it), which works everywhere; and, where this user may
make a private mount namespace (``unshare -m``), a real 160 KiB tmpfs that a
second checkpoint does not fit in (ENOSPC).
"""

import resource
import signal
import sys

import pytest

from harness import hetero_nn, temporaries, train_args, with_tmpfs
from hetero_nn.training.checkpoint import read_checkpoint

ONE_EPOCH = train_args(epochs=1)
RESUME_TO_TWO = ["train", "--resume", "--epochs", "2", "-q"]


def _file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _one_line_naming(stderr, path, *words):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert str(path) in lines[0] and "Traceback" not in stderr, stderr
    for word in words:
        assert word in lines[0], stderr
    return lines[0]


def test_a_file_size_limit_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    out = tmp_path / "run"
    first = hetero_nn(*ONE_EPOCH, "--out", out)
    assert first.returncode == 0, first.stderr
    before = (out / "checkpoint.npz").read_bytes()
    # 16 KiB: the metrics and the perfmodels fit, a checkpoint (about 68 KB) does not
    starved = hetero_nn(*RESUME_TO_TWO, "--out", out, preexec_fn=_file_size_limit(16 << 10))
    assert starved.returncode != 0
    _one_line_naming(starved.stderr, out / "checkpoint.npz", "File too large")
    assert (out / "checkpoint.npz").read_bytes() == before
    assert read_checkpoint(out / "checkpoint.npz").epoch == 1
    assert temporaries(out) == []
    again = hetero_nn(*RESUME_TO_TWO, "--out", out)  # with room again, the run goes on
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_a_full_tmpfs_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    mount, keep = tmp_path / "small", tmp_path / "kept"
    mount.mkdir()
    keep.mkdir()
    run = f"{sys.executable} -m hetero_nn"
    done = with_tmpfs(mount, "size=160k",
                      f"{run} {' '.join(ONE_EPOCH)} --out {mount}/run > /dev/null && "
                      f"cp {mount}/run/checkpoint.npz {keep}/before.npz && "
                      f"{{ {run} {' '.join(RESUME_TO_TWO)} --out {mount}/run 2> {keep}/stderr; "
                      f"echo $? > {keep}/rc; }} && cp -a {mount}/run {keep}/after")
    assert done.returncode == 0, done.stderr
    assert int((keep / "rc").read_text()) != 0
    line = _one_line_naming((keep / "stderr").read_text(), mount / "run" / "checkpoint.npz",
                            "No space left on device")
    assert line.startswith("hetero-nn: error:")
    after = keep / "after"
    assert (after / "checkpoint.npz").read_bytes() == (keep / "before.npz").read_bytes()
    assert read_checkpoint(after / "checkpoint.npz").epoch == 1
    assert temporaries(after) == []
