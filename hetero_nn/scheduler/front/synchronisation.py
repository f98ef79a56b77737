"""Synchronisation: the points where a program waits for its tasks (``wait``, ``fetch``,
``capture``) and what it asks a runtime between them (the trace, step parameters, the
modes of a block, memory statistics), as a mixin :class:`RuntimeSynchronisation` that
:class:`~hetero_nn.scheduler.runtime.Runtime` inherits.

Policy
------
``wait()`` / ``fetch()`` end a flush: pending REDUX trees are combined, the flush's tasks
handed to the executor where they were not streamed to it, and the call returns once all
have run (:mod:`~hetero_nn.scheduler.flush`); a flush automatic capture kept is captured
or replayed there instead (:mod:`~hetero_nn.scheduler.autocapture`). Each method hands
its concern to the component that owns it.

State
-----
None of its own (the runtime's components').
"""

from __future__ import annotations

import contextlib

from ...arena.handle import Handle
from ...errors import SubmitError
from ..capture import Graph
from ..trace.views import Trace


class RuntimeSynchronisation:
    """The synchronisation methods of :class:`~hetero_nn.scheduler.runtime.Runtime`."""

    def flush(self):
        """Run every submitted task and return when all have finished (same as :meth:`wait`)."""
        self.wait()

    def wait(self):
        """Combine pending reductions and block until every submitted task has run
        (handing them to the executor first where they were not streamed to it).

        A task that raised is re-raised as :class:`~hetero_nn.errors.TaskError` naming the
        codelet and task; the rest of that graph is cancelled and the runtime stays usable.
        """
        self._check_open()
        if self._auto.state and self._auto.wait():  # captured or replayed (autocapture.py)
            return
        self._reductions.combine_all()
        self._flushes.wait()

    def take_partials(self, handle) -> list:
        """The REDUX partials pending on ``handle``, in submission order, taken out of its tree:
        no tree is submitted for them and combining them is the caller's (a cluster worker
        sends its partitions' partials to the other workers)."""
        return self._reductions.take(handle)

    @contextlib.contextmanager
    def combining_with(self, across):
        """Inside the block, a REDUX tree due (at a handle's next non-REDUX access) is handed
        to ``across(handle, partials)``, which submits the combination, instead of the local
        tree (a cluster worker's reduction of batch statistics across workers)."""
        reductions = self._reductions
        previous, reductions.across = reductions.across, across
        try:
            yield
        finally:
            reductions.across = previous

    def recording(self, sink):
        """Flushes recorded, not run, in the block (:meth:`.flush.Flushes.recording`)."""
        return self._flushes.recording(sink)

    def measuring(self, model):
        """Measure and predict with ``model`` in the block (:meth:`.variants.Variants.measuring`)."""
        return self._variants.measuring(model)

    def tracing_apart(self):
        """Trace into a buffer of its own in the block (:meth:`.flush.Flushes.tracing_apart`)."""
        return self._flushes.tracing_apart()

    def param(self, name, value):
        """A step parameter outside a capture: ``value`` (an int or a float) to give
        ``submit``; a repeated flush (``auto_capture``) matches it by ``name`` and replays
        with its new value (the object made last under ``name`` where ``value`` is equal in
        type and value: a flush passing it again is matched by identity)."""
        return self._auto.param(name, value)

    def capture(self) -> Graph:
        """Record the tasks flushed inside a ``with`` block as a :class:`Graph` to replay.

        Work submitted before the block is flushed first; what is still pending at the end
        of the block is flushed (and recorded) when it closes (the README's *The runtime in
        ten lines*).
        """
        if self._flushes.capturing is not None:
            raise SubmitError("capture: this Runtime is already capturing a graph")
        self.wait()
        return Graph(self)

    def fetch(self, handle: Handle, copy: bool = False):
        """Wait, then return ``handle``'s data as a coherent host NumPy array.

        Without ``copy`` the array is the host replica itself (StarPU's acquire): read it
        before submitting more work on the handle."""
        if type(handle) is not Handle or handle.owner is not self:
            raise SubmitError(f"fetch: {handle!r} is not a handle of this Runtime")
        self.wait()
        if handle.temporary and handle.generation < self.generation - 1:
            raise SubmitError(f"fetch: temporary handle {handle.name!r} belongs to an earlier "
                              "flush; its arena was reset")
        arr = self.host_replica(handle)
        return arr.copy() if copy else arr

    def trace(self, clear: bool = False) -> Trace:
        """The records of executed tasks (see :class:`~hetero_nn.scheduler.trace.Trace`)."""
        memory = self._flushes.memory
        t = Trace.of_flushes(self._trace.per_flush(), [w.name for w in self.workers],
                             transfers=self._trace.transfers(),
                             memory=[m for f in memory for m in f])
        t.metadata.update(self._auto.metadata(clear))
        if clear:
            self._trace.clear()
            memory.clear()
        return t

    def memory_stats(self) -> dict:
        """Per memory node, the temporaries' ``high_water`` (bytes) and ``allocations`` (real
        allocations made so far): from the arenas (the node's and those of the captured
        graphs alive), or, with ``arenas=False``, from the per-task arrays
        (:mod:`~hetero_nn.scheduler.lifetimes`)."""
        return self._temporaries.stats()

    @property
    def generation(self) -> int:
        """Number of flushes run (temporaries belong to one)."""
        return self._flushes.generation


    def arena_stats(self) -> dict:
        """Per memory node: the temporaries arena's statistics."""
        return {n.name: n.arena.stats for n in self.nodes}
