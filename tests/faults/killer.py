"""Run ``hetero-nn`` and SIGKILL it at a chosen moment of a chosen file write.

Usage (by :mod:`harness`, never by the package)::

    python killer.py MOMENT -- train --dataset synthetic ... --out DIR

``MOMENT`` is ``<stage>:<file name>:<n>[:<bytes>]``: the ``n``-th (1-based) atomic
write of ``<file name>`` (``checkpoint.npz``, ``metrics.json`` ...) is killed

- ``write``: after ``<bytes>`` bytes reached its temporary file (mid-write);
- ``fsync``: when the temporary file is about to be synced (all bytes written);
- ``replace``: just before the rename over the target;
- ``renamed``: just after the rename, before the folder is synced.

The process sends itself SIGKILL, so nothing runs after it: no ``finally``, no
``atexit``, no flush — what a power cut or the OOM killer leaves. The hooks wrap
``open``, ``os.fsync`` and ``os.replace`` as :mod:`hetero_nn.fileio` calls them;
the package itself knows nothing of this.
"""

from __future__ import annotations

import builtins
import os
import re
import runpy
import signal
import sys

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


class _Moment:
    def __init__(self, spec: str):
        parts = spec.split(":")
        self.stage, self.name, self.nth = parts[0], parts[1], int(parts[2])
        self.bytes = int(parts[3]) if len(parts) > 3 else 0
        if self.stage not in ("write", "fsync", "replace", "renamed"):
            raise SystemExit(f"killer: unknown stage {self.stage!r}")
        self.seen = 0          # temporaries of the file opened so far
        self.armed_fd = None   # the descriptor of the n-th one

    def target(self, path) -> bool:
        match = _TEMPORARY.match(os.path.basename(os.fspath(path)))
        return bool(match) and match.group("name") == self.name


class _KillingFile:
    """A binary file that dies once ``limit`` bytes went through :meth:`write`."""

    def __init__(self, raw, limit):
        self._raw, self._left = raw, limit

    def write(self, data):
        data = memoryview(data).cast("B")
        if len(data) >= self._left:
            self._raw.write(data[:self._left])
            self._raw.flush()
            _die()
        self._left -= len(data)
        return self._raw.write(data)

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._raw.__exit__(*exc)


def install(moment: _Moment) -> None:
    real_open, real_fsync, real_replace = builtins.open, os.fsync, os.replace

    def open_(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, bytes, os.PathLike)) and "x" in mode and moment.target(file):
            moment.seen += 1
            if moment.seen == moment.nth:
                moment.armed_fd = f.fileno()
                if moment.stage == "write":
                    return _KillingFile(f, moment.bytes)
        return f

    def fsync(fd):
        if moment.stage == "fsync" and fd == moment.armed_fd:
            _die()
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        armed = moment.seen == moment.nth and moment.target(src)
        if armed and moment.stage == "replace":
            _die()
        result = real_replace(src, dst, *args, **kwargs)
        if armed and moment.stage == "renamed":
            _die()
        return result

    builtins.open, os.fsync, os.replace = open_, fsync, replace


def main(argv):
    moment, separator, *command = argv
    assert separator == "--", "usage: killer.py MOMENT -- hetero-nn arguments"
    install(_Moment(moment))
    sys.argv = ["hetero-nn", *command]
    runpy.run_module("hetero_nn", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
