"""Data-parallel training over a Dask cluster: coarse tasks across processes and machines.

This module owns the hierarchy StarPU-MPI users know: Dask places one coarse task
per *block* of a batch's partitions on a worker process; inside that process a
hetero_nn :class:`~hetero_nn.scheduler.runtime.Runtime` of its own runs the
fine-grained codelet tasks of forward, loss and backward on the worker's cores.
The client combines what the blocks return and runs the optimizer step once.

Policy
------
A batch of ``n`` samples is cut into the trainer's ``g`` partitions
(``numpy.array_split`` sizes, as in one process). The partitions are dealt in
``min(workers, g)`` contiguous *blocks* of near-equal length; block ``j`` goes to
worker ``j mod workers`` as a preference only, so Dask may run it elsewhere.

Bit-identity with one process. In one process, each layer's backward submits one
contribution per partition to each parameter gradient, in partition order
(:func:`~hetero_nn.layers.base.contribution`): after ``zero_grad`` the first one
overwrites the fresh gradient (the codelet's ``overwriting`` twin) and the others
are REDUX partials, which the runtime combines by its balanced tree in submission
order and adds into the gradient at the optimizer's read (:meth:`Runtime._combine`);
layers that do not overwrite start from ``fill_zero`` instead. A worker computes
each partition of its block on its own: the batch's first partition after
``zero_grad`` (so it runs the twin, as in one process), any other after
``fill_zero`` on non-fresh gradients (so it runs the REDUX codelet, with its
variant), each with the loss's mean over the *whole* batch (``batch=n``). A
partition's gradient is then exactly its contribution (``0 + x`` at most). The
client replays the contributions in partition order through the same
``contribution`` rule with :data:`deliver` (a copy into the handle or the
partial): ``zero_grad``, the first overwrites, the others are REDUX, and its own
runtime combines them by its own tree. Same kernels, same variants, same tree:
with pinned variants the weights are bit for bit those of ``--devices cpu:N`` at
the same granularity. The loss and the correct count travel the same way
(``SoftmaxCrossEntropy``'s pattern: the first partition writes in place).

State
-----
On the client (:class:`Cluster`): the ``distributed.Client`` (and the
``LocalCluster`` it started), a run id, the *template* future (the pickled model
architecture, loss and worker-runtime settings, sent once per run and model
build) and the scattered datasets (sent once per dataset, not per step). Each
step scatters the weights once (to one worker; the others fetch them from it)
and submits one task per block.

On each worker process: ``_RUNS``, run key -> :class:`_WorkerState` (the model
built and bound to a local runtime, created by the first block the process runs,
kept between steps). Tasks are pure functions of (template, weights, data,
block): a lost worker's blocks rerun elsewhere with the same result.

Faults
------
Dask reschedules the blocks of a worker that dies; its state is rebuilt from the
template by whichever process runs them. A worker that joins is dealt blocks
from the next step. If no worker is left for ``worker_grace`` seconds the step
raises :class:`~hetero_nn.errors.ClusterError` naming the last checkpoint; the
weights and the checkpoint on disk are those of the last completed step.
"""

from __future__ import annotations

import asyncio
import io
import logging
from concurrent.futures import CancelledError
import os
import threading
import time
import uuid

import numpy as np

from ..arena.handle import Handle
from ..codelets.codelet import REDUX, R, Codelet
from ..codelets.reduce import add_redux, fill_zero, overwriting, zero_init
from ..errors import ClusterError, ConfigError, HeteroNNError, TaskError
from ..layers.base import Parameter, contribution
from ..optim import submit_clip_grad_norm

_perf = time.perf_counter
#: Seconds without a single worker before a step gives up.
WORKER_GRACE = 20.0
#: Tries of a step whose scattered inputs went with the workers holding them.
_ATTEMPTS = 3
#: Seconds between two looks at the scheduler's list of workers.
WORKER_REFRESH = 0.5
#: Seconds a connection to a scheduler may take.
CONNECT_TIMEOUT = 10.0


