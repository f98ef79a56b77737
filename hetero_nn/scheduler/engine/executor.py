"""The compiled replay engine as an executor: the object a runtime holds and calls, as it
calls the local, sync and Dask executors (:mod:`~hetero_nn.scheduler.executors.contract`).

Policy
------
:class:`CompiledExecutor` runs replays only: ``replay(graph)`` gives the graph its
:class:`~hetero_nn.scheduler.engine.replay.CompiledGraph` at its first replay and runs it
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
