"""Durable, atomic file writes: a temporary file beside the target, fsync, rename, fsync the folder.

Checkpoints, metrics, traces and performance models are all written this way, so
a reader — or a run killed midway, or a machine that loses power — sees either the
old file or the new one, never half of one:

1. the bytes go to ``.<name>.<32 hex>.tmp`` in the target's folder (the rename must
   stay on one file system), which is flushed and ``fsync``-ed;
2. ``os.replace`` puts it over the target (atomic on POSIX);
3. the folder is ``fsync``-ed, so the rename itself survives a crash (without it a
   power cut can leave the folder pointing at the old file, or at none).

A failure at any point removes the temporary file and leaves the target as it was;
the ``OSError`` is re-raised with ``filename`` set to the *target*, so a full disk
or a file-size limit reads ``[Errno 28] No space left on device: 'run/checkpoint.npz'``
rather than naming a temporary file the user never sees.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "atomic_write_text", "fsync_directory"]


def fsync_directory(directory) -> None:
    """Flush ``directory``'s entries (renames, creations) to disk; a no-op where folders
    cannot be opened (Windows) or the file system refuses to sync them."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (and /proc-like mounts) cannot sync a folder
        pass
    finally:
        os.close(fd)


def atomic_write(path, write: Callable) -> Path:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it over.

    The temporary name is ``.<name>.<32 hex>.tmp`` in the same directory; it is removed
    if ``write`` (or the flush, the fsync or the rename) raises, leaving ``path`` as it
    was. An ``OSError`` names ``path`` (see the module docstring).
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename in (None, str(temporary), temporary):
            exc.filename = str(path)
        raise
    fsync_directory(path.parent)
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` for a UTF-8 text file."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))
