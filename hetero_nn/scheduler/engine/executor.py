"""The compiled replay engine as an executor: the object a runtime holds and calls, as it
calls the local, sync and Dask executors (:mod:`~hetero_nn.scheduler.executors.contract`).

Policy
------
:class:`CompiledExecutor` runs replays only: ``compile(graph)``, at the end of a capture,
gives the graph its :class:`~hetero_nn.scheduler.engine.replay.CompiledGraph` (bound and
planned on the capture run's times; ``replay`` makes it where that failed) and
``replay(graph)`` runs it
(segments bound, scheduled, compiled and dispatched as
:mod:`~hetero_nn.scheduler.engine.replay` says; each segment's run begins and ends in
:class:`~hetero_nn.scheduler.flush.Flushes`, as every flush does). ``close()`` joins the
engine's threads. :func:`replay_executor` is where a runtime asks the one rule,
:func:`~hetero_nn.scheduler.engine.replay.engine_refusal` (through
:func:`~hetero_nn.scheduler.engine.replay.unavailable`): the compiled executor where
the engine serves the runtime, else the runtime's own executor, which replays each
recorded flush through ``run``. The simulator asks the same rule
(:func:`~hetero_nn.simulation.paths.engine_serves`).

State
-----
``rt``: the runtime. The engine's threads stay the runtime's (``rt._engine``, an
:class:`~hetero_nn.scheduler.engine.replay.EngineThreads` made at the first compiled
replay, and made again after a share hung); each graph keeps its own compiled state
(``graph._compiled``).
"""

from __future__ import annotations

from .replay import ENGINE_FUSES, CompiledGraph, unavailable


class CompiledExecutor:
    """Replays captured graphs on the compiled engine (module docstring)."""

    fusion_refusal = ENGINE_FUSES  # one indirect call per task: nothing for a bundle to save

    def __init__(self, runtime):
        self.rt = runtime

    def refusal(self) -> str | None:
        """Why this runtime's replays cannot run here, or None when they do."""
        return unavailable(self.rt)

    def replay(self, graph):
        """Run ``graph``'s recorded flushes on the engine (compiled at its first replay)."""
        if graph._compiled is None:
            graph._compiled = CompiledGraph(graph)
        graph._compiled.run(self.rt)

    def compile(self, graph):
        """Compile ``graph`` now, at the end of its capture, while the capture run's tasks
        are resolved, so its first replay costs a steady one. A failure is left to the
        first replay, which compiles again and raises it where a replay's errors belong."""
        graph._compiled = CompiledGraph(graph)
        try:
            graph._compiled.compile(self.rt)
            graph._check_roots(self.rt)  # the roots listed now, not at the first replay
        except Exception:  # noqa: BLE001 - compiled again (and raised) by the first replay
            graph._compiled = None

    def close(self):
        """Join the engine's threads, if a replay made them."""
        threads = getattr(self.rt, "_engine", None)
        if threads is not None:
            threads.close()


def replay_executor(rt):
    """The executor that serves ``rt``'s replays: ``rt.compiled`` where
    :func:`~hetero_nn.scheduler.engine.replay.engine_refusal` allows it, else
    ``rt.executor``."""
    return rt.compiled if rt.compiled.refusal() is None else rt.executor
