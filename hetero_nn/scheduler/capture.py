"""Capture and replay: the tasks of a ``with rt.capture()`` block, run again.

Policy
------
``with rt.capture() as graph:`` records the tasks of every flush inside the
block, with their dependencies and REDUX trees as submitted; ``graph.replay()``
runs them again: no dependency inference, no task built, no tree rebuilt.
Temporaries made while capturing (``temporary()``, REDUX partials) are the
graph's own: each segment's are laid out once in a region of the graph's own arena
per node (:mod:`~hetero_nn.scheduler.lifetimes`; :meth:`Graph.arena_stats` gives
its bytes), that no arena reset reuses, so the graph stays valid while other
flushes run between replays. New inputs are
bound by writing into the captured handles' buffers, or parts of them (see
:meth:`Graph.write`), before ``replay()``; numbers that change between replays
are *step parameters* (:meth:`Graph.param`, ``replay(name=value)``).

Two executors run replays, called alike (``replay(graph)``,
:mod:`~hetero_nn.scheduler.executors.contract`). Where the runtime allows it (local
executor, workers of one kind or ``heft``, on one memory node or several: the rule is
:func:`~hetero_nn.scheduler.engine.replay.engine_refusal`, asked by
:func:`~hetero_nn.scheduler.engine.executor.replay_executor`;
``Runtime(replay_engine=...)``), the compiled executor (``Runtime.compiled``), the replay
engine of :mod:`~hetero_nn.scheduler.engine.replay`: bound tasks on fixed worker
schedules, each worker's share in one compiled loop. Elsewhere the runtime's executor: the same task
objects run again (only their per-run state reset), a static policy (``heft``)
keeping the plan it made at capture, and before its second replay a graph fuses
its chains of small tasks into bundles (``fuse_chains``;
:mod:`~hetero_nn.scheduler.executors.bundle`). The engine leaves that fusion nothing to
save (one indirect call per task) and runs bundles made explicitly member by
member on one worker.

State
-----
``Graph._segments``: per flush recorded, ``[(task, preds, succ), ...]`` in
submission order; ``_lifetimes``: per segment its temporaries' ``Lifetimes`` (or None);
``_made``: the temporaries made while capturing; ``_arenas``: node index -> Arena;
submission order; ``_planned``: whether a static policy may keep its plan (False
once fusion made new tasks); ``replays``; ``bundles`` (the fusion decision);
``nbytes``: the bytes of the temporaries it owns (one replica each), what a cache of
graphs bounds (the replay engine's scratch buffers are the runtime's, shared by its
graphs); ``_params``: the declared step parameters; ``_compiled``: the engine's
:class:`~hetero_nn.scheduler.engine.replay.CompiledGraph` (compiled at the capture's end
where the engine serves the runtime, else at the first replay it runs).
"""

from __future__ import annotations

import time

import numpy as np

from ..arena.arena import Arena
from ..arena.handle import Handle
from ..errors import SubmitError
from .executors.bundle import BundleReport, fuse_chains
from .engine.executor import replay_executor
from .engine.replay import set_params, step_param

_perf = time.perf_counter


