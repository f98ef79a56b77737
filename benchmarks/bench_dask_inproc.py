"""Replays with Dask in the process (issue 34): what Dask leaves behind, measured.

Replays one captured Task Bench grid (``--pattern``, 2 points by ``--steps`` steps,
``--iterations`` kernel iterations per point) on ``cpu:2``: ``--replays`` replays
before, then after one of these (each case in a fresh interpreter):

``none``           nothing;
``threaded``       ``dask.threaded.get`` ran once on the same grid (its thread pool
                   stays, idle);
``client``         a ``distributed`` ``LocalCluster(processes=False)`` and its
                   ``Client`` open in the process (its event loop thread runs periodic
                   callbacks in Python);
``client-closed``  the same, closed again;
``gil-thread``     a Python thread looping in pure Python (holds the interpreter lock:
                   the extreme of the above).

Prints the median replay time before and after, with the engine's interpreter-lock
handoffs on (the default) and off (``StudyOptions(gil_handoff=False)``;
:mod:`~hetero_nn.scheduler.engine.contention`). Note the load (``uptime``) beside
any figure. Example (about a minute on 2 cores)::

    python benchmarks/bench_dask_inproc.py --replays 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = ("none", "threaded", "client", "client-closed", "gil-thread")


def median_replay(g, replays):
    walls = [g.run_replayed() for _ in range(replays)]
    g.check()
    return statistics.median(walls)


def run_case(case, args):
    """One case in this interpreter: (median before, median after) in seconds."""
    import hetero_nn as hn
    from task_bench import HeteroGrid, grid, run_dask
    tasks = grid(args.pattern, 2, args.steps)
    study = hn.StudyOptions(gil_handoff=not args.no_gil_handoff)
    stop = threading.Event()
    with hn.Runtime(devices="cpu:2", perfmodel=False, study=study) as rt:
        g = HeteroGrid(rt, tasks, 2, args.steps)
        g.capture(args.iterations)
        for _ in range(3):
            g.run_replayed()
        before = median_replay(g, args.replays)
        if case == "threaded":
            run_dask(tasks, 2, args.steps, args.iterations, 1)
        elif case.startswith("client"):
            from distributed import Client, LocalCluster
            cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                   dashboard_address=None)
            client = Client(cluster)
            client.submit(sum, [1, 2]).result()
            if case == "client-closed":
                client.close()
                cluster.close()
        elif case == "gil-thread":
            def spin():
                while not stop.is_set():
                    sum(range(200))
            threading.Thread(target=spin, daemon=True).start()
        after = median_replay(g, args.replays)
        stop.set()
    return before, after


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="stencil_1d")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--no-gil-handoff", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # a child: one case, its result as JSON on the last line
        print(json.dumps(run_case(args.case, args)))
        return 0
    print(f"{args.pattern}, {2 * args.steps} tasks, {args.iterations} iterations, cpu:2, "
          f"median of {args.replays} replays (ms)")
    print(f"{'case':<15}{'handoffs':>9}{'before':>10}{'after':>10}{'after/before':>14}")
    for case in args.cases:
        for off in (False, True):
            cmd = [sys.executable, __file__, "--case", case, "--pattern", args.pattern,
                   "--steps", str(args.steps), "--iterations", str(args.iterations),
                   "--replays", str(args.replays)] + (["--no-gil-handoff"] if off else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            before, after = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{case:<15}{'off' if off else 'on':>9}{1e3 * before:>10.3f}"
                  f"{1e3 * after:>10.3f}{after / before:>14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
