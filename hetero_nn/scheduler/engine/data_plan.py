"""The data plan of a compiled segment on several memory nodes: its copies, fixed once.

Policy
------
A task reads its operands on its worker's memory node. A submitted task acquires them
there when it starts (``Runtime.bind``): the copies coherence asks for depend on where
earlier tasks ran. A compiled segment's fixed schedule puts every task on a known node,
so its copies are known too, and every operand has a fixed replica: its tasks bind to
arrays once and run compiled, as on one node. :func:`schedule_transfers` finds the copies by
running coherence (MSI per cell, as :func:`~hetero_nn.arena.handle.make_valid` does)
through the segment in one topological order that merges the workers' orders:

- *inputs*: a view read on node ``n`` before the segment writes it is made valid on
  ``n`` when a replay starts (``acquire``; one mask check per root when every input of
  it already is, the usual case: the last replay left it there): the prologue;
- *transfers*: cells the segment wrote, read on a node that lacks them, are copied
  there by a :class:`Transfer`: the whole view from one node holding all of it, else
  cell by cell from the lowest node holding each, as ``make_valid`` copies. A transfer
  waits for the tasks that wrote what it copies (and for the transfer that brought it
  to its source), and every reader of that version on its node waits for it. The
  segment places it just before its first reader in that order, so the workers' orders
  still merge into one topological order (no deadlock). Host to host it is one compiled
  copy on its first reader's worker; to or from a device it is enqueued on the device's
  stream by that device's worker;
- *epilogue*: compiled tasks leave the coherence state alone, so after a replay each
  root the segment touched gets the state the segment leaves, one masked update per root:
  a cell it wrote is valid exactly where its last version is, a cell it only read keeps
  its state plus the nodes it was copied to. After a failed replay (the tasks and copies
  other shares had not started were cancelled) the effects of those that ran are applied
  in order instead, one by one, as acquiring their operands would have: the state then
  says where each cell's data really is.

A plan stays right while each root's cells stay those it was planned on
(:meth:`TransferSchedule.current`; a later split that cuts a root again makes the segment
compile again). None is made when a node has a memory limit: a replica may then be
evicted and come back at another address, so operands are acquired at every run.

State
-----
:class:`TransferSchedule`: ``transfers``, ``waits`` (task -> the transfers it reads through),
``shadows`` (per root, its cells' planned state and its inputs: views, the node each is
read on first and by which task, and per cell the nodes they must be valid on).
"""

from __future__ import annotations

import numpy as np

from ...arena.handle import acquire
from ...codelets.codelet import R, SCRATCH


class Transfer:
    """One planned copy into node ``dst`` from node ``src``: ``pairs`` of (destination,
    source) arrays (a view of a handle, or one cell of its root), ``nbytes`` in all. It
    waits for the tasks ``writers`` (what wrote the data) and the transfers ``after``
    (what brought it to ``src``), and goes just before task ``first``, its first reader."""

    __slots__ = ("src", "dst", "pairs", "nbytes", "writers", "after", "first")

    def __init__(self, src, dst, pairs, writers, after, first):
        self.src, self.dst, self.pairs = src, dst, pairs
        self.nbytes = sum(int(d.nbytes) for d, _ in pairs)
        self.writers, self.after, self.first = writers, after, first

    @property
    def name(self) -> str:
        return f"copy {self.src.name}->{self.dst.name}"

    def __repr__(self):
        return f"Transfer({self.name}, {self.nbytes} bytes, before task {self.first})"


