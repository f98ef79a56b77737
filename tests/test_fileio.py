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


def test_atomic_write_names_the_target_when_the_disk_refuses(tmp_path):
    """A full disk or a file-size limit names the file the user asked for, not the
    temporary one; nothing is left behind."""
    import errno

    target = tmp_path / "checkpoint.npz"
    atomic_write_text(target, "old\n")

    def no_space(f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as info:
        atomic_write(target, no_space)
    assert info.value.filename == str(target) and str(target) in str(info.value)
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["checkpoint.npz"]


def test_atomic_write_syncs_the_folder_after_the_rename(tmp_path, monkeypatch):
    """The rename reaches the disk: the folder is fsync-ed after ``os.replace``."""
    import hetero_nn.fileio as fileio

    events = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(fileio.os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b))[1])

    def fsync(fd):
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        return real_fsync(fd)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    atomic_write_text(tmp_path / "metrics.json", "{}\n")
    assert events == ["fsync file", "replace", "fsync dir"]
