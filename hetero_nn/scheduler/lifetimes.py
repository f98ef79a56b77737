"""Lifetimes of a flush's temporaries: where each one lives in its memory node's arena,
and from when its bytes may serve another one.

Policy
------
When the runtime hands a closed DAG to the local executor (a capture, a replay, a
flush that does not stream), it knows every task that will touch each temporary
(``rt.temporary``, REDUX partials, the temporaries a capture makes). A temporary's
*interval* is the span of submission indices of the tasks that access it (through
any handle of its root). A temporary *released* with :meth:`Runtime.release
<hetero_nn.scheduler.runtime.Runtime.release>` (nothing reads it after this flush)
ends at its last access; any other one at the end of the flush, since it may be
fetched. Offsets are assigned greedily by size, largest first, each at the lowest
64-byte-aligned offset where no temporary of an intersecting interval lies (the
"greedy by size" assignment of TensorFlow Lite's arena planner). The flush then needs
one region of ``peak`` bytes per memory node, taken from the node's arena (from the
graph's own arenas for a capture, so a replay finds it again) when a temporary is
first used there; every replica of a temporary is a view of its node's region at the
temporary's offset. Placement depends on the task list alone: a replay uses the
same bytes, and :attr:`ArenaLayout.peak` is the arena's high-water for the flush.

Two temporaries that share bytes run in order: a dependency is added from each
*last* accessor of the earlier one (an accessor with no successor among its
accessors) to each *first* accessor of the later one (no predecessor among its
accessors). Every accessor of a root follows a first one and precedes a last one,
so no task of the later temporary starts before every task of the earlier one has
finished, and the edges go forward in submission order (no cycle). Transfers and
prefetches run for a task whose predecessors have finished, so they obey the order too.

A flush on a runtime with CUDA workers shares no bytes: a stream's copies and
kernels, enqueued ahead, do not keep the order that sharing needs (replays gave NaN
losses on ``cuda-emu:1``; submitted steps under ``heft`` other bits than replayed
ones), so there every temporary keeps bytes of its own.

With ``Runtime(arenas=False)`` (the memory study's baseline: plain per-task
allocation) nothing is placed and no edge is added: each replica is an allocation of
its own (the node's array module's ``empty``, outside the node's memory-limit
bookkeeping, as a program without arenas would call it) made when a task first uses
it, dropped when the last task of a released temporary has run, or when the next run
of the flush starts (a replay) for the others.

State
-----
``Lifetimes.roots``: planned roots in order of first access; ``first``/``last``: root
-> submission index; ``accessors``: root -> tasks in submission order; ``released``:
the released roots. ``ArenaLayout.offset``: root -> bytes; ``peak``; ``regions``: node
index -> the region. ``PlainAllocation.remaining``: released root -> accessors not yet
finished in this run; ``live``/``high_water``/``allocations`` per node name.
``Temporaries`` (one per runtime): ``released`` in the current flush, ``collectors``
(:meth:`Runtime.collect_temporaries <hetero_nn.scheduler.runtime.Runtime.collect_temporaries>`),
``plain`` (the per-task allocator, or None).
"""

from __future__ import annotations

import threading
import weakref

from ..codelets.codelet import SCRATCH
from .task import link
from .trace.records import MemoryRecord
from ..arena.handle import Handle
from ..errors import SubmitError

ALIGNMENT = 64
_END = float("inf")


