"""The contract every executor offers: what the runtime calls on the local, sync, Dask and
compiled executors.

Policy
------
An executor runs the tasks the runtime hands it; the runtime holds one for its flushes
(``Runtime.executor``: local, sync or Dask) and one for replays alone
(``Runtime.compiled``: :class:`~hetero_nn.scheduler.engine.executor.CompiledExecutor`).
They answer to the same calls:

- ``run(tasks, planned=False)``: run a closed DAG (a flush handed over at ``wait()``;
  ``planned``: a recorded flush replayed, a static policy keeping its plan) and return
  when its tasks have run or one failed. The flush's begin and end are the runtime's
  (:class:`~hetero_nn.scheduler.flush.Flushes`). The compiled executor has no ``run``:
  a flush runs there only as part of a captured graph.
- ``add(task)``, ``drain()``, ``wait_for(task, timeout)``, ``constrain()``: a flush
  streamed to the executor as it is submitted (local and sync, where
  ``Runtime.overlap`` holds).
- ``replay(graph)``: run a captured :class:`~hetero_nn.scheduler.capture.Graph`'s recorded
  flushes again. :class:`Executor`'s way, the local, sync and Dask executors': each
  recorded flush handed to ``run`` again as a closed DAG (``Graph._run``). The compiled
  executor's: the flushes bound and compiled once, then run by the dispatch loop.
  Which executor serves a runtime's replays is one rule,
  :func:`~hetero_nn.scheduler.engine.replay.engine_refusal`, asked by the runtime
  (:func:`~hetero_nn.scheduler.engine.executor.replay_executor`) and by the simulator
  (:func:`~hetero_nn.simulation.paths.engine_serves`).
- ``fusion_refusal``: why fusing a graph's chains into bundles
  (:mod:`~hetero_nn.scheduler.executors.bundle`) would save nothing on this executor,
  or None where it may.
- ``close()``: threads joined, pools and clients released.
"""

from __future__ import annotations


class Executor:
    """What the local, sync and Dask executors share of the contract (module docstring):
    a graph replayed flush by flush through ``run``."""

    fusion_refusal = None  # per-task dispatch a bundle saves: fusion may pay here

    def replay(self, graph):
        """Run ``graph``'s recorded flushes again, each as one closed DAG through the
        runtime's flush lifecycle (a recording runtime's sink takes them instead)."""
        graph._run()
