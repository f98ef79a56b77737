"""Capture and replay: the tasks of a ``with rt.capture()`` block, run again.

Policy
------
``with rt.capture() as graph:`` records the tasks of every flush inside the
block, with their dependencies and REDUX trees as submitted; ``graph.replay()``
runs the same task objects again (only their per-run state reset): no
dependency inference, no task built, no tree rebuilt, and a static policy
(``heft``) keeps the plan it made at capture. Temporaries made while capturing
(``temporary()``, REDUX partials) are the graph's own: ordinary handles,
allocated once, that no arena reset reuses, so the graph stays valid while
other flushes run between replays. New inputs are bound by writing into the
captured handles' buffers (see :meth:`Graph.write`) before ``replay()``.
Before its second replay a graph fuses its chains of small tasks into bundles
(``fuse_chains``; :mod:`~hetero_nn.scheduler.bundle`).

State
-----
``Graph._segments``: per flush recorded, ``[(task, preds, succ), ...]`` in
submission order; ``_planned``: whether a static policy may keep its plan (False
once fusion made new tasks); ``replays``; ``bundles`` (the fusion decision);
``nbytes``: the bytes of the temporaries it owns (one replica each), what a cache of
graphs bounds.
"""

from __future__ import annotations

import time

import numpy as np

from ..arena.handle import Handle
from ..errors import SubmitError
from .bundle import Bundle, fuse_chains

_perf = time.perf_counter


class Graph:
    """The tasks of a :meth:`Runtime.capture` block, to run again with :meth:`replay`.

    A context manager: entering starts recording on its runtime, leaving flushes
    what is pending and stops. ``replay()`` runs the recorded flushes in order,
    as ``wait()`` runs one, and returns when they are done. The task parameters
    are those given at capture: a value that changes per step must live in a
    handle's data, not in a parameter.
    """

    def __init__(self, runtime):
        self.runtime = runtime
        self._segments: list = []
        self._closed = False
        self._planned = True  # False after fusion: a static policy plans the new tasks
        self.replays = 0
        self.bundles = None  # the BundleReport of fuse_chains, once decided
        self.nbytes = 0  # its own temporaries' bytes (activations, REDUX partials)

    def __enter__(self):
        self.runtime._flushes.capturing = self
        return self

    def __exit__(self, exc_type, *exc):
        rt = self.runtime
        try:
            if exc_type is None:
                rt.wait()
                self._closed = True
        finally:
            rt._flushes.capturing = None
        return False

    @property
    def num_tasks(self) -> int:
        """Tasks recorded (REDUX trees included)."""
        return sum(len(s) for s in self._segments)

    def write(self, handle, array):
        """Bind a new input: copy ``array`` into ``handle``'s host buffer (a registered
        handle the graph reads), made the only valid replica."""
        rt = self.runtime
        if type(handle) is not Handle or handle.owner is not rt or handle.parent is not None:
            raise SubmitError(f"Graph.write: {handle!r} is not a root handle of this Runtime")
        if tuple(np.shape(array)) != tuple(handle.shape):
            raise SubmitError(f"Graph.write: handle {handle.name!r} has shape {handle.shape}, "
                              f"got an array of shape {np.shape(array)}")
        rt.wait()
        np.copyto(rt.host_replica(handle), array, casting="same_kind")
        handle.valid = {0}

    def replay(self):
        """Run the recorded tasks again (same operands, parameters and dependencies)."""
        if not self._closed:
            raise SubmitError("Graph.replay: the capture has not completed (replay after the "
                              "with block, which must not have raised)")
        if self.bundles is None and self.replays and self.runtime.fuse_chains:
            self.fuse_chains()
        self._run()
        self.replays += 1

    def _run(self):
        """Run the recorded segments, each as one flush of the runtime."""
        rt = self.runtime
        rt._check_open()
        rt.wait()  # work submitted since comes first, as in program order
        ids = rt._ids
        now = _perf()
        planned, self._planned = self._planned, True
        for segment in self._segments:
            tasks = []
            for t, preds, succ in segment:
                t.rearm(next(ids), now)  # fresh ids in the same (topological) order
                if t.__class__ is Bundle:
                    t.rearm_members(ids, now)
                t.preds = preds
                t.succ = succ
                t.npred = len(preds)
                tasks.append(t)
            rt._flushes.run(tasks, planned)

    def fuse_chains(self, overhead=None):
        """Fuse the chains of tasks predicted below the per-task overhead into bundles
        (:mod:`~hetero_nn.scheduler.bundle`); returns and keeps the decision as
        :attr:`bundles` (a :class:`~hetero_nn.scheduler.bundle.BundleReport`).

        ``overhead``: seconds per task to compare with; by default the overhead
        measured over the graph's last run. Decided once: a second call is refused.
        """
        if not self._closed:
            raise SubmitError("Graph.fuse_chains: the capture has not completed")
        if self.bundles is not None:
            raise SubmitError("Graph.fuse_chains: this graph's chains were already decided")
        self.runtime.wait()
        self.bundles = fuse_chains(self, overhead)
        if self.bundles.chains:
            self._planned = False
        return self.bundles

    def __repr__(self):
        return f"Graph({self.num_tasks} tasks in {len(self._segments)} flushes, " \
               f"{self.replays} replays)"