def _copy_into(src, partial):
    np.copyto(partial, src)


#: One block's result as a REDUX contribution: copied into a zero-initialised partial,
#: combined by ``add_redux`` (the ``init``/``redux`` pair of every REDUX codelet of the package).
deliver = Codelet("cluster_deliver", modes=(R, REDUX), variants={"ref": _copy_into},
                  init=zero_init, redux=add_redux)


# ---------------------------------------------------------------------------------------
# Dealing partitions
# ---------------------------------------------------------------------------------------

def partition_starts(n: int, g: int) -> list[int]:
    """Sample offsets of the ``g`` partitions of ``n`` samples, and ``n`` (array_split sizes)."""
    q, r = divmod(n, g)
    return [i * q + min(i, r) for i in range(g + 1)]


def blocks(g: int, workers: int) -> list[tuple[int, int]]:
    """``(first partition, partitions)`` of each block: ``min(workers, g)`` contiguous runs
    of ``g`` partitions, as even as ``numpy.array_split`` makes them."""
    starts = partition_starts(g, max(1, min(workers, g)))
    return [(a, b - a) for a, b in zip(starts, starts[1:])]


# ---------------------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------------------

_RUNS: dict = {}
_RUNS_LOCK = threading.Lock()


class _WorkerState:
    """A worker process's copy of a run: the model bound to a local runtime."""

    def __init__(self, template: bytes):
        import pickle

        from ..scheduler.runtime import Runtime

        spec = pickle.loads(template)
        self.model, self.loss = spec["model"], spec["loss"]
        self.runtime = Runtime(**spec["runtime"])
        self.model.build(spec["input_shape"], spec["dtype"])
        self.model.bind(self.runtime)
        self.dtype = np.dtype(spec["dtype"])
        self.weights_token = None
        self.lock = threading.Lock()

    def load(self, token, weights):
        if token != self.weights_token:
            self.model.load_state_dict(weights)
            self.weights_token = token

    def gradients(self, x, y, total, first):
        """The trainer's step sequence on one partition, without the update: its gradient
        contributions, loss share and correct count.

        The batch's ``first`` partition starts from ``zero_grad`` (its contributions
        overwrite fresh gradients, as in one process); any other starts from zeroed,
        not fresh, gradients, so its contributions are submitted as REDUX with the
        codelet one process uses for them.
        """
        rt, model = self.runtime, self.model
        if first:
            model.zero_grad(rt)
        else:
            for _, p in model.named_parameters():
                rt.submit(fill_zero, p.grad)
                p.fresh = False
        logits = model.forward(rt, [rt.register(x, name="x")])
        loss, correct, dlogits = self.loss(rt, logits, [rt.register(y, name="y")], batch=total)
        model.backward(rt, dlogits)
        rt.wait()
        grads = [rt.fetch(p.grad, copy=True) for _, p in model.named_parameters()]
        return grads, rt.fetch(loss, copy=True), rt.fetch(correct, copy=True)

    def close(self):
        self.runtime.close()


def _state(key, template) -> _WorkerState:
    with _RUNS_LOCK:
        state = _RUNS.get(key)
        if state is None:
            state = _RUNS[key] = _WorkerState(template)
        return state


def run_block(key, template, weights, source, block, first, sizes, total):
    """One coarse task: the contributions of one block of partitions (a pure function of
    its inputs).

    ``weights`` is ``(token, {name: array})``; ``source`` a dataset (``block`` its
    sample indices) or None (``block`` is ``(x, y)``); ``first`` the index of its first
    partition in the batch, ``sizes`` the sizes of its partitions. Returns ``([(grads, loss, correct) per partition], seconds, worker)``.
    """
    state = _state(key, template)
    with state.lock:  # one step at a time per process, however many Dask threads it has
        t0 = _perf()
        state.load(*weights)
        if source is None:
            x, y = block
            x = np.ascontiguousarray(x, dtype=state.dtype)
            y = np.ascontiguousarray(y, dtype=np.int64)
        else:
            x, y = source.batch(block, dtype=state.dtype)
        results, start = [], 0
        for i, size in enumerate(sizes):
            results.append(state.gradients(x[start:start + size], y[start:start + size], total,
                                           first + i == 0))
            start += size
        return results, _perf() - t0, _worker_name()


