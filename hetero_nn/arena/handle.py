"""Handles: logical arrays with one replica per memory node, partition plans, coherence.

A :class:`Handle` is what tasks access: a shape, a dtype, a name, and for each
memory node a replica. ``split(axis, n)`` partitions a handle into child handles
whose replicas are *views* of the parent's (no copy). A handle may be split
several ways (StarPU's partition plans): another ``n``, another axis, each
child split again, as deep as wanted; each plan is a :class:`Plan` and asking
for the same ``(axis, n)`` again returns the same children. Children of one
plan are disjoint; children of different plans overlap where their index
ranges do. Every handle knows its ``box``, its index range per dimension in its
root's coordinates, which is what the runtime compares to order accesses.

Coherence (MSI, per cell)
-------------------------
Views of different plans may overlap partially, so validity is not kept per
handle but per *cell* of a root's :class:`Grid`: the cuts of every plan made
below the root, along each axis, divide the root into cells, and every handle
is a whole number of cells. ``Grid.mask`` holds, per cell, a bit per memory
node whose replica of that cell is current. Reading a handle on node ``n``
copies in the cells not valid on ``n`` (the whole view at once when one node
holds all of them); writing it on ``n`` makes ``n`` the only valid node of its
cells. A root never split (most handles) keeps one mask, a plain int, and no
grid (nor does a split root until a transfer or a validity query needs its cells:
the grid is made then, with every plan's cuts). Transitions happen under the root's
lock when a task starts, in an order the task dependencies already make safe.

The scheduler keeps its per-handle dependency state in the ``_last_writer``,
``_readers`` and ``_live_below`` slots (StarPU keeps it in the handle too; see
:mod:`hetero_nn.scheduler.dependencies`).

Handles are cheap to make (``register`` and ``split`` are on the path of every
step): a handle holds as few containers as it can (no partition plans and no readers
until it has some: shared empty ones stand in), so the garbage collector has little
to walk, and a child's view of its parent is taken when first asked for.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from types import MappingProxyType

import numpy as np

_ids = itertools.count()


class Plan:
    """One partitioning of a handle: ``n`` children along ``axis``, sizes as
    ``numpy.array_split``; ``starts`` are the children's first indices in the
    root's coordinates (sorted, for finding the children a range meets)."""

    __slots__ = ("parent", "axis", "n", "children", "starts")

    def __init__(self, parent, axis, n, children):
        self.parent = parent
        self.axis = axis
        self.n = n
        self.children = children
        self.starts = [c.box[axis][0] for c in children]

    def meeting(self, box):
        """The children whose range along the plan's axis meets ``box``'s."""
        lo, hi = box[self.axis]
        starts = self.starts
        first = max(bisect.bisect_right(starts, lo) - 1, 0)
        last = bisect.bisect_left(starts, hi)
        return self.children[first:last]

    def __repr__(self):
        return f"Plan({self.parent.name!r}, axis={self.axis}, n={self.n})"


