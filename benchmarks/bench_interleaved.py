"""Replays interleaved with other work (issue 34, Build item 2): which neighbour slows them.

Captures one Task Bench grid (``--pattern``, 2 points by ``--steps`` steps,
``--iterations`` kernel iterations per point) on ``cpu:2`` with the default ``Runtime``
(traces and performance models on, as ``task_bench.py`` runs it), then for each case of
``--cases`` times ``--replays`` replays, each right after one run of:

``alone``      nothing (replays back to back);
``dask``       ``dask.threaded.get`` on the same grid (2 threads), as ``task_bench.py
               --systems replayed dask`` interleaves them;
``sleep``      ``--gap`` seconds of sleep (the process idle as long as Dask would keep it);
``busy``       ``--gap`` seconds of pure Python on the calling thread;
``numba``      two threads running the kernel ``steps`` times each (Dask's work without
               its scheduler);
``submitted``  the same grid submitted to the runtime and waited for.

``--mode`` fixes the engine's mode (``parallel``: one thread per worker; ``serial``: every
task on the calling thread) or leaves it to the engine (``auto``,
:mod:`~hetero_nn.scheduler.engine.contention`). Per case it prints the median replay,
the median time inside the shares (the compiled loops, from handing them out to their
return) and outside (Python around them), and the mode of each replay (``p``/``s``).
So a slowdown is told apart: the engine choosing one thread (``auto`` slower than
``parallel``), the shares themselves slower (threads waking, caches), or Python around
them. Note the load (``uptime``) beside any figure: on a loaded machine every replay is
slow in parallel. Example (about a minute on 2 cores)::

    python benchmarks/bench_interleaved.py --mode auto
    python benchmarks/bench_interleaved.py --mode parallel
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hetero_nn as hn  # noqa: E402
from hetero_nn.scheduler.engine import replay as engine  # noqa: E402
from task_bench import HeteroGrid, compute, grid, run_dask  # noqa: E402

CASES = ("alone", "dask", "sleep", "busy", "numba", "submitted")


def _between(case, g, tasks, args, k):
    """One run of ``case``'s work before a replay."""
    if case == "dask":
        run_dask(tasks, 2, args.steps, args.iterations, k + 1)
    elif case == "sleep":
        time.sleep(args.gap)
    elif case == "busy":
        end = time.perf_counter() + args.gap
        while time.perf_counter() < end:
            sum(range(100))
    elif case == "numba":
        threads = [threading.Thread(target=lambda: [compute(args.iterations)
                                                    for _ in range(args.steps)])
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif case == "submitted":
        g.run_submitted(args.iterations)
        g.check()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="stencil_1d")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=64)
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument("--gap", type=float, default=0.3, help="seconds of sleep / busy")
    parser.add_argument("--mode", choices=("auto", "parallel", "serial"), default="auto")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = parser.parse_args(argv)
    inside: list = []
    run = engine.EngineThreads.run

    def timed_run(self, jobs, *a, **k):  # the shares, from handing out to their return
        t0 = time.perf_counter()
        try:
            return run(self, jobs, *a, **k)
        finally:
            inside.append(time.perf_counter() - t0)
    engine.EngineThreads.run = timed_run
    tasks = grid(args.pattern, 2, args.steps)
    print(f"{args.pattern}, {len(tasks)} tasks, {args.iterations} iterations, cpu:2, "
          f"mode {args.mode}")
    with hn.Runtime(devices="cpu:2") as rt:
        g = HeteroGrid(rt, tasks, 2, args.steps)
        g.capture(args.iterations)
        for _ in range(5):
            g.run_replayed()
        (seg,) = g.graph._compiled.segments
        for case in args.cases:
            walls, shares, modes = [], [], []
            for k in range(args.replays):
                _between(case, g, tasks, args, k)
                c = seg.contention
                if c is not None and args.mode != "auto":
                    c.mode, c.countdown = args.mode, 10 ** 9
                modes.append("p" if c is None else c.next_mode()[0])
                del inside[:]
                walls.append(g.run_replayed())
                shares.append(sum(inside))
                g.check()
            wall, share = statistics.median(walls), statistics.median(shares)
            print(f"{case:<10} replay {1e3 * wall:8.3f} ms  shares {1e3 * share:8.3f} ms  "
                  f"outside {1e3 * (wall - share):7.3f} ms  modes {''.join(modes)}",
                  flush=True)
    engine.EngineThreads.run = run
    return 0


if __name__ == "__main__":
    sys.exit(main())
