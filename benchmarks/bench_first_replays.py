"""The first replays of a captured graph against the steady ones (issue 34, item 3).

Captures one Task Bench grid (``--pattern``, 2 points by ``--steps`` steps,
``--iterations`` kernel iterations per point: 2,000 tasks by default) on ``cpu:2``
after a throwaway graph of the same shape warmed every compilation cache, then prints
the wall time of its first ``--replays`` replays: the first binds every task, the
second plans again on the measured times (tasks that change worker are moved, not
bound again, where nothing they hold is their old worker's), the later ones are steady.
Note the load (``uptime``) beside any figure. Example (seconds)::

    python benchmarks/bench_first_replays.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
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
        g.capture(args.iterations)
        walls = [g.run_replayed() for _ in range(args.replays)]
        g.check()
    steady = statistics.median(walls[3:]) if len(walls) > 3 else walls[-1]
    print(f"{args.pattern}, {len(tasks)} tasks, {args.iterations} iterations, cpu:2")
    for k, w in enumerate(walls, start=1):
        print(f"replay {k}: {1e3 * w:9.2f} ms  ({w / steady:7.1f}x steady)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
