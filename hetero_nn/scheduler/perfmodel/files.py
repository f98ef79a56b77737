"""The performance models' files: their format, reading them, and the directory's lock.

A codelet's file is ``{"format": "hetero_nn-perfmodel", "version", "hostname",
"codelet", "entries"}``, the links' ``{"format": "hetero_nn-transfers", "version",
"hostname", "links"}`` (:class:`~hetero_nn.scheduler.perfmodel.model.PerfModel`'s
docstring says where they live and when they are written). A file that is not ours in
this version, or that cannot be parsed, is set aside under the directory's lock (renamed
to ``<name>.corrupt-<time>-<pid>``), never deleted; :class:`ModelFiles` holds those
methods for ``PerfModel``, which inherits them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from ...fileio import atomic_write_text, fsync_directory
from .history import History, LinkStats, default_link

try:  # advisory lock between processes saving into the same directory
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

FORMAT_VERSION = 1
_CODELET_FORMAT = "hetero_nn-perfmodel"
_TRANSFER_FORMAT = "hetero_nn-transfers"
_LOCK_FILE = ".lock"
FLOCK_TIMEOUT = 10.0  # seconds a save waits for another process's lock (then warns, keeps)


class ModelFiles:
    """Reading a :class:`~hetero_nn.scheduler.perfmodel.model.PerfModel`'s files, setting
    aside the unusable ones, and the directory's lock (the model's ``directory``,
    ``_flock_held`` and ``_warn``)."""

    def _read_doc(self, path: Path, fmt: str, parse, codelet: str | None = None):
        """``parse(doc)`` of the JSON document at ``path``; ``None`` when there is none.

        A file that is not ours in this version, names another codelet than
        ``codelet``, or that ``parse`` refuses (``KeyError``, ``TypeError``,
        ``ValueError``) is set aside (:meth:`_set_aside`); one that cannot be
        read is only warned about.
        """
        try:
            with open(path, "rb") as f:
                identity = _identity(os.fstat(f.fileno()))
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):  # no model (no folder) yet
            return None
        except OSError as exc:  # once per folder and cause, not once per codelet
            self._warn(f"ignoring the perfmodel files in {path.parent}: cannot read them "
                       f"({exc.strerror or exc})")
            return None
        try:
            doc = json.loads(raw)  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        except ValueError as exc:
            problem = f"not JSON ({exc})"
        else:
            if not isinstance(doc, dict) or doc.get("format") != fmt:
                problem = f"not a {fmt} file"
            elif doc.get("version") != FORMAT_VERSION:
                problem = (f"format version {doc.get('version')!r}, this hetero_nn reads "
                           f"version {FORMAT_VERSION}")
            elif codelet is not None and doc.get("codelet") != codelet:
                problem = f"it holds codelet {doc.get('codelet')!r}, not {codelet!r}"
            else:
                try:
                    return parse(doc)
                except (KeyError, TypeError, ValueError) as exc:
                    problem = f"bad entry ({exc!r})"
        self._set_aside(path, identity, problem)
        return None

    def _set_aside(self, path: Path, identity: tuple, problem: str) -> None:
        """Rename the unusable file at ``path`` to ``<name>.corrupt-<time>-<pid>`` and warn.

        Under the directory's lock, and only if ``path`` is still the file that
        was read (``identity``): another process may have replaced it with a
        good one meanwhile. Where it cannot be renamed, it is only ignored (the
        next successful save replaces it).
        """
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            with self._file_lock():
                if _identity(os.stat(path)) != identity:
                    return  # replaced since it was read: read again on the next touch
                os.replace(path, aside)
                fsync_directory(path.parent)
        except OSError as exc:
            self._warn(f"ignoring perfmodel file {path}: {problem}; could not set it aside ({exc})")
            return
        self._warn(f"perfmodel file {path} is unusable: {problem}; set aside as {aside.name}, "
                   f"a fresh model starts")

    def _read_codelet_file(self, path: Path, codelet: str) -> dict[tuple, History]:
        found = self._read_doc(path, _CODELET_FORMAT, lambda doc: self._parse_codelet(doc, codelet),
                               codelet)
        return found if found is not None else {}

    @staticmethod
    def _parse_codelet(doc: dict, codelet: str) -> dict[tuple, History]:
        out: dict[tuple, History] = {}
        for row in doc["entries"]:
            key = (codelet, row["variant"], row["kind"], row["footprint"])
            if not all(isinstance(k, str) for k in key):
                raise ValueError(f"non-string key {key!r}")
            out[key] = History.from_json(row).merged(out.get(key))
        return out

    def _read_transfers_file(self, path: Path) -> dict[tuple, LinkStats]:
        found = self._read_doc(path, _TRANSFER_FORMAT, _parse_links)
        return found if found is not None else {}

    @contextlib.contextmanager
    def _file_lock(self):
        """Exclusive advisory lock on the directory against other savers (no-op without fcntl).

        Re-entrant per thread: a save that finds a corrupt file sets it aside under
        the lock it holds (a second ``flock`` on a new descriptor would wait forever).
        """
        held = self._flock_held
        if fcntl is None or getattr(held, "depth", 0):
            held.depth = getattr(held, "depth", 0) + 1
            try:
                yield
            finally:
                held.depth -= 1
            return
        with open(self.directory / _LOCK_FILE, "a+") as f:
            deadline = time.monotonic() + FLOCK_TIMEOUT  # a stuck saver elsewhere: warn, go on
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{f.name} held by another process for "
                                           f"{FLOCK_TIMEOUT:g} s") from None
                    time.sleep(0.005)
            held.depth = 1
            try:
                yield
            finally:
                held.depth = 0
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _identity(stat: os.stat_result) -> tuple:
    """What tells one version of a file from another: inode, size, modification time."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _parse_links(doc: dict) -> dict[tuple, LinkStats]:
    out: dict[tuple, LinkStats] = {}
    for row in doc["links"]:
        key = (row["src"], row["dst"])
        if not all(isinstance(k, str) for k in key):
            raise ValueError(f"non-string link {key!r}")
        out[key] = LinkStats.from_json(row).merged(out.get(key))
    return out


def _codelet_doc(hostname: str, codelet: str, histories: dict[tuple, History]) -> dict:
    entries = [{"variant": k[1], "kind": k[2], "footprint": k[3], **h.to_json()}
               for k, h in sorted(histories.items(), key=lambda kv: kv[0])]
    return {"format": _CODELET_FORMAT, "version": FORMAT_VERSION, "hostname": hostname,
            "codelet": codelet, "entries": entries}


def _transfers_doc(hostname: str, links: dict[tuple, LinkStats]) -> dict:
    rows = []
    for (src, dst), stats in sorted(links.items()):
        latency, spb = stats.fit(default_link(src, dst))
        rows.append({"src": src, "dst": dst, **stats.to_json(),
                     "latency_s": latency, "bandwidth_Bps": 1.0 / spb if spb > 0 else None})
    return {"format": _TRANSFER_FORMAT, "version": FORMAT_VERSION, "hostname": hostname,
            "links": rows}


def _write_json_atomic(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON to a temporary file beside ``path`` and rename it over ``path``."""
    atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
