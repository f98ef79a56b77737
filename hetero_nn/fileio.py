"""Atomic file writes: a temporary file beside the target, then ``os.replace``.

Checkpoints, metrics, traces and performance models are all written this way,
so a reader — or a run killed midway — never sees a half-written file.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable


def atomic_write(path, write: Callable) -> Path:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it over.

    The temporary name is ``.<name>.<32 hex>.tmp`` in the same directory (so the rename
    stays on one file system); it is removed if ``write`` raises, leaving ``path`` as it
    was.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` for a UTF-8 text file."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))
