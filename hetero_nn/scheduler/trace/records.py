"""Trace records: what one executed task, one copy and one temporary left behind, and
what a run's records say about the runtime's own cost (:func:`dispatch_gaps`).

The executors append the records (:mod:`~hetero_nn.scheduler.trace.views` reads them,
:mod:`~hetero_nn.scheduler.trace.buffer` streams them); this module imports nothing of
the package, so every part of the scheduler may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FlatRecords", "MemoryRecord", "TaskRecord", "TransferRecord", "dispatch_gaps"]


@dataclass(slots=True)
class TaskRecord:
    """What happened to one executed task.

    Attributes
    ----------
    task_id : int
        The runtime's id of the task.
    codelet, variant : str
        What ran (``variant`` e.g. ``"ref"``, ``"cpu"``, ``"cuda:cublas"``).
    worker : str
        The worker that ran it (e.g. ``"cpu0"``).
    device : str
        Its device kind: ``"cpu"`` or ``"cuda"``.
    node : str
        The memory node its operands lived on (e.g. ``"host0"``).
    submit, ready, start, end : float
        ``time.perf_counter()`` seconds: known to the runtime, dependencies
        done, started, finished.
    bytes_in : int
        Bytes transferred to ``node`` for this task.
    deps : tuple of int
        The task ids this task waited on.
    error : str or None
        The exception's text when the codelet raised.
    """

    task_id: int
    codelet: str
    variant: str
    worker: str
    device: str
    node: str
    submit: float
    ready: float
    start: float
    end: float
    bytes_in: int = 0
    deps: tuple = ()
    error: str | None = None

    @property
    def duration(self) -> float:
        """Seconds the task ran."""
        return self.end - self.start


#: Fields of a task record: a :class:`FlatRecords` holds this many values per task.
TASK_FIELDS = len(TaskRecord.__slots__)
_DEPS = TaskRecord.__slots__.index("deps")


class FlatRecords:
    """One flush's task records as the executors keep them: one flat list, the
    :data:`TASK_FIELDS` fields of each record in :class:`TaskRecord`'s order, one record
    after the other (each appended with one ``extend``; read as tuples), ``deps`` of one
    task kept as its id. The garbage collector tracks the list, not a tuple per record:
    plain values (and a ``deps`` tuple of several ids, untracked at the first collection
    that sees it) cost a collection a pointer test each, where a tuple per task was an
    object to walk."""

    __slots__ = ("values",)

    def __init__(self, values: list):
        self.values = values

    def __len__(self) -> int:
        return len(self.values) // TASK_FIELDS

    def __iter__(self):
        """Each record as the tuple of its fields."""
        for r in zip(*[iter(self.values)] * TASK_FIELDS):
            if type(r[_DEPS]) is int:  # one dependency, kept as its id
                r = (*r[:_DEPS], (r[_DEPS],), *r[_DEPS + 1:])
            yield r

    def workers(self) -> set:
        """The workers its records name (without making them)."""
        return set(self.values[3::TASK_FIELDS])


@dataclass(slots=True)
class TransferRecord:
    """One copy between memory nodes: ``src -> dst``, ``nbytes``, when it ran (``start``,
    ``end``: ``time.perf_counter()`` seconds, taken where the copy ran)."""

    src: str
    dst: str
    nbytes: int
    start: float
    end: float


@dataclass(slots=True)
class MemoryRecord:
    """One temporary's bytes on one memory node: ``name``, ``node``, ``nbytes``, live from
    ``start`` to ``end`` (``time.perf_counter()`` seconds; see
    :mod:`~hetero_nn.scheduler.lifetimes`)."""

    name: str
    node: str
    nbytes: int
    start: float
    end: float


def dispatch_gaps(records, handoffs: bool = False) -> list:
    """Per task record of a real run, the seconds between the moment it could start (its
    worker free and its dependencies done) and its start: the runtime's per-task cost
    besides the codelet (release, wake-up, placement, binding, stream hand-offs).

    ``handoffs``: only the tasks that followed one of their dependencies on its worker
    (a chain handed on without a wake-up: what fusing the two tasks would save)."""
    by_id = {r.task_id: r for r in records}
    last_end = {}
    last_id = {}
    gaps = []
    for r in sorted(records, key=lambda r: r.start):
        ends = [by_id[d].end for d in r.deps if d in by_id] or [r.ready]  # roots: the flush
        prev = last_end.get(r.worker)
        if prev is not None:
            ends.append(prev)
        if not handoffs or last_id.get(r.worker) in r.deps:
            gaps.append(max(0.0, r.start - max(ends)))
        last_end[r.worker] = max(r.end, prev or r.end)
        last_id[r.worker] = r.task_id
    return gaps