def _worker_name():
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def drop_run(run_id):
    """Release a run's state in this process (called on every worker at close)."""
    with _RUNS_LOCK:
        keys = [k for k in _RUNS if k.startswith(run_id)]
        states = [_RUNS.pop(k) for k in keys]
    for s in states:
        s.close()
    return len(states)


# ---------------------------------------------------------------------------------------
# Shipping the model: parameters by value, handles as orphans
# ---------------------------------------------------------------------------------------

def _orphan(shape, dtype, name):
    return Handle(shape, dtype, name)


def template_bytes(model, loss, runtime_kwargs, input_shape, dtype) -> bytes:
    """The model architecture and loss as bytes a worker unpickles once.

    Parameters travel as plain arrays, and every runtime handle the model or the
    loss still refers to becomes a handle of no runtime, which the worker's
    runtime replaces at first use.
    """
    import cloudpickle

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, Parameter):
                return Parameter, (obj.name, obj.host())
            if isinstance(obj, Handle):
                return _orphan, (obj.shape, obj.dtype.str, obj.name)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    _Pickler(buf).dump({"model": model, "loss": loss, "runtime": runtime_kwargs,
                        "input_shape": tuple(input_shape), "dtype": np.dtype(dtype).name})
    return buf.getvalue()


# ---------------------------------------------------------------------------------------
# The client side
# ---------------------------------------------------------------------------------------

class DatasetBatch:
    """A batch named by its sample indices into a dataset the workers hold."""

    __slots__ = ("data", "indices")

    def __init__(self, data, indices):
        self.data, self.indices = data, indices

    def __len__(self):
        return len(self.indices)


