"""Task Bench on hetero_nn and Dask: the smallest task each system runs efficiently.

Task Bench (Slaughter et al., SC20) measures a task system by the *minimum
effective task granularity* METG(50%): the smallest task duration at which the
system still reaches half of the machine's peak throughput. Its graphs are a
grid of ``--width`` points by ``--steps`` timesteps; point ``(t, i)`` reads the
outputs of some points of timestep ``t - 1`` (the *pattern*) and runs the
compute-bound kernel: a Numba ``nogil`` loop of ``iterations`` iterations of 16
independent multiply-adds (32 flops) on registers. Patterns (``--patterns``):

``trivial``      no dependence at all;
``no_comm``      ``(t-1, i)``;
``stencil_1d``   ``(t-1, i-1)``, ``(t-1, i)``, ``(t-1, i+1)``;
``fft``          ``(t-1, i)`` and its butterfly partner ``(t-1, i XOR 2^((t-1) mod log2 W))``;
``tree``         a binary tree growing to the full width: ``min(2^t, W)`` points at
                 timestep ``t``, point ``i`` reading ``(t-1, i // 2)``;
``nearest``      the ``--radix`` points of ``t - 1`` nearest ``i`` (``stencil_1d`` is
                 radix 3);
``all_to_all``   every point of ``t - 1``.

Systems, run in the same process on the same grid (``--systems``):

``submitted``  hetero_nn, every task submitted and the graph flushed by ``wait()``
               (the default ``Runtime`` but ``auto_capture=False``: traces and
               performance models on; every flush runs as submitted);
``replayed``   hetero_nn, the grid captured once (``Runtime.capture``) and replayed
               by the compiled replay engine (the number of iterations a step
               parameter, ``graph.replay(iterations=...)``);
``auto``       hetero_nn, Task Bench's own method: the graph's construction timed, every
               task submitted (the number of iterations a step parameter,
               ``rt.param``) and ``wait()``; the default ``Runtime`` captures the
               repeated flush by itself and replays it (``auto_capture``: the
               submissions compared with the shape and kept, then one compiled
               replay, started early: while the flush is still submitted, the
               tasks of its matched prefix run, :mod:`~hetero_nn.scheduler.engine.early`).
               A runtime of its own; three untimed runs first (seen, captured, bound), as
               ``replayed`` captures before its sweep; its lines say how many timed runs
               replayed early (``early`` in ``--json``);
``dask``       ``dask.threaded.get`` on a dict of the same tasks (``--width`` threads),
               the kernel called by a pure Python function per task.

Each point writes ``point + epoch * points`` into its output and every task
checks that its inputs hold what its dependencies wrote in the same run (the
*epoch* is a one-element input written before each run): a dependence a system
misses fails the run instead of passing unseen. Task outputs are one-row handles
of one registered array (hetero_nn) or fresh arrays (Dask); each codelet takes
one output and ``k`` inputs (one codelet per ``k``, until codelets with variable
operand counts exist).

Measurement: the kernel's peak is measured first, ``--width`` threads running it
at once for ``--peak-seconds``: seconds per iteration per core. Then for each
pattern, iterations from ``--max-iterations`` halving down to 1 (and 0): for
``--rounds`` rounds, each system runs the grid once, the systems' order rotating
each round; the median wall time per system is kept. For a run of ``N`` tasks in
``T`` seconds on ``C`` cores: task granularity ``T * C / N`` and efficiency
``N * iterations * peak / (T * C)``. METG(50%) is the granularity where the
efficiency curve crosses 50% (log-linear between the last point at or above and
the first below; the smallest granularity measured when it never drops).

Each replayed point's line (and its ``--json`` row, ``serial``) says how many of its timed
replays the engine ran on one thread, measured faster there than one thread per worker
(:mod:`~hetero_nn.scheduler.engine.contention`; efficiency is then at most ``1 / C``).
Each point's line ends with every timed round's wall in ms (``walls`` in ``--json``); a
replayed round's is followed by ``p`` or ``s`` (parallel or serial), ``Nz`` when ``N`` of its
waits fell asleep (``CompiledSegment.wait_stats``), ``!`` when the replay compiled its
segments again (a rebinding), ``c`` when it was a try of parallel cut once it could not
win (:mod:`~hetero_nn.scheduler.engine.contention`) and ``gX`` when the garbage collector ran ``X`` ms inside it.
Prints METG per pattern and system and the ratio dask / replayed; ``--json``
writes every point; ``--plot`` the efficiency curves (a PNG, one panel per
pattern). Take no figure on a loaded machine. Example (about 10 minutes on 2
cores)::

    python benchmarks/task_bench.py --width 2 --steps 500 --rounds 5 \\
        --json runs/task_bench.json --plot docs/task_bench.png
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
from numba import njit

PATTERNS = ("trivial", "no_comm", "stencil_1d", "fft", "tree", "nearest", "all_to_all")
SYSTEMS = ("submitted", "replayed", "auto", "dask")
FLOPS_PER_ITERATION = 32


# ----------------------------------------------------------------------------- patterns

def active_points(pattern, t, width) -> range:
    """The points of timestep ``t`` that hold a task."""
    if pattern == "tree":
        return range(min(1 << t, width))
    return range(width)


def dependencies(pattern, t, i, width, radix=3) -> list:
    """The points of timestep ``t - 1`` that point ``(t, i)`` reads (sorted, distinct)."""
    if t == 0 or pattern == "trivial":
        return []
    if pattern == "no_comm":
        return [i]
    if pattern == "stencil_1d":
        return [j for j in (i - 1, i, i + 1) if 0 <= j < width]
    if pattern == "nearest":
        lo = i - (radix - 1) // 2
        return [j for j in range(lo, lo + radix) if 0 <= j < width]
    if pattern == "fft":
        stages = max(1, int(math.log2(width))) if width > 1 else 1
        partner = i ^ (1 << ((t - 1) % stages))
        return sorted({i, partner} & set(range(width)))
    if pattern == "tree":
        return [i // 2] if i // 2 in active_points(pattern, t - 1, width) else []
    if pattern == "all_to_all":
        return list(range(width))
    raise ValueError(f"unknown pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")


def grid(pattern, width, steps, radix=3) -> list:
    """``[(t, i, deps), ...]`` in timestep order."""
    return [(t, i, dependencies(pattern, t, i, width, radix))
            for t in range(steps) for i in active_points(pattern, t, width)]


# ----------------------------------------------------------------------------- the kernel

@njit(nogil=True, fastmath=False)  # no disk cache: tests load this file as a module of no name
def compute(iterations):
    """``iterations`` rounds of 16 independent multiply-adds: Task Bench's compute kernel."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 1.0
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = 0.5
    for _ in range(iterations):
        a0 = a0 * 0.999 + 0.001
        a1 = a1 * 0.999 + 0.001
        a2 = a2 * 0.999 + 0.001
        a3 = a3 * 0.999 + 0.001
        a4 = a4 * 0.999 + 0.001
        a5 = a5 * 0.999 + 0.001
        a6 = a6 * 0.999 + 0.001
        a7 = a7 * 0.999 + 0.001
        b0 = b0 * 0.999 + 0.001
        b1 = b1 * 0.999 + 0.001
        b2 = b2 * 0.999 + 0.001
        b3 = b3 * 0.999 + 0.001
        b4 = b4 * 0.999 + 0.001
        b5 = b5 * 0.999 + 0.001
        b6 = b6 * 0.999 + 0.001
        b7 = b7 * 0.999 + 0.001
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7


