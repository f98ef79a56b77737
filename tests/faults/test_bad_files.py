"""Corrupt or truncated files, and a performance-model folder that cannot be written.

What a user meets: a checkpoint cut short by a full disk or a bad copy, a dataset
download that stopped halfway, a damaged model cache, a cache folder that is
read-only. Each is one clear line; a bad run input stops the run (non-zero exit,
nothing written over), a bad cache never does (the run completes and says so once).

Tests run as root, and root writes through permission bits, so "not writable" is
made two real ways: the cache folder's parent is a file (``mkdir`` fails with
ENOTDIR, anywhere), and, where a private mount namespace is allowed (``unshare -m``),
a read-only tmpfs mounted over the cache (EROFS, what a read-only home gives).
"""

import gzip
import json
import socket
import sys

import numpy as np
import pytest

from harness import TRAIN, hetero_nn, temporaries, train_args, with_tmpfs
from helpers import cache_with_shared_trampolines
from hetero_nn.training.checkpoint import read_checkpoint
from hetero_nn.scheduler.perfmodel.model import PerfModel


def _only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _warnings(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert all(line.startswith("hetero-nn: warning: ") for line in lines), stderr
    return lines


# -- checkpoints -------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", pytest.param("garbage", marks=pytest.mark.slow),
                                    pytest.param("empty", marks=pytest.mark.slow)])
def test_a_damaged_checkpoint_is_one_line_and_stays_as_it_was(tmp_path, damage):
    out = tmp_path / "run"
    first = hetero_nn(*train_args(epochs=1), "--out", out)
    assert first.returncode == 0, first.stderr
    good = (out / "checkpoint.npz").read_bytes()
    bad = {"truncated": good[: len(good) // 2], "garbage": b"\x00not a zip" * 100,
           "empty": b""}[damage]
    (out / "checkpoint.npz").write_bytes(bad)
    done = hetero_nn("train", "--out", out, "--resume", "--epochs", "2", "-q")
    assert done.returncode == 2
    line = _only_line(done.stderr)
    assert line.startswith("hetero-nn: error:") and str(out / "checkpoint.npz") in line
    assert (out / "checkpoint.npz").read_bytes() == bad  # kept for the user to look at
    assert read_checkpoint(out / "checkpoint-final.npz").epoch == 1  # the rest untouched


# -- datasets ----------------------------------------------------------------------------

def _idx(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.tobytes()


@pytest.mark.parametrize("cut", ["inside the gzip stream", "inside the data"])
def test_a_truncated_dataset_file_is_one_line(tmp_path, cut):
    rng = np.random.default_rng(0)
    home = tmp_path / "mnist"
    home.mkdir()
    for stem, n in (("train", 64), ("t10k", 16)):
        images = _idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), 2051)
        labels = _idx(rng.integers(0, 10, n).astype(np.uint8), 2049)
        (home / f"{stem}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        (home / f"{stem}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    victim = home / "train-images-idx3-ubyte.gz"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] if cut == "inside the gzip stream"
                       else gzip.compress(gzip.decompress(data)[:-100]))
    out = tmp_path / "run"
    done = hetero_nn("train", "--dataset", "mnist", "--data-dir", tmp_path, "--epochs", "1",
                     "--out", out, "-q")
    assert done.returncode == 2
    line = _only_line(done.stderr)
    assert str(victim) in line and "truncated" in line
    assert "uncompressed size" not in line or cut == "inside the data"
    assert not out.exists()  # refused before anything was written


# -- performance models ------------------------------------------------------------------

def test_damaged_perfmodel_files_are_set_aside_and_the_run_completes(tmp_path):
    cache = cache_with_shared_trampolines(tmp_path / "cache")
    first = hetero_nn(*TRAIN, "--out", tmp_path / "first", extra_env={"HETERO_NN_CACHE": cache})
    assert first.returncode == 0, first.stderr
    folder = PerfModel(cache).directory
    files = sorted(folder.glob("*.json"))
    assert files, "the first run saved no performance model"
    damaged = files[:3]
    for path in damaged:
        path.write_bytes(path.read_bytes()[:40])  # cut short
    done = hetero_nn(*TRAIN, "--out", tmp_path / "second", extra_env={"HETERO_NN_CACHE": cache})
    assert done.returncode == 0, done.stderr
    lines = _warnings(done.stderr)
    assert len(lines) == len(damaged)  # one line per file, each naming it
    for path in damaged:
        assert any(str(path) in line and "set aside" in line for line in lines), lines
        assert list(folder.glob(f"{path.name}.corrupt-*"))
        json.loads(path.read_text())  # a fresh, whole model in its place


def test_a_perfmodel_folder_below_a_file_warns_once_and_the_run_completes(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    done = hetero_nn(*TRAIN, "--out", tmp_path / "run", extra_env={"HETERO_NN_CACHE": blocker})
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in _warnings(done.stderr) if "could not save" in line]
    assert str(blocker) in line
    assert read_checkpoint(tmp_path / "run" / "checkpoint-final.npz").epoch == 2
    assert temporaries(tmp_path / "run") == []


@pytest.mark.slow
def test_a_read_only_perfmodel_folder_warns_once_and_the_run_completes(tmp_path):
    cache, keep = tmp_path / "cache", tmp_path / "kept"
    folder = PerfModel(cache, hostname=socket.gethostname()).directory
    folder.mkdir(parents=True)
    keep.mkdir()
    command = " ".join([sys.executable, "-m", "hetero_nn", *TRAIN, "--out", str(tmp_path / "run")])
    done = with_tmpfs(folder, "ro,size=64k",
                      f"{{ HETERO_NN_CACHE={cache} {command} 2> {keep}/stderr; echo $? > {keep}/rc; }}")
    assert done.returncode == 0, done.stderr
    assert int((keep / "rc").read_text()) == 0, (keep / "stderr").read_text()
    (line,) = [line for line in _warnings((keep / "stderr").read_text()) if "could not save" in line]
    assert str(folder) in line and "Read-only file system" in line
    assert read_checkpoint(tmp_path / "run" / "checkpoint-final.npz").epoch == 2
    assert list(folder.iterdir()) == []  # the mount is gone: nothing reached the real folder