class Cluster:
    """A Dask client and the data-parallel step over it (see the module docstring).

    Parameters
    ----------
    client : distributed.Client
    threads : int
        Cores of the local runtime in each worker process (``cpu:threads``).
    devices : str, optional
        The worker runtime's devices instead (e.g. ``"cpu:2,cuda:0"``).
    cluster : distributed.LocalCluster, optional
        Closed with this object.
    own_client : bool
        Close ``client`` with this object.
    """

    def __init__(self, client, *, threads=1, devices=None, cluster=None, own_client=False,
                 worker_grace=WORKER_GRACE, spec=None):
        self.client = client
        self.worker_devices = devices or f"cpu:{int(threads)}"
        self.spec = spec or client.scheduler.address
        self.worker_grace = float(worker_grace)
        self._cluster = cluster
        self._own_client = own_client
        self.run_id = uuid.uuid4().hex[:12]
        self._template = None          # (build key, future)
        self._sources: dict = {}       # id(dataset) -> (dataset, future)
        self._handles = None           # client-side loss/correct handles
        self._step = 0
        self._workers: list[str] = []
        self._workers_at = 0.0
        self.last_timings: dict = {}

    # ------------------------------------------------------------ facts
    @property
    def workers(self) -> list[str]:
        """Addresses of the workers now connected."""
        return sorted(self.client.nthreads())

    @property
    def dashboard(self) -> str | None:
        """The Dask dashboard's address, or None when the scheduler serves none.

        Without bokeh the scheduler serves only its HTML pages (no plots): the
        address is then that of the workers' page.
        """
        try:
            services = self.client.scheduler_info(n_workers=0).get("services", {})
        except TypeError:  # older distributed: no n_workers
            services = self.client.scheduler_info().get("services", {})
        if "dashboard" not in services:
            return None
        link = self.client.dashboard_link
        return link if _has_bokeh() else link.replace("/status", "/info/main/workers.html")

    def describe(self) -> str:
        """One line for the start of a run: scheduler, workers, devices, dashboard."""
        dash = self.dashboard
        note = "" if _has_bokeh() else " (install bokeh for the plots)"
        return (f"cluster {self.spec} (scheduler {self.client.scheduler.address}): "
                f"{len(self.workers)} worker(s), {self.worker_devices} each; "
                f"dashboard {dash + note if dash else 'not served'}")

    def facts(self) -> dict:
        return {"spec": self.spec, "scheduler": self.client.scheduler.address,
                "workers": self.workers, "worker_devices": self.worker_devices,
                "dashboard": self.dashboard}

    # ------------------------------------------------------------ what travels once
    def _template_future(self, trainer):
        model, rt = trainer.model, trainer.runtime
        key = (model.input_shape, model.dtype.name, id(model), id(trainer.loss))
        if self._template is None or self._template[0] != key:
            runtime_kwargs = {"devices": self.worker_devices, "policy": rt.policy_name,
                              "deterministic": rt.deterministic,
                              "variants": dict(rt.preferred) or None,
                              "perfmodel": None if rt.perfmodel is not None else False,
                              "trace": False}
            data = template_bytes(model, trainer.loss, runtime_kwargs, model.input_shape,
                                  model.dtype)
            version = 0 if self._template is None else self._template[2] + 1
            future = self._scatter(data)
            self._template = (key, future, version)
        return f"{self.run_id}-{self._template[2]}", self._template[1]

    def _source(self, data):
        entry = self._sources.get(id(data))
        if entry is None or entry[0] is not data:
            future = self._scatter(data)
            entry = self._sources[id(data)] = (data, future)
        return entry[1]

    def batches(self, data, order, batch_size, start, stop):
        """Yield ``(DatasetBatch, indices)`` for batches ``start..stop-1`` of ``order``.

        The dataset goes to the workers once, at the first step; each batch is its indices. (The
        trainer's ``fit`` uses ``len`` of the second item.)
        """
        for b in range(start, stop):
            indices = np.asarray(order[b * batch_size:(b + 1) * batch_size], dtype=np.int64)
            yield DatasetBatch(data, indices), indices

    # ------------------------------------------------------------ the step
    def train_step(self, trainer, x, y) -> float:
        """One optimizer step of ``trainer`` with the gradients computed on the workers.

        ``x`` is a :class:`DatasetBatch` (from :meth:`batches`) or an array of
        images with ``y`` its labels (sent with the step's tasks). If the step's
        inputs were lost with the workers holding them (scattered data cannot be
        recomputed) or a worker died receiving them, they are sent again and the
        step rerun (``_ATTEMPTS`` tries in all).
        """
        t_start = _perf()
        model = trainer.model
        if isinstance(x, DatasetBatch):
            n = len(x)
            sample = tuple(getattr(x.data, "input_shape", None) or model.input_shape)
        else:
            x = np.asarray(x)
            y = np.asarray(y)
            if y.shape != (x.shape[0],):
                raise ConfigError(f"labels of shape {y.shape} do not match a batch of "
                                  f"{x.shape[0]} samples")
            n, sample = x.shape[0], tuple(x.shape[1:])
        trainer.prepare(np.empty((0, *sample), trainer.dtype))
        params = model.named_parameters()
        self._step += 1
        weights = (f"{self.run_id}-{self._step}", {name: p.host() for name, p in params})
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                results, timings = self._gradients(trainer, x, y, n, weights, attempt)
                break
            except _InputsLost:
                if attempt == _ATTEMPTS or not self.client.nthreads():
                    raise ClusterError(self._lost(trainer)) from None
                self._template, self._sources = None, {}  # send them again
        t0 = _perf()
        value, correct = self._apply(trainer, params, results)
        compute = [r[1] for r in results]
        self.last_timings = {**timings, "apply": _perf() - t0, "worker_max": max(compute),
                             "worker_sum": sum(compute), "blocks": len(results),
                             "workers": sorted({r[2] for r in results}),
                             "total": _perf() - t_start,
                             "gradient_bytes": sum(a.nbytes for r in results for part in r[0]
                                                   for a in part[0])}
        trainer.last_correct = correct
        return value

    def _gradients(self, trainer, x, y, n, weights, attempt):
        """Submit the step's blocks and gather their results, in block order."""
        key, template = self._template_future(trainer)
        source = self._source(x.data) if isinstance(x, DatasetBatch) else None
        t0 = _perf()
        weights_future = self._scatter(weights)
        t_scatter = _perf() - t0
        g = min(trainer.granularity, n)
        starts = partition_starts(n, g)
        workers = self._current_workers()
        futures = []
        for j, (first, parts) in enumerate(blocks(g, len(workers))):
            lo, hi = starts[first], starts[first + parts]
            block = x.indices[lo:hi] if source is not None else (x[lo:hi], y[lo:hi])
            sizes = [starts[i + 1] - starts[i] for i in range(first, first + parts)]
            futures.append(self.client.submit(
                run_block, key, template, weights_future, source, block, first, sizes, n,
                key=f"hetero_nn-block-{self.run_id}-{self._step}.{attempt}-{j}", pure=False,
                workers=[workers[j % len(workers)]] if workers else None,
                allow_other_workers=True))
        t0 = _perf()
        self._wait(trainer, futures)
        t_wait = _perf() - t0
        t0 = _perf()
        try:
            results = self.client.gather(futures)
        except CancelledError:
            raise _InputsLost() from None
        return results, {"scatter": t_scatter, "wait": t_wait, "gather": _perf() - t0}

    def _scatter(self, value):
        """``value`` on one worker now (one future; the blocks on other workers fetch it
        from there); no worker within the grace: lost.

        Not a broadcast: replicating to every listed worker kept a worker SIGKILLed
        mid-transfer listed, and the scheduler retried its address 30 s per try
        (``test_sigkilled_worker_loses_nothing`` failed in 2 of 3 full-suite runs). The
        whole scatter is bounded, not only its wait for workers; past the bound the
        step's inputs count as lost and are sent again."""
        client = self.client
        try:
            [future] = client.sync(asyncio.wait_for,
                                   client._scatter([value], broadcast=False, hash=False,
                                                   timeout=self.worker_grace),
                                   2 * self.worker_grace)
        except (TimeoutError, asyncio.TimeoutError, OSError):  # no worker, or one died
            raise _InputsLost() from None
        return future

    def _current_workers(self) -> list[str]:
        """The workers to deal blocks to: asked of the scheduler at most every
        ``WORKER_REFRESH`` seconds (a round trip), so a joining worker gets blocks soon."""
        now = _perf()
        if not self._workers or now - self._workers_at > WORKER_REFRESH:
            workers = self.workers
            if workers:
                self._workers, self._workers_at = workers, now
        return self._workers

    def _lost(self, trainer) -> str:
        workers = len(self.client.nthreads())
        why = "no worker left" if not workers else \
            f"the step's inputs were lost {_ATTEMPTS} times over"
        return (f"cluster {self.spec}: {why}; step {trainer.global_step + 1} was not applied; "
                f"{trainer.describe_last_checkpoint()}")

    def _wait(self, trainer, futures):
        """Block until every block is done; a step with no worker for ``worker_grace`` s fails."""
        from distributed import wait

        alone_since = None
        while True:
            try:
                wait(futures, timeout=1.0)
            except TimeoutError:
                pass
            except CancelledError:  # the scattered inputs went with the workers holding them
                raise _InputsLost() from None
            except Exception as exc:  # a lost connection to the scheduler
                raise ClusterError(f"cluster {self.spec}: {type(exc).__name__}: {exc}; "
                                   f"{trainer.describe_last_checkpoint()}") from None
            if all(f.done() for f in futures):
                break
            try:
                n = len(self.client.nthreads())
            except Exception as exc:
                raise ClusterError(f"cluster {self.spec}: the scheduler is gone "
                                   f"({type(exc).__name__}); "
                                   f"{trainer.describe_last_checkpoint()}") from None
            if n:
                alone_since = None
            elif alone_since is None:
                alone_since = _perf()
            elif _perf() - alone_since > self.worker_grace:
                for f in futures:
                    f.cancel()
                raise ClusterError(f"cluster {self.spec}: no worker left for "
                                   f"{self.worker_grace:.0f} s; step {trainer.global_step + 1} "
                                   f"was not applied; {trainer.describe_last_checkpoint()}")
        for f in futures:
            if f.status == "cancelled":
                raise _InputsLost()
            if f.status == "error":
                exc = f.exception()
                if isinstance(exc, HeteroNNError):
                    raise exc
                name = type(exc).__name__
                if name == "KilledWorker":
                    raise ClusterError(f"cluster {self.spec}: a block of step "
                                       f"{trainer.global_step + 1} killed every worker it ran "
                                       f"on ({exc}); "
                                       f"{trainer.describe_last_checkpoint()}") from None
                raise TaskError(f"cluster block {f.key} failed: {name}: {exc}") from exc
            if f.status != "finished":
                raise ClusterError(f"cluster {self.spec}: block {f.key} ended {f.status}; "
                                   f"{trainer.describe_last_checkpoint()}")

    def _apply(self, trainer, params, results):
        """Replay the partitions' contributions in partition order, as one process
        submits them, then clip (if asked) and run the optimizer step."""
        rt, model = trainer.runtime, trainer.model
        handles = self._handles
        if handles is None or handles[0].owner is not rt or handles[0].dtype != model.dtype:
            handles = self._handles = (rt.empty((), model.dtype, name="loss"),
                                       rt.empty((), np.int64, name="correct"))
        loss, correct = handles
        model.zero_grad(rt)  # fresh gradients, or fill_zero: what the layers do
        first = True
        for block in results:
            for grads, part_loss, part_correct in block[0]:
                if len(grads) != len(params):
                    raise ClusterError(f"a worker returned {len(grads)} gradients for "
                                       f"{len(params)} parameters")
                for (name, p), grad in zip(params, grads):
                    rt.submit(contribution(deliver, [p]),
                              rt.register(_array(grad), name=f"{name}.part"), p.grad)
                # the loss's first partition writes in place, as SoftmaxCrossEntropy's does
                codelet = overwriting(deliver) if first else deliver
                rt.submit(codelet, rt.register(_array(part_loss), name="loss.part"), loss)
                rt.submit(codelet, rt.register(_array(part_correct), name="correct.part"),
                          correct)
                first = False
        clip = getattr(trainer, "clip_grad_norm", None)
        norm_sq = submit_clip_grad_norm(trainer.optimizer, clip) if clip is not None else None
        trainer.optimizer.step(rt)
        if norm_sq is not None:
            trainer.last_grad_norm = float(np.sqrt(rt.fetch(norm_sq)))
        return float(rt.fetch(loss)), int(rt.fetch(correct))

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Drop the run's state on the workers; close what this object started."""
        client, self.client = self.client, None
        if client is None:
            return
        try:
            if client.status == "running":
                client.run(drop_run, self.run_id)
        except Exception:  # workers gone: nothing left to drop
            pass
        self._template, self._sources = None, {}
        if self._own_client:
            client.close()
            if self._cluster is not None:
                self._cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Cluster({self.spec!r}, worker_devices={self.worker_devices!r})"


