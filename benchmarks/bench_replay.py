"""Capture and replay: what a replayed training step saves over a submitted one.

LeNet-5 (MNIST shape, float32, SGD with momentum), ``--batch`` samples split
into ``--granularity`` partitions, ``--workers`` CPU workers, eager policy,
traces and performance models off. Rounds alternate between three trainers
(same seeded weights, same batches): ``replay=True``; ``replay=False``, whose
tasks start while the step is still being submitted (``Runtime(overlap=True)``,
the default); and ``replay=False`` on ``Runtime(overlap=False)``, whose tasks
run at the step's ``wait()``. Each round times ``--steps`` steps after two
warm-up steps. Printed per mode, medians over every timed step:

- ``step``: ``train_step`` wall time;
- ``host``: the step's time on the calling thread outside the executor's
  ``run``/``drain`` (submission: registering, partitioning, dependency
  inference, REDUX trees, task objects; or, replaying, binding the batch and
  resetting the tasks). With overlap the tasks run during it too.

Example (about 20 s on 2 cores)::

    python benchmarks/bench_replay.py --batch 64 --granularity 2 --workers 2 --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hetero_nn as hn


def lenet5():
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120), hn.ReLU(), hn.Dense(120, 84), hn.ReLU(), hn.Dense(84, 10))


MODES = {"submit": (False, True), "submit, overlap=False": (False, False), "replay": (True, False)}


def timed_steps(mode, args, batches):
    """``(step seconds, host seconds)`` per timed step of ``mode`` (a key of ``MODES``)."""
    replay, overlap = MODES[mode]
    hn.manual_seed(0)
    model = lenet5()
    with hn.Runtime(devices=f"cpu:{args.workers}", perfmodel=False, trace=False,
                    overlap=overlap) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                             batch_size=args.batch, granularity=args.granularity, replay=replay)
        executor = rt.executor
        in_run = [0.0]
        depth = [0]  # run() calls drain(): count the outer call only

        def timed(method):
            def call(*a, **kw):
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    return method(*a, **kw)
                finally:
                    depth[0] -= 1
                    if not depth[0]:
                        in_run[0] += time.perf_counter() - t0
            return call

        executor.run = timed(executor.run)
        executor.drain = timed(executor.drain)
        steps, host = [], []
        for i, (x, y) in enumerate(batches):
            in_run[0] = 0.0
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            dt = time.perf_counter() - t0
            if i >= 2:
                steps.append(dt)
                host.append(dt - in_run[0])
    return steps, host


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--granularity", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    batches = [(rng.random((args.batch, 1, 28, 28), dtype=np.float32),
                rng.integers(0, 10, args.batch)) for _ in range(args.steps + 2)]
    results = {mode: ([], []) for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            steps, host = timed_steps(mode, args, batches)
            results[mode][0].extend(steps)
            results[mode][1].extend(host)
    print(f"LeNet-5, batch {args.batch}, g={args.granularity}, {args.workers} workers, "
          f"{args.rounds} rounds x {args.steps} steps, medians in ms")
    print(f"{'mode':<22} {'step':>8} {'host':>8}")
    for mode, (steps, host) in results.items():
        print(f"{mode:<22} {1e3 * statistics.median(steps):8.3f} "
              f"{1e3 * statistics.median(host):8.3f}")
    saved = statistics.median(results["submit"][1]) - statistics.median(results["replay"][1])
    print(f"host time saved per step by replay: {1e3 * saved:.3f} ms")
    overlap = (statistics.median(results["submit, overlap=False"][0])
               / statistics.median(results["submit"][0]))
    print(f"submitted step, overlap=False / overlap=True: {overlap:.2f}x")


if __name__ == "__main__":
    main()
