"""Task-level fusion: tasks per replayed step and step time with and without bundles.

LeNet-5 (MNIST shape, float32, SGD with momentum), eager policy, ``--workers`` CPU
workers, traces off, a performance model in a temporary directory shared by every
run (fusion is decided from it). For each batch size and granularity, rounds
alternate a trainer on ``Runtime(fuse_chains=True)`` and one on
``fuse_chains=False`` (same seeded weights, same batches); each times ``--steps``
replayed steps after four warm-up steps (two captures, the replay that measures
the overhead, the first fused replay). Printed per configuration: tasks per
replayed step, bundles, the measured overhead, and the median step time.

Example (about a minute on 2 cores)::

    python benchmarks/bench_bundle.py --batch 16 64 --granularity 1 2 --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

import hetero_nn as hn
from hetero_nn.scheduler.perfmodel.model import PerfModel

WARMUP = 4


def timed_steps(fuse, batch, g, args, batches, perfmodel):
    """``(step seconds, tasks per replayed step, the fused graph's report)``."""
    model = hn.build_model("lenet5", (1, 28, 28), 10, seed=0)
    with hn.Runtime(devices=f"cpu:{args.workers}", perfmodel=perfmodel, trace=False,
                    fuse_chains=fuse) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                             batch_size=batch, granularity=g)
        steps = []
        for i, (x, y) in enumerate(batches):
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            if i >= WARMUP:
                steps.append(time.perf_counter() - t0)
        graph = list(trainer.graphs.values())[-1]
    return steps, graph.num_tasks, graph.bundles


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--granularity", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    perfmodel = PerfModel(tempfile.mkdtemp(prefix="bench_bundle-"))
    print(f"LeNet-5, {args.workers} workers, eager, {args.rounds} rounds x {args.steps} steps, "
          "median step ms")
    print(f"{'batch':>5} {'g':>2} {'mode':<8} {'tasks':>5} {'bundles':>7} {'overhead us':>11} "
          f"{'step ms':>8}")
    for batch in args.batch:
        batches = [(rng.random((batch, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, batch))
                   for _ in range(args.steps + WARMUP)]
        for g in args.granularity:
            results = {True: [], False: []}
            shape = {}
            for _ in range(args.rounds):
                for fuse in (True, False):
                    steps, tasks, report = timed_steps(fuse, batch, g, args, batches, perfmodel)
                    results[fuse].extend(steps)
                    shape[fuse] = (tasks, report)
            for fuse in (False, True):
                tasks, report = shape[fuse]
                bundles = len(report.chains) if report is not None else 0
                overhead = f"{1e6 * report.overhead:.1f}" if report and report.overhead else "-"
                print(f"{batch:>5} {g:>2} {'fused' if fuse else 'unfused':<8} {tasks:>5} "
                      f"{bundles:>7} {overhead:>11} {1e3 * statistics.median(results[fuse]):8.3f}")


if __name__ == "__main__":
    main()