class _InputsLost(Exception):
    """A step's scattered inputs (weights, template, data) are gone from the cluster."""


def _array(a):
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def connect(spec, *, threads=1, devices=None, timeout=CONNECT_TIMEOUT,
            worker_grace=WORKER_GRACE) -> Cluster:
    """A :class:`Cluster` from a ``distributed.Client``, ``"local:N"`` or a scheduler address.

    ``"local:N"`` starts a ``LocalCluster`` of ``N`` worker processes with one Dask
    thread each (its runtime uses ``threads`` cores); an address (``tcp://HOST:PORT``)
    joins a running scheduler within ``timeout`` seconds.

    Raises
    ------
    ConfigError
        A malformed spec, or a scheduler that cannot be reached in time (the
        message names the address).
    """
    if isinstance(spec, Cluster):
        return spec
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ConfigError(f"cluster threads must be a positive integer, got {threads!r}")
    if devices is not None:
        from ..scheduler.devices import parse_devices
        parse_devices(devices)
    try:
        import distributed
    except ImportError:
        raise ConfigError("cluster: the 'distributed' package is not installed") from None
    if isinstance(spec, distributed.Client):
        return Cluster(spec, threads=threads, devices=devices, worker_grace=worker_grace)
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"cluster: expected 'local:N', an address such as "
                          f"'tcp://HOST:PORT' or a distributed.Client, got {spec!r}")
    if spec.startswith("local:") or spec == "local":
        count = spec.partition(":")[2] or "1"
        if not count.isdigit() or int(count) < 1:
            raise ConfigError(f"cluster {spec!r}: expected 'local:N' with N a positive integer")
        cluster = distributed.LocalCluster(
            n_workers=int(count), threads_per_worker=1, processes=True,
            dashboard_address=":0", silence_logs=logging.ERROR)
        client = distributed.Client(cluster)
        return Cluster(client, threads=threads, devices=devices, cluster=cluster,
                       own_client=True, worker_grace=worker_grace, spec=spec)
    if "://" not in spec and ":" not in spec:
        raise ConfigError(f"cluster {spec!r}: expected 'local:N' or an address such as "
                          "'tcp://HOST:PORT'")
    try:
        client = distributed.Client(spec, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"cluster {spec}: cannot reach a Dask scheduler within "
                          f"{timeout:g} s ({type(exc).__name__})") from None
    return Cluster(client, threads=threads, devices=devices, own_client=True,
                   worker_grace=worker_grace, spec=spec)


