"""Where a runtime keeps its trace records: bounded in memory, optionally streamed to a file.

Policy
------
A long training run must not grow. The runtime hands its :class:`TraceBuffer` the
records of each flush as one unit (:meth:`TraceBuffer.add_flush`); the buffer keeps
the last ``flushes`` of them (default :data:`TRACE_FLUSHES`) and forgets older ones,
so memory is flat after the first ``flushes`` flushes whatever the run's length.
``flushes=None`` keeps everything, for a caller that empties the buffer itself
(the CLI takes the records of every step with ``trace(clear=True)``).

With a ``path``, every record is also appended to that file as it arrives (JSON
Lines, format :data:`STREAM_FORMAT`): a header line naming the workers, then one
line per task (``{"task": {...}}``) or copy (``{"transfer": {...}}``), written
and flushed at the end of each flush. The file is created (or truncated) with the
buffer and stays empty until the first flush ends (an empty stream: no task ran). Nothing of the file is kept in memory, so
the whole run's trace survives without the run holding it; a process killed
mid-write leaves at most a torn last line, which :func:`read_stream` skips. The trace
is an observer: a stream that cannot be written (a full disk, ``/dev/full``) warns once
(:class:`TraceWarning`) and is written no more; the run and the records in memory go on.
:meth:`Trace.from_json <hetero_nn.scheduler.trace.Trace.from_json>` reads both
this stream and the single document of :meth:`Trace.to_json`.

State
-----
``_flushes``: deque of ``(task records, transfer records)``, one per flush, at most
``flushes`` long. ``_transfers``: copies since the last flush ended (copies run on
stream threads and at fetches, between flushes); appends and the swap at a
flush's end are single bytecode operations, safe without a lock.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections import deque
from pathlib import Path

from ...errors import ConfigError
from .records import TaskRecord, TransferRecord

__all__ = ["TraceBuffer", "TraceWarning", "TRACE_FLUSHES", "STREAM_FORMAT", "read_stream",
           "is_stream"]

#: Flushes a runtime's trace keeps by default (a training step is one to a few).
TRACE_FLUSHES = 100
STREAM_FORMAT = "hetero_nn.trace-stream"
STREAM_VERSION = 1


class TraceWarning(UserWarning):
    """The trace stream could not be written (the run goes on; see :class:`TraceBuffer`)."""


class TraceBuffer:
    """The task and transfer records of a runtime's last flushes (and optionally a file).

    Parameters
    ----------
    flushes : int or None
        How many flushes to keep in memory; ``None``: all of them.
    path : str or path, optional
        A file to stream every record to (JSON Lines, created or truncated now).
    workers : list of str
        The runtime's workers, for the stream's header (the runtime sets
        :attr:`workers` once it has made them).
    """

    def __init__(self, flushes: int | None = TRACE_FLUSHES, path=None, workers=()):
        if flushes is not None and (not isinstance(flushes, int) or isinstance(flushes, bool)
                                    or flushes < 1):
            raise ConfigError(f"trace_flushes: expected a positive int or None, got {flushes!r}")
        self.flushes = flushes
        self._flushes: deque = deque(maxlen=flushes)
        self._transfers: list = []
        self.workers = list(workers)
        self.path = Path(path) if path is not None else None
        self._header_written = False
        if self.path is not None:
            open(self.path, "w").close()  # created (or emptied) now: a bad path fails early

    def add_transfer(self, record: TransferRecord) -> None:
        """Keep one copy between memory nodes (from any thread)."""
        self._transfers.append(record)

    def add_flush(self, records: list) -> None:
        """End a flush: ``records`` and the copies since the last one become one unit.

        ``records``: :class:`TaskRecord` s or tuples of their fields in order, or what
        yields them (what the runtime hands over: a
        :class:`~hetero_nn.scheduler.trace.records.FlatRecords`, a replay's records),
        made ``TaskRecord`` s only when read."""
        transfers, self._transfers = self._transfers, []
        if not records and not transfers:
            return
        self._flushes.append((records, transfers))
        if self.path is not None:
            lines = [] if self._header_written else [json.dumps(
                {"format": STREAM_FORMAT, "version": STREAM_VERSION, "workers": self.workers})]
            self._header_written = True
            lines += [json.dumps({"task": _fields(r)}) for r in records]
            lines += [json.dumps({"transfer": dataclasses.asdict(t)}) for t in transfers]
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write("\n".join(lines) + "\n")
            except OSError as exc:  # an observer: the run goes on, in memory only
                warnings.warn(f"trace stream {self.path}: {type(exc).__name__}: {exc}; "
                              "the rest of the run's trace is kept in memory only "
                              "(Runtime(trace_flushes=) flushes)", TraceWarning, stacklevel=2)
                self.path = None

    def extend(self, other: "TraceBuffer") -> None:
        """Add ``other``'s flushes after this buffer's, as if they had ended here."""
        for records, transfers in other._flushes:
            self._transfers.extend(transfers)
            self.add_flush(records)
        self._transfers.extend(other._transfers)

    def records(self) -> list:
        """Task records of the flushes kept, oldest first."""
        return [r if type(r) is TaskRecord else TaskRecord(*r)
                for records, _ in self._flushes for r in records]

    def per_flush(self) -> list:
        """Per flush kept, oldest first, its task records as kept (for
        :meth:`Trace.of_flushes <hetero_nn.scheduler.trace.Trace.of_flushes>`)."""
        return [records for records, _ in self._flushes]

    def transfers(self) -> list:
        """Transfer records of the flushes kept, then those since the last flush."""
        return [t for _, transfers in self._flushes for t in transfers] + list(self._transfers)

    def clear(self) -> None:
        """Forget what memory holds (the stream file keeps everything)."""
        self._flushes.clear()
        self._transfers = []

    def __len__(self) -> int:
        """Task records held in memory."""
        return sum(len(records) for records, _ in self._flushes)


_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(TaskRecord))


def _fields(record) -> dict:
    """A task record (a ``TaskRecord`` or the tuple of its fields) as a dict."""
    if type(record) is TaskRecord:
        return dataclasses.asdict(record)
    return dict(zip(_TASK_FIELDS, record))


def read_stream(path) -> tuple[list, list, list]:
    """``(task records, transfer records, workers)`` of a stream written by a :class:`TraceBuffer`.

    A torn last line (the writer was killed) is skipped; any other bad line raises
    ``ValueError`` naming the file and the line.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines == [""]:  # the stream of a runtime that ran no task
        return [], [], []
    header = json.loads(lines[0])
    if header.get("format") != STREAM_FORMAT or header.get("version") != STREAM_VERSION:
        raise ValueError(f"{path}: trace stream format {header.get('format')!r} version "
                         f"{header.get('version')!r}; this hetero_nn reads {STREAM_FORMAT!r} "
                         f"version {STREAM_VERSION}")
    records, transfers = [], []
    last = len(lines) - 1
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        try:
            entry = json.loads(line)
            if "task" in entry:
                fields = dict(entry["task"])
                fields["deps"] = tuple(fields.get("deps", ()))
                records.append(TaskRecord(**fields))
            else:
                transfers.append(TransferRecord(**entry["transfer"]))
        except (ValueError, KeyError, TypeError) as exc:
            if number - 1 == last:  # no newline after it: the writer died mid-line
                break
            raise ValueError(f"{path}, line {number}: not a trace record ({exc})") from None
    return records, transfers, list(header.get("workers", ()))


def is_stream(path) -> bool:
    """Whether the file at ``path`` starts like a trace stream (its first line a header,
    or nothing: a runtime that ran no task)."""
    with open(path, "rb") as f:
        first = f.readline(4096)
    return first == b"" or (STREAM_FORMAT.encode() in first and first.endswith(b"\n"))

