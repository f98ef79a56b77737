"""Traces: one record per executed task, and the views people read them through.

The executor appends a :class:`TaskRecord` for every task it runs (codelet,
variant, worker, device, memory node, four ``time.perf_counter()`` stamps, bytes
moved in, the tasks it waited on). A :class:`Trace` wraps those records and
exports them:

- :meth:`Trace.to_chrome`: Chrome trace event JSON for Perfetto / ``chrome://tracing``
  (a process per device kind, a thread per worker, a complete event per task,
  flow arrows along dependencies);
- :meth:`Trace.gantt`: a PNG Gantt chart (matplotlib, the ``plot`` extra;
  :mod:`hetero_nn.scheduler.trace.gantt`);
- :meth:`Trace.to_dot`: the executed DAG as Graphviz DOT, coloured by worker;
- :meth:`Trace.stats` / :meth:`Trace.format_stats`: time per (codelet, variant);
- :meth:`Trace.utilisation` / :meth:`Trace.format_utilisation`: busy fraction per worker;
- :meth:`Trace.to_json` / :meth:`Trace.from_json`: the raw records (``from_json`` also
  reads the Chrome trace back, and the stream a runtime writes with ``trace=path``,
  see :mod:`.buffer`);
- :meth:`Trace.links` / :meth:`Trace.format_links`: bytes moved per link (src -> dst
  memory node), from a :class:`TransferRecord` per copy, prefetches and copies
  back to the host included; the Chrome trace shows each copy as an event of
  its own (a process ``transfers``, a thread per link);
- :meth:`Trace.live_bytes`: bytes of temporaries live per memory node over time, from a
  :class:`MemoryRecord` per temporary and node (flushes run as one DAG, see
  :mod:`~hetero_nn.scheduler.lifetimes`); the Chrome trace shows them as counters.

Times of a task: ``submit`` (the runtime knew the task), ``ready`` (its last
dependency finished), ``start`` and ``end`` (it ran on its worker). So
``ready - submit`` is time *waiting* on dependencies and ``start - ready`` time
*queued* for a worker. The makespan runs from the earliest submit to the latest
end: what the caller waited for. Every file is written under a temporary name in
the target directory and renamed over the target, so a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Iterable, Iterator

from ...errors import ConfigError
from ...fileio import atomic_write
from ...tables import format_table
from .records import MemoryRecord, TaskRecord, TransferRecord
from .gantt import gantt
from .buffer import is_stream, read_stream

__all__ = ["MemoryRecord", "TaskRecord", "TransferRecord", "Trace"]

_JSON_FORMAT = "hetero_nn.trace"
_JSON_VERSION = 1
_CHROME_PRODUCER = "hetero_nn"

# Fill colours for workers in DOT graphs (light enough for black labels).
_WORKER_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
                   "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _natural_key(name: str):
    """Sort ``cpu2`` before ``cpu10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]