def _has_bokeh() -> bool:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    return True


def connect_trainer(trainer, spec) -> tuple[Cluster, bool]:
    """``(cluster, owned)`` for ``Trainer(cluster=spec)``: refuses what a cluster cannot
    train like one process, then connects (``owned``: made here, so the trainer closes it)."""
    if trainer.auto_granularity:
        raise ConfigError("granularity='auto' calibrates and measures local steps; with "
                          "a cluster give an integer (a multiple of the workers deals best)")
    model = trainer.model
    if getattr(model, "granularities", None) is not None:
        raise ConfigError("cluster: the model has per-layer granularities; a cluster "
                          "worker runs its share at the trainer's granularity")
    if trainer.augment is not None:
        raise ConfigError("augment= runs on the client's loader thread; with a cluster "
                          "the workers read their batches themselves: give one or the other")
    from ..layers import BatchNorm2D, Dropout, RateEncode
    stateful = sorted({type(m).__name__ for m in model.modules()
                       if isinstance(m, (BatchNorm2D, Dropout, RateEncode))})
    if stateful:  # their statistics / masks span the whole batch, not one worker's block
        raise ConfigError(f"cluster: the model has {', '.join(stateful)} layers, whose "
                          f"batch statistics or dropout masks are not yet kept equal to "
                          f"one process's across workers; train it with --devices")
    return connect(spec), not isinstance(spec, Cluster)
