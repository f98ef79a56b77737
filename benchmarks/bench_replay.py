"""Capture and replay: what a replayed training step saves over a submitted one.

LeNet-5 (MNIST shape, float32, SGD with momentum or, ``--optimizer adam``, Adam,
whose step count and learning rate reach the tasks through its hyper handle),
``--batch`` samples split
into ``--granularity`` partitions, ``--workers`` CPU workers, eager policy,
traces and performance models off. Rounds alternate between a trainer with
``replay=True`` and one with ``replay=False`` (same seeded weights, same
batches); each round times ``--steps`` steps after two warm-up steps. Printed
per mode, medians over every timed step:

- ``step``: ``train_step`` wall time;
- ``host``: the step's time on the calling thread outside the executor's run
  (submission: registering, partitioning, dependency inference, REDUX trees,
  task objects; or, replaying, binding the batch and resetting the tasks), i.e.
  ``step`` minus the time spent in ``executor.run``.

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


def timed_steps(replay, args, batches):
    """``(step seconds, host seconds)`` per timed step."""
    hn.manual_seed(0)
    model = lenet5()
    with hn.Runtime(devices=f"cpu:{args.workers}", perfmodel=False, trace=False) as rt:
        optimizer = (hn.optim.Adam(lr=1e-3) if args.optimizer == "adam"
                     else hn.optim.SGD(lr=0.01, momentum=0.9))
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt,
                             batch_size=args.batch, granularity=args.granularity, replay=replay)
        executor = rt.executor
        run = executor.run
        in_run = [0.0]

        def timed_run(tasks, **kw):
            t0 = time.perf_counter()
            try:
                return run(tasks, **kw)
            finally:
                in_run[0] += time.perf_counter() - t0

        executor.run = timed_run
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
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    batches = [(rng.random((args.batch, 1, 28, 28), dtype=np.float32),
                rng.integers(0, 10, args.batch)) for _ in range(args.steps + 2)]
    results = {True: ([], []), False: ([], [])}
    for _ in range(args.rounds):
        for replay in (True, False):
            steps, host = timed_steps(replay, args, batches)
            results[replay][0].extend(steps)
            results[replay][1].extend(host)
    print(f"LeNet-5, {args.optimizer}, batch {args.batch}, g={args.granularity}, "
          f"{args.workers} workers, "
          f"{args.rounds} rounds x {args.steps} steps, medians in ms")
    print(f"{'mode':<10} {'step':>8} {'host':>8}")
    for replay in (False, True):
        steps, host = results[replay]
        print(f"{'replay' if replay else 'submit':<10} {1e3 * statistics.median(steps):8.3f} "
              f"{1e3 * statistics.median(host):8.3f}")
    saved = statistics.median(results[False][1]) - statistics.median(results[True][1])
    print(f"host time saved per step: {1e3 * saved:.3f} ms")


if __name__ == "__main__":
    main()