class _Shadow:
    """The planned state of one root's cells (one cell for a root never split):
    ``written`` by the segment so far, ``bits`` the nodes holding each (exactly once
    written; at least, before), ``writer`` the last task writing it, ``via[node]`` the
    transfer that brought its current version to ``node`` (or -1); its ``inputs`` and the
    nodes ``need`` says they are read on."""

    __slots__ = ("root", "split", "version", "shape", "written", "bits", "writer", "via",
                 "inputs", "need")

    def __init__(self, root, n_nodes):
        grid = root._grid
        self.root = root
        self.split = type(grid) is not int
        self.version = grid.version if self.split else None
        self.shape = grid.mask.shape if self.split else (1,)
        self.written = np.zeros(self.shape, bool)
        self.bits = np.zeros(self.shape, np.uint64)
        self.writer = np.full(self.shape, -1, np.int64)
        self.via = np.full((n_nodes, *self.shape), -1, np.int64)
        self.inputs = {}  # (view id, node index) -> (view, node, first reader)
        self.need = np.zeros(self.shape, np.uint64)  # per cell, the nodes inputs read it on

    def missing(self) -> bool:
        """Whether some input cell is not valid (now) on a node the plan reads it on."""
        grid = self.root._grid
        mask = np.uint64(grid) if not self.split else grid.mask
        return bool((self.need & ~mask).any())

    def cells(self, h) -> tuple:
        return h.cells() if self.split else (slice(None),)

    def settle(self) -> None:
        """Write the planned final state into the root's cells (module docstring)."""
        root = self.root
        with root._lock:
            if not self.split:
                bits = int(self.bits[0])
                root._grid = bits if self.written[0] else root._grid | bits
                return
            mask = root._grid.mask
            mask[...] = np.where(self.written, self.bits, mask | self.bits)

    def mark(self, cells, bit, written) -> None:
        """One effect on the root's state: ``cells`` (slices, or a cell's index) now valid
        on ``bit``'s node too, or (``written``) only there."""
        root = self.root
        with root._lock:
            if not self.split:
                root._grid = int(bit) if written else root._grid | int(bit)
            elif written:
                root._grid.mask[cells] = bit
            else:
                root._grid.mask[cells] |= bit


