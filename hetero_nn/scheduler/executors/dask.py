"""Dask executors: the flushed DAG through ``dask.threaded.get`` or a ``distributed.Client``.

Both run the graph of :mod:`hetero_nn.scheduler.executors.dask_graph`, where codelets are
pure; the final version of every handle written is copied back into its host
replica. They run the variants the local executor would (pinned, preferred or
the performance model's choice, fed with the times the tasks measured), and
BLAS runs one thread per Dask thread: ``threads`` holds the limit in this
process while the executor lives, ``distributed`` registers a worker plugin
that sets it in every worker, joining ones included. Registered data (weights
among it) reaches ``distributed`` workers as futures scattered once per flush,
never inside the graph. See docs/cluster.md for what these executors cost.
StarPU's task fields: ``after=`` becomes extra dependencies in the Dask graph and
``callback=`` runs once the graph has run, in submission order; ``priority=`` and
``worker=`` are refused at submission (Dask orders and places tasks itself).
``distributed`` starts a ``LocalCluster`` of worker processes (one
thread each, as many as the runtime has CPU workers) unless given a scheduler
address or a ``Client``; a cluster it started is closed with the runtime.
``threads`` runs on a thread pool of its own (``dask.threaded.get`` would otherwise
cache one per calling thread for the life of the process), shut down by ``close``.
"""

from __future__ import annotations

import time

import numpy as np
from concurrent.futures import ThreadPoolExecutor
from threadpoolctl import threadpool_limits

from ...arena.handle import mark_written
from ...errors import DeviceError, TaskError
from .contract import Executor
from .dask_graph import build_graph


class DaskExecutor(Executor):
    """Runs flushed DAGs with Dask (``mode`` ``"threads"`` or ``"distributed"``)."""

    def __init__(self, runtime, mode, *, address=None, client=None):
        self.rt = runtime
        self.mode = mode
        self.workers = runtime.workers
        self._client = client
        self._own_client = False
        self._cluster = None
        self._address = address
        self._pool = None
        self._blas = None
        if mode == "threads":
            self._blas = _one_blas_thread()
        if any(w.kind != "cpu" for w in self.workers):
            raise DeviceError("the Dask executors run codelets on CPU workers only; use "
                              "executor='local' for CUDA devices")

    @property
    def client(self):
        # distributed loads with the first cluster (heavy at start-up)
        from distributed import Client, LocalCluster, WorkerPlugin
        if self._client is None:
            if self._address:
                self._client = Client(self._address)
            else:
                self._cluster = LocalCluster(n_workers=max(1, len(self.workers)),
                                             threads_per_worker=1, processes=True,
                                             dashboard_address=None)
                self._client = Client(self._cluster)
            self._own_client = True
        if not getattr(self._client, "_hetero_nn_blas", False):
            self._client.register_plugin(one_blas_thread_plugin(WorkerPlugin),
                                         name="hetero_nn-one-blas-thread")
            self._client._hetero_nn_blas = True
        return self._client

    def run(self, tasks, planned=False):
        """Run ``tasks`` as one Dask graph (``planned`` changes nothing: no static plan)."""
        rt = self.rt
        dsk, outputs, timing_keys = build_graph(rt, tasks)
        keys = list(outputs.values()) + timing_keys
        offset = time.time() - time.perf_counter()
        t0 = time.perf_counter()
        if self.mode == "threads":
            import dask.threaded  # dask's schedulers load with the Dask executor
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max(1, len(self.workers)),
                                                thread_name_prefix="hetero_nn-dask")
            values = dask.threaded.get(dsk, keys, pool=self._pool)
        else:
            client = self.client
            data = {k: v for k, v in dsk.items() if isinstance(v, np.ndarray)}
            if data:  # registered arrays travel as scattered futures, not graph literals
                dsk.update(client.scatter(data, hash=False))
            values = client.get(dsk, keys)
        node0 = rt.nodes[0]
        for h, value in zip(outputs, values):
            with h._lock:
                np.copyto(h.replica(node0), value)
                mark_written(h, 0)
        for t, (start, end, worker) in zip(tasks, values[len(outputs):]):
            t.t_ready = t0
            t.t_start = start - offset
            t.t_end = end - offset
            t.worker = worker
            rt.record(t, "cpu")
        for t in tasks:  # callback=, once the graph has run, in submission order
            if t.callback is not None:
                try:
                    t.callback(t)
                except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                    raise TaskError(f"the callback of task {t.id} (codelet {t.codelet.name!r}) "
                                    f"failed: {type(exc).__name__}: {exc}") from exc

    def constrain(self):  # pragma: no cover - the runtime refuses worker= first
        raise DeviceError("the Dask executors place tasks themselves: worker= is refused")

    def wait_for(self, task, timeout=None):  # pragma: no cover - never streamed
        """Tasks run at ``wait()`` here: :meth:`Task.wait` runs the flush first."""

    def close(self):
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._own_client and self._client is not None:
            self._client.close()
            if self._cluster is not None:
                self._cluster.close()
        self._client = self._cluster = None


def _one_blas_thread():
    """Hold BLAS to one thread in this process (None without a BLAS)."""
    try:
        return threadpool_limits(limits=1, user_api="blas")
    except Exception:
        return None


def one_blas_thread_plugin(base):
    """A distributed worker plugin (``base``: ``distributed.WorkerPlugin``): BLAS at one
    thread, so a worker's N Dask threads use N cores. Made on first use: importing
    ``distributed`` costs 0.7 s, which a runtime that never meets a cluster should not pay."""

    class OneBlasThread(base):
        def setup(self, worker):
            self.limits = _one_blas_thread()

    return OneBlasThread()
