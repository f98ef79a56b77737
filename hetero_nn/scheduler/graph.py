"""The flushed task DAG as a Dask graph, with codelets run pure.

Every task becomes one key (``Task.key`` plus a token unique to the graph, so
graphs never share keys on a shared scheduler) whose arguments are the keys holding
the values it reads; its value is the tuple of the arrays it writes plus its
timing. Reads of a handle resolve to the key of its latest version: the output
of the task that last wrote it, a slice of a parent's version (partitions), or
the concatenation of the children's versions. Registered data enters the graph
as arrays under ``data-*`` keys, which the distributed executor replaces by
scattered futures (no array travels inside the graph). Because nothing is
updated in place, ``dask.threaded.get`` and a ``distributed.Client`` can run the
graph unchanged and Dask can recompute what a dead worker lost (but for a
scattered input: its loss fails the flush).
"""

from __future__ import annotations

import operator
import socket
import threading
import time
import uuid

import numpy as np

from ..codelets.codelet import REDUX
from ..errors import TaskError

_PARENT = "parent"    # version derives from the parent's
_GATHER = "gather"    # version is the concatenation of the children's


class PureTask:
    """A codelet variant as a pure function of the values it reads.

    Called with the values of its ``R``/``RW`` operands in order; returns the
    arrays of its written operands (``W``, ``RW``, ``REDUX``) followed by
    ``(start, end, worker)`` wall-clock times.
    """

    def __init__(self, task, variant):
        self.fn = task.codelet.variants[variant]
        self.codelet = task.codelet.name
        self.init = task.codelet.init
        self.task_id = task.id
        self.variant = variant
        self.modes = task.modes
        self.specs = [(h.shape, h.dtype) for h in task.handles]
        self.params = task.params

    def __call__(self, *values):
        start = time.time()
        arrays, outputs, it = [], [], iter(values)
        for m, (shape, dtype) in zip(self.modes, self.specs):
            if m.reads:
                arr = next(it)
                if m.writes:
                    arr = np.array(arr, dtype=dtype, copy=True)
            else:
                arr = np.empty(shape, dtype)
                if m is REDUX:
                    self.init(arr)
            arrays.append(arr)
            if m.writes or m is REDUX:
                outputs.append(arr)
        try:
            self.fn(*arrays, **self.params)
        except Exception as exc:
            raise TaskError(f"task {self.task_id} (codelet {self.codelet!r}, variant "
                            f"{self.variant!r}) failed: {type(exc).__name__}: {exc}",
                            codelet=self.codelet, task_id=self.task_id) from exc
        worker = f"{socket.gethostname()}:{threading.current_thread().name}"
        return (*outputs, (start, time.time(), worker))


def _gather(parts, axis):
    return np.concatenate(parts, axis=axis)


class GraphBuilder:
    """Turns a list of tasks (a topological order) into a Dask graph dict."""

    def __init__(self, runtime):
        self.rt = runtime
        # Keys are unique per graph: a distributed scheduler may still hold the keys of an
        # earlier graph (or of another runtime sharing the client) when this one arrives.
        self.token = uuid.uuid4().hex[:12]
        self.dsk: dict = {}
        self.src: dict = {}        # handle -> key | _PARENT | _GATHER
        self.written_roots: dict = {}
        self._n = 0

    def _new_key(self, prefix):
        self._n += 1
        return f"{prefix}-{self._n}-{self.token}"

    def value(self, h) -> str:
        """The key holding ``h``'s current version (adding slice/gather nodes as needed)."""
        s = self.src.get(h)
        if s is None:
            s = _PARENT if h.parent is not None else None
        if s is None:  # root never written in this graph: its registered data
            key = f"data-{h.id}-{self.token}"
            self.dsk[key] = self.rt.host_replica(h)
        elif s is _PARENT:
            key = self._new_key(f"slice-{h.id}")
            self.dsk[key] = (operator.getitem, self.value(h.parent), h.index)
        elif s is _GATHER:
            key = self._new_key(f"gather-{h.id}")
            self.dsk[key] = (_gather, [self.value(c) for c in h.children], h.axis)
        else:
            return s
        self.src[h] = key
        return key

    def _written(self, h, key):
        path = [h, *h.ancestors()]
        on_path = set(path)
        for a in path[1:]:  # freeze siblings that derive from an ancestor about to change
            if self.src.get(a) is not _GATHER:
                for c in a.children:
                    if c not in on_path and self.src.get(c, _PARENT) is _PARENT:
                        self.value(c)
        self.src[h] = key
        for d in h.descendants():
            self.src[d] = _PARENT
        for a in path[1:]:
            self.src[a] = _GATHER
        self.written_roots[h.root] = None

    def task_key(self, task) -> str:
        """``task``'s key in this graph."""
        return f"{task.key}-{self.token}"

    def add(self, task, variant):
        args = [self.value(h) for h, m in zip(task.handles, task.modes) if m.reads]
        key = self.task_key(task)
        self.dsk[key] = (PureTask(task, variant), *args)
        i = 0
        for h, m in zip(task.handles, task.modes):
            if m.writes or m is REDUX:
                out = f"{key}-out{i}"
                self.dsk[out] = (operator.getitem, key, i)
                self._written(h, out)
                i += 1
        self.dsk[f"{key}-time"] = (operator.getitem, key, i)

    def outputs(self) -> dict:
        """Root handle -> key of its final version, for every root written."""
        return {h: self.value(h) for h in self.written_roots}


def build_graph(runtime, tasks):
    """``(dsk, outputs, timing_keys)`` for ``tasks``; see :class:`GraphBuilder`."""
    g = GraphBuilder(runtime)
    for t in tasks:
        # the variant the local executor would run (pinned, preferred, or the perfmodel's)
        kind = "cpu" if runtime.candidates(t.codelet, "cpu") else "cuda"
        t.variant = runtime.choose_variant(t, kind)
        g.add(t, t.variant)
    return g.dsk, g.outputs(), [f"{g.task_key(t)}-time" for t in tasks]