_KERNELS: dict = {}


class Collections:
    """Seconds the garbage collector has run in this process (``gc.callbacks``)."""

    def __init__(self):
        self.seconds = 0.0
        self._start = None
        gc.callbacks.append(self._observe)

    def _observe(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


COLLECTIONS = Collections()


def kernel(k):
    """The Numba task of ``k`` inputs: ``(out, epoch, in_0 .. in_k-1, iterations, point,
    points, deps)``; checks each input, then computes and writes ``out``."""
    fn = _KERNELS.get(k)
    if fn is None:
        inputs = "".join(f", in_{j}" for j in range(k))
        checks = "".join(
            f"    if in_{j}[0, 0] != deps[{j}] + e * points:\n"
            f"        raise ValueError('an input was not written by its dependence')\n"
            for j in range(k))
        source = (f"def task_bench_{k}(out, epoch{inputs}, iterations, point, points, deps):\n"
                  "    e = epoch[0]\n"
                  f"{checks}"
                  "    out[0, 1] = compute(iterations)\n"
                  "    out[0, 0] = point + e * points\n")
        namespace = {"compute": compute}
        exec(compile(source, f"<task_bench_{k}>", "exec"), namespace)
        fn = _KERNELS[k] = njit(nogil=True)(namespace[f"task_bench_{k}"])
    return fn


def codelet(k):
    """The hetero_nn codelet of ``k`` inputs (one output ``W``, the epoch and inputs ``R``)."""
    import hetero_nn as hn
    c = _CODELETS.get(k)
    if c is None:
        c = _CODELETS[k] = hn.Codelet(f"task_bench_{k}", modes=(hn.W,) + (hn.R,) * (k + 1),
                                      variants={"cpu": kernel(k)},
                                      flops=lambda *shapes, iterations, **p:
                                      float(FLOPS_PER_ITERATION * iterations))
    return c


_CODELETS: dict = {}


def _dask_point(iterations, point, points, deps, epoch, *inputs):
    out = np.empty((1, 2))
    kernel(len(inputs))(out, epoch, *inputs, iterations, point, points, deps)
    return out


# ----------------------------------------------------------------------------- the systems

class HeteroGrid:
    """One pattern's grid on a hetero_nn runtime: handles, submission, and its capture."""

    def __init__(self, rt, tasks, width, steps):
        self.rt = rt
        self.tasks = tasks
        self.width = width
        self.points = steps * width
        self.data = np.zeros((self.points, 2))  # row t * width + i: point (t, i)'s output
        root = rt.register(self.data, name="task_bench")
        self.cells = [row.split(0, width) for row in root.split(0, steps)]
        self.epoch_data = np.zeros(1)
        self.epoch = rt.register(self.epoch_data, name="epoch")
        self.graph = None
        self.runs = 0
        self.calls = [(codelet(len(deps)), (cells_t[i], self.epoch,
                                            *[self.cells[t - 1][j] for j in deps]),
                       {"point": t * width + i, "points": self.points,
                        "deps": tuple((t - 1) * width + j for j in deps)})
                      for t, i, deps in tasks for cells_t in (self.cells[t],)]

    def submit(self, iterations):
        """Every task submitted (the graph's description made beforehand, in ``calls``)."""
        submit = self.rt.submit
        for cl, handles, params in self.calls:
            submit(cl, *handles, iterations=iterations, **params)

    def next_epoch(self):
        """Before a run: a new epoch for the checks (written where the tasks read it)."""
        self.runs += 1
        if self.graph is not None:
            self.graph.write(self.epoch, np.array([float(self.runs)]))
        else:
            self.rt.wait()
            self.epoch_data[0] = self.runs

    def run_submitted(self, iterations):
        self.next_epoch()
        t0 = time.perf_counter()
        self.submit(iterations)
        self.rt.wait()
        elapsed = time.perf_counter() - t0
        self.rt.trace(clear=True)  # the records of a run (traces are on): not kept
        return elapsed

    def capture(self, iterations):
        self.next_epoch()
        with self.rt.capture() as graph:
            self.submit(graph.param("iterations", iterations))
        self.graph = graph

    def set_iterations(self, iterations):
        """Untimed: the step parameter set, and one replay that binds it."""
        self.next_epoch()
        self.graph.replay(iterations=iterations)

    def run_auto(self, iterations):
        """Task Bench's own method: submit and wait, timed (the runtime replays by itself)."""
        self.next_epoch()
        t0 = time.perf_counter()
        self.submit(self.rt.param("iterations", iterations))
        self.rt.wait()
        elapsed = time.perf_counter() - t0
        notes = self.rt.trace(clear=True).metadata.get("auto_capture", [])
        self.action = notes[-1]["action"] if notes else "submitted"
        self.early = bool(notes and notes[-1].get("early"))
        return elapsed

    def next_mode(self):
        """The mode the engine runs the next replay in (parallel, or serial where one
        thread was measured faster)."""
        compiled = self.graph._compiled
        modes = [seg.contention.next_mode() for seg in compiled.segments or ()
                 if seg.contention is not None] if compiled is not None else []
        return "serial" if "serial" in modes else "parallel"

    def run_replayed(self):
        self.next_epoch()
        mode = self.next_mode()
        before = list(self.graph._compiled.segments or ())
        cuts = sum(seg.contention.cuts for seg in before if seg.contention is not None)
        collected = COLLECTIONS.seconds
        t0 = time.perf_counter()
        self.graph.replay()
        elapsed = time.perf_counter() - t0
        collected = COLLECTIONS.seconds - collected
        self.rt.trace(clear=True)
        from hetero_nn.scheduler.engine.dispatch import SLEPT
        segments = self.graph._compiled.segments
        slept = sum(int(seg.wait_stats[:, SLEPT].sum()) for seg in segments)
        self.note = ("s" if mode == "serial" else "p") + \
            (f"{slept}z" if slept else "") + ("!" if segments != before else "") + \
            ("c" if cuts < sum(seg.contention.cuts for seg in segments
                               if seg.contention is not None) else "") + \
            (f"g{1e3 * collected:.1f}" if collected else "")
        return elapsed

    def check(self):
        """The last run's outputs are its points (an unchecked input would have raised)."""
        self.rt.wait()
        for t, i, _ in self.tasks:
            point = t * self.width + i
            if self.data[point, 0] != point + self.runs * self.points:
                raise AssertionError(f"point ({t}, {i}) was not run")


def dask_graph(tasks, width, steps, iterations, epoch):
    points = steps * width
    dsk = {"epoch": epoch}
    for t, i, deps in tasks:
        dsk[("p", t, i)] = (_dask_point, iterations, t * width + i, points,
                            tuple((t - 1) * width + j for j in deps), "epoch",
                            *[("p", t - 1, j) for j in deps])
    return dsk, [("p", t, i) for t, i, _ in tasks]


def run_dask(tasks, width, steps, iterations, run):
    import dask.threaded
    epoch = np.array([float(run)])
    dsk, keys = dask_graph(tasks, width, steps, iterations, epoch)
    t0 = time.perf_counter()
    values = dask.threaded.get(dsk, keys, num_workers=width)
    elapsed = time.perf_counter() - t0
    points = steps * width
    for (t, i, _), v in zip(tasks, values):
        if v[0, 0] != t * width + i + run * points:
            raise AssertionError(f"dask: point ({t}, {i}) holds {v[0, 0]}")
    return elapsed


# ----------------------------------------------------------------------------- measurement

def peak_seconds_per_iteration(cores, seconds=1.0, iterations=1 << 16):
    """Seconds per kernel iteration per core with ``cores`` threads running it at once."""
    compute(10)
    counts = [0] * cores
    stop = time.perf_counter() + seconds

    def spin(c):
        n = 0
        while time.perf_counter() < stop:
            compute(iterations)
            n += 1
        counts[c] = n
    threads = [threading.Thread(target=spin, args=(c,)) for c in range(cores)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    return elapsed * cores / (sum(counts) * iterations)


def metg(points, threshold=0.5):
    """METG from ``[(granularity, efficiency), ...]`` (module docstring); None when no
    point reaches ``threshold``."""
    points = sorted(points, reverse=True)  # coarse to fine
    last_ok = None
    for g, e in points:
        if e >= threshold:
            last_ok = (g, e)
            continue
        if last_ok is None:
            return None
        (g0, e0), (g1, e1) = last_ok, (g, e)
        if g0 <= 0 or g1 <= 0 or e0 == e1:
            return g0
        frac = (e0 - threshold) / (e0 - e1)
        return math.exp(math.log(g0) + frac * (math.log(g1) - math.log(g0)))
    return last_ok[0] if last_ok else None


def sweep(max_iterations):
    """Iterations per task: ``max`` halving down to 1, then 0."""
    out, k = [], max_iterations
    while k >= 1:
        out.append(k)
        k //= 2
    return out + [0]


def bench_pattern(pattern, args, rt, peak, log):
    tasks = grid(pattern, args.width, args.steps, args.radix)
    n = len(tasks)
    rt, rt_auto = rt
    hetero = HeteroGrid(rt, tasks, args.width, args.steps) if rt is not None else None
    if hetero is not None and "replayed" in args.systems:
        hetero.capture(1)
    auto = HeteroGrid(rt_auto, tasks, args.width, args.steps) if rt_auto is not None else None
    if auto is not None:
        for _ in range(3):  # seen, captured, replayed once (bound): untimed
            auto.run_auto(1)
    rows = []
    for iterations in sweep(args.max_iterations):
        if hetero is not None and "replayed" in args.systems:
            hetero.set_iterations(iterations)
        if auto is not None:  # untimed, as set_iterations: the new value bound, then planned
            auto.run_auto(iterations)
        times = {s: [] for s in args.systems}
        notes = {s: [] for s in args.systems}  # each round's wall (ms), and how it ran
        serial = 0  # timed replays the engine ran on one thread (engine/contention.py)
        early = 0  # timed auto runs replayed while submitted (engine/early.py)
        for r in range(args.rounds + 1):  # round 0 warms up (not kept)
            order = list(args.systems)
            order = order[r % len(order):] + order[:r % len(order)]
            for system in order:
                if system == "submitted":
                    wall = hetero.run_submitted(iterations)
                    hetero.check()
                elif system == "replayed":
                    serial += bool(r) and hetero.next_mode() == "serial"
                    wall = hetero.run_replayed()
                    hetero.check()
                elif system == "auto":
                    wall = auto.run_auto(iterations)
                    early += bool(r) and auto.early
                    auto.check()
                    if auto.action != "replayed":
                        raise AssertionError(f"auto: the repeated flush was {auto.action}, "
                                             "not replayed")
                else:
                    wall = run_dask(tasks, args.width, args.steps, iterations, r + 1)
                if r:
                    times[system].append(wall)
                    notes[system].append(f"{1e3 * wall:.2f}" + (
                        hetero.note if system == "replayed" else ""))
        for system, walls in times.items():
            wall = statistics.median(walls)
            granularity = wall * args.width / n
            efficiency = n * iterations * peak / (wall * args.width)
            rows.append({"pattern": pattern, "system": system, "iterations": iterations,
                         "tasks": n, "wall": wall, "walls": walls, "granularity": granularity,
                         "efficiency": efficiency,
                         **({"serial": serial} if system == "replayed" else {}),
                         **({"early": early} if system == "auto" else {})})
            log(f"  {pattern:<11} {system:<9} iterations {iterations:>7}  "
                f"{1e6 * granularity:10.2f} us/task  efficiency {100 * efficiency:6.1f}%"
                + (f"  ({serial} of {len(walls)} serial)" if system == "replayed" else "")
                + (f"  ({early} of {len(walls)} early)" if system == "auto" else "")
                + f"  rounds {' '.join(notes[system])}")
    return rows


def summarise(rows, patterns, systems):
    out = {}
    for p in patterns:
        for s in systems:
            pts = [(r["granularity"], r["efficiency"]) for r in rows
                   if r["pattern"] == p and r["system"] == s and r["iterations"] > 0]
            if pts:
                out.setdefault(p, {})[s] = metg(pts)
    return out


def plot(rows, patterns, systems, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cols = min(4, len(patterns))
    nrows = math.ceil(len(patterns) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False,
                             sharey=True)
    for ax, p in zip(axes.flat, patterns):
        for s in systems:
            pts = sorted((r["granularity"] * 1e6, r["efficiency"]) for r in rows
                         if r["pattern"] == p and r["system"] == s and r["iterations"] > 0)
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=s)
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(p)
        ax.set_xlabel("task granularity (us)")
        ax.set_ylim(0, 1.05)
    for ax in axes.flat[len(patterns):]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("efficiency")
    axes[0][0].legend()
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2, help="points per timestep and "
                        "workers / threads of every system (default 2)")
    parser.add_argument("--steps", type=int, default=500, help="timesteps (default 500)")
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--radix", type=int, default=5, help="nearest's radix (default 5)")
    parser.add_argument("--max-iterations", type=int, default=1 << 18,
                        help="kernel iterations of the coarsest tasks (default 262144)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--peak-seconds", type=float, default=2.0)
    parser.add_argument("--no-gil-handoff", action="store_true",
                        help="StudyOptions(gil_handoff=False): the switch interval left as "
                             "it is during replays (the A/B of issue 34)")
    parser.add_argument("--no-cut-tries", action="store_true",
                        help="StudyOptions(cut_tries=False): every try of the other mode runs "
                             "to its end (the before of engine/contention.py's cut)")
    parser.add_argument("--json", help="write every point here")
    parser.add_argument("--plot", help="write the efficiency curves here (PNG)")
    args = parser.parse_args(argv)
    if args.width < 1 or args.steps < 1 or args.rounds < 1 or args.radix < 1:
        parser.error("--width, --steps, --rounds and --radix must be positive")
    os.environ.setdefault("HETERO_NN_CACHE", tempfile.mkdtemp(prefix="hetero_nn-task-bench-"))
    log = (lambda line: print(line, file=sys.stderr, flush=True))

    peak = peak_seconds_per_iteration(args.width, args.peak_seconds)
    log(f"kernel peak: {1e9 * peak:.2f} ns per iteration per core ({args.width} cores)")
    rt = rt_auto = None
    if {"submitted", "replayed", "auto"} & set(args.systems):
        import hetero_nn as hn
        study = hn.StudyOptions(gil_handoff=not args.no_gil_handoff,
                                cut_tries=not args.no_cut_tries)
        if {"submitted", "replayed"} & set(args.systems):
            rt = hn.Runtime(devices=f"cpu:{args.width}", study=study, auto_capture=False)
        if "auto" in args.systems:
            rt_auto = hn.Runtime(devices=f"cpu:{args.width}", study=study)
    rows = []
    try:
        for pattern in args.patterns:
            rows += bench_pattern(pattern, args, (rt, rt_auto), peak, log)
    finally:
        for r in (rt, rt_auto):
            if r is not None:
                r.close()
    table = summarise(rows, args.patterns, args.systems)
    print(f"\nMETG(50%) in microseconds, {args.width} cores, {args.steps} timesteps "
          f"(median of {args.rounds} rounds)")
    print(f"{'pattern':<12}" + "".join(f"{s:>12}" for s in args.systems) + "  dask/replayed")
    for p in args.patterns:
        cells = table.get(p, {})
        line = f"{p:<12}" + "".join(
            f"{1e6 * cells[s]:>12.1f}" if cells.get(s) else f"{'-':>12}" for s in args.systems)
        if cells.get("dask") and cells.get("replayed"):
            line += f"  {cells['dask'] / cells['replayed']:>8.1f}x"
        print(line)
    if args.json:
        import hetero_nn as hn
        doc = {"width": args.width, "steps": args.steps, "rounds": args.rounds,
               "radix": args.radix, "peak_seconds_per_iteration": peak,
               "flops_per_iteration": FLOPS_PER_ITERATION, "cpu_count": os.cpu_count(),
               "machine": platform.platform(), "python": platform.python_version(),
               "hetero_nn": hn.__version__,
               "metg_seconds": table, "points": rows}
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, args.json)
    if args.plot:
        plot(rows, args.patterns, args.systems, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
