"""The first replays of a captured graph against the steady ones (issue 34, item 3).

Captures one Task Bench grid (``--pattern``, 2 points by ``--steps`` steps,
``--iterations`` kernel iterations per point: 2,000 tasks by default) on ``cpu:2``
after a throwaway graph of the same shape warmed every compilation cache, then prints
the capture's wall time (the capture run, then the graph compiled: bound, planned on the
capture run's times, laid out in shares) and that of its first ``--replays`` replays with
the mode each ran in (``parallel``: one thread per worker; ``serial``: every task on the
calling thread, where that was measured faster: a busy machine): the second plans again
on the measured times (keeping the compiled segment where the plan is unchanged, else
moving, not binding again, the tasks that change worker where nothing they hold is their
old worker's); ``steady`` is the median of the replays from the fourth on, and of those in
the first replay's mode. Note the load (``uptime``) beside any figure. Example (seconds)::

    python benchmarks/bench_first_replays.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hetero_nn as hn  # noqa: E402
from task_bench import HeteroGrid, grid  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="stencil_1d")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--replays", type=int, default=8)
    args = parser.parse_args(argv)
    tasks = grid(args.pattern, 2, args.steps)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        warm = HeteroGrid(rt, tasks, 2, args.steps)
        warm.capture(args.iterations)
        for _ in range(3):
            warm.run_replayed()
        g = HeteroGrid(rt, tasks, 2, args.steps)
        t0 = time.perf_counter()
        g.capture(args.iterations)
        capture = time.perf_counter() - t0
        walls, modes = [], []
        for _ in range(args.replays):
            (seg,) = g.graph._compiled.segments
            modes.append("parallel" if seg.contention is None else seg.contention.next_mode())
            walls.append(g.run_replayed())
        g.check()
    steady = statistics.median(walls[3:]) if len(walls) > 3 else walls[-1]
    same = [w for w, m in zip(walls[3:], modes[3:]) if m == modes[0]]
    steady_same = statistics.median(same) if same else None
    print(f"{args.pattern}, {len(tasks)} tasks, {args.iterations} iterations, cpu:2; "
          f"capture (run and compile) {1e3 * capture:.1f} ms")
    for k, (w, m) in enumerate(zip(walls, modes), start=1):
        print(f"replay {k}: {1e3 * w:9.2f} ms  {m:<8}  ({w / steady:7.1f}x steady)")
    print(f"steady: {1e3 * steady:.2f} ms; in the first replay's mode ({modes[0]}): "
          + (f"{1e3 * steady_same:.2f} ms, first = {walls[0] / steady_same:.1f}x"
             if steady_same else "none from the fourth on"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
