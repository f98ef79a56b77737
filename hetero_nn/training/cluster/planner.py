"""The cluster path on a described platform: a predicted step, and scaling projections.

This module owns what ``hetero-nn simulate --cluster-workers`` predicts: the time of
one data-parallel step of :mod:`hetero_nn.training.cluster` on ``W`` machines of a
:class:`~hetero_nn.simulation.platforms.ClusterPlatform`, and how it scales.

Model
-----
The step a rank runs is captured as it is submitted
(:func:`~hetero_nn.training.cluster.rank.submit_share`, on a runtime whose executor records
instead of running: :func:`~hetero_nn.simulation.simulate.capture`), so the
simulated graph is the real one: the rank's partitions' forward and backward, the
``cluster_reduce`` task of every batch statistic, one ``cluster_send`` per gradient
bucket, the ``cluster_recv`` that writes the reduced gradients, the optimizer.
It is replayed on one machine of the platform (its workers, links and devices; the
cores a rank uses) by the simulator, each codelet predicted by this host's
measured models or, where the device has none, by its roofline, and the exchange's
codelets by the network:

- ``cluster_reduce`` (a batch statistic; on the critical path, as it is in a
  rank): its messages as the exchange sends them -- each rank's values to every
  other rank, or, from :data:`~hetero_nn.training.cluster.exchange.TREE_FROM` ranks on, one
  message per hop up the tree and down a binomial tree -- at ``latency +
  message_overhead`` per message and the machine's port ``bandwidth``;
- ``cluster_send``: packing its bucket (memory traffic); the bucket's messages
  then leave when it ends, one bucket after another on the machine's port
  (a first replay gives the send times);
- ``cluster_recv``: waits until the last bucket's reduction is in (a second replay
  charges it the wait the first one found), then unpacks.

A rank replays its captured step: the host's time per step is what the caller gives
(a calibration's measure of the replay path), not the capture's submission time.

A step on the cluster: the client's command to the ``W`` ranks (``W`` messages
from its port), the rank's simulated step, the answer back. Not modelled: the
slowest rank (every rank is taken to be rank 0, on identical machines), the
reading of the samples on the rank, contention inside the network (a
non-blocking switch is assumed), the client's own bookkeeping.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import threading
import time

from ...simulation.platforms import ClusterPlatform, Device, Machine, Network
from ...simulation.simulate import capture, simulate
from .messages import partition_starts
from .exchange import Exchange, tree_ops
from .rank import place_share, submit_share
from ...models import build_model
from ...scheduler.runtime import Runtime
from ..trainer import Trainer
from ...simulation.paths import PathCosts, engine_serves
from .endpoint import Endpoint, serialized
from ...datasets import load
from .client import connect

__all__ = ["ClusterPrediction", "capture_share", "predict_cluster_step", "scaling", "shares",
           "format_scaling", "local_platform", "measure_network", "measure_cluster_step"]

#: Bytes per second a rank packs and unpacks gradient buckets at (host memory copies).
PACK_BANDWIDTH = 5e9


@dataclass
class ClusterPrediction:
    """A predicted step on ``ranks`` machines: seconds per term and images/s."""

    ranks: int
    batch: int
    granularity: int
    step_seconds: float
    rank_seconds: float
    dispatch_seconds: float
    report_seconds: float
    exposed_seconds: float
    statistics_seconds: float
    result: object = None
    buckets: list = field(default_factory=list)  # (bytes, sent at, reduced at), seconds

    @property
    def images_per_second(self) -> float:
        return self.batch / self.step_seconds

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "batch": self.batch, "granularity": self.granularity,
                "step_seconds": self.step_seconds, "rank_seconds": self.rank_seconds,
                "dispatch_seconds": self.dispatch_seconds,
                "report_seconds": self.report_seconds,
                "exposed_reduction_seconds": self.exposed_seconds,
                "statistics_seconds": self.statistics_seconds,
                "images_per_second": self.images_per_second, "buckets": self.buckets,
                "rank_step": None if self.result is None else self.result.to_json()}


def capture_share(model, shape, batch, granularity, ranks, rank=0, dtype="float32",
                  perfmodel=None, seed=0, steps=6, host_seconds=0.0):
    """Capture rank ``rank``'s share of a step of ``model`` (a built-in name) on a batch
    of ``batch`` samples in ``granularity`` partitions dealt to ``ranks`` ranks.

    Returns ``(step graphs, runtime)``: the last two captured steps (the first binds
    the model) and the runtime whose models predict them; the caller closes it. The
    host's time of each step is ``host_seconds``: a rank replays its step, so the
    capture's submission time, which a replay does not spend, is not counted.
    """

    rt = Runtime(devices="cpu:1", trace=False, perfmodel=perfmodel, deterministic=False)
    try:
        net = build_model(model, shape, dtype=dtype, seed=seed)
        trainer = Trainer(net, runtime=rt, batch_size=batch, granularity=1, dtype=dtype)
        starts = partition_starts(granularity, ranks)
        sample_starts = partition_starts(batch, granularity)
        place_share(trainer, rank, starts, sample_starts, batch)
        n = sample_starts[starts[rank + 1]] - sample_starts[starts[rank]]
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, *shape)).astype(dtype)
        y = rng.integers(0, 10, n)
        exchange = Exchange(None, 0, rank, [f"rank{j}" for j in range(ranks)])

        def submit():
            submit_share(trainer, exchange, starts, batch, *trainer.register_batch(x, y))
            rt.wait()  # the flush the recorder keeps

        graphs = capture(rt, submit, steps=steps)[1:]
        for g in graphs:
            g.submit_seconds = host_seconds
        return graphs[-2:], rt
    except BaseException:
        rt.close()
        raise


def _collective(shape, ranks, rank, network, itemsize) -> float:
    """Seconds of one reduction's messages for ``rank`` (module docstring)."""
    if ranks < 2:
        return 0.0
    if shape.tree:  # up the tree, to rank 0, down a binomial tree: one message per hop
        up = {s for i, j, s in tree_ops(shape.m) if not shape.local(i, s, shape.owner_of_leaf(i))}
        hops = len(up) + (shape.m > 0 and shape.owner_of_leaf(0) != 0) + math.ceil(math.log2(ranks))
        return hops * network.message(shape.size * itemsize)
    values = shape.values_sent(rank)
    size = shape.size * itemsize
    if len(shape.ranges) == 1:  # to every rank, each reduces the whole
        out = (ranks - 1) * values * size
        return network.latency + (ranks - 1) * network.message_overhead + out / network.bandwidth
    part = size / ranks  # reduce-scatter, then all-gather
    out = (ranks - 1) * (values + 1) * part
    return (2 * network.latency + 2 * (ranks - 1) * network.message_overhead
            + out / network.bandwidth)


