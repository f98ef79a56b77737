"""Dependency inference: which earlier tasks of the flush a submitted task must follow.

Policy
------
Tasks are submitted in program order (StarPU's sequential task flow). For every
operand the runtime keeps, per handle, the last writer and the readers since;
an ``R`` access waits for the last writer, a ``W``/``RW`` access waits for the
last writer and every reader since (write-after-read). Accesses through any
handle of one root are ordered as sequential NumPy on the same views would be:
two handles conflict when their boxes (index ranges in the root) intersect,
whether one is below the other or they belong to different partition plans.
Children of one plan are disjoint by construction and never compared.

The cost of a submission does not grow with what is pending. A reader appends
itself to its handle's reader list; a writer takes that list as dependencies
once and empties it, and empties the state of every handle inside the region
it writes (it depends on them, so later accesses need only it). Finding the
conflicting handles walks the ancestors, the descendants that hold state
(``_live_below`` counts them), and, per other plan of an ancestor, only the
children whose range meets the access (a bisection); for a child of a root's only
plan, the root without state and nothing below the child with any, there is nothing
to find and no walk. All dependency state belongs to the tasks of one flush and is
dropped when the flush ends (:meth:`Dependencies.drop`).

``REDUX`` and ``SCRATCH`` operands make no dependency here (see
:mod:`~hetero_nn.scheduler.redux`).

State
-----
Per handle, in slots of :class:`~hetero_nn.arena.handle.Handle` (StarPU keeps it
in the handle too; a dictionary keyed by handle would cost a lookup per operand):
``_last_writer`` (the task that last wrote it in this flush, or None),
``_readers`` (tasks that read it since: a list, or an empty tuple), ``_live_below`` (handles below it that
hold state). Per runtime, :attr:`Dependencies.tracked`: the handles given state in
this flush, whose state :meth:`Dependencies.drop` clears.
"""

from __future__ import annotations

from ..arena.handle import Handle
from ..errors import SubmitError


class Dependencies:
    """The dependency state of one runtime's current flush (see the module docstring).

    ``depend_root`` and ``depend`` add to ``preds`` (a dict used as an ordered set)
    the tasks a new task must follow for one operand, and update the state.
    """

    __slots__ = ("tracked",)

    def __init__(self):
        self.tracked: list[Handle] = []

    def depend_root(self, task, h, writes, preds):
        """:meth:`depend` for a root never split, the common case: O(1) for a reader."""
        lw = h._last_writer
        readers = h._readers
        if lw is None and not readers:
            self.tracked.append(h)
        elif lw is not None:
            preds[lw] = None
        if writes:
            if readers:
                for r in readers:
                    preds[r] = None
                h._readers = ()
            h._last_writer = task
        elif readers:
            readers.append(task)
        else:
            h._readers = [task]

    def depend(self, task, h, writes, preds):
        """Add to ``preds`` the tasks ``task`` must follow to access ``h``; update the state.

        Every handle of ``h``'s root with state whose box meets ``h``'s conflicts:
        ``task`` follows its last writer, and, when writing, its readers; a
        write then empties the state of the handles it covers.
        """
        a = h.parent
        if (a is not None and a.parent is None and a._last_writer is None and not a._readers
                and not h._live_below and len(a.plans) == 1):
            conflicting = ()  # the one plan of a root without state: siblings are disjoint
        else:
            conflicting = _conflicting(h)
        for x in conflicting:
            lw = x._last_writer
            if lw is not None:
                preds[lw] = None
            if writes:
                for r in x._readers:
                    preds[r] = None
        own = h._last_writer
        if own is not None:
            preds[own] = None
        if writes:
            for x in conflicting:
                if x.within(h):
                    _set_state(x, None, (), self.tracked)
            readers = h._readers
            if readers:
                for r in readers:
                    preds[r] = None
                h._readers = ()
            h._last_writer = task
            if own is None and not readers:  # h had no state: count it in its ancestors
                h._readers = ()  # _set_state(h, task, (), self.tracked), inlined: the hot case
                self.tracked.append(h)
                a = h.parent
                while a is not None:
                    a._live_below += 1
                    a = a.parent
        elif h._readers:
            h._readers.append(task)
        elif own is None:
            _set_state(h, None, [task], self.tracked)
        else:
            h._readers = [task]

    def drop(self):
        """Forget the flushed tasks: every dependency is on a task of the same flush."""
        for h in self.tracked:
            h._last_writer = None
            h._readers = ()
            h._live_below = 0
            a = h.parent
            while a is not None and a._live_below:  # above a zeroed one, all are zeroed
                a._live_below = 0
                a = a.parent
        self.tracked = []


def check_overlap(codelet, handles, modes):
    """Refuse a task that writes a region it also reaches through another handle.

    In place the two arrays would alias, in the pure Dask graph they would not:
    the result would depend on the executor. (One handle twice is fine.)
    """
    for i, a in enumerate(handles):
        if type(a) is not Handle:
            continue  # the operand check names it
        for j in range(i + 1, len(handles)):
            b = handles[j]
            if b is a or type(b) is not Handle:
                continue
            if (modes[i].writes or modes[j].writes) and a.overlaps(b):
                raise SubmitError(
                    f"codelet {codelet.name!r}: operands {i} ({a.name!r}, {modes[i].value}) and "
                    f"{j} ({b.name!r}, {modes[j].value}) overlap and one of them is written; "
                    "pass disjoint handles")


def _conflicting(h) -> list:
    """The handles of ``h``'s root, other than ``h``, that hold dependency state and
    whose boxes meet ``h``'s: ancestors; descendants through every plan; and below
    each ancestor's other plans, the handles whose ranges meet ``h``'s (siblings of
    one plan are disjoint and skipped)."""
    out = []
    child, a = h, h.parent
    while a is not None:
        if a._last_writer is not None or a._readers:
            out.append(a)
        if len(a.plans) > 1 and a._live_below > child._live_below + (
                child._last_writer is not None or bool(child._readers)):  # state beside the path
            for plan in a.plans.values():
                if plan is not child.plan:
                    _tracked_meeting(plan, h.box, out)
        child, a = a, a.parent
    if h._live_below:
        for plan in h.plans.values():
            _tracked_meeting(plan, h.box, out)
    return out


def _tracked_meeting(plan, box, out):
    """Append to ``out`` the handles with state below ``plan`` whose boxes meet ``box``."""
    for c in plan.meeting(box):
        if not all(c0 < b1 and b0 < c1 for (c0, c1), (b0, b1) in zip(c.box, box)):
            continue
        if c._last_writer is not None or c._readers:
            out.append(c)
        if c._live_below:
            for p in c.plans.values():
                _tracked_meeting(p, box, out)


def _set_state(h, writer, readers, tracked):
    """Give ``h`` dependency state (or none), keeping the ``_live_below`` counts of
    its ancestors and the list of handles to clear at the end of the flush."""
    had = h._last_writer is not None or bool(h._readers)
    has = writer is not None or bool(readers)
    h._last_writer = writer
    h._readers = readers
    if has != had:
        step = 1 if has else -1
        if has:
            tracked.append(h)
        a = h.parent
        while a is not None:
            a._live_below += step
            a = a.parent
