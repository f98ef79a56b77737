"""The handle factory: the handles a runtime makes, and the checks on those it is given;
and the runtime's handle methods (:class:`RuntimeHandles`, which ``Runtime`` inherits).

Policy
------
``register`` wraps a host NumPy array: its buffer is the handle's host replica
(no copy). ``empty`` makes a handle with no data; its replicas are allocated where
it is first used. ``temporary`` makes one whose replicas come from the node arenas,
valid for one flush: the arenas are reset when the next flush starts, so a task
submitted on it later is refused. Inside a capture a temporary is the captured
graph's own (an ordinary handle, allocated once), so the graph stays valid while
other flushes run between replays. Where a flush runs as one DAG its temporaries are
laid out from their lifetimes (:mod:`~hetero_nn.scheduler.lifetimes`). Children come from
:meth:`Handle.split <hetero_nn.arena.handle.Handle.split>`.

``close`` writes back: every registered root still managed gets a current host replica
(its array holds the last values written on any node), so a model's ``state_dict`` read
after the runtime closed is the trained one.

``unregister`` (StarPU's ``starpu_data_unregister``) waits for the work submitted,
brings a root's data back to the host, drops its other replicas and disowns it and
its children: the handles cannot be used again.

An operand given to ``submit`` must be a :class:`~hetero_nn.arena.handle.Handle` of
this runtime and, if temporary, of the current flush.

State
-----
``registered``: the roots ``register`` made, held weakly (for ``close``'s write-back).
The current generation (flush number) and whether a capture is recording come from the
flush lifecycle (:mod:`~hetero_nn.scheduler.flush`).
"""

from __future__ import annotations

import contextlib
import numbers
import weakref

import numpy as np

from ..arena.handle import Handle
from ..errors import SubmitError
from .devices import Worker


UNREGISTERED = "unregistered"  # the owner of a handle given to Runtime.unregister


class HandleFactory:
    """Makes and checks one runtime's handles (see the module docstring)."""

    __slots__ = ("rt", "registered")

    def __init__(self, runtime):
        self.rt = runtime
        self.registered: "weakref.WeakSet[Handle]" = weakref.WeakSet()  # roots of register()

    def register(self, array, name=None) -> Handle:
        if not isinstance(array, np.ndarray):
            raise SubmitError(f"register: expected a numpy.ndarray, got {type(array).__name__}")
        h = Handle.wrap(array, name, self.rt)
        self.registered.add(h)
        return h

    def empty(self, shape, dtype="float32", name=None) -> Handle:
        return Handle(shape, dtype, name, owner=self.rt)

    def temporary(self, shape, dtype="float32", name=None) -> Handle:
        flushes = self.rt._flushes
        if flushes.capturing is not None:  # the captured graph's own: outlives arena resets
            h = Handle(shape, dtype, name, owner=self.rt)
            flushes.capturing.nbytes += h.nbytes
        else:
            h = Handle(shape, dtype, name, owner=self.rt, temporary=True,
                       generation=flushes.generation)
        self.rt._temporaries.made(h, flushes.capturing)
        return h

    def write_back(self):
        """Make the host replica (the registered array) of every registered root this runtime
        still owns coherent: at ``close``, after the workers stopped, before the streams."""
        rt = self.rt
        for h in list(self.registered):
            if h.owner is rt:
                rt.host_replica(h)

    def unregister(self, root):
        """Make ``root`` coherent on the host, drop its replicas elsewhere and disown it
        and its descendants (the runtime has waited for its tasks); returns the host array."""
        rt = self.rt
        host = rt.host_replica(root)
        for node in rt.nodes[1:]:  # replicas there come from node.empty: resident, evictable
            node.evict(root)
        stack = [root]
        while stack:
            h = stack.pop()
            h.owner = UNREGISTERED
            for plan in h.plans.values():
                stack.extend(plan.children)
        return host

    def bad_operand(self, codelet, i, h):
        """Raise the ``SubmitError`` for operand ``i`` of a submission, which is not a
        current handle of this runtime."""
        if type(h) is not Handle:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: expected a Handle, "
                              f"got {type(h).__name__} (register arrays with rt.register)")
        if h.owner is UNREGISTERED:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: handle {h.name!r} was "
                              "unregistered")
        if h.owner is not self.rt:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: handle {h.name!r} belongs "
                              "to another Runtime")
        raise SubmitError(f"codelet {codelet.name!r} operand {i}: temporary handle "
                          f"{h.name!r} belongs to an earlier flush; its arena was reset")


