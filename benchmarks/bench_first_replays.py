"""The first replays of a captured graph against the steady ones (issue 34, item 3).

Captures one Task Bench grid (``--pattern``, 2 points by ``--steps`` steps,
``--iterations`` kernel iterations per point: 2,000 tasks by default) on ``cpu:2``
after a throwaway graph of the same shape warmed every compilation cache, then prints
the capture's wall time (the capture run, then the graph compiled: bound, planned on the
capture run's times, laid out in shares) and that of its first ``--replays`` replays with
the mode each ran in (``parallel``: one thread per worker; ``serial``: every task on the
one thread, where that was measured faster: a busy machine): the second plans again
on the measured times (keeping the compiled segment unless the new plan gains enough,
else moving, not binding again, the tasks that change worker where nothing they hold is
their old worker's; the line says which); ``steady`` is the median of the replays from the fourth on in the first
replay's mode (all of them where none is); ``--runs`` graphs one after the other, and the median of their
first replays. Note the load (``uptime``) beside any figure. Example (a minute)::

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
    parser.add_argument("--runs", type=int, default=3, help="graphs captured, one by one")
    args = parser.parse_args(argv)
    tasks = grid(args.pattern, 2, args.steps)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        warm = HeteroGrid(rt, tasks, 2, args.steps)
        warm.capture(args.iterations)
        for _ in range(3):
            warm.run_replayed()
        print(f"{args.pattern}, {len(tasks)} tasks, {args.iterations} iterations, cpu:2")
        ratios, firsts, seconds = [], [], []
        for run in range(1, args.runs + 1):
            g = HeteroGrid(rt, tasks, 2, args.steps)
            t0 = time.perf_counter()
            g.capture(args.iterations)
            capture = time.perf_counter() - t0
            walls, modes, kept = [], [], None
            for k in range(args.replays):
                modes.append(_mode(g.graph))
                before = list(g.graph._compiled.segments or ())
                walls.append(g.run_replayed())
                if k == 1:  # the re-plan on measured times: kept, or compiled again
                    kept = list(g.graph._compiled.segments) == before
            g.check()
            same = [w for w, m in zip(walls[3:], modes[3:]) if m == modes[0]] or walls[3:]
            steady = statistics.median(same or walls[-1:])
            ratios.append(walls[0] / steady)
            firsts.append(walls[0])
            seconds.append(walls[1] / steady if len(walls) > 1 else float("nan"))
            print(f"run {run}: capture (run and compile) {1e3 * capture:.1f} ms; replays (ms, "
                  f"p/s: parallel/serial): " + " ".join(
                      f"{1e3 * w:.2f}{m[0]}" for w, m in zip(walls, modes)))
            print(f"  steady (median of replays 4-{args.replays} in replay 1's mode, "
                  f"{modes[0]}) {1e3 * steady:.2f} ms: replay 1 = {ratios[-1]:.1f}x, "
                  f"replay 2 = {seconds[-1]:.1f}x (its re-plan "
                  f"{'compiled again' if kept is False else 'kept the compiled segments'})")
    print(f"median over {args.runs} runs: replay 1 {1e3 * statistics.median(firsts):.2f} ms, "
          f"{statistics.median(ratios):.1f}x steady; replay 2 {statistics.median(seconds):.1f}x")
    return 0


def _mode(graph):
    """The mode the graph's next replay runs in (before the engine compiled it: parallel)."""
    compiled = graph._compiled
    segments = compiled.segments if compiled is not None else None
    seg = segments[0] if segments else None
    return "parallel" if seg is None or seg.contention is None else seg.contention.next_mode()


if __name__ == "__main__":
    sys.exit(main())