def _lowest(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


class TransferSchedule:
    """The copies of one compiled segment (module docstring)."""

    def __init__(self, transfers, waits, shadows, effects):
        self.transfers = transfers
        self.waits = waits
        self.shadows = shadows
        self.effects = effects  # in order: (counter index, shadow, cells, bit, written)
        self.inputs = [sh for sh in shadows if sh.inputs]
        # the roots a replay changes the state of (one only read keeps the prologue's)
        self.changed = [sh for sh in shadows if sh.written.any() or (sh.via >= 0).any()]
        self.split = [(sh.root, sh.version, sh.shape) for sh in shadows if sh.split]
        self.whole = [sh.root for sh in shadows if not sh.split]

    def current(self) -> bool:
        """Whether every root still has the cells the plan was made on."""
        for root in self.whole:
            if type(root._grid) is not int:
                return False
        for root, version, shape in self.split:
            grid = root._grid
            if type(grid) is int or grid.version != version or grid.mask.shape != shape:
                return False
        return True

    def prologue(self, nodes, bytes_in) -> None:
        """Make the inputs valid where the plan reads them (a root whose inputs all are
        costs one check); the bytes copied are added to their first reader's ``bytes_in``."""
        for sh in self.inputs:
            if not sh.missing():
                continue
            for h, node, first in sh.inputs.values():
                with node.context():
                    bytes_in[first] += acquire(h, node, nodes, True, False)[1]

    def epilogue(self, ran=None) -> None:
        """Give every root the replay changed the state it left (module docstring);
        ``ran`` (after a failure): per counter index (tasks, then transfer ``k`` at
        ``n + k``), whether it ran, so only what did counts."""
        if ran is None:
            for sh in self.changed:
                sh.settle()
            return
        for i, sh, cells, bit, written in self.effects:
            if ran[i]:
                sh.mark(cells, bit, written)


def schedule_transfers(nodes, tasks, node_of, order):
    """The :class:`TransferSchedule` of ``tasks`` (a segment's, bundles flattened), task ``t``
    running on memory node ``node_of[t]``, simulated in ``order`` (task indices, one
    topological order); None when the segment cannot be planned (module docstring)."""
    if any(node.limit is not None for node in nodes):
        return None
    shadows: dict = {}
    transfers: list = []
    waits: dict = {}
    effects: list = []
    n_nodes = len(nodes)
    n = len(tasks)
    for t in order:
        task, node = tasks[t], node_of[t]
        bit = np.uint64(1 << node.index)
        for h, m in zip(task.handles, task.modes):
            if not m.reads:
                continue
            sh = _shadow(shadows, h.root, n_nodes)
            sl = sh.cells(h)
            written, bits = sh.written[sl], sh.bits[sl]
            if ((bits & bit) == 0)[~written].any():  # an input not yet valid here
                sh.inputs.setdefault((id(h), node.index), (h, node, t))
                bits[~written] |= bit
                sh.need[sl][~written] |= bit
            if ((bits & bit) == 0).any():
                for k, cells in _bring(sh, h, sl, node, nodes, t, transfers):
                    effects.append((n + k, sh, cells, bit, False))
            via = sh.via[node.index][sl]
            through = set(int(x) for x in np.unique(via[via >= 0]))
            if through:
                waits.setdefault(t, set()).update(through)
        for h, m in zip(task.handles, task.modes):
            if m is SCRATCH or m is R:
                continue
            sh = _shadow(shadows, h.root, n_nodes)
            sl = sh.cells(h)
            sh.written[sl] = True
            sh.bits[sl] = bit
            sh.writer[sl] = t
            sh.via[(slice(None), *sl)] = -1
            effects.append((t, sh, sl, bit, True))
    return TransferSchedule(transfers, waits, list(shadows.values()), effects)


def _shadow(shadows, root, n_nodes):
    sh = shadows.get(root.id)
    if sh is None:
        sh = shadows[root.id] = _Shadow(root, n_nodes)
    return sh


def _bring(sh, h, sl, node, nodes, t, transfers) -> list:
    """Plan the copies that make view ``h`` (its cells ``sl``) valid on ``node`` for task
    ``t``, as ``make_valid`` would make them; updates the shadow. Returns ``[(transfer
    index, the cells it makes valid)]`` (slices, or a tuple of cell indices)."""
    bits = sh.bits[sl]
    bit = np.uint64(1 << node.index)
    common = int(np.bitwise_and.reduce(bits, axis=None))
    groups: dict = {}  # source node index -> [(cell mask within sl, pairs)]
    if common:
        src = nodes[_lowest(common)]
        groups[src.index] = (np.ones(bits.shape, bool), [_pair(h, node, src)])
    else:
        grid = sh.root._grid
        offset = tuple(s.start for s in sl)
        lacking = (bits & bit) == 0
        for rel in zip(*np.nonzero(lacking)):
            src = nodes[_lowest(int(bits[rel]))]
            cells, pairs = groups.setdefault(src.index, (np.zeros(bits.shape, bool), []))
            cells[rel] = True
            box = grid.cell_box(tuple(o + int(i) for o, i in zip(offset, rel)))
            pairs.append(_pair(sh.root, node, src, box))
    writer, via_dst = sh.writer[sl], sh.via[node.index][sl]
    made = []
    for s, (cells, pairs) in groups.items():
        writers = {int(w) for w in writer[cells] if w >= 0}
        after = {int(x) for x in sh.via[s][sl][cells] if x >= 0}
        via_dst[cells] = len(transfers)
        bits[cells] |= bit
        absolute = tuple(o + i for o, i in zip((x.start for x in sl), np.nonzero(cells))) \
            if sh.split else sl
        made.append((len(transfers), absolute))
        transfers.append(Transfer(nodes[s], node, pairs, writers, after, t))
    return made


def _pair(h, dst, src, box=None):
    """``(destination, source)`` arrays of ``h`` (or of ``h[box]``), replicas allocated in
    their nodes' contexts."""
    with dst.context():
        d = h.replica(dst)
    with src.context():
        s = h.replica(src)
    return (d, s) if box is None else (d[box], s[box])
