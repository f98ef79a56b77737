"""Data-parallel training on a Dask cluster against one process: images/s and per-step costs.

For each built-in model (``dahl-basic``, ``lenet5`` on 1x28x28, ``cifar-small`` on
3x32x32) and each batch size (``--batches``, default 64 and 256), trains on
synthetic data with the CLI's pinned variants:

- ``cpu:1``, ``cpu:2``: one process, ``Runtime(devices="cpu:N")``;
- ``local:1``, ``local:2``: ``Trainer(cluster=...)`` over a ``LocalCluster`` of N
  worker processes with one core each (the client runtime, which only combines and
  updates, has one worker).

Each configuration runs ``--warmup`` steps (compiles, worker state, data sent
once), then ``--steps`` timed steps; images/s is steps x batch / seconds. For
the cluster, the mean per step of what :class:`hetero_nn.training.cluster.Cluster` times:
``scatter`` (the weight broadcast), ``sched`` (submit until every block is done,
minus the slowest block's compute on its worker: Dask scheduling, the workers'
weight load and task dispatch), ``gather`` (the gradient transfer to the client),
``apply`` (the client's REDUX tree and optimizer step), and ``compute`` (the
slowest block on its worker).

Projection: a step on ``W`` workers (granularity ``>= W``, one block each) is
modelled as ``scatter_w * W + sched + compute_1 / W + gather_b * W + apply``,
with ``scatter_w`` the broadcast cost per worker, ``gather_b`` the transfer cost
per block and ``compute_1`` the batch's compute on one worker (all measured on
``local:2``); printed for 4, 16 and 64 workers. It assumes the client's network
link is the bottleneck of the broadcast and the gather (no tree broadcast), which
is what ``scatter(broadcast=True)`` and ``gather`` do.

Example (a few minutes on 2 idle cores; figures are noisy on a loaded machine)::

    python benchmarks/bench_cluster.py --steps 10 --json runs/bench_cluster.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import hetero_nn as hn
from hetero_nn.training.cluster import connect

MODELS = {"dahl-basic": (1, 28), "lenet5": (1, 28), "cifar-small": (3, 32)}
CONFIGS = ("cpu:1", "cpu:2", "local:1", "local:2")
PROJECT = (4, 16, 64)


def _measure(model_name, batch, config, args, clusters):
    channels, size = MODELS[model_name]
    data = hn.datasets.load("synthetic", "train", image_size=size, channels=channels,
                            num_samples=batch * 2)  # two distinct batches, visited in turn
    model = hn.build_model(model_name, data.input_shape, data.num_classes, seed=0)
    cluster = clusters.get(config)
    devices = "cpu:1" if cluster is not None else config
    timings = []
    with (hn.Runtime(devices=devices, deterministic=True,
                     perfmodel=False, trace=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=batch, granularity=args.granularity,
                     cluster=cluster) as trainer):
        order = np.arange(len(data))
        if cluster is not None:
            two = list(cluster.batches(data, order, batch, 0, 2))
        else:
            two = [data.batch(order[b * batch:(b + 1) * batch]) for b in range(2)]
        batches = [two[b % 2] for b in range(args.warmup + args.steps)]
        for x, y in batches[:args.warmup]:
            trainer.train_step(x, y)
        t0 = time.perf_counter()
        for x, y in batches[args.warmup:]:
            trainer.train_step(x, y)
            if cluster is not None:
                timings.append(dict(cluster.last_timings))
        seconds = time.perf_counter() - t0
    row = {"model": model_name, "batch": batch, "config": config,
           "images_per_second": args.steps * batch / seconds,
           "step_ms": 1e3 * seconds / args.steps}
    if timings:
        def mean(f):
            return 1e3 * statistics.fmean(f(t) for t in timings)
        row.update(scatter_ms=mean(lambda t: t["scatter"]),
                   sched_ms=mean(lambda t: t["wait"] - t["worker_max"]),
                   gather_ms=mean(lambda t: t["gather"]), apply_ms=mean(lambda t: t["apply"]),
                   compute_ms=mean(lambda t: t["worker_max"]),
                   compute_sum_ms=mean(lambda t: t["worker_sum"]),
                   blocks=timings[-1]["blocks"], workers=len(timings[-1]["workers"]),
                   gradient_kib=timings[-1]["gradient_bytes"] / 1024)
    return row


def _projection(row):
    """Images/s on W workers from the costs measured on ``local:2`` (module docstring)."""
    w = row["workers"]
    scatter_w = row["scatter_ms"] / w
    gather_b = row["gather_ms"] / row["blocks"]
    compute_1 = row["compute_sum_ms"]
    out = {}
    for n in PROJECT:
        step = scatter_w * n + row["sched_ms"] + compute_1 / n + gather_b * n + row["apply_ms"]
        out[n] = 1e3 * row["batch"] / step
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--granularity", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    clusters = {c: connect(c) for c in args.configs if c.startswith("local:")}
    rows = []
    try:
        for model_name in args.models:
            for batch in args.batches:
                for config in args.configs:
                    row = _measure(model_name, batch, config, args, clusters)
                    rows.append(row)
                    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                      for k, v in row.items()}), file=sys.stderr, flush=True)
    finally:
        for c in clusters.values():
            c.close()

    by = {(r["model"], r["batch"], r["config"]): r for r in rows}
    print(f"{'model':<12} {'batch':>5} " + " ".join(f"{c:>9}" for c in args.configs)
          + "  local:2/cpu:2   (images/s)")
    for model_name in args.models:
        for batch in args.batches:
            ips = [by[(model_name, batch, c)]["images_per_second"] for c in args.configs]
            ratio = ""
            if "local:2" in args.configs and "cpu:2" in args.configs:
                ratio = (f"{by[(model_name, batch, 'local:2')]['images_per_second'] / by[(model_name, batch, 'cpu:2')]['images_per_second']:.2f}")
            print(f"{model_name:<12} {batch:>5} " + " ".join(f"{v:>9.0f}" for v in ips)
                  + f"  {ratio:>13}")
    print("\nper step on the cluster (ms): scatter = weight broadcast, sched = Dask scheduling "
          "and dispatch, gather = gradient transfer, apply = client tree + optimizer")
    print(f"{'model':<12} {'batch':>5} {'config':>8} {'scatter':>8} {'sched':>8} {'gather':>8} "
          f"{'apply':>8} {'compute':>8} {'grad KiB':>9}  projected images/s at "
          + ", ".join(f"{n}" for n in PROJECT) + " workers")
    projections = {}
    for r in rows:
        if "scatter_ms" not in r:
            continue
        proj = ""
        if r["config"] == "local:2":
            p = _projection(r)
            projections[f"{r['model']}/{r['batch']}"] = p
            proj = "  " + ", ".join(f"{v:.0f}" for v in p.values())
        print(f"{r['model']:<12} {r['batch']:>5} {r['config']:>8} {r['scatter_ms']:>8.1f} "
              f"{r['sched_ms']:>8.1f} {r['gather_ms']:>8.1f} {r['apply_ms']:>8.1f} "
              f"{r['compute_ms']:>8.1f} {r['gradient_kib']:>9.0f}{proj}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "projections": projections, "args": vars(args),
                       "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "load": os.getloadavg()}}, f, indent=2)


if __name__ == "__main__":
    main()
