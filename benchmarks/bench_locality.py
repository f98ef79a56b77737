"""Where tasks run relative to their inputs: the share of a training step's tasks that run
on another worker than the task that wrote their first input.

A submitted (not replayed) training step of ``--model`` is traced under each policy
on ``--workers`` CPU workers. For every task, its *source* is the last writer, in
the same flush, of its first operand it reads (recorded as the task is submitted,
from the runtime's dependency state); the table gives the share of tasks with a
source that ran on another worker than it (they read that input from another
core's cache), and the share that ran on a worker that ran none of their
predecessors. REDUX trees combine partials made on several workers: some of those
moves are unavoidable. The figures are counts from the trace, not timings: they may
be taken on a loaded machine, though which worker is idle when a task becomes ready
still depends on timing, so they vary from run to run (``--steps`` steps are pooled).

Example::

    python benchmarks/bench_locality.py --model lenet5 --batch 64 --granularity 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np


def moved_shares(records, sources) -> tuple[int, int, int, int]:
    """``(moved, with_source, away, with_deps)``: tasks that ran on another worker than
    their source, tasks with a source in the trace, tasks that ran where none of their
    predecessors ran, tasks whose predecessors are all in the trace."""
    worker = {r.task_id: r.worker for r in records}
    moved = with_source = away = with_deps = 0
    for r in records:
        s = sources.get(r.task_id)
        if s in worker:
            with_source += 1
            moved += worker[s] != r.worker
        if r.deps and all(d in worker for d in r.deps):
            with_deps += 1
            away += r.worker not in {worker[d] for d in r.deps}
    return moved, with_source, away, with_deps


def _record_sources(rt, sources):
    """Wrap ``rt.submit`` to note each task's source (see the module docstring)."""
    submit = rt.submit

    def recording(codelet, *handles, **kw):
        modes = kw.get("modes") or codelet.modes
        source = next((h._last_writer for h, m in zip(handles, modes)
                       if m.reads and h._last_writer is not None), None)
        task = submit(codelet, *handles, **kw)
        if source is not None:
            sources[task.id] = source.id
        return task

    rt.submit = recording


def measure(model, batch, granularity, policy, workers, steps):
    import hetero_nn as hn

    shape = (1, 28, 28) if model in ("lenet5", "dahl-basic") else (3, 32, 32)
    net = hn.build_model(model, shape, 10, seed=0)
    rt = hn.Runtime(devices=f"cpu:{workers}", policy=policy)
    trainer = hn.Trainer(net, optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                         batch_size=batch, granularity=granularity, replay=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    try:
        for _ in range(3):  # warm-up: compilation, models
            trainer.train_step(x, y)
        rt.trace(clear=True)
        sources = {}
        _record_sources(rt, sources)
        for _ in range(steps):
            trainer.train_step(x, y)
        return moved_shares(rt.trace().records, sources)
    finally:
        rt.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--granularity", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--policies", nargs="+", default=["eager", "ws", "dmda", "random"])
    args = parser.parse_args(argv)
    os.environ.setdefault("HETERO_NN_CACHE", tempfile.mkdtemp(prefix="hetero_nn-locality-"))
    print(f"{args.model} batch {args.batch} g={args.granularity}, {args.workers} workers, "
          f"{args.steps} submitted steps")
    print(f"{'policy':<8} {'tasks':>6} {'off their source':>17} {'off all inputs':>15}")
    for policy in args.policies:
        moved, n, away, m = measure(args.model, args.batch, args.granularity, policy,
                                    args.workers, args.steps)
        print(f"{policy:<8} {n:>6} {moved:>8} ({moved / max(n, 1):>5.1%}) "
              f"{away:>6} ({away / max(m, 1):>5.1%})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