class Graph:
    """The tasks of a :meth:`Runtime.capture` block, to run again with :meth:`replay`.

    A context manager: entering starts recording on its runtime, leaving flushes
    what is pending and stops. ``replay()`` runs the recorded flushes in order,
    as ``wait()`` runs one, and returns when they are done. The task parameters
    are those given at capture, but for *step parameters*: values made with
    :meth:`param` while capturing, given again to ``replay(name=value)``.
    """

    def __init__(self, runtime):
        self.runtime = runtime
        self._compiled = None  # the replay engine's CompiledGraph (made at the capture's end)
        self._params: dict = {}  # declared step parameters: name -> value at capture
        self._segments: list = []
        self._closed = False
        self._planned = True  # False after fusion: a static policy plans the new tasks
        self.replays = 0
        self.bundles = None  # the BundleReport of fuse_chains, once decided
        self._made: set = set()  # temporaries made while capturing: the graph's own
        self._lifetimes: list = []  # per segment, its Lifetimes (or None)
        self._arenas: dict = {}  # node index -> the Arena holding this graph's regions
        runtime._temporaries.graphs.add(self)
        self.nbytes = 0  # its own temporaries' bytes (activations, REDUX partials)
        self._roots = None  # the roots its tasks access, listed at the first replay

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
        if self._closed:
            self._compile_now(rt)
        return False

    def _compile_now(self, rt):
        """Where the engine will replay the graph, compile it now, while the capture run's
        tasks are resolved (Build item 3 of issue 34): the first replay then runs at the
        steady cost. A failure here is left to the first replay, which compiles again and
        reports it where a replay's errors belong."""
        executor = replay_executor(rt)
        if executor is rt.compiled and self._segments:
            executor.compile(self)

    def _region(self, node, nbytes):
        """``nbytes`` of this graph's own arena on ``node``: a segment's layout region."""
        arena = self._arenas.get(node.index)
        if arena is None:
            arena = self._arenas.setdefault(  # a region over 64 KiB gets a block of its own
                node.index, Arena(f"{node.name}.graph", xp=node.arena.xp, block_bytes=1 << 16))
        return arena.empty((max(nbytes, 1),), np.uint8)

    def arena_stats(self) -> dict:
        """Per memory node the graph's temporaries are on, its own arena's statistics."""
        names = {n.index: n.name for n in self.runtime.nodes}
        return {names[i]: a.stats for i, a in sorted(self._arenas.items())}

    @property
    def num_tasks(self) -> int:
        """Tasks recorded (REDUX trees included)."""
        return sum(len(s) for s in self._segments)

    def param(self, name, value):
        """Declare a step parameter while capturing: returns ``value`` (an ``int`` or a
        ``float``) to pass to ``submit`` as a task parameter; ``replay(name=new)`` then
        runs those tasks with ``new`` instead, with no handle per value.

        >>> import numpy as np, hetero_nn as hn
        >>> def scale(x, factor): x *= factor
        >>> cl = hn.Codelet("scale_by", modes=(hn.RW,), variants={"ref": scale})
        >>> with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        ...     h = rt.register(np.ones(2))
        ...     with rt.capture() as graph:
        ...         _ = rt.submit(cl, h, factor=graph.param("factor", 2.0))
        ...     graph.replay(factor=3.0)
        ...     rt.fetch(h)
        array([6., 6.])
        """
        if self.runtime._flushes.capturing is not self:
            raise SubmitError(f"Graph.param({name!r}): declare step parameters inside the "
                              "capture's with block")
        if name in self._params:
            raise SubmitError(f"Graph.param: step parameter {name!r} is already declared")
        p = self._params[name] = step_param(name, value)
        return p

    def write(self, handle, array):
        """Bind a new input: copy ``array`` into ``handle``'s host buffer (a registered
        handle the graph reads, or a part of one), made the only valid replica."""
        rt = self.runtime
        if type(handle) is not Handle or handle.owner is not rt:
            raise SubmitError(f"Graph.write: {handle!r} is not a handle of this Runtime")
        if tuple(np.shape(array)) != tuple(handle.shape):
            raise SubmitError(f"Graph.write: handle {handle.name!r} has shape {handle.shape}, "
                              f"got an array of shape {np.shape(array)}")
        rt.wait()
        np.copyto(rt.host_replica(handle), array, casting="same_kind")
        handle.valid = {0}

    def replay(self, **params):
        """Run the recorded tasks again (same operands and dependencies; the same
        parameters but the step parameters given here, see :meth:`param`)."""
        if not self._closed:
            raise SubmitError("Graph.replay: the capture has not completed (replay after the "
                              "with block, which must not have raised)")
        rt = self.runtime
        if params:
            set_params(self, params)
        executor = replay_executor(rt)  # the compiled one where the engine serves rt
        if self.bundles is None and self.replays and rt.fuse_chains:
            if executor.fusion_refusal is not None:
                self.bundles = BundleReport(None, tasks_before=self.num_tasks,
                                            tasks_after=self.num_tasks,
                                            reason=executor.fusion_refusal)
            else:
                self.fuse_chains()
        rt._check_open()
        self._check_roots(rt)
        rt.wait()  # work submitted since comes first, as in program order
        executor.replay(self)
        self.replays += 1

    def _check_roots(self, rt):
        """Refuse to replay on a handle unregistered since the capture: its array is the
        program's again, and the recorded tasks would still write it."""
        if self._roots is None:
            roots = {}
            for segment in self._segments:
                for t, _, _ in segment:
                    for m in [t] + list(t.members or ()):
                        for h in m.handles:
                            roots[h.root.id] = h.root
            self._roots = list(roots.values())
        for root in self._roots:
            if root.owner is not rt:
                raise SubmitError(f"Graph.replay: handle {root.name!r} was unregistered after "
                                  "the capture; capture the program again on a registered "
                                  "handle")

    def _run(self):
        """Run the recorded segments through the executor, each as one flush (how the
        executors that run flushes replay:
        :class:`~hetero_nn.scheduler.executors.contract.Executor`)."""
        rt = self.runtime
        ids = rt._ids
        now = _perf()
        planned, self._planned = self._planned, True
        for segment, lifetimes in zip(self._segments, self._lifetimes):
            tasks = []
            for t, preds, succ in segment:
                t.rearm(next(ids), now)  # fresh ids in the same (topological) order
                if t.members is not None:
                    t.rearm_members(ids, now)
                t.preds = preds
                t.succ = succ
                t.npred = len(preds)
                tasks.append(t)
            rt._flushes.run(tasks, planned, lifetimes)

    def fuse_chains(self, overhead=None):
        """Fuse the chains of tasks predicted below the per-task overhead into bundles
        (:mod:`~hetero_nn.scheduler.executors.bundle`); returns and keeps the decision as
        :attr:`bundles` (a :class:`~hetero_nn.scheduler.executors.bundle.BundleReport`).

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
            self._compiled = None  # new segments: the engine compiles them again
        return self.bundles

    def __repr__(self):
        return f"Graph({self.num_tasks} tasks in {len(self._segments)} flushes, " \
               f"{self.replays} replays)"