def predict_cluster_step(model, shape, batch, granularity, platform: ClusterPlatform, ranks,
                         policy="dmda", dtype="float32", costs=None, cpu_workers=None,
                         perfmodel=None) -> ClusterPrediction:
    """One step of the cluster path on ``ranks`` machines of ``platform`` (module
    docstring): ``batch`` samples in ``granularity`` partitions (at least ``ranks``).
    ``costs``: what the rank's runtime costs besides its kernels on the path its replayed
    steps take (:class:`~hetero_nn.simulation.paths.PathCosts`, measured by a
    calibration; none: nothing), the compiled engine's schedule where it serves."""

    costs = costs or PathCosts("compiled")
    ranks = max(1, min(ranks, granularity))
    machine = platform.machine(0)
    sim_platform = machine.platform(platform.dispatch, cpu_workers)
    path = {"dispatch": costs.dispatch, "handoff": costs.handoff,
            "engine": costs.path == "compiled" and engine_serves(sim_platform, policy)}
    network = platform.network
    itemsize = np.dtype(dtype).itemsize
    steps, rt = capture_share(model, shape, batch, granularity, ranks, 0, dtype, perfmodel,
                              host_seconds=costs.host or 0.0)
    try:
        waits: dict = {}

        def models(task, kind):
            name = task.codelet.name
            if name == "cluster_reduce":
                return _collective(task.params["shape"], ranks, 0, network, itemsize), "network"
            if name in ("cluster_send", "cluster_recv"):
                nbytes = sum(h.nbytes for h in task.handles[name == "cluster_recv":])
                return nbytes / PACK_BANDWIDTH + waits.get(task.id, 0.0), "network"
            return None

        result = simulate(steps, sim_platform, policy, rt, models=models, **path)
        tasks = {t.id: t for g in steps[-1].graphs for t in g}
        rows = sorted((r for r in result.schedule if tasks[r[0]].codelet.name in
                       ("cluster_send", "cluster_recv")), key=lambda r: r[4])
        port_free, buckets, recv = 0.0, [], None
        for task_id, name, _, start, end in rows:
            task = tasks[task_id]
            if name == "cluster_recv":
                recv = (task_id, start)
                continue
            leave = max(end, port_free)
            port_free = leave + _collective(task.params["shape"], ranks, 0, network, itemsize)
            buckets.append((task.params["shape"].size * itemsize, end, port_free))
        exposed = 0.0
        if recv is not None and buckets:
            exposed = max(0.0, max(b[2] for b in buckets) - recv[1])
            waits[recv[0]] = exposed
            result = simulate(steps, sim_platform, policy, rt, models=models, **path)
        stats = sum(e - s for tid, name, _, s, e in result.schedule if name == "cluster_reduce")
    finally:
        rt.close()
    send = network.latency + ranks * network.message_overhead + 64 * ranks / network.bandwidth
    report = network.message(256)
    step = send + result.step_seconds + report
    return ClusterPrediction(ranks, batch, granularity, step, result.step_seconds, send, report,
                             exposed, stats, result, buckets)


