"""Data-parallel training on a Dask cluster against one process: images/s and per-step costs.

For each built-in model (``--models``, default ``lenet5`` on 1x28x28 and
``cifar-small`` on 3x32x32) and batch size (``--batches``, default 64 and 256),
trains on synthetic data with the pinned variants at granularity ``--granularity``
(default 2):

- ``cpu:1``, ``cpu:2``: one process, ``Runtime(devices="cpu:N")``;
- ``local:1``, ``local:2``: ``Trainer(cluster=...)`` over a ``LocalCluster`` of N
  worker processes with one core each (``hetero_nn.training.cluster``: each worker
  keeps its share of the run, gradients are reduced between the workers).

Each configuration runs ``--warmup`` steps (compilation, the group's forming, the
first capture), then ``--steps`` timed steps; images/s is steps x batch / seconds.
For the cluster, the mean per step of what ``Cluster.last_timings`` splits a step
into (milliseconds): ``dispatch`` (the step's command on its way to the last
worker), ``data`` (the slowest worker reading its samples), ``compute`` (the slowest
worker's step less its waits for reductions), ``exchange`` (the longest wait for a
reduction the backward pass did not hide), ``report`` (the answers' way back),
``client`` (the client's own work: the step's total less the time the workers had
it), and ``beyond`` = total - compute, the goal's per-step cost beyond compute.

The goals of issue 22 are printed under the table: ``local:2`` >= 0.8x ``cpu:2`` at
batch 256 and >= 0.6x at batch 64, and at most 3 ms beyond compute per step.

Example (a few minutes on 2 idle cores; figures are noisy on a loaded machine)::

    python benchmarks/bench_cluster.py --steps 30 --json runs/bench_cluster.json
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
from hetero_nn.training.cluster.client import connect

MODELS = {"dahl-basic": (1, 28), "lenet5": (1, 28), "cifar-small": (3, 32),
          "resnet-small": (3, 32)}
CONFIGS = ("cpu:1", "cpu:2", "local:1", "local:2")
TERMS = ("dispatch", "data", "compute", "exchange", "report", "client")


def _measure(model_name, batch, config, args, clusters):
    channels, size = MODELS[model_name]
    data = hn.datasets.load("synthetic", "train", image_size=size, channels=channels,
                            num_samples=batch * 2)  # two distinct batches, visited in turn
    model = hn.build_model(model_name, data.input_shape, data.num_classes, seed=0)
    cluster = clusters.get(config)
    devices = "cpu:1" if cluster is not None else config
    timings = []
    with (hn.Runtime(devices=devices, deterministic=True, perfmodel=False, trace=False) as rt,
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
    timings = [t for t in timings if "compute" in t]  # a step that recovered has no terms
    if timings:
        for term in TERMS[:-1]:
            row[f"{term}_ms"] = 1e3 * statistics.fmean(t[term] for t in timings)
        row["client_ms"] = 1e3 * statistics.fmean(t["total"] - t["links"] for t in timings)
        row["total_ms"] = 1e3 * statistics.fmean(t["total"] for t in timings)
        row["beyond_ms"] = row["total_ms"] - row["compute_ms"]
        row["ranks"] = timings[-1]["ranks"]
    return row


def _goals(by, models, batches):
    """Lines saying whether each goal of issue 22 is met by the rows measured."""
    lines = []
    for model_name in models:
        for batch in batches:
            a, b = by.get((model_name, batch, "local:2")), by.get((model_name, batch, "cpu:2"))
            if a is None or b is None:
                continue
            ratio = a["images_per_second"] / b["images_per_second"]
            need = 0.8 if batch >= 256 else 0.6
            lines.append(f"goal local:2 >= {need}x cpu:2, {model_name} batch {batch}: "
                         f"{ratio:.2f}x {'met' if ratio >= need else 'NOT met'}")
            if "beyond_ms" in a:
                lines.append(f"goal beyond compute <= 3 ms, {model_name} batch {batch}: "
                             f"{a['beyond_ms']:.2f} ms {'met' if a['beyond_ms'] <= 3 else 'NOT met'}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["lenet5", "cifar-small"],
                        choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--granularity", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
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
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
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
    print("\nper step on the cluster (ms, means; the module docstring defines each term)")
    print(f"{'model':<12} {'batch':>5} {'config':>8} " + " ".join(f"{t:>9}" for t in TERMS)
          + f" {'total':>9} {'beyond':>9}")
    for r in rows:
        if "compute_ms" in r:
            print(f"{r['model']:<12} {r['batch']:>5} {r['config']:>8} "
                  + " ".join(f"{r[f'{t}_ms']:>9.2f}" for t in TERMS)
                  + f" {r['total_ms']:>9.2f} {r['beyond_ms']:>9.2f}")
    goals = _goals(by, args.models, args.batches)
    print("\n" + "\n".join(goals))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "goals": goals, "args": vars(args),
                       "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "load": os.getloadavg()}}, f, indent=2)


if __name__ == "__main__":
    main()
