"""The flushed task DAG as a Dask graph, with codelets run pure.

Every task becomes one key (``Task.key`` plus a token unique to the graph, so
graphs never share keys on a shared scheduler) whose arguments are the keys holding
the values it reads; its value is the tuple of the arrays it writes plus its
timing. Reads of a handle resolve to the key of its latest version. Versions
are kept per cell of the root's grid (the cells every partition plan's cuts
make, see :mod:`hetero_nn.arena.handle`): each cell maps to the key and box of
the last value written over it. A read whose cells all come from one value is
that key or a slice of it; otherwise the view is assembled from the pieces
(one per cell), so views of different plans compose however they overlap.
Registered data enters the graph as arrays under ``data-*`` keys, which the
distributed executor replaces by scattered futures (no array travels inside the
graph). Because nothing is updated in place, ``dask.threaded.get`` and a
``distributed.Client`` can run the graph unchanged and Dask can recompute what a
dead worker lost (but for a scattered input: its loss fails the flush).
"""

from __future__ import annotations

import operator
import socket
import threading
import time
import uuid

import numpy as np

from ...codelets.codelet import REDUX
from ...errors import TaskError


class PureTask:
    """A codelet variant as a pure function of the values it reads.

    Called with the values of its ``R``/``RW`` operands in order (then the values of
    its ``after=`` tasks, which only order it and are ignored); returns the arrays of
    its written operands (``W``, ``RW``, ``REDUX``) followed by ``(start, end,
    worker)`` wall-clock times.
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


def _assemble(shape, dtype, pieces, *values):
    """A view's value from pieces: ``(dst slices, value index, src slices)``."""
    out = np.empty(shape, dtype)
    for dst, i, src in pieces:
        out[dst] = values[i][src]
    return out


def _relative(box, within):
    """``box`` (root coordinates) as slices into a value of box ``within``."""
    return tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(box, within))


class GraphBuilder:
    """Turns a list of tasks (a topological order) into a Dask graph dict."""

    def __init__(self, runtime):
        self.rt = runtime
        # Keys are unique per graph: a distributed scheduler may still hold the keys of an
        # earlier graph (or of another runtime sharing the client) when this one arrives.
        self.token = uuid.uuid4().hex[:12]
        self.dsk: dict = {}
        self.versions: dict = {}   # root -> object array over its grid's cells of (key, box)
        self.written_roots: dict = {}
        self._n = 0

    def _new_key(self, prefix):
        self._n += 1
        return f"{prefix}-{self._n}-{self.token}"

    def _cells(self, root):
        cells = self.versions.get(root)
        if cells is None:
            key = f"data-{root.id}-{self.token}"
            self.dsk[key] = self.rt.host_replica(root)
            cells = np.empty(root.grid.mask.shape, dtype=object)
            cells.fill((key, root.box))
            self.versions[root] = cells
        return cells

    def value(self, h) -> str:
        """The key holding ``h``'s current version (adding slice/assemble nodes as needed)."""
        cells = self._cells(h.root)
        sl = h.cells()
        sub = cells[sl]
        first = sub.flat[0]
        if all(v is first for v in sub.flat):
            key, box = first
            if box == h.box:
                return key
            out = self._new_key(f"slice-{h.id}")
            self.dsk[out] = (operator.getitem, key, _relative(h.box, box))
        else:
            grid = h.grid
            offset = tuple(s.start for s in sl)
            keys, pieces = {}, []
            for rel, (key, box) in np.ndenumerate(sub):
                cell = grid.cell_box(tuple(o + i for o, i in zip(offset, rel)))
                cell = tuple((c.start, c.stop) for c in cell)
                i = keys.setdefault(key, len(keys))
                pieces.append((_relative(cell, h.box), i, _relative(cell, box)))
            out = self._new_key(f"assemble-{h.id}")
            self.dsk[out] = (_assemble, h.shape, h.dtype, pieces, *keys)
        sub[...] = _single((out, h.box))
        return out

    def _written(self, h, key):
        self._cells(h.root)[h.cells()] = _single((key, h.box))
        self.written_roots[h.root] = None

    def task_key(self, task) -> str:
        """``task``'s key in this graph."""
        return f"{task.key}-{self.token}"

    def add(self, task, variant):
        args = [self.value(h) for h, m in zip(task.handles, task.modes) if m.reads]
        key = self.task_key(task)
        # after= tasks of this graph: extra arguments the pure task ignores (order only)
        args += [self.task_key(p) for p in task.after if self.task_key(p) in self.dsk]
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


def _single(value):
    """A 0-d object array holding ``value`` (a tuple), to fill cells with it."""
    a = np.empty((), dtype=object)
    a[()] = value
    return a


def build_graph(runtime, tasks):
    """``(dsk, outputs, timing_keys)`` for ``tasks``; see :class:`GraphBuilder`."""
    g = GraphBuilder(runtime)
    for t in tasks:
        # the variant the local executor would run (pinned, preferred, or the perfmodel's)
        kind = "cpu" if runtime.candidates(t.codelet, "cpu") else "cuda"
        t.variant = runtime.choose_variant(t, kind)
        g.add(t, t.variant)
    return g.dsk, g.outputs(), [f"{g.task_key(t)}-time" for t in tasks]