def scaling(model, shape, platform, workers, batch, granularity, weak=False, **kw) -> list:
    """Predicted steps for each worker count of ``workers``. Weak scaling: ``batch``
    samples and ``granularity`` partitions per worker. Strong: the batch of ``batch``
    samples in ``granularity`` partitions (at least one per worker) dealt to them, as
    the same run on more workers deals it."""
    rows = []
    for w in workers:
        n, g = (batch * w, granularity * w) if weak else (batch, max(granularity, w))
        rows.append(predict_cluster_step(model, shape, n, g, platform, w, **kw))
    return rows


def shares(workers, batch, granularity, weak=False) -> list:
    """The distinct ``(samples, partitions)`` of rank 0's share over ``workers`` (what a
    calibration must measure for :func:`scaling`)."""
    out = set()
    for w in workers:
        if weak:
            out.add((batch, granularity))
            continue
        g = max(granularity, w)
        mine = partition_starts(g, w)[1]  # rank 0's partitions, and their samples
        out.add((partition_starts(batch, g)[mine], mine))
    return sorted(out)


def format_scaling(rows, weak=False) -> str:
    """A table of :func:`scaling`'s predictions, with speed-up and efficiency against the
    first row."""
    base = rows[0]
    lines = [f"{'workers':>7} {'batch':>6} {'step ms':>9} {'images/s':>10} {'speed-up':>9} "
             f"{'efficiency':>10} {'exposed ms':>10} {'stats ms':>9}"]
    for r in rows:
        speedup = r.images_per_second / base.images_per_second
        ideal = r.ranks / base.ranks
        lines.append(f"{r.ranks:>7} {r.batch:>6} {1e3 * r.step_seconds:>9.2f} "
                     f"{r.images_per_second:>10.0f} {speedup:>9.2f} {speedup / ideal:>10.2f} "
                     f"{1e3 * r.exposed_seconds:>10.2f} {1e3 * r.statistics_seconds:>9.2f}")
    return "\n".join(lines)


def measure_network(trips=40) -> Network:
    """This machine's links between processes as the cluster path uses them: two
    endpoints in this process, ping-pong of 8 bytes (half the round trip: the
    per-message cost) and of 4 MiB (the bandwidth); medians."""

    got = threading.Event()
    b = Endpoint("b", "127.0.0.1", lambda peer, m: b.post(peer, m))
    a = Endpoint("a", "127.0.0.1", lambda peer, m: got.set())
    try:
        a.connect("b", b.address)

        def half_trip(nbytes):
            payload = serialized(np.zeros(max(1, nbytes // 4), np.float32))
            times = []
            for _ in range(trips):
                got.clear()
                t0 = time.perf_counter()
                a.post("b", {"v": payload})
                if not got.wait(30):
                    raise TimeoutError("no answer over this machine's loopback")
                times.append((time.perf_counter() - t0) / 2)
            return statistics.median(times[trips // 4:])

        small, big = half_trip(8), half_trip(4 << 20)
    finally:
        a.close()
        b.close()
    return Network(latency=0.0, bandwidth=(4 << 20) / max(big - small, 1e-9),
                   message_overhead=small, source="measured on this machine (loopback)")


def local_platform(workers, threads=1, network=None) -> ClusterPlatform:
    """This machine as ``workers`` single-machine workers of ``threads`` cores each (what
    ``--cluster local:N --cluster-threads T`` runs), its codelets this host's measured
    models, its network :func:`measure_network` unless given."""
    core = Device("this host's core", "cpu", measured=True, source="this host's models")
    return ClusterPlatform("this machine", [Machine("this host", int(workers),
                                                    (core, int(threads)))],
                           network or measure_network())


def measure_cluster_step(model, shape, batch, granularity, workers, threads=1, steps=12,
                         warmup=4, dtype="float32") -> float:
    """The median seconds of real steps of ``model`` on ``--cluster local:workers``
    (synthetic data, the pinned variants), for a prediction to be checked against."""


    data = load("synthetic", "train", image_size=shape[-1], channels=shape[0],
                num_samples=2 * batch)
    net = build_model(model, shape, dtype=dtype, seed=0)
    with (connect(f"local:{workers}", threads=threads) as cluster,
          Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
          Trainer(net, runtime=rt, batch_size=batch, granularity=granularity,
                  cluster=cluster) as trainer):
        two = list(cluster.batches(data, np.arange(len(data)), batch, 0, 2))
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            trainer.train_step(*two[i % 2])
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)