def _round_up(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


class Lifetimes:
    """The planned roots of one flush (``tasks`` in submission order) and their intervals.

    ``plannable(root)`` says which roots the runtime places (temporaries not yet
    allocated); ``released`` is the set of roots released in this flush.
    """

    def __init__(self, tasks, plannable, released):
        first, last, accessors = {}, {}, {}
        for i, task in enumerate(tasks):
            for h, m in zip(task.handles, task.modes):
                if m is SCRATCH:
                    continue
                root = h.root
                if root in last:
                    if last[root] != i:  # not the same root twice in one task
                        last[root] = i
                        accessors[root].append(task)
                elif plannable(root):
                    first[root] = last[root] = i
                    accessors[root] = [task]
        self.tasks = tasks
        self.roots = list(first)
        self.first, self.last, self.accessors = first, last, accessors
        self.released = {r for r in self.roots if r in released}

    def end(self, root) -> float:
        """The submission index after which ``root``'s bytes are free (inf: the flush's end)."""
        return self.last[root] if root in self.released else _END

    def memory_records(self) -> list:
        """After a run: one :class:`~hetero_nn.scheduler.trace.MemoryRecord` per planned
        root and memory node its tasks ran on, live from the first of them starting to
        the last of all ending (released) or to the end of the flush (the others)."""

        ran = [t for t in self.tasks if t.t_start and t.worker is not None
               and not isinstance(t.worker, str)]
        if not ran:
            return []
        flush_end = max(t.t_end for t in ran)
        out = []
        for root in self.roots:
            starts: dict = {}
            last = 0.0
            for t in self.accessors[root]:
                if not t.t_start or t.worker is None or isinstance(t.worker, str):
                    continue
                node = t.worker.node.name
                starts[node] = min(starts.get(node, t.t_start), t.t_start)
                last = max(last, t.t_end)
            end = last if root in self.released else flush_end
            out.extend(MemoryRecord(root.name, node, root.nbytes, start, end)
                       for node, start in starts.items())
        return out

    def first_accessors(self, root) -> list:
        mine = set(self.accessors[root])
        return [t for t in self.accessors[root] if not any(p in mine for p in t.preds)]

    def last_accessors(self, root) -> list:
        mine = set(self.accessors[root])
        return [t for t in self.accessors[root] if not any(s in mine for s in t.succ)]


class ArenaLayout:
    """Offsets of a flush's planned temporaries in one region per memory node.

    ``take(node, nbytes)`` gives the region's bytes on a node (an arena's ``empty``);
    it is called once per node, the first time a planned temporary is used there.
    """

    def __init__(self, lifetimes, take):
        self.lifetimes = lifetimes
        self._take = take
        self.offset: dict = {}
        placed = []  # (offset, end offset, first, end) of the roots placed so far
        for root in sorted(lifetimes.roots, key=lambda r: (-r.nbytes, lifetimes.first[r])):
            lo, hi = lifetimes.first[root], lifetimes.end(root)
            size = _round_up(max(root.nbytes, 1))
            busy = sorted((a, b) for a, b, f, e in placed if f <= hi and lo <= e)
            offset = 0
            for a, b in busy:
                if offset + size <= a:
                    break
                offset = max(offset, b)
            self.offset[root] = offset
            placed.append((offset, offset + size, lo, hi))
        self.peak = max((b for _, b, _, _ in placed), default=0)
        self.regions: dict = {}
        self._lock = threading.Lock()
        self.edges = self._order_reuse(placed)

    def _order_reuse(self, placed) -> int:
        """Add the dependencies that keep temporaries sharing bytes in order (module
        docstring); returns how many were added."""
        lt = self.lifetimes
        by_start = sorted(lt.roots, key=lambda r: lt.first[r])
        added = 0
        spans = {r: (self.offset[r], self.offset[r] + _round_up(max(r.nbytes, 1)))
                 for r in lt.roots}
        for j, later in enumerate(by_start):
            a1, b1 = spans[later]
            heads = None
            for earlier in by_start[:j]:
                if lt.end(earlier) >= lt.first[later]:
                    continue
                a0, b0 = spans[earlier]
                if not (a0 < b1 and a1 < b0):
                    continue
                if heads is None:
                    heads = lt.first_accessors(later)
                for t in lt.last_accessors(earlier):
                    for h in heads:
                        added += link(t, h)
        return added

    def array(self, node, root):
        """``root``'s replica on ``node``: a view of the node's region at its offset."""
        region = self.regions.get(node.index)
        if region is None:
            with self._lock:
                region = self.regions.get(node.index)
                if region is None:
                    region = self.regions[node.index] = self._take(node, self.peak)
        start = self.offset[root]
        return region[start:start + root.nbytes].view(root.dtype).reshape(root.shape)


class PlainAllocation:
    """Per-task allocation (``Runtime(arenas=False)``): a replica is ``xp.empty`` when a
    task first uses it; a released root's replicas are dropped after its last accessor.

    Counts, per node name, the arrays allocated (``allocations``), the bytes they hold
    (``live``) and the most held at once (``high_water``).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.remaining: dict = {}
        self.allocations: dict = {}
        self.live: dict = {}
        self.high_water: dict = {}
        self.holding: dict = {}  # root -> node names holding a replica

    def array(self, node, root):
        with node.context():  # the array module's own allocator, as a program without
            arr = node.xp.empty(root.shape, dtype=root.dtype)  # arenas would call it
        with self._lock:
            name = node.name
            self.allocations[name] = self.allocations.get(name, 0) + 1
            live = self.live[name] = self.live.get(name, 0) + root.nbytes
            if live > self.high_water.get(name, 0):
                self.high_water[name] = live
            self.holding.setdefault(root, []).append(name)
        return arr

    def track(self, lifetimes) -> None:
        """Mark the accessors of the released roots of a flush to report when they
        finish (``Task.frees``: the released roots each one accesses)."""
        for root in lifetimes.released:
            for t in lifetimes.accessors[root]:
                t.frees = (*(t.frees or ()), root)

    def begin(self, lifetimes) -> None:
        """A run of the flush starts: drop the replicas the last run left, count the
        accessors of the released roots."""
        for root in lifetimes.roots:
            self.drop(root)
        with self._lock:
            for root in lifetimes.released:
                self.remaining[root] = len(lifetimes.accessors[root])

    def forget_flush(self, generation) -> None:
        """The flush of ``generation`` ended: stop counting its temporaries (their arrays
        go when the program drops the handles; an arena would reset here)."""
        with self._lock:
            gone = [r for r in self.holding if r.temporary and r.generation == generation]
            for root in gone:
                for name in self.holding.pop(root):
                    self.live[name] -= root.nbytes
                self.remaining.pop(root, None)

    def finished(self, task) -> None:
        """``task`` ran: drop the released roots it was the last accessor of."""
        done = []
        with self._lock:
            for root in task.frees:
                left = self.remaining.get(root, 0) - 1
                self.remaining[root] = left
                if left == 0:
                    done.append(root)
        for root in done:
            self.drop(root)

    def drop(self, root) -> None:
        """Forget ``root``'s replicas (and its views' ones): the arrays are freed."""
        with self._lock:
            names = self.holding.pop(root, ())
            for name in names:
                self.live[name] -= root.nbytes
        if not names:
            return
        with root._lock:
            stack = [root]
            while stack:
                h = stack.pop()
                h._replicas.clear()
                for plan in h.plans.values():
                    stack.extend(plan.children)
            if type(root._grid) is int:
                root._grid = 0
            else:
                root._grid.mask[...] = 0



class Temporaries:
    """One runtime's side of this module: the roots released in the current flush, the
    lists collecting the temporaries made (``collect_temporaries``), and the per-task
    allocator when the runtime has no arenas."""

    __slots__ = ("rt", "plain", "released", "collectors", "graphs", "keeping")

    def __init__(self, runtime, arenas: bool):
        self.rt = runtime
        self.plain = None if arenas else PlainAllocation()
        self.released: set = set()
        self.collectors: list = []
        self.graphs = weakref.WeakSet()  # captured graphs alive (their arenas)
        self.keeping = 0  # depth of keeping_temporaries() blocks: releases ignored

    def stats(self) -> dict:
        """Per memory node name: ``high_water`` (most bytes held for temporaries: the node
        arena's high-water plus the live graphs' arenas', or the most that per-task
        arrays held at once) and ``allocations`` (real allocations so far: arena
        blocks, or per-task arrays)."""
        out = {}
        for node in self.rt.nodes:
            if self.plain is not None:
                out[node.name] = {"high_water": self.plain.high_water.get(node.name, 0),
                                  "allocations": self.plain.allocations.get(node.name, 0)}
                continue
            arenas = [node.arena] + [g._arenas[node.index] for g in list(self.graphs)
                                     if node.index in g._arenas]
            stats = [a.stats for a in arenas]
            out[node.name] = {"high_water": sum(s.high_water for s in stats),
                              "allocations": sum(s.block_allocations for s in stats)}
        return out

    def made(self, h, capture) -> None:
        """A temporary was just made (inside ``capture``, a Graph, or not)."""
        if capture is not None:
            capture._made.add(h)
        if self.plain is not None:
            h.placed = self.plain
        for made in self.collectors:
            made.append(h)

    def releasable(self, h, generation, capture) -> bool:
        root = h.root
        return (root.temporary and root.generation == generation) or (
            capture is not None and root in capture._made)

    def release(self, handles, generation, capture) -> None:

        for h in handles:
            if type(h) is not Handle or h.owner is not self.rt:
                raise SubmitError(f"release: {h!r} is not a handle of this Runtime")
            if not self.releasable(h, generation, capture):
                raise SubmitError(f"release: handle {h.name!r} is not a temporary of the "
                                  "current flush")
            if not self.keeping:
                self.released.add(h.root)

    def lay_out(self, tasks, generation, capture):
        """The :class:`Lifetimes` of a flush the local executor runs as one DAG, its
        temporaries placed (an :class:`ArenaLayout`, reuse ordered) or tracked
        (per-task allocation); None where nothing is planned."""
        if self.rt.executor_name != "local":
            return None
        made = None if capture is None else capture._made

        def plannable(root):
            if root._replicas:  # allocated by an earlier flush of this capture
                return False
            return (root.temporary and root.generation == generation) or (
                made is not None and root in made)

        released = self.released
        if any(w.stream is not None for w in self.rt.workers):
            released = ()  # streams do not keep the order shared bytes need (seen: NaNs)
        lifetimes = Lifetimes(tasks, plannable, released)
        if not lifetimes.roots:
            return None
        if self.plain is not None:
            self.plain.track(lifetimes)
            return lifetimes
        take = _from_node_arena if capture is None else capture._region
        lifetimes.layout = layout = ArenaLayout(lifetimes, take)
        for root in lifetimes.roots:
            root.placed = layout
        return lifetimes

    def begin(self, lifetimes) -> None:
        """A run of a laid-out flush starts."""
        if lifetimes is not None and self.plain is not None:
            self.plain.begin(lifetimes)

    def end(self, generation) -> None:
        """The flush of ``generation`` ended."""
        self.released.clear()
        if self.plain is not None:
            self.plain.forget_flush(generation)


def _from_node_arena(node, nbytes):
    """A flush's region on ``node`` from the node's arena (reset when the next flush runs)."""
    return node.arena.empty((max(nbytes, 1),), "uint8")
