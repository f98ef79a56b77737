"""The handle factory: the handles a runtime makes, and the checks on those it is given.

Policy
------
``register`` wraps a host NumPy array: its buffer is the handle's host replica
(no copy). ``empty`` makes a handle with no data; its replicas are allocated where
it is first used. ``temporary`` makes one whose replicas come from the node arenas,
valid for one flush: the arenas are reset when the next flush starts, so a task
submitted on it later is refused. Inside a capture a temporary is the captured
graph's own (an ordinary handle, allocated once), so the graph stays valid while
other flushes run between replays. Children come from
:meth:`Handle.split <hetero_nn.arena.handle.Handle.split>`.

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


class HandleFactory:
    """Makes and checks one runtime's handles (see the module docstring)."""

    __slots__ = ("rt",)

    def __init__(self, runtime):
        self.rt = runtime

    def register(self, array, name=None) -> Handle:
        if not isinstance(array, np.ndarray):
            raise SubmitError(f"register: expected a numpy.ndarray, got {type(array).__name__}")
        h = Handle(array.shape, array.dtype, name, owner=self.rt)
        h._replicas[0] = array
        h.valid = {0}
        return h

    def empty(self, shape, dtype="float32", name=None) -> Handle:
        return Handle(shape, dtype, name, owner=self.rt)

    def temporary(self, shape, dtype="float32", name=None) -> Handle:
        flushes = self.rt._flushes
        if flushes.capturing is not None:  # the captured graph's own: outlives arena resets
            h = Handle(shape, dtype, name, owner=self.rt)
            flushes.capturing.nbytes += h.nbytes
            return h
        return Handle(shape, dtype, name, owner=self.rt, temporary=True,
                      generation=flushes.generation)

    def bad_operand(self, codelet, i, h):
        """Raise the ``SubmitError`` for operand ``i`` of a submission, which is not a
        current handle of this runtime."""
        if type(h) is not Handle:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: expected a Handle, "
                              f"got {type(h).__name__} (register arrays with rt.register)")
        if h.owner is not self.rt:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: handle {h.name!r} belongs "
                              "to another Runtime")
        raise SubmitError(f"codelet {codelet.name!r} operand {i}: temporary handle "
                          f"{h.name!r} belongs to an earlier flush; its arena was reset")