class Handle:
    """A logical array managed by a runtime; see the module docstring.

    Handles are made by ``Runtime.register`` / ``Runtime.empty`` /
    ``Runtime.temporary`` and by :meth:`split`, never directly by users.
    """

    __slots__ = ("id", "shape", "dtype", "name", "owner", "parent", "plan", "box",
                 "plans", "_replicas", "root", "_grid", "_lock", "temporary", "generation",
                 "footprint", "nbytes", "_cells", "_last_writer", "_readers", "_live_below",
                 "placed", "__weakref__")

    def __init__(self, shape, dtype, name=None, *, owner=None, temporary=False, generation=0):
        self.id = next(_ids)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.name = name or f"h{self.id}"
        self.owner = owner
        self.parent = None
        self.plan = None              # the Plan this handle is a child of (None for a root)
        self.box = tuple((0, d) for d in self.shape)
        self.plans = _NO_PLANS        # a dict once split
        self._replicas: dict[int, object] = {}
        # a root's coherence state: an int (one node mask for the whole root) until a
        # split or a transfer needs cells, then its Grid; children use their root's
        self._grid = 0
        self.root = self
        self._lock = threading.RLock()
        self.temporary = temporary
        self.generation = generation
        size = 1
        for d in self.shape:
            size *= d
        self.nbytes = size * self.dtype.itemsize
        self.footprint = _footprint(self.shape, self.dtype)
        self._cells = None            # (grid version, cell slices) cache
        self._last_writer = None
        self._readers = _NO_READERS   # a list once read in the flush
        self._live_below = 0          # handles below this one with dependency state
        self.placed = None            # what allocates a root's replicas when not its node

    @classmethod
    def wrap(cls, array, name=None, owner=None) -> "Handle":
        """A root handle whose host replica (node 0) is ``array``, valid there (no copy)."""
        h = cls.__new__(cls)
        h.id = i = next(_ids)
        h.shape = shape = array.shape
        h.dtype = dtype = array.dtype
        h.name = name or f"h{i}"
        h.owner = owner
        h.parent = h.plan = h._last_writer = h._cells = None
        h.box = tuple([(0, d) for d in shape])
        h.plans = _NO_PLANS
        h._replicas = {0: array}
        h._grid = 1  # valid on node 0 only
        h.root = h
        h._lock = threading.RLock()
        h.temporary = False
        h.generation = h._live_below = 0
        h.nbytes = array.nbytes
        h.footprint = _footprint(shape, dtype)
        h._readers = _NO_READERS
        h.placed = None
        return h

    @property
    def index(self):
        """A child's index into its parent (a tuple of slices); None for a root."""
        if self.plan is None:
            return None
        axis = self.plan.axis
        lo = self.box[axis][0] - self.parent.box[axis][0]
        hi = self.box[axis][1] - self.parent.box[axis][0]
        return (slice(None),) * axis + (slice(lo, hi),)

    # ---------------------------------------------------------------- partitioning
    def split(self, axis: int = 0, n: int = 2) -> tuple["Handle", ...]:
        """Partition along ``axis`` into ``n`` child handles (views, no copy).

        Sizes follow ``numpy.array_split``: when ``n`` does not divide the
        length the first parts are one longer. A handle may be split several
        ways; the same arguments return the same children.
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
        plan = self.plans.get((axis, n))
        if plan is not None:
            return plan.children
        base, extra = divmod(length, n)
        offset = self.box[axis][0]
        shape, box = list(self.shape), list(self.box)
        shapes = {}  # size along the axis -> (shape, footprint): at most two sizes
        children, start = [], 0
        for i in range(n):
            size = base + 1 if i < extra else base
            made = shapes.get(size)
            if made is None:
                shape[axis] = size
                child_shape = tuple(shape)
                made = shapes[size] = (child_shape, _footprint(child_shape, self.dtype))
            box[axis] = (offset + start, offset + start + size)
            children.append(self._child(made[0], tuple(box), f"{self.name}[{i}]", made[1]))
            start += size
        plan = Plan(self, axis, n, tuple(children))
        for child in children:
            child.plan = plan
        root = self.root
        with self._lock:
            if type(root._grid) is not int:  # cells already in use: cut them now
                root._grid.cut(axis, plan.starts)
            if not self.plans:
                self.plans = {}
            self.plans[(axis, n)] = plan
        return plan.children

    def _child(self, shape, box, name, footprint) -> "Handle":
        """A child view of this handle (its ``plan`` is set by :meth:`split`)."""
        h = Handle.__new__(Handle)
        h.id = next(_ids)
        h.shape = shape
        h.dtype = dtype = self.dtype
        h.name = name
        h.owner = self.owner
        h.parent = self
        h.plan = h._last_writer = h._cells = None
        h.box = box
        h.plans = _NO_PLANS
        h._replicas = {}
        h._grid = 0
        h.root = root = self.root
        h._lock = root._lock
        h.temporary = self.temporary
        h.generation = self.generation
        size = 1
        for d in shape:
            size *= d
        h.nbytes = size * dtype.itemsize
        h.footprint = footprint
        h._readers = _NO_READERS
        h._live_below = 0
        h.placed = None
        return h

    def overlaps(self, other: "Handle") -> bool:
        """Whether the two handles share elements (same root, intersecting boxes)."""
        if other.root is not self.root:
            return False
        return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(self.box, other.box))

    def within(self, other: "Handle") -> bool:
        """Whether every element of this handle belongs to ``other``."""
        return other.root is self.root and all(
            b0 <= a0 and a1 <= b1 for (a0, a1), (b0, b1) in zip(self.box, other.box))

    # ---------------------------------------------------------------- replicas
    def replica(self, node) -> object:
        """This handle's array on ``node`` (allocated on first use; a view for children).

        A root's buffer is allocated under its lock: two workers binding children of one
        root not yet allocated there must see views of one buffer. (Two views of it made
        at once are equal: a child keeps either.)"""
        arr = self._replicas.get(node.index)
        if arr is None:
            if self.parent is not None:
                arr = self._replicas[node.index] = self.parent.replica(node)[self.index]
                return arr  # a view, kept per node
            with self._lock:
                arr = self._replicas.get(node.index)
                if arr is None:  # stored before the lock is let go: one buffer
                    if self.placed is not None:  # laid out by the runtime (scheduler/lifetimes.py)
                        arr = self.placed.array(node, self)
                    elif self.temporary:
                        arr = node.arena.empty(self.shape, self.dtype)
                    else:
                        arr = node.empty(self.shape, self.dtype, self)  # evictable under a limit
                    self._replicas[node.index] = arr
        return arr

    @property
    def grid(self) -> "Grid":
        """The root's :class:`Grid`, made on first use with the cuts of every plan made
        so far (a split alone does not make it: on one memory node it is never needed)."""
        root = self.root
        grid = root._grid
        if type(grid) is int:
            with root._lock:
                grid = root._grid
                if type(grid) is int:
                    grid = Grid(root.shape, grid)
                    stack = [root]
                    while stack:
                        for plan in stack.pop().plans.values():
                            grid.cut(plan.axis, plan.starts)
                            stack.extend(plan.children)
                    root._grid = grid
        return grid

    def cells(self) -> tuple:
        """Slices of :attr:`grid` ``.mask`` covering this handle."""
        cached = self._cells
        grid = self.grid
        if cached is None or cached[0] != grid.version:
            cached = (grid.version, grid.cell_slices(self.box))
            self._cells = cached
        return cached[1]

    @property
    def valid(self) -> set:
        """Memory node indices whose replica holds the current data of the whole handle."""
        if type(self.root._grid) is int:
            return _nodes_of(self.root._grid)
        with self._lock:
            return _nodes_of(self._valid_bits())

    @property
    def valid_hint(self) -> set:
        """:attr:`valid` read without the root's lock: for placement estimates only.

        A policy runs under the executor's lock; taking a root's lock there would wait
        for a transfer that holds it while waiting for a stream whose completion
        callback needs the executor's lock (a deadlock seen with ``cuda-emu`` workers
        under ``dmda``). The answer may be stale while a transfer runs.
        """
        return _nodes_of(self._valid_bits())

    def _valid_bits(self) -> int:
        grid = self.root._grid
        if type(grid) is int:
            return grid
        sub = grid.mask[self.cells()]
        return int(sub.flat[0]) if sub.size == 1 else int(np.bitwise_and.reduce(sub, axis=None))

    @valid.setter
    def valid(self, nodes):
        bits = sum(1 << n for n in nodes)
        with self._lock:
            if self.parent is None and type(self._grid) is int:
                self._grid = bits
            else:
                self.grid.mask[self.cells()] = bits

    def __repr__(self):
        return f"Handle({self.name!r}, shape={self.shape}, dtype={self.dtype.name})"


class Grid:
    """Per root: the cells that every plan's cuts make, and per cell a bit mask of the
    memory nodes holding it current (see the module docstring). Guarded by the root's lock.

    ``cuts[d]``: sorted cell boundaries along dimension ``d`` (``0`` and the length
    included); ``mask``: ``uint64`` array with one entry per cell; ``version``:
    bumped when a cut refines the cells, so handles refresh their cached slices.
    """

    __slots__ = ("cuts", "mask", "version")

    def __init__(self, shape, mask: int = 0):
        self.cuts = [[0, d] if d else [0] for d in shape]
        cells = tuple(max(len(c) - 1, 1) for c in self.cuts) or (1,)  # a 0-d root: one cell
        self.mask = np.full(cells, mask, dtype=np.uint64)
        self.version = 0

    def cut(self, axis, positions):
        """Add cell boundaries along ``axis``; each new cell keeps its old cell's mask."""
        cuts = self.cuts[axis]
        new = sorted(set(positions).union(cuts))
        if len(new) == len(cuts):
            return
        # how many new cells each old cell becomes
        counts = [bisect.bisect_left(new, hi) - bisect.bisect_left(new, lo)
                  for lo, hi in zip(cuts, cuts[1:])]
        self.mask = np.repeat(self.mask, counts, axis=axis)
        self.cuts[axis] = new
        self.version += 1

    def cell_slices(self, box) -> tuple:
        out = []
        for (lo, hi), cuts in zip(box, self.cuts):
            if lo == hi:  # an empty dimension: its one (empty) cell
                out.append(slice(0, 1))
            else:
                out.append(slice(bisect.bisect_left(cuts, lo), bisect.bisect_left(cuts, hi)))
        return tuple(out) or (slice(0, 1),)

    def cell_box(self, index) -> tuple:
        """The root-coordinate slices of the cell at ``index`` (a tuple of ints)."""
        return tuple(slice(c[i], c[i + 1]) if len(c) > 1 else slice(0, 0)
                     for i, c in zip(index, self.cuts))


