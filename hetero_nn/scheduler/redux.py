"""REDUX trees: private partials for commutative accumulation, combined in a fixed order.

Policy
------
A ``REDUX`` contribution makes no dependency on the handle it accumulates
into: the task gets a private partial instead (a temporary of the current flush,
initialised by the codelet's ``init`` when the task binds it). At the next
non-REDUX access to any handle of the same root (or at ``wait``) the runtime
submits a balanced tree of ``redux`` tasks over the partials in submission order
and adds the result into the handle, so the result is bit-for-bit the same
whatever the executor, policy or timing. A task's non-REDUX operands are
processed before its REDUX ones, and a REDUX access combines the other handles of
its root but keeps those the same task accumulates into, so no tree ever takes the
partial of the task being submitted (the pending list stays in topological order).

State
-----
``pending``: root handle -> ``{handle of that root: [(partial, codelet), ...]}``
for the handles with partials not yet combined, in the order of their first
contribution (partials in submission order). ``_codelets``: per accumulating
codelet, the ``<name>.redux`` codelet (``RW``, ``R``) that runs its ``redux``.
``across``: None, or a callable ``across(handle, partials)`` that submits the
combination of the trees pending on a handle instead of the local tree (a cluster
worker reduces its partitions' partials with those of the other workers, see
:mod:`hetero_nn.training.cluster.exchange`); set by :meth:`Runtime.combining_with`.
"""

from __future__ import annotations

from ..codelets.codelet import REDUX, RW, R, Codelet


class Reductions:
    """The REDUX partials of one runtime and the trees that combine them."""

    __slots__ = ("rt", "pending", "_codelets", "across")

    def __init__(self, runtime):
        self.rt = runtime
        self.pending: dict = {}
        self._codelets: dict = {}
        self.across = None

    def contribute(self, task, codelet, handles, modes) -> list:
        """``handles`` with each REDUX operand replaced by a fresh partial that ``task``
        writes (after combining other pending trees of the same roots)."""
        ops = list(handles)
        keep = {h for h, m in zip(handles, modes) if m is REDUX}
        pending = self.pending
        for i, h in enumerate(handles):
            if modes[i] is REDUX:
                root = h.root
                if root in pending:
                    self.combine_family(root, keep=keep)
                family = pending.get(root)
                parts = family.get(h) if family is not None else None
                if parts is None:
                    parts = pending.setdefault(root, {})[h] = []
                partial = self.rt._handles.temporary(h.shape, h.dtype,
                                                     f"{h.name}.partial{len(parts)}")
                partial._last_writer = task  # the tree's tasks follow it (its only writer)
                parts.append((partial, codelet))
                ops[i] = partial
        return ops

    def combine_family(self, root, keep=()):
        """Submit the REDUX trees pending on any handle of ``root`` (any plan), in the
        order of their first contribution, but those of the handles in ``keep`` (the
        REDUX operands of the task being submitted)."""
        family = self.pending.pop(root)
        kept = {x: parts for x, parts in family.items() if x in keep}
        if kept:
            self.pending[root] = kept
        for x, parts in family.items():
            if x not in keep:
                self._combine(x, parts)

    def combine_all(self):
        """Submit every pending tree (before a flush ends)."""
        while self.pending:
            self.combine_family(next(iter(self.pending)))

    def take(self, h) -> list:
        """The partials pending on ``h`` in submission order, removed from its tree
        (their combination is the caller's); [] when there are none."""
        family = self.pending.get(h.root)
        if family is None or h not in family:
            return []
        parts = family.pop(h)
        if not family:
            del self.pending[h.root]
        return [p for p, _ in parts]

    def _combine(self, h, contributions):
        parts = [p for p, _ in contributions]
        self.rt._temporaries.released.update(parts)  # this tree reads them, nothing after
        if self.across is not None:
            self.across(h, parts)
            return
        rc = self._redux_codelet(contributions[0][1])
        submit = self.rt._submit  # the runtime's own: no shape of the program's (autocapture.py)
        step = 1
        while step < len(parts):
            for i in range(0, len(parts) - step, 2 * step):
                submit(rc, (parts[i], parts[i + step]), {})
            step *= 2
        submit(rc, (h, parts[0]), {})

    def _redux_codelet(self, codelet):
        rc = self._codelets.get(codelet)
        if rc is None:
            rc = Codelet(f"{codelet.name}.redux", modes=(RW, R),
                         variants={"ref": codelet.redux, "cuda": codelet.redux})
            self._codelets[codelet] = rc
        return rc
