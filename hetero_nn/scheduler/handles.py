"""The handle factory: the handles a runtime makes, and the checks on those it is given.

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

``unregister`` (StarPU's ``starpu_data_unregister``) waits for the work submitted,
brings a root's data back to the host, drops its other replicas and disowns it and
its children: the handles cannot be used again.

An operand given to ``submit`` must be a :class:`~hetero_nn.arena.handle.Handle` of
this runtime and, if temporary, of the current flush.

State
-----
None of its own: the current generation (flush number) and whether a capture is
recording come from the flush lifecycle (:mod:`~hetero_nn.scheduler.flush`).
"""

from __future__ import annotations

import numpy as np

from ..arena.handle import Handle
from ..errors import SubmitError


UNREGISTERED = "unregistered"  # the owner of a handle given to Runtime.unregister


class HandleFactory:
    """Makes and checks one runtime's handles (see the module docstring)."""

    __slots__ = ("rt",)

    def __init__(self, runtime):
        self.rt = runtime

    def register(self, array, name=None) -> Handle:
        if not isinstance(array, np.ndarray):
            raise SubmitError(f"register: expected a numpy.ndarray, got {type(array).__name__}")
        return Handle.wrap(array, name, self.rt)

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
