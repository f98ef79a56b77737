"""The replay engine on a busy machine, and with Dask in the process (issue 34's figures).

Replays one Task Bench grid (``stencil_1d``, ``--width`` points by ``--steps`` steps,
``--iterations`` kernel iterations per point: 2,000 tasks by default) captured on
``cpu:1`` and on ``cpu:2``, alone and beside a busy-loop process (``python -c 'while
True: pass'``, pinned to the last core with ``--pin``), and prints the median replay
time of each. ``--dask-first`` runs ``dask.threaded.get`` once in the process before
anything (the cluster path always has Dask in the process). ``--dask-worker`` also replays
the same grid inside a ``distributed`` worker process (a ``LocalCluster`` of one worker
with one thread, the task run through ``Client.submit``: where a cluster rank runs its
steps), one run in this process and one in the worker in turn, alone. Note the machine's
load (``uptime``) beside any figure: other processes take cores from it. Examples::

    python benchmarks/bench_contention.py --replays 30 --pin
    python benchmarks/bench_contention.py --replays 30 --dask-worker --no-neighbour
    python benchmarks/bench_contention.py --replays 30 --pin --ab-cut 2

``--ab-cut R`` runs each row ``R`` times with ``StudyOptions(cut_tries=False)`` and ``True``
in turn: a try of parallel beside the neighbour, cut once it cannot win, against one run
to its end (the ``max``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hetero_nn as hn  # noqa: E402
from task_bench import HeteroGrid, grid  # noqa: E402


def replay_times(devices, tasks, width, steps, iterations, replays, cut_tries=True):
    """Median and all wall times of ``replays`` replays (after 3 not timed)."""
    with hn.Runtime(devices=devices, perfmodel=False,
                    study=hn.StudyOptions(cut_tries=cut_tries)) as rt:
        g = HeteroGrid(rt, tasks, width, steps)
        g.capture(iterations)
        for _ in range(3):
            g.run_replayed()
        walls = [g.run_replayed() for _ in range(replays)]
        g.check()
        mode = getattr(g.graph._compiled.segments[0], "contention", None)
    return statistics.median(walls), walls, mode


def rank_replay(bench_dir, *args):
    """:func:`replay_times` in a Dask worker process (this module is not importable there:
    the function travels by value)."""
    sys.path.insert(0, bench_dir)
    from bench_contention import replay_times as run
    median, walls, mode = run(*args)
    return median, walls, repr(mode)


def dask_worker_rows(args, tasks, rounds=2):
    """Replays in this process and in a Dask worker process, ``rounds`` times in turn."""
    from distributed import Client, LocalCluster
    here = str(Path(__file__).resolve().parent)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for r in range(rounds):
            for devices in args.devices:
                a = (devices, tasks, args.width, args.steps, args.iterations, args.replays)
                for where in ("this process", "a Dask worker"):
                    if where == "this process":
                        median, walls, mode = replay_times(*a)
                    else:
                        median, walls, mode = client.submit(rank_replay, here, *a,
                                                            pure=False).result()
                    print(f"  round {r + 1} {where:<13} {devices}: median {1e3 * median:8.2f} "
                          f"ms (min {1e3 * min(walls):.2f}, max {1e3 * max(walls):.2f})"
                          + (f"  [{mode}]" if mode else ""))


def neighbour(pin):
    """A busy-loop process (pinned to the last core with ``pin``)."""
    def pin_it():
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=pin_it if pin else None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=1024)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--pin", action="store_true", help="pin the neighbour to one core")
    parser.add_argument("--dask-first", action="store_true",
                        help="run dask.threaded.get once in the process first")
    parser.add_argument("--devices", nargs="+", default=["cpu:1", "cpu:2"])
    parser.add_argument("--dask-worker", action="store_true",
                        help="also replay inside a distributed worker process (a rank)")
    parser.add_argument("--no-neighbour", action="store_true",
                        help="leave out the rows beside a busy loop")
    parser.add_argument("--ab-cut", type=int, default=0, metavar="ROUNDS",
                        help="each row this many times with StudyOptions(cut_tries=False) "
                             "and True in turn (the before/after of cut tries)")
    args = parser.parse_args(argv)
    if args.dask_first:
        import dask.threaded
        dask.threaded.get({"a": 1, "b": (sum, ["a", "a"])}, "b")
    tasks = grid("stencil_1d", args.width, args.steps)
    print(f"stencil_1d {len(tasks)} tasks, {args.iterations} iterations, load "
          f"{os.getloadavg()[0]:.2f}, dask first: {args.dask_first}")
    if args.dask_worker:
        dask_worker_rows(args, tasks)
    for busy in (False,) if args.no_neighbour else (False, True):
        proc = neighbour(args.pin) if busy else None
        try:
            time.sleep(0.2 if busy else 0)
            for devices in args.devices:
                for r in range(max(1, args.ab_cut)):
                    for cut in (False, True) if args.ab_cut else (True,):
                        median, walls, mode = replay_times(devices, tasks, args.width,
                                                           args.steps, args.iterations,
                                                           args.replays, cut)
                        ab = f" cut_tries={cut!s:<5} round {r + 1}" if args.ab_cut else ""
                        print(f"  {'beside a busy loop' if busy else 'alone':<19} {devices}"
                              f"{ab}: median {1e3 * median:8.2f} ms (min "
                              f"{1e3 * min(walls):.2f}, max {1e3 * max(walls):.2f})"
                              + (f"  [{mode}]" if mode else ""))
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
