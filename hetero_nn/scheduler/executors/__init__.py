"""Executors: what runs a flush's tasks once they are submitted.

:mod:`.contract` (what every executor answers, the compiled one of
:mod:`hetero_nn.scheduler.engine.executor` included), :mod:`.local` (worker threads, one
per device), :mod:`.sync` (one thread, in order: for tests and debugging), :mod:`.dask`
(a Dask graph, :mod:`.dask_graph`), their shared state (:mod:`.state`) and timing
(:mod:`.timing`), and :mod:`.bundle`, the tasks of a chain fused into one.
"""
