"""Where a slow replay's time went (issue 34): each replay's wall told apart from its stamps,
its waits' counters and the garbage collector.

Captures one Task Bench grid (``--pattern``, 2 points by ``--steps`` steps, ``--iterations``
kernel iterations per point) on ``cpu:2`` with the default ``Runtime`` (traces and
performance models on, as ``task_bench.py`` runs it), replays it ``--replays`` times
(each after ``--between``: nothing, one ``dask.threaded.get`` of the same grid, or a
0.02 s sleep) and prints the median and the largest wall, then for every replay slower
than ``--slow`` times the median:

- its mode (``parallel``, ``serial``, or a try cut and finished on one thread:
  :mod:`~hetero_nn.scheduler.engine.contention`), whether its segments were compiled again
  (a rebinding or re-plan), the collector's time inside it;
- ``start``: from the call to each share's first task (an engine thread's wake-up);
  ``after``: from the last task's end to the return (flush end, records, the model);
- per share: its wait counters (``CompiledSegment.wait_stats``: waits spun, yielded,
  slept, cut short by a lost core; time asleep, the longest wait), the largest gaps
  between two of its tasks with how late each start was after its inputs were ready
  (*late*: the thread was not running, or asleep), and its longest task against the
  median task (a task several times the median lost its core mid-run).

So a slow replay is told apart: a thread without a core (long tasks, late starts, sleeps
of milliseconds), hand-offs the spin missed (many sleeps of tens of microseconds), a
late engine thread, the collector, a rebinding, or Python around the shares. Note the
load (``uptime``) beside any figure. Example::

    python benchmarks/bench_slow_replays.py --pattern nearest --iterations 512 --replays 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hetero_nn as hn  # noqa: E402
from hetero_nn.scheduler.engine.dispatch import STATS  # noqa: E402
from task_bench import COLLECTIONS, HeteroGrid, grid, run_dask  # noqa: E402


def share_lines(seg, times, stats, ms):
    """Per share: its wait counters, largest gaps (and how late), longest task."""
    out = []
    median_task = float(np.median(times[:, 1] - times[:, 0]))
    for share in seg.running:
        order = [int(t) for t in share.order if times[t, 0]]
        gaps = []
        for prev, t in zip(order, order[1:]):
            preds = seg.waits_of[t] if share in seg.shares else ()  # (serial: none)
            ready = max([times[prev, 1]] + [times[p, 1] for p in preds])
            gaps.append((times[t, 0] - times[prev, 1], times[t, 0] - ready))
        gaps.sort(reverse=True)
        longest = max((times[t, 1] - times[t, 0] for t in order), default=0)
        counts = dict(zip(STATS, stats[share.row].tolist()))
        waits = (f"waits {counts['waits']} (spun {counts['spun']}, yielded "
                 f"{counts['yielded']}, slept {counts['slept']} for "
                 f"{ms(counts['sleep_ns']):.2f} ms, cut short {counts['preempted']}, longest "
                 f"{ms(counts['longest_ns']):.2f} ms); largest gaps (ms, late ms) "
                 + " ".join(f"({ms(g):.2f}, {ms(late):.2f})" for g, late in gaps[:4])
                 + "; ") if share in seg.shares else ""
        out.append(f"    {share.worker.name}: {waits}longest task {ms(longest):.2f} ms "
                   f"(median {ms(median_task):.3f})")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="nearest", choices=("stencil_1d", "nearest",
                                                                 "no_comm", "all_to_all"))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=512)
    parser.add_argument("--replays", type=int, default=60)
    parser.add_argument("--between", default="none", choices=("none", "dask", "sleep"))
    parser.add_argument("--slow", type=float, default=1.5,
                        help="replays slower than this times the median are told apart")
    args = parser.parse_args(argv)
    tasks = grid(args.pattern, 2, args.steps, 5)
    ms = (lambda ns: ns * 1e-6)
    rows = []
    with hn.Runtime(devices="cpu:2", auto_capture=False) as rt:
        g = HeteroGrid(rt, tasks, 2, args.steps)
        g.capture(args.iterations)
        for _ in range(3):
            g.run_replayed()
        for k in range(args.replays):
            if args.between == "dask":
                run_dask(tasks, 2, args.steps, args.iterations, k + 1)
            elif args.between == "sleep":
                time.sleep(0.02)
            g.next_epoch()
            before = list(g.graph._compiled.segments)
            collected, t0 = COLLECTIONS.seconds, time.monotonic_ns()
            g.graph.replay()
            t1 = time.monotonic_ns()
            seg = g.graph._compiled.segments[0]
            rows.append((t1 - t0, seg, seg.times.copy(), seg.wait_stats.copy(), t0, t1,
                         COLLECTIONS.seconds - collected, seg.running,
                         g.graph._compiled.segments != before, seg.contention and
                         seg.contention.cuts))
            g.rt.trace(clear=True)
    walls = [r[0] for r in rows]
    median = statistics.median(walls)
    print(f"{args.pattern}, {len(tasks)} tasks, {args.iterations} iterations, between: "
          f"{args.between}; median {ms(median):.2f} ms, max {ms(max(walls)):.2f} ms, "
          f"{sum(w > args.slow * median for w in walls)} of {len(walls)} over "
          f"{args.slow}x the median; load {os.getloadavg()[0]:.2f}")
    cuts = 0
    for k, (wall, seg, times, stats, t0, t1, gc_s, running, rebound, seg_cuts) in \
            enumerate(rows):
        was_cut = bool(seg_cuts) and seg_cuts > cuts
        cuts = seg_cuts or 0
        if wall <= args.slow * median:
            continue
        running = seg.shares if was_cut else running  # (the serial rest ran as worker 0's)
        seg.running = running
        mode = "cut try" if was_cut else ("serial" if len(running) == 1 else "parallel")
        ran = times[:, 0] != 0
        starts = " ".join(f"{s.worker.name} +{ms(times[s.order[0], 0] - t0):.2f}"
                          for s in running if len(s.order))
        print(f"  replay {k}: {ms(wall):.2f} ms, {mode}"
              + (", compiled again" if rebound else "")
              + (f", collector {1e3 * gc_s:.2f} ms" if gc_s else "")
              + f"; start {starts} ms; after {ms(t1 - times[ran, 1].max()):.2f} ms")
        for line in share_lines(seg, times, stats, ms):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
