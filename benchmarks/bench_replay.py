"""Capture and replay: what a replayed training step saves over a submitted one.

LeNet-5 (MNIST shape, float32, SGD with momentum or, ``--optimizer adam``, Adam,
its step count and lr in the optimizer's hyper handle), ``--batch`` samples split
into ``--granularity`` partitions, ``--workers`` CPU workers, eager policy,
traces and performance models off. Four trainers (same seeded weights, same
batches) take steps in turn, each going first in turn, so a busy machine slows
them alike: ``replay=True`` on the compiled replay engine (the default,
``replay``); ``replay=True`` through the executor
(``Runtime(replay_engine="executor")``, ``replay, executor``); ``replay=False``,
whose tasks start while the step is still being submitted
(``Runtime(overlap=True)``, the default); and ``replay=False`` on
``Runtime(overlap=False)``, whose tasks run at the step's ``wait()``. After
three warm-up steps each (the engine binds at its first replay and plans again
after its second), ``--rounds`` times ``--steps`` steps are timed. Printed per
mode, medians over every timed step:

- ``step``: ``train_step`` wall time;
- ``host``: the step's time on the calling thread outside the executor's
  ``run``/``drain`` and the engine's run (submission: registering,
  partitioning, dependency inference, REDUX trees, task objects; or, replaying,
  binding the batch and resetting the tasks). With overlap the tasks run during
  it too.

Example (about 20 s on 2 cores)::

    python benchmarks/bench_replay.py --batch 64 --granularity 2 --workers 2 --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hetero_nn as hn
from hetero_nn.scheduler.engine.replay import CompiledGraph

_ENGINE_RUNS: dict = {}  # runtime -> its TimedTrainer
_engine_run = CompiledGraph.run


def _timed_engine_run(graph, rt):
    timer = _ENGINE_RUNS.get(rt)
    return _engine_run(graph, rt) if timer is None else timer.engine_run(_engine_run, graph, rt)


CompiledGraph.run = _timed_engine_run  # the engine's runs count as execution, as the executor's


def lenet5():
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120), hn.ReLU(), hn.Dense(120, 84), hn.ReLU(), hn.Dense(84, 10))


#: mode -> (Trainer replay, Runtime overlap, Runtime replay_engine)
MODES = {"submit": (False, True, "compiled"), "submit, overlap=False": (False, False, "compiled"),
         "replay": (True, False, "compiled"), "replay, executor": (True, False, "executor")}


class TimedTrainer:
    """A trainer of one mode (a key of ``MODES``) whose steps are timed: ``step`` wall
    time, and ``host`` = that minus the time in the executor's ``run``/``drain``."""

    def __init__(self, mode, args):
        replay, overlap, engine = MODES[mode]
        hn.manual_seed(0)
        self.runtime = hn.Runtime(devices=f"cpu:{args.workers}", perfmodel=False, trace=False,
                                  overlap=overlap, replay_engine=engine)
        optimizer = (hn.optim.Adam(lr=1e-3) if args.optimizer == "adam"
                     else hn.optim.SGD(lr=0.01, momentum=0.9))
        self.trainer = hn.Trainer(lenet5(), optimizer=optimizer,
                                  runtime=self.runtime, batch_size=args.batch,
                                  granularity=args.granularity, replay=replay)
        self.steps, self.host = [], []
        self._in_run = 0.0
        self._depth = 0  # run() calls drain(): count the outer call only
        executor = self.runtime.executor
        executor.run = self._timed(executor.run)
        executor.drain = self._timed(executor.drain)
        _ENGINE_RUNS[self.runtime] = self

    def _timed(self, method):
        def call(*a, **kw):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                self._depth -= 1
                if not self._depth:
                    self._in_run += time.perf_counter() - t0
        return call

    def engine_run(self, run, graph, rt):
        """``CompiledGraph.run`` of this trainer's runtime, timed as the executor's runs."""
        return self._timed(lambda: run(graph, rt))()

    def step(self, x, y, keep=True):
        self._in_run = 0.0
        t0 = time.perf_counter()
        self.trainer.train_step(x, y)
        dt = time.perf_counter() - t0
        if keep:
            self.steps.append(dt)
            self.host.append(dt - self._in_run)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--granularity", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    batches = [(rng.random((args.batch, 1, 28, 28), dtype=np.float32),
                rng.integers(0, 10, args.batch)) for _ in range(args.steps)]
    timed = [TimedTrainer(mode, args) for mode in MODES]
    try:
        for t in timed:
            for x, y in batches[:3]:  # warm-up: compiles, arena growth, capture, binding
                t.step(x, y, keep=False)
        for r in range(args.rounds):
            for i, (x, y) in enumerate(batches):
                k = (r * len(batches) + i) % len(timed)  # each mode in turn goes first
                for t in timed[k:] + timed[:k]:
                    t.step(x, y)
    finally:
        for t in timed:
            t.runtime.close()
    results = {mode: (t.steps, t.host) for mode, t in zip(MODES, timed)}
    print(f"LeNet-5, {args.optimizer}, batch {args.batch}, g={args.granularity}, {args.workers} workers, "
          f"{args.rounds} rounds x {args.steps} steps, medians in ms")
    print(f"{'mode':<22} {'step':>8} {'host':>8}")
    for mode, (steps, host) in results.items():
        print(f"{mode:<22} {1e3 * statistics.median(steps):8.3f} "
              f"{1e3 * statistics.median(host):8.3f}")
    saved = statistics.median(results["submit"][1]) - statistics.median(results["replay"][1])
    print(f"host time saved per step by replay: {1e3 * saved:.3f} ms")
    engine = (statistics.median(results["replay, executor"][0])
              / statistics.median(results["replay"][0]))
    print(f"replayed step, through the executor / compiled engine: {engine:.2f}x")
    overlap = (statistics.median(results["submit, overlap=False"][0])
               / statistics.median(results["submit"][0]))
    print(f"submitted step, overlap=False / overlap=True: {overlap:.2f}x")


if __name__ == "__main__":
    main()
