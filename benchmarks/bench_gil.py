"""Why kernels slow down when two run at once: the interpreter lock, per codelet.

The tasks of one real training step (captured by the Trainer) are run one by one
outside the runtime, on the arrays the runtime binds for them, in three settings:

- ``alone``: the variant the pinned runtime runs, called on the main thread;
- ``beside python``: the same while another thread runs pure Python (it holds the
  interpreter lock whenever it can). Each time the variant gives up the lock
  (entering a ``nogil`` Numba kernel or a BLAS call) and wants it back, it waits
  for the other thread's switch interval (``sys.setswitchinterval``, set to
  ``--interval``), so ``(beside - alone) / interval`` counts the variant's round
  trips through the lock per call;
- ``two threads``: the variant on two threads at once, each on its own copy of the
  operands: the slowdown two workers see (no runtime involved).

Two processes running the same kernels show no slowdown on this machine (the
cores scale), so what ``two threads`` shows is the lock. Example::

    python benchmarks/bench_gil.py --model lenet5 --batch 64 --granularity 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import defaultdict

import numpy as np


def step_tasks(model, shape, batch, granularity):
    """The runtime and the tasks of one captured (replayable) training step."""
    import hetero_nn as hn
    net = hn.build_model(model, shape, 10, seed=0)
    rt = hn.Runtime(devices="cpu:1", perfmodel=False, trace=False)
    trainer = hn.Trainer(net, optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                         batch_size=batch, granularity=granularity)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    for _ in range(3):
        trainer.train_step(x, y)
    graph = next(iter(trainer.graphs.values()))
    return trainer, rt, [t for segment in graph._segments for t, _, _ in segment]


def _median_call(fn, arrays, params, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*arrays, **params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _beside(background, fn, arrays, params, repeat):
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            background()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        return _median_call(fn, arrays, params, repeat)
    finally:
        stop.set()
        thread.join()


def _python():
    total = 0
    for i in range(1000):
        total += i


def _two_threads(fn, arrays, params, repeat):
    copies = [np.array(a, copy=True) for a in arrays]
    results = [None, None]
    barrier = threading.Barrier(2)

    def run(i, ops):
        fn(*ops, **params)
        barrier.wait()
        results[i] = _median_call(fn, ops, params, repeat)

    other = threading.Thread(target=run, args=(1, copies))
    other.start()
    run(0, arrays)
    other.join()
    return max(results)


def measure(tasks, rt, repeat, interval):
    worker = rt.workers[0]
    rows = defaultdict(lambda: {"calls": 0, "alone": 0.0, "beside": 0.0, "two": 0.0})
    old = sys.getswitchinterval()
    for task in tasks:
        variant = rt.choose_variant(task, worker.kind)
        fn = task.codelet.variants[variant]
        arrays = rt.bind(task, worker)
        fn(*arrays, **task.params)  # compile / warm
        alone = _median_call(fn, arrays, task.params, repeat)
        sys.setswitchinterval(interval)
        try:
            beside = _beside(_python, fn, arrays, task.params, max(5, repeat // 4))
        finally:
            sys.setswitchinterval(old)
        two = _two_threads(fn, arrays, task.params, repeat)
        row = rows[(task.codelet.name, variant)]
        row["calls"] += 1
        row["alone"] += alone
        row["beside"] += beside
        row["two"] += two
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="lenet5", choices=["dahl-basic", "lenet5", "cifar-small"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--granularity", type=int, default=2)
    p.add_argument("--repeat", type=int, default=40)
    p.add_argument("--interval", type=float, default=1e-3,
                   help="switch interval (s) while beside the Python thread")
    args = p.parse_args(argv)
    shape = (3, 32, 32) if args.model == "cifar-small" else (1, 28, 28)
    trainer, rt, tasks = step_tasks(args.model, shape, args.batch, args.granularity)
    try:
        rows = measure(tasks, rt, args.repeat, args.interval)
    finally:
        trainer.close()
        rt.close()
    print(f"{args.model}, batch {args.batch}, g={args.granularity}: {len(tasks)} tasks per step; "
          f"per call, summed over a step's calls (us); lock round trips per call = "
          f"(beside python - alone) / {args.interval * 1e3:g} ms")
    print(f"{'codelet':38s} {'variant':11s} {'calls':>5s} {'alone':>9s} {'round trips':>11s} "
          f"{'two threads':>11s} {'slowdown':>8s}")
    total_alone = total_two = 0.0
    for (name, variant), r in sorted(rows.items(), key=lambda kv: -kv[1]["alone"]):
        trips = (r["beside"] - r["alone"]) / r["calls"] / args.interval
        total_alone += r["alone"]
        total_two += r["two"]
        print(f"{name:38s} {variant:11s} {r['calls']:5d} {r['alone'] * 1e6:9.1f} {trips:11.1f} "
              f"{r['two'] * 1e6:11.1f} {r['two'] / r['alone']:8.2f}")
    print(f"{'step':38s} {'':11s} {len(tasks):5d} {total_alone * 1e6:9.1f} {'':11s} "
          f"{total_two * 1e6:11.1f} {total_two / total_alone:8.2f}")


if __name__ == "__main__":
    main()