_NO_PLANS = MappingProxyType({})  # what an unsplit handle's ``plans`` is: read-only, shared
_NO_READERS = ()  # what a handle without readers in the flush holds


_FOOTPRINTS: dict = {}  # (shape, dtype) -> footprint: a program uses few shapes


def _footprint(shape, dtype) -> str:
    """The performance model's key for an operand: shape and dtype (``"4x3:<f8"``)."""
    key = (shape, dtype)
    fp = _FOOTPRINTS.get(key)
    if fp is None:
        if len(_FOOTPRINTS) > 4096:  # a program of ever new shapes: keep the memory bounded
            _FOOTPRINTS.clear()
        fp = _FOOTPRINTS[key] = "x".join(map(str, shape)) + ":" + dtype.str
    return fp


def _nodes_of(mask: int) -> set:
    nodes, n = set(), 0
    while mask and n < 64:
        if mask & 1:
            nodes.add(n)
        mask >>= 1
        n += 1
    return nodes


def _lowest(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


# -------------------------------------------------------------------- coherence
def make_valid(h: Handle, node, nodes) -> int:
    """Bring ``h``'s replica on ``node`` up to date; returns bytes copied. Root lock held."""
    held = h.root._grid
    if type(held) is int and h.parent is None:  # one mask for all of the root
        if held >> node.index & 1:
            return 0
        dst = h.replica(node)
        moved = 0
        if held:
            src = nodes[_lowest(held)]
            moved = node.copy(dst, h.replica(src), src)
        h._grid = held | 1 << node.index
        return moved
    bit = np.uint64(1 << node.index)
    sl = h.cells()
    grid = h.grid
    sub = grid.mask[sl]
    missing = (sub & bit) == 0
    if not missing.any():
        return 0
    dst = h.replica(node)
    common = int(np.bitwise_and.reduce(sub, axis=None))
    moved = 0
    if common:  # one node holds the whole view: one copy
        src = nodes[_lowest(common)]
        moved = node.copy(dst, h.replica(src), src)
    else:
        root = h.root
        offset = tuple(s.start for s in sl)
        for rel in zip(*np.nonzero(missing)):
            held = int(sub[rel])
            if not held:  # never written: nothing to bring, the fresh replica is the data
                continue
            box = grid.cell_box(tuple(o + int(i) for o, i in zip(offset, rel)))
            src = nodes[_lowest(held)]
            moved += node.copy(root.replica(node)[box], root.replica(src)[box], src)
    grid.mask[sl] = sub | bit
    return moved


def drop_replicas(root: Handle, node, nodes) -> None:
    """Forget ``root``'s replica on ``node`` and its views there (eviction), first
    copying to ``nodes[0]`` (the host) the cells only ``node`` holds. Root lock held."""
    bit = 1 << node.index
    grid = root._grid
    if type(grid) is int:
        if grid == bit:
            make_valid(root, nodes[0], nodes)
        root._grid &= ~bit
    else:
        if (grid.mask == np.uint64(bit)).any():
            make_valid(root, nodes[0], nodes)
        grid.mask &= ~np.uint64(bit)
    stack = [root]
    while stack:
        h = stack.pop()
        h._replicas.pop(node.index, None)
        for plan in h.plans.values():
            stack.extend(plan.children)


def mark_written(h: Handle, n: int) -> None:
    """Record that ``h`` was written on node index ``n``. Root lock held."""
    if h.parent is None and type(h._grid) is int:
        h._grid = 1 << n
    else:
        h.grid.mask[h.cells()] = np.uint64(1 << n)


def acquire(h: Handle, node, nodes, reads: bool, writes: bool):
    """Return ``(array, bytes_moved)`` for a task accessing ``h`` on ``node``."""
    with h._lock:
        moved = make_valid(h, node, nodes) if reads else 0
        arr = h.replica(node)
        if writes:
            mark_written(h, node.index)
    return arr, moved
