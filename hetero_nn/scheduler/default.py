"""The default runtime: what ``model(x)`` runs on when the model is bound to no runtime.

Policy: created on first use, once per process (under a lock), as
``Runtime(devices="cpu", trace=False)`` (one CPU worker per core, pinned variants,
as the trainer's default); kept until :func:`close_default_runtime` or the end of
the process (an ``atexit`` hook closes it, saving its performance models). A later
use after closing creates a fresh one. :func:`set_default_runtime` installs a
runtime of the caller's (which the caller closes; the package never does).
"""

from __future__ import annotations

import atexit
import threading
from .runtime import Runtime

_lock = threading.Lock()
_runtime = None
_owned = False


def default_runtime():
    """The default runtime, created now if there is none (or the last one was closed)."""
    global _runtime, _owned
    with _lock:
        if _runtime is None or _runtime.closed:
            _runtime, _owned = Runtime(devices="cpu", trace=False), True
        return _runtime


def set_default_runtime(runtime) -> None:
    """Make ``runtime`` the default (None: back to one made on first use); a runtime the
    package made before is closed."""
    global _runtime, _owned
    with _lock:
        previous, owned = _runtime, _owned
        _runtime, _owned = runtime, False
    if owned and previous is not None and previous is not runtime:
        previous.close()


def close_default_runtime() -> None:
    """Close the default runtime if the package made one (its workers stop); the next
    ``model(x)`` makes a new one."""
    global _runtime, _owned
    with _lock:
        runtime, owned = _runtime, _owned
        _runtime, _owned = None, False
    if owned and runtime is not None:
        runtime.close()


atexit.register(close_default_runtime)
