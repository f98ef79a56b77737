"""Data-parallel training over a Dask cluster: steps without round trips through Dask.

This module owns the client side of the cluster path (StarPU-MPI's hierarchy over
Dask): :class:`Cluster`, made by :func:`connect`, runs a trainer's steps on a
*group* of Dask workers, one *rank* each (:class:`~hetero_nn.training.cluster.rank.Rank`, a
Dask actor that keeps its share of the run -- model, runtime, optimizer, data --
between steps). Inside each rank the local runtime runs the fine-grained tasks on
the worker's cores; between ranks, gradients and batch statistics are reduced
directly, in partition order (:mod:`hetero_nn.training.cluster.exchange`), over
``distributed``'s TCP comms (:mod:`hetero_nn.training.cluster.endpoint`). The client sends
each step's command (sample indices, hyper-parameters) straight to the ranks and
reads one small answer from each; it never sends weights after the group forms, and
Dask's scheduler is used only to place the actors and to list the workers.

Policy
------
A batch of ``n`` samples is cut into the trainer's ``g`` partitions
(``numpy.array_split`` sizes, as in one process) and the partitions are dealt in
contiguous blocks, as even as :func:`blocks` makes them, to the group's ranks in
the order of their worker addresses; the group has ``min(workers, g)`` ranks.
Every rank reduces the same contributions by the same tree, so each holds the
weights of ``--devices cpu:N`` at the same granularity, bit for bit, whatever the
number of ranks.

The group forms at the first step, and again at a step boundary after a worker
left or joined or the client's state was replaced (``load_checkpoint``): the
client then pulls the run's state from a rank (:meth:`Cluster.pull`) and pushes it
to every rank of the new group (a joining worker gets the state and a share from
the next step). The client's own model and optimizer are brought up to date
(pulled) before a checkpoint, an evaluation, a prediction and at the end of
``fit``; between those, the ranks hold the run.

Faults. When a rank's link closes (its process died, SIGKILL included) or its
worker leaves the scheduler, the client aborts the step on the others. If one of
them completed the step, every reduction was in and its state is the step's
result; otherwise each survivor put back what the failed step changed and holds
the state after the last completed step. The client pulls that state, forms a new
group with the workers now there, and runs the step again: the run ends with the
bytes of an uninterrupted one. With no worker left for ``worker_grace`` seconds the
step raises :class:`~hetero_nn.errors.ClusterError` naming the last checkpoint. A
rank drops the run's state when the client's link closes (the client ended or
died) or its actor is released.

State
-----
``client`` (and the ``LocalCluster`` it started), ``spec``; ``links`` (the client's
:class:`~hetero_nn.training.cluster.messages.ClientLinks`, named by the ranks' endpoint
addresses); ``_stale`` (the ranks are ahead of the client's model) and ``_dirty``
(the client's state is newer than the ranks'); ``last_timings`` (the last step's
terms, :func:`~hetero_nn.training.cluster.messages.step_terms`); the group's own state
is :class:`~hetero_nn.training.cluster.group.Group`'s.
"""

from __future__ import annotations

import importlib.util
import logging
import time

import numpy as np
import dataclasses

from ...errors import ClusterError, ConfigError
from .messages import (DatasetBatch, RankLost, blocks, load_run_state, partition_starts,
                         step_terms)
from .exchange import BUCKET_BYTES
from .group import ATTEMPTS, WORKER_GRACE, WORKER_REFRESH, Group
from ...scheduler.devices import parse_devices

__all__ = ["Cluster", "connect", "DatasetBatch", "partition_starts", "blocks",
           "WORKER_GRACE", "WORKER_REFRESH"]

_perf = time.perf_counter
#: Seconds a connection to a scheduler may take.
CONNECT_TIMEOUT = 10.0


