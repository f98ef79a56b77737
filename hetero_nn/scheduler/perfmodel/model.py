"""Performance models: measured run times per codelet variant, and transfer costs per link.

This module owns what the scheduler knows about how long things take, as StarPU's
history-based and regression performance models do, and the files that keep it
between runs (shown by ``hetero-nn perfmodel``, like ``starpu_perfmodel_display``;
the display lives in :mod:`hetero_nn.cli.perfmodel`).

State, all behind one lock (``PerfModel._lock``):

``_history``   {(codelet, variant, kind, footprint): History}
    Every measurement since the model was created, plus what was on disk when the
    codelet was first touched: count, mean and M2 (Welford), and the mean size.
``_pending``   same keys: only the measurements not yet saved. ``save()`` adds these
    to what is on disk *now*, so two processes never erase or double-count each
    other's measurements.
``_groups``    {(codelet, variant, kind): {footprint: History}} (same objects as
    ``_history``), the points of the regression on size.
``_fits``      {(codelet, variant, kind): Regression or None}, fitted lazily and
    dropped when a footprint appears or when a footprint's count reaches a power
    of two, so a steady stream of records refits only logarithmically often.
``_links``, ``_links_pending``, ``_link_fits``
    The same for transfers, per (src node, dst node): weighted sums for
    ``t = latency + nbytes / bandwidth`` and the fitted (latency, seconds per byte).

Predictions
    ``predict`` returns the history mean when the footprint (operand shapes and
    dtypes) has been measured; otherwise StarPU's non-linear regression
    ``t = a * size**b + c`` fitted over the other footprints of the same
    (codelet, variant, kind) — a least-squares fit of ``log t`` on ``log size``,
    with ``c`` (a fixed per-task cost) searched when at least 3 distinct sizes
    exist; with fewer than 2 distinct sizes the answer is ``None`` (unknown).
    ``predict_transfer`` is ``latency + nbytes * seconds_per_byte``, fitted by
    least squares weighted by ``1 / t**2`` (timing noise is relative); before any
    record it uses defaults by node kind read from the names.

Files: ``<cache dir>/perfmodels/<hostname>/<codelet>.json`` (one per codelet,
loaded lazily the first time the codelet is recorded or predicted) and
``_transfers.json`` beside them. Each carries ``format`` and ``version``.

Durability
    Writes go to a temporary name, are fsync-ed and renamed, and the folder is
    fsync-ed (:func:`~hetero_nn.fileio.atomic_write`), under an advisory file lock
    (POSIX ``flock``) against other processes. The runtime saves at ``close()``,
    the trainer at every epoch end, and :meth:`PerfModel.save_if_due` (called by
    the runtime after each flush) every ``save_every`` seconds, so a killed
    process loses at most that much calibration. A save that fails (a full disk,
    a folder that cannot be made) warns once with a :class:`PerfModelWarning`
    naming the file, keeps the measurements in memory and tries again at the next
    save; it never stops a run.
    A file that cannot be used (not JSON, not ours, another format version, a bad
    entry) is *set aside*: renamed ``<name>.corrupt-<time>-<pid>`` under the lock,
    kept for a post-mortem, with a warning naming both; the codelet's model starts
    fresh and the next save writes a new file.

>>> import tempfile
>>> pm = PerfModel(tempfile.mkdtemp())
>>> for _ in range(3):
...     pm.record("scale", "cpu", "cpu", "f64[1000]", 1000.0, 2e-6)
>>> pm.predict("scale", "cpu", "cpu", "f64[1000]", 1000.0), pm.count("scale", "cpu", "cpu", "f64[1000]")
(2e-06, 3)
>>> pm.predict("scale", "cpu", "cpu", "f64[9]", 9.0) is None   # one size only: no regression
True
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from .files import (_CODELET_FORMAT, FORMAT_VERSION, ModelFiles, _codelet_doc, _transfers_doc,
                    _write_json_atomic)
from .history import RECENT, History, LinkStats, Regression, default_link, fit_regression

__all__ = ["PerfModel", "PerfModelWarning", "Regression", "default_cache_dir", "fit_regression",
           "FORMAT_VERSION"]

_TRANSFERS_FILE = "_transfers.json"
#: Default seconds between the saves :meth:`PerfModel.save_if_due` makes.
SAVE_EVERY = 60.0

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_MISSING = object()


class PerfModelWarning(UserWarning):
    """A performance-model file could not be used (corrupt, foreign, unwritable)."""


def default_cache_dir() -> Path:
    """The cache directory: ``$HETERO_NN_CACHE`` when set, else ``~/.cache/hetero_nn``."""
    env = os.environ.get("HETERO_NN_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hetero_nn"


def _file_stem(name: str) -> str:
    """A file name for ``name``: itself when it is safe, else a sanitised form plus a hash.

    The hash keeps two names that sanitise alike (``"a/b"``, ``"a_b"``) apart;
    names starting with ``_`` or ``.`` get one too, so no codelet can take the
    transfers file or a hidden name.
    """
    if _SAFE_NAME.match(name) and len(name) <= 120:
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._")[:80] or "x"
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:10]
    return f"{safe}-{digest}"


class PerfModel(ModelFiles):
    """Measured run times per (codelet, variant, device kind, footprint) and transfer costs.

    Parameters
    ----------
    cache_dir : str or path, optional
        Root of the cache; default :func:`default_cache_dir`. Models live in
        ``<cache_dir>/perfmodels/<hostname>/``.
    load : bool
        Read what is on disk (lazily, per codelet). With ``False`` the model starts
        empty; ``save()`` still adds to, never replaces, what is on disk.
    hostname : str, optional
        Whose models to read and write; default this machine's name.
    save_every : float or None
        Seconds between the saves :meth:`save_if_due` makes (default
        :data:`SAVE_EVERY`); ``None``: only explicit ``save()`` calls.

    Notes
    -----
    ``record``, ``predict``, ``predict_transfer`` and ``count`` are called per task
    from worker threads: they are a few dict lookups, and ``record`` holds the
    lock only for the update. All methods are thread-safe.
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None, *, load: bool = True,
                 hostname: str | None = None, save_every: float | None = SAVE_EVERY):
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.hostname = hostname or socket.gethostname() or "localhost"
        self.directory = root / "perfmodels" / _file_stem(self.hostname)
        self.load = bool(load)
        self._lock = threading.RLock()
        self._loaded: set[str] = set()
        self._history: dict[tuple, History] = {}
        self._pending: dict[tuple, History] = {}
        self._groups: dict[tuple, dict[str, History]] = {}
        self._fits: dict[tuple, Regression | None] = {}
        self._transfers_loaded = False
        self._links: dict[tuple, LinkStats] = {}
        self._links_pending: dict[tuple, LinkStats] = {}
        self._link_fits: dict[tuple, tuple[float, float]] = {}
        self._warned: set[str] = set()
        self.save_every = save_every
        self._last_save = time.monotonic()
        self._save_failing = False   # a save failed and was warned about; reset by a good one
        self._flock_held = threading.local()

    def __repr__(self):
        return f"PerfModel({str(self.directory)!r}, keys={len(self._history)}, links={len(self._links)})"

    # -- hot calls -----------------------------------------------------------------

    def record(self, codelet: str, variant: str, kind: str, footprint: str,
               size: float, seconds: float) -> None:
        """Add one measured run; thread-safe.

        Parameters
        ----------
        codelet, variant, kind, footprint : str
            The key; ``footprint`` names the operands' shapes and dtypes.
        size : float
            The codelet's work figure (``Codelet.work``), for the regression.
        seconds : float
            Measured run time; must be >= 0.
        """
        self.record_many([(codelet, variant, kind, footprint, size, seconds)])

    def record_many(self, runs) -> None:
        """Add measured runs ``(codelet, variant, kind, footprint, size, seconds)``.

        One lock acquisition for all of them: the runtime feeds a flushed
        graph's measurements at once rather than contending per task.
        """
        batches: dict = {}
        for codelet, variant, kind, footprint, size, seconds in runs:
            if not seconds >= 0.0:  # also catches NaN
                raise ValueError(f"perfmodel record for {codelet!r}: run time {seconds!r} s is not >= 0")
            key = (codelet, variant, kind, footprint)
            batch = batches.get(key)
            if batch is None:
                batch = batches[key] = (size, [])
            batch[1].append(seconds)
        self._absorb({key: History.of(size, seconds) for key, (size, seconds) in batches.items()})

    def record_array(self, codelet: str, variant: str, kind: str, footprint: str, size: float,
                     ns, idx, skip: int = 0) -> None:
        """Add the runs of one key whose times are ``ns[idx[skip:]]``, nanoseconds (the
        replay engine's stamps of a graph's tasks): :meth:`record_many` without a tuple
        per run, in one compiled pass (:meth:`History.of_nanoseconds`)."""
        if len(idx) <= skip:
            return
        runs = History.of_nanoseconds(float(size), ns, idx, skip)
        if runs is None:
            seconds = np.asarray(ns)[np.asarray(idx)[skip:]] * 1e-9
            raise ValueError(f"perfmodel record for {codelet!r}: run times "
                             f"{seconds[~(seconds >= 0.0)][:3].tolist()} s are not >= 0")
        self._absorb({(codelet, variant, kind, footprint): runs})

    def _absorb(self, batches) -> None:
        """Merge ``{key: History of new runs}`` into the model under its lock."""
        for codelet in {key[0] for key in batches}:
            if codelet not in self._loaded:
                self._load_codelet(codelet)
        with self._lock:
            for key, runs in batches.items():
                history = self._history.get(key)
                if history is None:
                    history = self._history[key] = History()
                    self._groups.setdefault(key[:3], {})[key[3]] = history
                before = history.count
                history.absorb(runs)
                if before == 0 or before.bit_length() != history.count.bit_length():
                    self._fits.pop(key[:3], None)  # new footprint or count passed a power of two
                pending = self._pending.get(key)
                if pending is None:
                    pending = self._pending[key] = History()
                pending.absorb(runs)

    def predict(self, codelet: str, variant: str, kind: str, footprint: str,
                size: float) -> float | None:
        """Expected run time in seconds, or ``None`` when nothing is known.

        The history's estimate for a measured footprint (the median of its recent runs:
        an outlier does not move it); else the regression on ``size`` over the other
        footprints of (codelet, variant, kind).
        """
        if codelet not in self._loaded:
            self._load_codelet(codelet)
        history = self._history.get((codelet, variant, kind, footprint))
        if history is not None:
            return history.estimate
        fit = self._fits.get((codelet, variant, kind), _MISSING)
        if fit is _MISSING:
            fit = self.fit(codelet, variant, kind)
        if fit is None or not size > 0:
            return None
        return fit(size)

    def count(self, codelet: str, variant: str, kind: str, footprint: str) -> int:
        """Number of measurements of this key (on disk and in this process)."""
        if codelet not in self._loaded:
            self._load_codelet(codelet)
        history = self._history.get((codelet, variant, kind, footprint))
        return history.count if history is not None else 0

    def record_transfer(self, src: str, dst: str, nbytes: int, seconds: float) -> None:
        """Add one measured copy of ``nbytes`` from memory node ``src`` to ``dst``; thread-safe."""
        if not seconds >= 0.0:
            raise ValueError(f"perfmodel transfer {src}->{dst}: time {seconds!r} s is not >= 0")
        if not self._transfers_loaded:
            self._load_transfers()
        key = (src, dst)
        with self._lock:
            stats = self._links.get(key)
            if stats is None:
                stats = self._links[key] = LinkStats()
            stats.add(float(nbytes), seconds)
            self._link_fits[key] = stats.fit(default_link(src, dst))
            pending = self._links_pending.get(key)
            if pending is None:
                pending = self._links_pending[key] = LinkStats()
            pending.add(float(nbytes), seconds)

    def predict_transfer(self, src: str, dst: str, nbytes: int) -> float:
        """Expected seconds to copy ``nbytes`` from ``src`` to ``dst``: 0 on the same node."""
        if src == dst:
            return 0.0
        if not self._transfers_loaded:
            self._load_transfers()
        fit = self._link_fits.get((src, dst))
        if fit is None:  # cache the default; a record's fit replaces it (setdefault is atomic)
            fit = self._link_fits.setdefault((src, dst), default_link(src, dst))
        return fit[0] + nbytes * fit[1]

    # -- regression and display ------------------------------------------------------

    def fit(self, codelet: str, variant: str, kind: str) -> Regression | None:
        """The regression on size of (codelet, variant, kind), fitted if stale; ``None`` if unknown."""
        if codelet not in self._loaded:
            self._load_codelet(codelet)
        group = (codelet, variant, kind)
        with self._lock:
            fit = self._fits.get(group, _MISSING)
            if fit is _MISSING:
                footprints = self._groups.get(group, {})
                fit = fit_regression([(h.size, h.estimate) for h in footprints.values()])
                self._fits[group] = fit
            return fit

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bandwidth bytes/s) used for ``src -> dst``: fitted, else the default."""
        if not self._transfers_loaded:
            self._load_transfers()
        latency, spb = self._link_fits.get((src, dst)) or default_link(src, dst)
        return latency, (1.0 / spb if spb > 0 else math.inf)

    def codelets(self) -> list[str]:
        """Names of the codelets with a model, on disk or in memory, sorted."""
        self._load_all()
        with self._lock:
            return sorted({key[0] for key in self._history})

    def entries(self, codelet: str | None = None) -> list[dict]:
        """One row per (codelet, variant, kind, footprint), by size in each group; times in seconds.

        Keys: ``codelet, variant, kind, footprint, size, count, mean, var, stddev``, and
        ``median``, the estimate predictions use (of the recent runs).
        """
        if codelet is None:
            self._load_all()
        elif codelet not in self._loaded:
            self._load_codelet(codelet)
        with self._lock:
            items = [(k, h.merged(None)) for k, h in self._history.items()
                     if codelet is None or k[0] == codelet]
        rows = []
        items.sort(key=lambda kv: (kv[0][:3], kv[1].size, kv[0][3]))  # by size within a group
        for (name, variant, kind, footprint), h in items:
            var = h.variance
            rows.append({"codelet": name, "variant": variant, "kind": kind, "footprint": footprint,
                         "size": h.size, "count": h.count, "mean": h.mean, "var": var,
                         "stddev": math.sqrt(var), "median": h.estimate})
        return rows

    def transfer_entries(self) -> list[dict]:
        """One row per measured link: ``src, dst, count, mean_bytes, latency, bandwidth``."""
        if not self._transfers_loaded:
            self._load_transfers()
        with self._lock:
            items = sorted((k, s.count, s.mean_x, self._link_fits[k]) for k, s in self._links.items())
        return [{"src": src, "dst": dst, "count": n, "mean_bytes": mean_x, "latency": lat,
                 "bandwidth": 1.0 / spb if spb > 0 else math.inf}
                for (src, dst), n, mean_x, (lat, spb) in items]

    # -- files -----------------------------------------------------------------------

    def path_for(self, codelet: str) -> Path:
        """The JSON file of ``codelet``'s model."""
        return self.directory / f"{_file_stem(codelet)}.json"

    def save_if_due(self) -> bool:
        """:meth:`save` if ``save_every`` seconds passed since the last one; whether it saved.

        The runtime calls it after every flush, from the thread that waited, so
        a long run keeps its calibration on disk without a thread of its own.
        """
        if self.save_every is None or time.monotonic() - self._last_save < self.save_every:
            return False
        self.save()
        return True

    def save(self) -> None:
        """Add the measurements not yet saved to the files on disk; thread-safe.

        Reads each file again under the directory's lock, merges, writes to a
        temporary name and renames, so concurrent savers lose nothing. Never
        raises for a file problem: the first failure gives a
        :class:`PerfModelWarning` naming the file (later ones are quiet until a
        save succeeds again) and the measurements stay pending.
        """
        self._last_save = time.monotonic()
        with self._lock:
            pending, self._pending = self._pending, {}
            links_pending, self._links_pending = self._links_pending, {}
        if not pending and not links_pending:
            return
        by_codelet: dict[str, dict[tuple, History]] = {}
        for key, delta in pending.items():
            by_codelet.setdefault(key[0], {})[key] = delta
        saved: dict[str, dict[tuple, History]] = {}
        saved_links: dict[tuple, LinkStats] | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._file_lock():
                for codelet, deltas in by_codelet.items():
                    path = self.path_for(codelet)
                    merged = self._read_codelet_file(path, codelet)
                    for key, delta in deltas.items():
                        merged[key] = (merged.get(key) or History()).merged(delta)  # delta last
                    try:
                        _write_json_atomic(path, _codelet_doc(self.hostname, codelet, merged))
                    except OSError as exc:
                        self._save_failed(f"could not save perfmodel file {path}: {exc}")
                        continue
                    saved[codelet] = merged
                if links_pending:
                    path = self.directory / _TRANSFERS_FILE
                    merged_links = self._read_transfers_file(path)
                    for key, delta in links_pending.items():
                        merged_links[key] = delta.merged(merged_links.get(key))
                    try:
                        _write_json_atomic(path, _transfers_doc(self.hostname, merged_links))
                        saved_links = merged_links
                    except OSError as exc:
                        self._save_failed(f"could not save perfmodel file {path}: {exc}")
        except OSError as exc:
            self._save_failed(f"could not save performance models in {self.directory}: {exc}")
        with self._lock:
            if len(saved) == len(by_codelet) and (saved_links is not None or not links_pending):
                self._save_failing = False
            for codelet, deltas in by_codelet.items():  # put back what did not reach the disk
                if codelet not in saved:
                    for key, delta in deltas.items():
                        self._pending[key] = delta.merged(self._pending.get(key))
            if saved_links is None:
                for key, delta in links_pending.items():
                    self._links_pending[key] = delta.merged(self._links_pending.get(key))
            if self.load:  # adopt the merged files: other processes' measurements too
                for codelet, merged in saved.items():
                    self._replace_codelet(codelet, merged)
                if saved_links is not None:
                    for key, stats in saved_links.items():
                        total = stats.merged(self._links_pending.get(key))
                        self._links[key] = total
                        self._link_fits[key] = total.fit(default_link(*key))

    def _replace_codelet(self, codelet: str, merged: dict[tuple, History]) -> None:
        """Under the lock: the totals of ``codelet`` become ``merged`` plus what is pending now."""
        for key in [k for k in self._history if k[0] == codelet]:
            del self._history[key]
        for group in [g for g in self._groups if g[0] == codelet]:
            del self._groups[group]
            self._fits.pop(group, None)
        keys = set(merged) | {k for k in self._pending if k[0] == codelet}
        for key in keys:
            base = merged.get(key)
            total = (base or History()).merged(self._pending.get(key))
            self._history[key] = total
            self._groups.setdefault(key[:3], {})[key[3]] = total
            self._fits.pop(key[:3], None)

    def _load_codelet(self, codelet: str) -> None:
        """First touch of ``codelet``: read its file (outside the lock) and add it to the totals."""
        disk = self._read_codelet_file(self.path_for(codelet), codelet) if self.load else {}
        self._adopt(codelet, disk)

    def _adopt(self, codelet: str, disk: dict[tuple, History]) -> None:
        with self._lock:
            if codelet in self._loaded:
                return
            for key, stats in disk.items():
                total = stats.merged(self._history.get(key))
                self._history[key] = total
                self._groups.setdefault(key[:3], {})[key[3]] = total
                self._fits.pop(key[:3], None)
            self._loaded.add(codelet)

    def _load_all(self) -> None:
        """Read every codelet file of the directory (for display)."""
        if not self.load:
            return
        try:
            paths = sorted(self.directory.glob("*.json"))
        except OSError:
            paths = []
        for path in paths:
            if path.name == _TRANSFERS_FILE:
                continue
            found = self._read_doc(path, _CODELET_FORMAT, lambda doc, path=path: self._named(path, doc))
            if found is not None and found[0] not in self._loaded:
                self._adopt(*found)
        if not self._transfers_loaded:
            self._load_transfers()

    def _named(self, path: Path, doc: dict) -> tuple[str, dict]:
        """``(codelet, entries)`` of a codelet file found by listing the folder."""
        codelet = doc.get("codelet")
        if not isinstance(codelet, str) or self.path_for(codelet) != path:
            where = self.path_for(codelet).name if isinstance(codelet, str) else "?"
            raise ValueError(f"it names codelet {codelet!r}, whose file would be {where}")
        return codelet, self._parse_codelet(doc, codelet)

    def _load_transfers(self) -> None:
        disk = self._read_transfers_file(self.directory / _TRANSFERS_FILE) if self.load else {}
        with self._lock:
            if self._transfers_loaded:
                return
            for key, stats in disk.items():
                total = stats.merged(self._links.get(key))
                self._links[key] = total
                self._link_fits[key] = total.fit(default_link(*key))
            self._transfers_loaded = True

    def _warn(self, message: str) -> None:
        """Warn once per message and instance: a cache file must never stop a training run."""
        with self._lock:
            if message in self._warned:
                return
            self._warned.add(message)
        warnings.warn(message, PerfModelWarning, stacklevel=3)

    def _save_failed(self, message: str) -> None:
        """Warn about a failed save once, until a save succeeds again (a timer retries it)."""
        with self._lock:
            if self._save_failing:
                return
            self._save_failing = True
        warnings.warn(f"{message}; the measurements stay in memory and the next save tries "
                      "again", PerfModelWarning, stacklevel=3)
