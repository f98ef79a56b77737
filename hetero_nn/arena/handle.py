"""Handles: logical arrays with one replica per memory node and MSI coherency.

A :class:`Handle` is what tasks access: a shape, a dtype, a name, and for each
memory node a replica that is either valid or not. Reading on a node where the
replica is invalid copies it in from a node where it is valid; writing on a node
makes that replica the only valid one. ``split(axis, n)`` partitions a handle
into child handles whose replicas are *views* of the parent's (no copy), nested
as deep as wanted.

Coherence state, per handle: ``valid``, the set of node indices whose replica
holds the current data. Two invariants make partitions work:

1. ``n in h.valid`` means ``h``'s replica on node ``n`` is current over the
   whole of ``h``;
2. ``n in h.valid`` implies ``n in d.valid`` for every descendant ``d``.

A write to ``h`` on node ``n`` sets ``h`` and its descendants to ``{n}`` and
intersects every ancestor's set with ``{n}``. Reading an ancestor whose set is
empty gathers it child by child. Transitions happen under the root's lock when a
task starts, in an order the task dependencies already make safe.

The scheduler keeps its per-handle dependency state in the ``_last_writer``,
``_readers`` and ``_redux`` slots (StarPU keeps it in the handle too).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

_ids = itertools.count()


class Handle:
    """A logical array managed by a runtime; see the module docstring.

    Handles are made by ``Runtime.register`` / ``Runtime.empty`` /
    ``Runtime.temporary`` and by :meth:`split`, never directly by users.
    """

    __slots__ = ("id", "shape", "dtype", "name", "owner", "parent", "axis", "index", "children",
                 "_split_spec", "_replicas", "valid", "root", "_lock", "temporary", "generation",
                 "footprint", "nbytes", "_last_writer", "_readers", "_redux", "__weakref__")

    def __init__(self, shape, dtype, name=None, *, owner=None, parent=None, index=None,
                 temporary=False, generation=0):
        self.id = next(_ids)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.name = name or f"h{self.id}"
        self.owner = owner
        self.parent = parent
        self.index = index            # tuple of slices into the parent (None for a root)
        self.axis = None              # axis of the split that made the children
        self.children: tuple[Handle, ...] = ()
        self._split_spec = None
        self._replicas: dict[int, object] = {}
        self.valid: set[int] = set()
        self.root = self if parent is None else parent.root
        self._lock = threading.RLock() if parent is None else self.root._lock
        self.temporary = temporary
        self.generation = generation
        size = 1
        for d in self.shape:
            size *= d
        self.nbytes = size * self.dtype.itemsize
        self.footprint = "x".join(map(str, self.shape)) + ":" + self.dtype.str
        self._last_writer = None
        self._readers: list = []
        self._redux: list = []

    # ---------------------------------------------------------------- partitioning
    def split(self, axis: int = 0, n: int = 2) -> tuple["Handle", ...]:
        """Partition along ``axis`` into ``n`` child handles (views, no copy).

        Sizes follow ``numpy.array_split``: when ``n`` does not divide the
        length the first parts are one longer. A handle has one partitioning;
        asking again with the same arguments returns the same children.
        """
        axis = int(axis)
        if axis < 0:
            axis += len(self.shape)
        if not 0 <= axis < len(self.shape):
            raise ValueError(f"handle {self.name!r} of shape {self.shape}: no axis {axis}")
        length = self.shape[axis]
        if not 1 <= n <= max(length, 1):
            raise ValueError(f"handle {self.name!r}: cannot split axis {axis} of length {length} "
                             f"into {n} parts")
        if self._split_spec is not None:
            if self._split_spec == (axis, n):
                return self.children
            raise ValueError(f"handle {self.name!r} is already split as (axis={self._split_spec[0]}, "
                             f"n={self._split_spec[1]}); one partitioning per handle")
        base, extra = divmod(length, n)
        children, start = [], 0
        for i in range(n):
            size = base + (1 if i < extra else 0)
            index = tuple(slice(start, start + size) if d == axis else slice(None)
                          for d in range(len(self.shape)))
            shape = tuple(size if d == axis else s for d, s in enumerate(self.shape))
            child = Handle(shape, self.dtype, f"{self.name}[{i}]", owner=self.owner, parent=self,
                           index=index, temporary=self.temporary, generation=self.generation)
            child.valid = set(self.valid)
            children.append(child)
            start += size
        self.axis = axis
        self.children = tuple(children)
        self._split_spec = (axis, n)
        return self.children

    def ancestors(self):
        h = self.parent
        while h is not None:
            yield h
            h = h.parent

    def descendants(self):
        stack = list(self.children)
        while stack:
            h = stack.pop()
            yield h
            stack.extend(h.children)

    # ---------------------------------------------------------------- replicas
    def replica(self, node) -> object:
        """This handle's array on ``node`` (allocated on first use; a view for children)."""
        arr = self._replicas.get(node.index)
        if arr is None:
            if self.parent is not None:
                arr = self.parent.replica(node)[self.index]
            elif self.temporary:
                arr = node.arena.empty(self.shape, self.dtype)
            else:
                arr = node.empty(self.shape, self.dtype, self)  # evictable under a limit
            self._replicas[node.index] = arr
        return arr

    def _drop_replicas(self):
        """Forget arena-backed replicas (their arena was reset)."""
        self._replicas.clear()
        for d in self.descendants():
            d._replicas.clear()

    def __repr__(self):
        return f"Handle({self.name!r}, shape={self.shape}, dtype={self.dtype.name})"


# -------------------------------------------------------------------- coherence
def _add_valid(h: Handle, n: int) -> None:
    h.valid.add(n)
    for d in h.descendants():
        d.valid.add(n)


def make_valid(h: Handle, node, nodes) -> int:
    """Bring ``h``'s replica on ``node`` up to date; returns bytes copied. Root lock held."""
    n = node.index
    if n in h.valid:
        return 0
    if h.valid:
        src = nodes[min(h.valid)]
        moved = node.copy(h.replica(node), h.replica(src), src)
        _add_valid(h, n)
        return moved
    moved = 0
    if h.children:
        for c in h.children:
            moved += make_valid(c, node, nodes)
    else:  # never written: nothing to bring, the fresh replica is the data
        h.replica(node)
    h.valid.add(n)
    return moved


def mark_written(h: Handle, n: int) -> None:
    """Record that ``h`` was written on node index ``n``. Root lock held."""
    h.valid = {n}
    for d in h.descendants():
        d.valid = {n}
    for a in h.ancestors():
        if a.valid:
            a.valid = {n} if n in a.valid else set()


def acquire(h: Handle, node, nodes, reads: bool, writes: bool):
    """Return ``(array, bytes_moved)`` for a task accessing ``h`` on ``node``."""
    with h._lock:
        moved = make_valid(h, node, nodes) if reads else 0
        arr = h.replica(node)
        if writes:
            mark_written(h, node.index)
    return arr, moved
