"""Atomic writes: what checkpoints, metrics, traces and performance models rely on."""

import os

import pytest

from hetero_nn.fileio import atomic_write, atomic_write_text


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "metrics.json"
    atomic_write_text(target, "old\n")

    def failing(f):
        f.write(b"half a file")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, failing)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["metrics.json"]