def _workers_of(records) -> set:
    """The workers named by one flush's records as kept (TaskRecords or tuples of their
    fields, or an object that says, ``workers()``: a compiled replay's records)."""
    workers = getattr(records, "workers", None)
    if workers is not None:
        return workers()
    return {r[3] if type(r) is tuple else r.worker for r in records}


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Trace:
    """The records of executed tasks, with exporters and summaries.

    Parameters
    ----------
    records : iterable of TaskRecord
        Kept in the order given.
    workers : list of str, optional
        Every worker of the run, so idle ones show up too (utilisation 0). Workers
        that appear in ``records`` but not here are added; without the list, the
        workers of the records are used, in natural order (``cpu2`` before ``cpu10``).

    Examples
    --------
    >>> r = TaskRecord(0, "relu_fwd", "cpu", "cpu0", "cpu", "host0", 0.0, 0.0, 0.5, 1.5)
    >>> t = Trace([r], workers=["cpu0", "cpu1"])
    >>> t.makespan, t.utilisation()
    (1.5, {'cpu0': 0.6666666666666666, 'cpu1': 0.0})
    """

    def __init__(self, records: Iterable[TaskRecord], workers: list[str] | None = None,
                 transfers: Iterable[TransferRecord] = (), memory: Iterable[MemoryRecord] = ()):
        self._made([list(records)], workers, transfers, memory)

    @classmethod
    def of_flushes(cls, flushes, workers: list[str] | None = None,
                   transfers: Iterable[TransferRecord] = (),
                   memory: Iterable[MemoryRecord] = ()) -> "Trace":
        """A runtime's trace: per flush, its records as the runtime keeps them (tuples of a
        :class:`TaskRecord`'s fields, :func:`~hetero_nn.scheduler.flush.record_of`, or a
        compiled replay's :class:`~hetero_nn.scheduler.engine.replay.ReplayRecords`),
        made :class:`TaskRecord` s at the first read of :attr:`records`, all at once (a
        program that takes ``rt.trace(clear=True)`` only to empty the buffer makes none)."""
        trace = cls.__new__(cls)
        trace._made(list(flushes), workers, transfers, memory)
        return trace

    def _made(self, flushes, workers, transfers, memory):
        self._records = None
        self._flushes = flushes  # until read: per flush, its records as kept
        self.transfers: list[TransferRecord] = list(transfers)
        self.memory: list[MemoryRecord] = list(memory)
        seen = set()
        for flush in flushes:
            seen |= _workers_of(flush)
        seen = sorted(seen, key=_natural_key)
        given = list(dict.fromkeys(workers or ()))
        self.workers: list[str] = given + [w for w in seen if w not in given]
        #: What the file a trace was read from said about it (e.g. the training steps it
        #: covers); written into a Chrome trace by :meth:`to_chrome`'s ``metadata``.
        self.metadata: dict = {}

    @property
    def records(self) -> list[TaskRecord]:
        """The task records, in the order given (made at the first read: see
        :meth:`of_flushes`)."""
        if self._records is None:
            self._records = [r if type(r) is TaskRecord else TaskRecord(*r)
                             for flush in self._flushes for r in flush]
            self._flushes = None
        return self._records

    def __len__(self) -> int:
        if self._records is None:
            return sum(map(len, self._flushes))
        return len(self._records)

    def __iter__(self) -> Iterator[TaskRecord]:
        return iter(self.records)

    @property
    def origin(self) -> float:
        """The earliest submit time (the zero of every exported time axis)."""
        return min((r.submit for r in self.records), default=0.0)

    @property
    def makespan(self) -> float:
        """Seconds from the earliest submit to the latest end (0 for an empty trace)."""
        if not self.records:
            return 0.0
        return max(r.end for r in self.records) - self.origin

    def _worker_devices(self) -> dict[str, str]:
        devices = {}
        for r in self.records:
            devices.setdefault(r.worker, r.device)
        return devices

    # -- summaries ----------------------------------------------------------------------------

    def live_bytes(self) -> dict[str, list[tuple[float, int]]]:
        """Per memory node, the bytes of temporaries live over time: ``[(time, bytes), ...]``
        at every change, from the :class:`MemoryRecord` s (flushes run as one DAG)."""
        changes: dict = {}
        for m in self.memory:
            changes.setdefault(m.node, []).extend([(m.start, m.nbytes), (m.end, -m.nbytes)])
        out = {}
        for node, events in sorted(changes.items(), key=lambda kv: _natural_key(kv[0])):
            events.sort(key=lambda e: (e[0], e[1]))  # a free before an allocation at one time
            live, series = 0, []
            for t, delta in events:
                live += delta
                if series and series[-1][0] == t:
                    series[-1] = (t, live)
                else:
                    series.append((t, live))
            out[node] = series
        return out

    def stats(self) -> list[dict]:
        """Run time per (codelet, variant), the largest total first.

        Returns
        -------
        list of dict
            Keys ``codelet, variant, count, total, mean, std, min, max`` (seconds;
            ``std`` is the population standard deviation) and ``errors`` (tasks that raised).
        """
        groups: dict[tuple[str, str], list[TaskRecord]] = {}
        for r in self.records:
            groups.setdefault((r.codelet, r.variant), []).append(r)
        rows = []
        for (codelet, variant), records in groups.items():
            durations = [r.duration for r in records]
            total = math.fsum(durations)
            mean = total / len(durations)
            variance = math.fsum((d - mean) ** 2 for d in durations) / len(durations)
            rows.append({"codelet": codelet, "variant": variant, "count": len(durations),
                         "total": total, "mean": mean, "std": math.sqrt(variance),
                         "min": min(durations), "max": max(durations),
                         "errors": sum(r.error is not None for r in records)})
        rows.sort(key=lambda row: (-row["total"], row["codelet"], row["variant"]))
        return rows

    def format_stats(self) -> str:
        """:meth:`stats` as an aligned text table (milliseconds), with each codelet's share."""
        rows = self.stats()
        grand_total = math.fsum(row["total"] for row in rows)
        header = ("codelet", "variant", "count", "total ms", "mean ms", "std ms", "min ms",
                  "max ms", "share %")
        lines = []
        for row in rows:
            share = 100.0 * row["total"] / grand_total if grand_total > 0 else 0.0
            lines.append((row["codelet"], row["variant"], str(row["count"]),
                          *(f"{1e3 * row[key]:.3f}" for key in ("total", "mean", "std", "min",
                                                                  "max")),
                          f"{share:.1f}"))
        return format_table(header, lines)

    def utilisation(self) -> dict[str, float]:
        """Fraction of the makespan each worker spent running tasks (0 for idle ones)."""
        makespan = self.makespan
        busy = self._busy_seconds()
        return {w: (busy[w] / makespan if makespan > 0 else 0.0) for w in self.workers}

    def _busy_seconds(self) -> dict[str, float]:
        """Seconds each worker ran tasks (overlapping records on one worker counted once)."""
        intervals: dict[str, list[tuple[float, float]]] = {w: [] for w in self.workers}
        for r in self.records:
            intervals[r.worker].append((r.start, r.end))
        busy = {}
        for worker, spans in intervals.items():
            total, reach = 0.0, -math.inf
            for start, end in sorted(spans):
                if end > reach:
                    total += end - max(start, reach)
                    reach = end
            busy[worker] = total
        return busy

    def format_utilisation(self) -> str:
        """:meth:`utilisation` as an aligned table with task counts and busy time."""
        utilisation = self.utilisation()
        busy = self._busy_seconds()
        devices = self._worker_devices()
        counts = {w: 0 for w in self.workers}
        for r in self.records:
            counts[r.worker] += 1
        lines = []
        for w in self.workers:
            fraction = utilisation[w]
            lines.append((w, devices.get(w, "-"), str(counts[w]), f"{1e3 * busy[w]:.3f}",
                          f"{100 * fraction:.1f}", "#" * round(20 * fraction)))
        table = format_table(("worker", "device", "tasks", "busy ms", "util %", "util bar"), lines)
        return f"{table}\nmakespan {1e3 * self.makespan:.3f} ms over {len(self.workers)} workers"

    def links(self) -> dict[tuple[str, str], dict]:
        """Per link ``(src, dst)``: ``{"bytes", "copies", "seconds"}`` over every copy."""
        out: dict[tuple[str, str], dict] = {}
        for t in self.transfers:
            row = out.setdefault((t.src, t.dst), {"bytes": 0, "copies": 0, "seconds": 0.0})
            row["bytes"] += t.nbytes
            row["copies"] += 1
            row["seconds"] += t.end - t.start
        return dict(sorted(out.items()))

    @property
    def bytes_moved(self) -> int:
        """Bytes copied between memory nodes, over every link."""
        return sum(t.nbytes for t in self.transfers)

    def format_links(self) -> str:
        """:meth:`links` as an aligned table."""
        lines = []
        for (src, dst), row in self.links().items():
            rate = row["bytes"] / row["seconds"] / 1e9 if row["seconds"] > 0 else 0.0
            lines.append((f"{src} -> {dst}", str(row["copies"]), str(row["bytes"]),
                          f"{1e3 * row['seconds']:.3f}", f"{rate:.2f}"))
        return format_table(("link", "copies", "bytes", "ms", "GB/s"), lines)

    # -- exporters ----------------------------------------------------------------------------

    def chrome_events(self) -> list[dict]:
        """The Chrome trace events of :meth:`to_chrome` (times in microseconds)."""
        origin = self.origin
        devices = self._worker_devices()
        kinds = sorted(set(devices.values()))
        pid_of_kind = {kind: i + 1 for i, kind in enumerate(kinds)}
        idle_pid = len(kinds) + 1
        tid_of = {w: i + 1 for i, w in enumerate(self.workers)}
        pid_of = {w: pid_of_kind.get(devices.get(w), idle_pid) for w in self.workers}

        events = []
        for kind, pid in pid_of_kind.items():
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": kind}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        if any(w not in devices for w in self.workers):
            events.append({"ph": "M", "name": "process_name", "pid": idle_pid, "tid": 0,
                           "args": {"name": "idle workers"}})
        for w in self.workers:
            events.append({"ph": "M", "name": "thread_name", "pid": pid_of[w], "tid": tid_of[w],
                           "args": {"name": w}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of[w],
                           "tid": tid_of[w], "args": {"sort_index": tid_of[w]}})

        def us(t):
            return (t - origin) * 1e6

        by_id = {r.task_id: r for r in self.records}
        for r in self.records:
            args = {"codelet": r.codelet, "variant": r.variant, "task_id": r.task_id,
                    "bytes_in": r.bytes_in, "node": r.node,
                    "waiting_us": (r.ready - r.submit) * 1e6,
                    "queued_us": (r.start - r.ready) * 1e6, "deps": list(r.deps)}
            if r.error is not None:
                args["error"] = r.error
            events.append({"ph": "X", "name": r.codelet, "cat": r.device, "ts": us(r.start),
                           "dur": (r.end - r.start) * 1e6, "pid": pid_of[r.worker],
                           "tid": tid_of[r.worker], "args": args})
        if self.transfers:  # each copy an event of its own: a thread per link
            link_pid = idle_pid + 1
            events.append({"ph": "M", "name": "process_name", "pid": link_pid, "tid": 0,
                           "args": {"name": "transfers"}})
            tid_of_link: dict = {}
            for t in self.transfers:
                tid = tid_of_link.get((t.src, t.dst))
                if tid is None:
                    tid = tid_of_link[(t.src, t.dst)] = len(tid_of_link) + 1
                    events.append({"ph": "M", "name": "thread_name", "pid": link_pid,
                                   "tid": tid, "args": {"name": f"{t.src} -> {t.dst}"}})
                events.append({"ph": "X", "name": f"copy {t.nbytes} B", "cat": "transfer",
                               "ts": us(t.start), "dur": (t.end - t.start) * 1e6,
                               "pid": link_pid, "tid": tid,
                               "args": {"src": t.src, "dst": t.dst, "bytes": t.nbytes}})
        live = self.live_bytes()
        if live:
            events.append({"ph": "M", "name": "process_name", "pid": idle_pid + 2, "tid": 0,
                           "args": {"name": "temporaries"}})
        for node, series in live.items():  # a counter track per memory node
            for t, live in series:
                events.append({"ph": "C", "name": f"live bytes {node}", "pid": idle_pid + 2,
                               "ts": us(t), "args": {"bytes": live}})
        # Flow arrows (flow events v1): out of each dependency, into the task.
        flow_id = 0
        for r in self.records:
            for dep in r.deps:
                source = by_id.get(dep)
                if source is None:  # a task outside this trace (e.g. an earlier step)
                    continue
                flow_id += 1
                events.append({"ph": "s", "name": "dep", "cat": "dep", "id": flow_id,
                               "ts": us(source.start), "pid": pid_of[source.worker],
                               "tid": tid_of[source.worker]})
                events.append({"ph": "f", "bp": "e", "name": "dep", "cat": "dep", "id": flow_id,
                               "ts": us(r.start), "pid": pid_of[r.worker],
                               "tid": tid_of[r.worker]})
        return events

    def to_chrome(self, path, metadata: dict | None = None) -> Path:
        """Write a Chrome trace event JSON file (open it in Perfetto or chrome://tracing).

        ``metadata`` (JSON values) joins the file's ``otherData``; :meth:`from_json` reads
        the file back, into :attr:`metadata`.
        """
        document = {"traceEvents": self.chrome_events(), "displayTimeUnit": "ms",
                    "otherData": {"producer": _CHROME_PRODUCER, "tasks": len(self.records),
                                  "makespan_s": self.makespan, **(metadata or {})}}
        data = json.dumps(document, separators=(",", ":")).encode()
        return atomic_write(path, lambda f: f.write(data))

    def dot(self) -> str:
        """The executed DAG in Graphviz DOT: a node ``codelet#id`` per task, coloured by worker."""
        colour = {w: _WORKER_COLOURS[i % len(_WORKER_COLOURS)] for i, w in enumerate(self.workers)}
        lines = ["digraph trace {", "  rankdir=TB;",
                 '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
        ids = {r.task_id for r in self.records}
        for r in self.records:
            tooltip = (f"{r.codelet} ({r.variant}) on {r.worker}, "
                       f"{1e3 * r.duration:.3f} ms")
            attributes = [f"label={_dot_string(f'{r.codelet}#{r.task_id}')}",
                          f"fillcolor={_dot_string(colour[r.worker])}",
                          f"tooltip={_dot_string(tooltip)}"]
            if r.error is not None:
                attributes += ['color="red"', "penwidth=3"]
            lines.append(f"  t{r.task_id} [{', '.join(attributes)}];")
        for r in self.records:
            for dep in r.deps:
                if dep in ids:
                    lines.append(f"  t{dep} -> t{r.task_id};")
        lines.append("  subgraph cluster_workers {")
        lines.append('    label="workers"; style=dashed;')
        for i, w in enumerate(self.workers):
            lines.append(f"    worker{i} [label={_dot_string(w)}, "
                         f"fillcolor={_dot_string(colour[w])}];")
        lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_dot(self, path) -> Path:
        """Write :meth:`dot` to ``path`` (render with ``dot -Tsvg path -o dag.svg``)."""
        data = self.dot().encode()
        return atomic_write(path, lambda f: f.write(data))

    def gantt(self, path, title: str | None = None, window: tuple | None = None) -> Path:
        """Write a PNG Gantt chart: a row per worker and per link, a colour per codelet, the
        legend beside it, idle time in grey (:mod:`hetero_nn.scheduler.trace.gantt`).

        ``window=(t0, t1)`` shows those milliseconds since the first submit. Needs
        matplotlib (``pip install hetero-nn[plot]``).
        """

        return gantt(self, path, title=title, window=window)

    def to_json(self, path) -> Path:
        """Write the raw records (and worker list) as JSON; read back with :meth:`from_json`."""
        document = {"format": _JSON_FORMAT, "version": _JSON_VERSION, "workers": self.workers,
                    "records": [dataclasses.asdict(r) for r in self.records],
                    "transfers": [dataclasses.asdict(t) for t in self.transfers],
                    "memory": [dataclasses.asdict(m) for m in self.memory]}
        data = json.dumps(document, indent=1).encode()
        return atomic_write(path, lambda f: f.write(data))

    @classmethod
    def from_json(cls, path) -> "Trace":
        """Read a trace written by :meth:`to_json`, by :meth:`to_chrome` (what
        ``hetero-nn train --trace`` writes), or streamed by ``Runtime(trace=path)``.

        From a Chrome trace, times come back relative to the first submit (the file
        keeps no other origin); the metadata the file carries lands in :attr:`metadata`.

        Raises
        ------
        ConfigError
            A file that is not JSON, or JSON that neither method wrote (the message
            names the file).
        """

        if is_stream(path):
            records, transfers, workers = read_stream(path)
            return cls(records, workers=workers, transfers=transfers)
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not a hetero_nn trace (not JSON: {exc})") from None
        if isinstance(document, dict) and "traceEvents" in document \
                and document.get("otherData", {}).get("producer") == _CHROME_PRODUCER:
            return cls._from_chrome(document, path)
        if not isinstance(document, dict) or document.get("format") != _JSON_FORMAT:
            raise ConfigError(f"{path}: not a hetero_nn trace (neither Trace.to_json's "
                              f"'format': {_JSON_FORMAT!r} nor a Chrome trace with "
                              f"'producer': {_CHROME_PRODUCER!r})")
        if document.get("version") != _JSON_VERSION:
            raise ConfigError(f"{path}: trace format version {document.get('version')!r}, "
                              f"this hetero_nn reads version {_JSON_VERSION}")
        records = []
        for fields in document["records"]:
            fields = dict(fields)
            fields["deps"] = tuple(fields.get("deps", ()))
            records.append(TaskRecord(**fields))
        transfers = [TransferRecord(**fields) for fields in document.get("transfers", ())]
        memory = [MemoryRecord(**fields) for fields in document.get("memory", ())]
        return cls(records, workers=document.get("workers"), transfers=transfers, memory=memory)

    @classmethod
    def _from_chrome(cls, document, path) -> "Trace":
        """The trace :meth:`to_chrome` wrote: a task per complete event of a worker's
        thread, a copy per complete event of the ``transfers`` process."""
        events = document["traceEvents"]
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e.get("name") == "thread_name"}
        processes = {e["pid"]: e["args"]["name"] for e in events
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
        records, transfers = [], []
        try:
            for e in events:
                if e.get("ph") != "X":
                    continue
                start, end = e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
                a = e.get("args", {})
                if e.get("cat") == "transfer":
                    transfers.append(TransferRecord(a["src"], a["dst"], int(a["bytes"]),
                                                    start, end))
                    continue
                ready = start - a.get("queued_us", 0.0) / 1e6
                records.append(TaskRecord(
                    int(a["task_id"]), a.get("codelet", e["name"]), a["variant"],
                    threads[(e["pid"], e["tid"])], e.get("cat", "cpu"), a.get("node", ""),
                    submit=ready - a.get("waiting_us", 0.0) / 1e6, ready=ready,
                    start=start, end=end, bytes_in=int(a.get("bytes_in", 0)),
                    deps=tuple(a.get("deps", ())), error=a.get("error")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: a Chrome trace event hetero_nn cannot read "
                              f"({type(exc).__name__}: {exc})") from None
        workers = [name for (pid, tid), name in sorted(threads.items(), key=lambda kv: kv[0][1])
                   if processes.get(pid) != "transfers"]
        trace = cls(records, workers=workers, transfers=transfers)
        trace.metadata = {k: v for k, v in document.get("otherData", {}).items()
                          if k not in ("producer", "tasks", "makespan_s")}
        return trace

    def __repr__(self):
        return (f"Trace({len(self.records)} tasks, {len(self.workers)} workers, "
                f"makespan {1e3 * self.makespan:.3f} ms)")