class Cluster(Group):
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
    worker_grace : float
        Seconds a step waits for a worker to appear when none is left.
    bucket_bytes : int
        Gradient bytes per reduction bucket (:mod:`hetero_nn.training.cluster.exchange`).
    """

    def __init__(self, client, *, threads=1, devices=None, cluster=None, own_client=False,
                 worker_grace=WORKER_GRACE, spec=None, bucket_bytes=BUCKET_BYTES):
        super().__init__(client, devices or f"cpu:{int(threads)}", worker_grace, bucket_bytes)
        self.spec = spec or client.scheduler.address
        self._cluster = cluster
        self._own_client = own_client
        self.last_timings: dict = {}

    # ------------------------------------------------------------ facts
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

    # ------------------------------------------------------------ batches
    def batches(self, data, order, batch_size, start, stop):
        """Yield ``(DatasetBatch, indices)`` for batches ``start..stop-1`` of ``order``.

        The dataset goes to the workers once, when the group forms; each step sends
        each rank its samples' indices. (The trainer's ``fit`` uses ``len`` of the
        second item.)
        """
        for b in range(start, stop):
            indices = np.asarray(order[b * batch_size:(b + 1) * batch_size], dtype=np.int64)
            yield DatasetBatch(data, indices), indices

    # ------------------------------------------------------------ the step
    def train_step(self, trainer, x, y) -> float:
        """One optimizer step of ``trainer`` on the group; returns the batch's mean loss.

        ``x`` is a :class:`DatasetBatch` (from :meth:`batches`) or an array of images
        with ``y`` its labels (sent to the ranks with the step).
        """
        t_start = _perf()
        model = trainer.model
        if isinstance(x, DatasetBatch):
            n, data = len(x), x.data
            sample = tuple(getattr(data, "input_shape", None) or model.input_shape)
        else:
            x, y, data = np.asarray(x), np.asarray(y), None
            if y.shape != (x.shape[0],):
                raise ConfigError(f"labels of shape {y.shape} do not match a batch of "
                                  f"{x.shape[0]} samples")
            n, sample = x.shape[0], tuple(x.shape[1:])
        trainer.prepare(np.empty((0, *sample), trainer.dtype))
        self._adopt(trainer)
        if trainer.granularity is None:
            self.tune(trainer, x, y)
        g = min(trainer.granularity, n)
        step = trainer.global_step + 1
        for attempt in range(1, ATTEMPTS + 1):
            size = min(g, max(1, len(self._seen)))
            self._ensure_group(trainer, data, size)
            try:
                result, timings = self._run_step(trainer, x, y, n, g, step)
                break
            except RankLost as lost:
                result = self._recover(trainer, step, lost)
                if result is not None:
                    timings = {}
                    break
                if attempt == ATTEMPTS:
                    raise ClusterError(f"cluster {self.spec}: step {step} failed {ATTEMPTS} "
                                       f"times ({lost}); {trainer.describe_last_checkpoint()}") \
                        from None
        self._stale = True
        trainer.last_correct = int(result["correct"])
        if result.get("norm") is not None:
            trainer.last_grad_norm = float(result["norm"])
        self.last_timings = {**timings, "total": _perf() - t_start, "ranks": len(self._group)}
        return float(result["loss"])

    def _run_step(self, trainer, x, y, n, g, step):
        group = self._group
        starts = partition_starts(g, len(group))
        sample_starts = partition_starts(n, g)
        hyper = trainer.optimizer.hyper()
        common = {"op": "step", "gen": self._generation, "step": step, "epoch": trainer.epoch,
                  "n": n, "starts": starts, "sample_starts": sample_starts, "hyper": hyper}
        messages = {}
        for j, worker in enumerate(group):
            lo, hi = sample_starts[starts[j]], sample_starts[starts[j + 1]]
            if isinstance(x, DatasetBatch):
                part = {"indices": self.links.array(x.indices[lo:hi])}
            else:
                part = {"x": self.links.array(x[lo:hi]), "y": self.links.array(y[lo:hi])}
            messages[self._ranks[worker].address] = {**common, **part}
        t_send = time.monotonic()
        replies = self.links.ask(messages, self._alive)
        t_all = time.monotonic()
        self._raise_errors(replies, trainer)
        first = replies[self._ranks[group[0]].address]
        return first["result"], step_terms(t_send, t_all, replies.values())

    # ------------------------------------------------------------ faults
    def _abort(self, addresses):
        """Stop the step on ``addresses``; ``{address: reply}`` of those that answered."""
        messages = {a: {"op": "abort"} for a in addresses if a in self.links.peers()}
        return self.links.ask(messages, lambda: list(messages), partial=True, timeout=60.0)

    def _recover(self, trainer, step, lost):
        """After a rank was lost in ``step``: the step's result if a survivor completed it
        (its state pulled), else None (the survivors' state, after ``step - 1``, pulled);
        the next formation pushes it."""
        logging.getLogger("hetero_nn.cluster").warning("cluster %s: %s; recovering step %d",
                                                       self.spec, lost, step)
        survivors = [self._ranks[w].address for w in self._group if w in self._ranks]
        replies = self._abort(survivors)
        self._forget([a for a in survivors if a not in replies] + list(lost.addresses))
        self._dirty = True
        done = [a for a, r in replies.items() if r.get("completed") == step]
        ready = done or [a for a, r in replies.items() if r.get("completed") == step - 1]
        for address in ready:
            try:
                self._load(trainer, address)
            except RankLost:
                continue
            if done:
                return replies[address]["result"]
            return None
        self._group = []
        if self._stale:
            raise ClusterError(f"cluster {self.spec}: every worker holding the run was lost "
                               f"in step {step}; {trainer.describe_last_checkpoint()}")
        return None

    # ------------------------------------------------------------ the run's state
    def pull(self, trainer):
        """Bring the run's state (weights, buffers, optimizer, dropout counters) from the
        group's first rank into ``trainer``, if the ranks are ahead of it."""
        if not self._stale or self.client is None or trainer is not self._trainer:
            return
        for worker in list(self._group):
            ref = self._ranks.get(worker)
            if ref is None:
                continue
            try:
                self._load(trainer, ref.address)
                return
            except RankLost:
                self._forget([ref.address])
        raise ClusterError(f"cluster {self.spec}: every worker holding the run was lost; "
                           f"{trainer.describe_last_checkpoint()}")

    def _load(self, trainer, address):
        reply = self.links.ask({address: {"op": "state"}}, lambda: [address])[address]
        if reply.get("op") != "state":
            raise RankLost(f"rank {address}: {reply.get('error')}")
        load_run_state(trainer.model, trainer.optimizer, reply["state"])
        trainer.step_cache.clear()  # its graphs hold the handles the load replaced
        self._stale = False

    def invalidate(self):
        """The client's state was replaced (a checkpoint loaded): push it at the next step."""
        self._stale = False
        self._dirty = True

    def tune(self, trainer, x, y=None):
        """``granularity="auto"`` on the cluster: each rank of a group of all the workers
        chooses a granularity for its share of the batch on its own devices (without
        per-layer granularities); the run's granularity is their sum, dealt evenly from
        then on, with the first rank's choice of fusion everywhere."""

        data = x.data if isinstance(x, DatasetBatch) else None
        n = len(x)
        self._adopt(trainer)
        self._ensure_group(trainer, data, max(1, min(len(self._seen), n)))
        group = self._group
        shares = partition_starts(n, len(group))
        messages = {}
        for j, worker in enumerate(group):
            lo, hi = shares[j], shares[j + 1]
            part = ({"indices": self.links.array(x.indices[lo:hi]), "epoch": trainer.epoch}
                    if data is not None else {"x": self.links.array(np.asarray(x)[lo:hi]),
                                              "y": self.links.array(np.asarray(y)[lo:hi])})
            messages[self._ranks[worker].address] = {"op": "tune", **part}
        replies = self.links.ask(messages, self._alive)
        self._raise_errors(replies, trainer)
        answers = [replies[self._ranks[w].address] for w in group]
        chosen = [a["granularity"] for a in answers]
        first = answers[0]["decision"]
        trainer.granularity = min(sum(chosen), trainer.batch_size)
        trainer.granularity_decision = dataclasses.replace(
            first, granularity=trainer.granularity,
            platform=f"{first.platform}; {len(group)} workers chose {chosen}")
        if first.fuse is not None and hasattr(trainer.model, "fuse"):
            trainer.model.fuse = first.fuse
        trainer.unbind()  # the ranks take the fusion at the next formation
        return trainer.granularity

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Drop the run on the workers; close what this object started."""
        if self.client is None:
            return
        if self._trainer is not None and self._stale:  # the run's last steps: here first
            try:
                self.pull(self._trainer)
            except Exception as exc:
                logging.getLogger("hetero_nn.cluster").warning(
                    "cluster %s: the state of the last steps could not be brought back "
                    "(%s); the model holds the state after step %s", self.spec, exc,
                    self._trainer.global_step)
        client, self.client = self.client, None
        self._stop.set()
        if self.links is not None:
            for address in self.links.peers():
                self.links.post(address, {"op": "close"})
            self.links.close()
        for ref in self._ranks.values():
            try:
                ref.future.release()
            except Exception:
                pass
        self._ranks.clear()
        self._data = None
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


def connect(spec, *, threads=1, devices=None, timeout=CONNECT_TIMEOUT,
            worker_grace=WORKER_GRACE, cls=None) -> Cluster:
    """A :class:`Cluster` from a ``distributed.Client``, ``"local:N"`` or a scheduler address.

    ``"local:N"`` starts a ``LocalCluster`` of ``N`` worker processes with one Dask
    thread each (its runtime uses ``threads`` cores); an address (``tcp://HOST:PORT``)
    joins a running scheduler within ``timeout`` seconds. ``cls``: the class made
    (default :class:`Cluster`; a pipeline's is
    :class:`~hetero_nn.training.pipeline.stage_cluster.StageCluster`).

    Raises
    ------
    ConfigError
        A malformed spec, or a scheduler that cannot be reached in time (the
        message names the address).
    """
    if isinstance(spec, Cluster):
        return spec
    cls = cls or Cluster
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ConfigError(f"cluster threads must be a positive integer, got {threads!r}")
    if devices is not None:
        parse_devices(devices)
    try:
        import distributed  # distributed loads with the first cluster (heavy at start-up)
    except ImportError:
        raise ConfigError("cluster: the 'distributed' package is not installed") from None
    if isinstance(spec, distributed.Client):
        return cls(spec, threads=threads, devices=devices, worker_grace=worker_grace)
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
        return cls(client, threads=threads, devices=devices, cluster=cluster,
                   own_client=True, worker_grace=worker_grace, spec=spec)
    if "://" not in spec and ":" not in spec:
        raise ConfigError(f"cluster {spec!r}: expected 'local:N' or an address such as "
                          "'tcp://HOST:PORT'")
    try:
        client = distributed.Client(spec, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"cluster {spec}: cannot reach a Dask scheduler within "
                          f"{timeout:g} s ({type(exc).__name__})") from None
    return cls(client, threads=threads, devices=devices, own_client=True,
               worker_grace=worker_grace, spec=spec)


def _has_bokeh() -> bool:
    """Whether bokeh (optional: the dashboard's plots) is installed, without importing it."""
    return importlib.util.find_spec("bokeh") is not None