class RuntimeHandles:
    """The handle methods of :class:`~hetero_nn.scheduler.runtime.Runtime`: what a program
    calls to make, drop and release handles and to place a block's tasks (the runtime's
    ``_handles``, ``_temporaries`` and ``_flushes`` do the work)."""

    def register(self, array, name=None) -> Handle:
        """Register a host NumPy array; its buffer is the handle's host replica (no copy)."""
        self._check_open()
        return self._handles.register(array, name)

    def empty(self, shape, dtype="float32", name=None) -> Handle:
        """A handle with no data yet; its replicas are allocated where it is first used."""
        self._check_open()
        return self._handles.empty(shape, dtype, name)

    def temporary(self, shape, dtype="float32", name=None) -> Handle:
        """A handle whose replicas come from the node arenas: valid for the next flush only.

        It may be fetched after that flush, until work is submitted again.
        """
        self._check_open()
        return self._handles.temporary(shape, dtype, name)

    def unregister(self, handle: Handle):
        """Stop managing ``handle`` (StarPU's ``starpu_data_unregister``): wait for the
        work submitted, bring its data back to the host, drop its other replicas, and
        return the host array (a registered handle's: the array given to
        :meth:`register`). The handle, and its children, cannot be used afterwards."""
        self._check_open()
        if type(handle) is not Handle or handle.owner is not self:
            raise SubmitError(f"unregister: {handle!r} is not a handle of this Runtime")
        if handle.parent is not None:
            raise SubmitError(f"unregister: {handle.name!r} is a child of "
                              f"{handle.root.name!r}; unregister the root")
        self.wait()
        return self._handles.unregister(handle)

    def release(self, *handles):
        """Declare that nothing reads these temporaries after the current flush (StarPU's
        ``starpu_data_invalidate_submit``): in a flush laid out whole (a capture, a
        replay, a flush that does not stream) each one's bytes serve later temporaries
        once the last task of the flush that accesses it has run
        (:mod:`~hetero_nn.scheduler.lifetimes`). Tasks may still be submitted on it until
        the flush ends; it must not be fetched after. A flush that streams keeps every
        temporary to its end."""
        self._check_open()
        flushes = self._flushes
        self._temporaries.release(handles, flushes.generation, flushes.capturing)

    @contextlib.contextmanager
    def keeping_temporaries(self):
        """Inside the block :meth:`release` is ignored: the temporaries made or used there
        live to the end of the flush (an order added against the submission order, as a
        pipeline schedule's, must not meet the dependencies that sharing bytes adds)."""
        self._temporaries.keeping += 1
        try:
            yield
        finally:
            self._temporaries.keeping -= 1

    def is_temporary(self, handle) -> bool:
        """Whether ``handle`` belongs to a temporary of the current flush (or of the
        graph being captured): what :meth:`release` accepts."""
        return self._temporaries.releasable(handle, self._flushes.generation,
                                            self._flushes.capturing)

    @contextlib.contextmanager
    def collect_temporaries(self):
        """Collect in a list the temporaries made inside the ``with`` block."""
        made: list = []
        collectors = self._temporaries.collectors
        collectors.append(made)
        try:
            yield made
        finally:
            collectors.remove(made)

    @contextlib.contextmanager
    def placing(self, workers):
        """Place every task submitted inside the block on one of ``workers`` (Worker objects
        or names), and collect those tasks in the list it yields (a pipeline stage's).

        Each task is submitted as with ``worker=workers`` (unless it names its own): a
        placement constraint every policy honours."""
        chosen = tuple(w for w in self.workers if w in workers or w.name in workers)
        if not chosen:
            raise SubmitError(f"placing: none of {list(workers)!r} is a worker of this "
                              f"runtime ({[w.name for w in self.workers]})")
        outer = self._placing
        self._placing = (chosen, [])
        try:
            yield self._placing[1]
        finally:
            if outer is not None:
                outer[1].extend(self._placing[1])
            self._placing = outer

    def _workers_named(self, worker, codelet_name) -> tuple:
        """The workers ``worker=`` names: a worker, its name, its index, or a collection."""
        single = isinstance(worker, (str, Worker, numbers.Integral))
        if not single and not isinstance(worker, (list, tuple, set, frozenset)):
            raise SubmitError(f"codelet {codelet_name!r}: worker={worker!r}: expected a worker, "
                              "its name, its index, or a list of them")
        items = (worker,) if single else tuple(worker)
        by_name = {w.name: w for w in self.workers}
        out = []
        for item in items:
            if isinstance(item, bool):
                w = None
            elif isinstance(item, numbers.Integral):  # StarPU's worker id
                w = self.workers[item] if 0 <= item < len(self.workers) else None
            else:
                w = by_name.get(item) if isinstance(item, str) else item
            if w is None or w not in self.workers:
                raise SubmitError(f"codelet {codelet_name!r}: worker={item!r} is not a worker of "
                                  f"this Runtime (indices 0-{len(by_name) - 1}: "
                                  f"{list(by_name)})")
            out.append(w)
        if not out:
            raise SubmitError(f"codelet {codelet_name!r}: worker= names no worker")
        return tuple(out)
