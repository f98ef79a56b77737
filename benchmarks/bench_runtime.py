"""Per-task overhead of the runtime: microseconds per task for an empty codelet.

The codelet's ``cpu`` variant is a Numba ``nogil`` no-op (what the runtime runs; its
``ref`` twin, a Python no-op, serves the Dask rows). Two graphs of ``--tasks``
tasks (default 10,000), timed from the first submit to ``wait()`` returning
(submission, dependency inference and scheduling included):

- ``chain``: every task ``RW`` on one handle, so each waits for the one before;
- ``wide``: every task ``RW`` on its own child of one partitioned handle (independent).

Run through:

- the local executor under each policy (``eager``, ``random``, ``ws``, ``dmda``,
  ``heft``) with ``--workers`` workers, traces and performance models off (the
  overhead floor), and under ``eager``/``dmda`` with both on (the defaults); tasks
  start as they are submitted, or at ``wait()`` with ``--no-overlap``
  (``Runtime(overlap=False)``);
- the same graphs captured once (``Runtime.capture``) and replayed (``graph.replay()``,
  timed alone): by the compiled replay engine with traces and performance models off
  and on, and through the executor (``replay_engine="executor"``) for comparison;
- ``executor="dask"``: the same program as a Dask graph through ``dask.threaded.get``;
- ``dask.threaded.get`` alone on that prebuilt graph (``build_graph``), and on a
  hand-built dict of no-op tasks of the same shape, for reference;
- ``distributed``: a ``LocalCluster`` of 2 processes through ``executor=client``
  and a hand-built dict through ``client.get`` (``--dist-tasks`` tasks, default 2,000).

More tables:

- ``readers``: ``--readers`` (default 1,000, 5,000, 20,000) ``R`` tasks on one
  handle and then one ``RW`` task, in one flush, on the local executor (eager,
  traces and performance models off): microseconds per task of submission alone
  and of submission plus ``wait()``. Submission must stay flat in the number of
  pending readers;
- ``plans``: one handle split two ways, into ``P`` and ``P/2`` parts (the same
  ``--readers`` counts as ``P``), an ``RW`` task on every part of the first plan,
  then on every part of the second (each waits for the two parts it overlaps):
  submission must stay flat in the number of partitions;
- ``perfmodel hot calls``: nanoseconds per ``PerfModel.predict`` (from the
  history and from the regression), ``predict_transfer`` and ``record`` call;
- ``goal`` (issue 16's submission goal): an empty codelet whose ``cpu`` variant is a
  Numba ``nogil`` no-op, ``--workers`` workers, the default ``Runtime()`` (trace and
  performance models on), ``--tasks`` tasks: ``chain`` (``RW`` on one handle) and
  ``wide`` (``W`` on each part of a ``--tasks``-way split, made before the clock
  starts); microseconds per task from the first submit to ``wait()`` returning
  (goal: <= 5), the best and the median run, and the garbage collections per run by
  generation (young / older / full: flush.py's ``Collector``); the process CPU per task
  (all threads, median run) and the CPU in collections per task, both from the first
  submit through the trace's clear after ``wait()`` (where the collection a flush leaves
  for after it comes); then each program again on handles made once, so that the default
  runtime's automatic capture replays it (``chain repeated``, ``wide repeated``: the
  submissions compared with the shape and kept, then one compiled replay; after four
  untimed runs);
- ``calls``: the goal's programs once more under a profiler hook in every thread:
  Python function calls and C calls per task (load-independent: what the per-task
  cost is made of, on any machine), and of those the calls in the submitting thread
  (``submit``, its dependency inference and hand-over: the submission cost);
- ``auto`` (not in the default list): Task Bench's own method (``task_bench.py``'s
  ``auto``) on ``stencil_1d``, 2 x 500 points, 0 iterations: microseconds per task of the
  submission loop (compared with the shape and kept) and of the ``wait()`` that replays;
- ``handles``: microseconds per ``rt.register`` of a small array, and per
  ``split(0, 2)`` and ``split(0, 8)`` of a registered root (goals: <= 2 and <= 5).

Prints a table (best of ``--repeat`` local runs, ``--dask-repeat`` Dask runs) and
the ratios dask / local; ``--json`` writes the numbers with the machine and
versions. Example (about 2 minutes on 2 cores)::

    python benchmarks/bench_runtime.py --tasks 10000 --repeat 5 --json runs/bench_runtime.json

The submission goal and the handles alone (a few seconds)::

    python benchmarks/bench_runtime.py --only goal handles --tasks 10000 --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time

import numba
import numpy as np

import hetero_nn as hn
from hetero_nn.scheduler.executors.dask_graph import build_graph


def _noop(x):
    pass


def _noop_value(*args):
    return None


@numba.njit(nogil=True)
def _noop_cpu(x):
    pass


EMPTY = hn.Codelet("empty", modes=(hn.RW,), variants={"ref": _noop, "cpu": _noop_cpu})
READ = hn.Codelet("read", modes=(hn.R,), variants={"ref": _noop, "cpu": _noop_cpu})
# the submission goal's codelets: the cpu variant, the only one, is the nogil no-op itself
EMPTY_RW = hn.Codelet("empty_nogil_rw", modes=(hn.RW,), variants={"cpu": _noop_cpu})
EMPTY_W = hn.Codelet("empty_nogil_w", modes=(hn.W,), variants={"cpu": _noop_cpu})
POLICIES = ("eager", "random", "ws", "dmda", "heft")


# ---------------------------------------------------------------- programs
def submit_chain(rt, n):
    """``n`` tasks ``RW`` on one handle; returns the submit start time."""
    h = rt.register(np.zeros(1))
    t0 = time.perf_counter()
    for _ in range(n):
        rt.submit(EMPTY, h)
    return t0


def submit_wide(rt, n):
    """``n`` independent tasks, each ``RW`` on its own child of one handle."""
    parts = rt.register(np.zeros(n)).split(axis=0, n=n)
    t0 = time.perf_counter()
    for p in parts:
        rt.submit(EMPTY, p)
    return t0


PROGRAMS = {"chain": submit_chain, "wide": submit_wide}


def time_runtime(make_runtime, program, n, repeat):
    """Best seconds per task over ``repeat`` runs, each on a fresh graph of one runtime."""
    best = float("inf")
    with make_runtime() as rt:
        PROGRAMS[program](rt, min(n, 200))  # warm-up: threads started, caches filled
        rt.wait()
        for _ in range(repeat):
            t0 = PROGRAMS[program](rt, n)
            rt.wait()
            best = min(best, time.perf_counter() - t0)
            rt.trace(clear=True)
    return best / n


def time_replayed(make_runtime, program, n, repeat):
    """Best seconds per task of ``graph.replay()`` over ``repeat`` replays of the program
    captured once (after two warm-up replays: binding, compiling, the second plan)."""
    best = float("inf")
    with make_runtime() as rt:
        with rt.capture() as graph:
            PROGRAMS[program](rt, n)
        for _ in range(2):
            graph.replay()
        for _ in range(repeat):
            t0 = time.perf_counter()
            graph.replay()
            best = min(best, time.perf_counter() - t0)
            rt.trace(clear=True)
    return best / n


def time_prebuilt_dask(program, n, repeat, workers):
    """``dask.threaded.get`` alone on the graph ``build_graph`` makes of the program."""
    import dask.threaded
    from concurrent.futures import ThreadPoolExecutor

    best = float("inf")
    with hn.Runtime(devices=f"cpu:{workers}", executor="dask", perfmodel=False,
                    trace=False) as rt:
        PROGRAMS[program](rt, n)
        tasks, rt._flushes.pending = rt._flushes.pending, []
        dsk, outputs, timing = build_graph(rt, tasks)
        keys = list(outputs.values()) + timing
        with ThreadPoolExecutor(workers) as pool:
            for _ in range(repeat):
                t0 = time.perf_counter()
                dask.threaded.get(dsk, keys, pool=pool)
                best = min(best, time.perf_counter() - t0)
    return best / n


def plain_graph(program, n):
    """A hand-built dict of ``n`` no-op tasks: a chain, or ``n`` independent keys."""
    if program == "chain":
        dsk = {"t-0": (_noop_value,)}
        for i in range(1, n):
            dsk[f"t-{i}"] = (_noop_value, f"t-{i - 1}")
        return dsk, [f"t-{n - 1}"]
    dsk = {f"t-{i}": (_noop_value,) for i in range(n)}
    return dsk, list(dsk)


def time_plain_dask(program, n, repeat, workers):
    import dask.threaded
    from concurrent.futures import ThreadPoolExecutor

    dsk, keys = plain_graph(program, n)
    best = float("inf")
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(repeat):
            t0 = time.perf_counter()
            dask.threaded.get(dsk, keys, pool=pool)
            best = min(best, time.perf_counter() - t0)
    return best / n


def time_plain_distributed(client, program, n, repeat):
    best = float("inf")
    for r in range(repeat):
        dsk, keys = plain_graph(program, n)
        suffix = f"-{r}-{time.monotonic_ns()}"  # fresh keys: nothing cached on the scheduler
        dsk = {k + suffix: (v[0], *[a + suffix for a in v[1:]]) for k, v in dsk.items()}
        keys = [k + suffix for k in keys]
        t0 = time.perf_counter()
        client.get(dsk, keys)
        best = min(best, time.perf_counter() - t0)
    return best / n


def time_wide_readers(n, repeat, workers):
    """``(submit, total)`` best seconds per task for ``n`` readers of one handle and a writer."""
    best_submit = best_total = float("inf")
    with hn.Runtime(devices=f"cpu:{workers}", perfmodel=False, trace=False) as rt:
        for _ in range(repeat):
            h = rt.register(np.zeros(1))
            t0 = time.perf_counter()
            for _ in range(n):
                rt.submit(READ, h)
            rt.submit(EMPTY, h)
            t1 = time.perf_counter()
            rt.wait()
            t2 = time.perf_counter()
            best_submit = min(best_submit, (t1 - t0) / (n + 1))
            best_total = min(best_total, (t2 - t0) / (n + 1))
    return best_submit, best_total


def time_two_plans(parts, repeat, workers):
    """``(submit, total)`` best seconds per task for ``RW`` tasks on every part of two
    plans of one handle (``parts`` and ``parts // 2`` parts)."""
    best_submit = best_total = float("inf")
    with hn.Runtime(devices=f"cpu:{workers}", perfmodel=False, trace=False) as rt:
        for _ in range(repeat):
            h = rt.register(np.zeros(2 * parts))
            fine, coarse = h.split(axis=0, n=parts), h.split(axis=0, n=parts // 2)
            t0 = time.perf_counter()
            for p in (*fine, *coarse):
                rt.submit(EMPTY, p)
            t1 = time.perf_counter()
            rt.wait()
            t2 = time.perf_counter()
            ntasks = len(fine) + len(coarse)
            best_submit = min(best_submit, (t1 - t0) / ntasks)
            best_total = min(best_total, (t2 - t0) / ntasks)
    return best_submit, best_total


def time_goal(n, repeat, workers):
    """Best seconds per task of the submission goal, per program (see the docstring)."""
    # timing[0]: from a timed run's first submit to its wait() returning; timing[1]: on
    # through the trace's clear (the collection a flush leaves for after it comes there)
    timing = [False, False]
    cpu0 = [0.0]

    def chain(rt):
        h = rt.register(np.zeros(1))
        timing[:] = True, True
        cpu0[0] = time.process_time()
        t0 = time.perf_counter()
        for _ in range(n):
            rt.submit(EMPTY_RW, h)
        return t0

    def wide(rt):
        parts = rt.register(np.zeros(n)).split(axis=0, n=n)
        timing[:] = True, True
        cpu0[0] = time.process_time()
        t0 = time.perf_counter()
        for p in parts:
            rt.submit(EMPTY_W, p)
        return t0

    out = {}
    counts = [0, 0, 0]  # collections by generation while a timed run runs
    collecting = [0.0, None]  # CPU seconds in collections in timing[1]'s window (a
    # collection runs start to stop in one thread: its thread's clock), the last start

    def counted(phase, info):
        if phase == "start":
            if timing[0]:
                counts[info["generation"]] += 1
            if timing[1]:
                collecting[1] = time.thread_time()
        elif collecting[1] is not None:
            collecting[0] += time.thread_time() - collecting[1]
            collecting[1] = None

    gc.callbacks.append(counted)
    try:
        with hn.Runtime(devices=f"cpu:{workers}") as rt:  # the defaults: trace, perfmodel on
            for name, program in (("chain", chain), ("wide", wide)):
                program(rt)  # warm-up: compilation, threads, models
                rt.wait()
                walls, cpus, counts[:], timing[:], collecting[0] = [], [], [0, 0, 0], \
                    [False, False], 0.0
                for _ in range(repeat):
                    t0 = program(rt)
                    rt.wait()
                    walls.append(time.perf_counter() - t0)
                    timing[0] = False
                    rt.trace(clear=True)
                    cpus.append(time.process_time() - cpu0[0])
                    timing[1] = False
                out[name] = min(walls) / n
                out[f"{name} median"] = statistics.median(walls) / n
                out[f"{name} collections"] = [c / repeat for c in counts]
                out[f"{name} cpu"] = statistics.median(cpus) / n
                out[f"{name} collecting"] = collecting[0] / repeat / n
    finally:
        gc.callbacks.remove(counted)
    with hn.Runtime(devices=f"cpu:{workers}") as rt:  # the same handles each run: replayed
        h = rt.register(np.zeros(1))
        parts = rt.register(np.zeros(n)).split(axis=0, n=n)
        for name, program in (("chain repeated", lambda: [rt.submit(EMPTY_RW, h)
                                                         for _ in range(n)]),
                              ("wide repeated", lambda: [rt.submit(EMPTY_W, p) for p in parts])):
            for _ in range(4):  # seen, captured, bound, planned: the steady state after
                program()
                rt.wait()
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                program()
                rt.wait()
                best = min(best, time.perf_counter() - t0)
                notes = rt.trace(clear=True).metadata.get("auto_capture", [])
                if not notes or notes[-1]["action"] != "replayed":
                    raise AssertionError(f"{name}: the repeated flush was not replayed")
            out[name] = best / n
    return out


def count_calls(n, workers, top=12):
    """Python and C calls per task of the goal's programs, in every thread; returns
    ``{program: (calls per task, [(calls per task, where), ...] the most frequent,
    calls per task in the submitting thread)}``."""
    import collections
    import threading

    counts = collections.Counter()
    submitting = [0]

    def hook_main(frame, event, arg):  # hook(), counting the submitting thread's calls too
        if event == "call" or event == "c_call":
            submitting[0] += 1
        hook(frame, event, arg)

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        elif event == "c_call":
            counts[f"C:{getattr(arg, '__qualname__', arg)}"] += 1

    def hook_workers(x, barrier):  # a task run on each worker installs the hook there
        barrier.wait(30)
        sys.setprofile(hook)

    install = hn.Codelet("install_profiler", modes=(hn.RW,), variants={"ref": hook_workers})
    out = {}
    with hn.Runtime(devices=f"cpu:{workers}") as rt:
        programs = {"chain": lambda: [rt.submit(EMPTY_RW, h) for _ in range(n)],
                    "wide": lambda: [rt.submit(EMPTY_W, p) for p in parts]}
        for name, program in programs.items():
            h = rt.register(np.zeros(1))
            parts = rt.register(np.zeros(n)).split(axis=0, n=n)
            program()
            rt.wait()
            barrier = threading.Barrier(workers)
            for _ in range(workers):
                rt.submit(install, rt.register(np.zeros(1)), barrier=barrier)
            rt.wait()
            h = rt.register(np.zeros(1))
            parts = rt.register(np.zeros(n)).split(axis=0, n=n)
            counts.clear()
            submitting[0] = 0
            sys.setprofile(hook_main)
            program()
            rt.wait()
            sys.setprofile(None)
            uninstall = hn.Codelet("uninstall_profiler", modes=(hn.RW,),
                                   variants={"ref": lambda x, b: (b.wait(30), sys.setprofile(None))})
            barrier = threading.Barrier(workers)
            for _ in range(workers):
                rt.submit(uninstall, rt.register(np.zeros(1)), b=barrier)
            rt.wait()
            total = sum(counts.values()) / n
            out[name] = (total, [(c / n, k) for k, c in counts.most_common(top)],
                         submitting[0] / n)
    return out


def time_auto_split(repeat, steps=500, pattern="stencil_1d"):
    """Task Bench's own method (``task_bench.py``'s ``auto``) at 0 iterations, split:
    median seconds per task of the submission loop (each submission compared with the
    shape and kept; wall, and the submitting thread's CPU time, which a loaded machine
    moves less) and of the ``wait()`` that replays; untimed first, as ``task_bench.py``:
    three runs at 1 iteration (seen, captured, bound), one at 0."""
    import statistics
    import task_bench as tb  # beside this script

    tasks = tb.grid(pattern, 2, steps)
    submit, cpu, wait = [], [], []
    with hn.Runtime(devices="cpu:2") as rt:
        grid = tb.HeteroGrid(rt, tasks, 2, steps)
        for iterations in (1, 1, 1, 0):
            grid.run_auto(iterations)
        for _ in range(repeat):
            grid.next_epoch()
            t0, c0 = time.perf_counter(), time.thread_time()
            grid.submit(rt.param("iterations", 0))
            t1, c1 = time.perf_counter(), time.thread_time()
            rt.wait()
            submit.append(t1 - t0)
            cpu.append(c1 - c0)
            wait.append(time.perf_counter() - t1)
            grid.check()
    return tuple(statistics.median(x) / len(tasks) for x in (submit, cpu, wait))


def time_handles(repeat, calls=5_000):
    """Best seconds per ``register`` and per ``split(0, 2)`` / ``split(0, 8)``."""
    out = {}
    a = np.zeros((64, 8), np.float32)
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(calls):
                rt.register(a)
            best = min(best, time.perf_counter() - t0)
        out["register"] = best / calls
        for n in (2, 8):
            best = float("inf")
            for _ in range(repeat):
                roots = [rt.register(a) for _ in range(calls)]
                t0 = time.perf_counter()
                for h in roots:
                    h.split(0, n)
                best = min(best, time.perf_counter() - t0)
            out[f"split(0, {n})"] = best / calls
    return out


def time_perfmodel_calls(calls=20_000):
    """Nanoseconds per call of the performance model's hot methods (history of two sizes)."""
    from hetero_nn.scheduler.perfmodel.model import PerfModel

    key = ("bench_codelet", "ref", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        pm = PerfModel(tmp)
        for size in (100, 1000):
            pm.record(*key, f"f32[{size}]", float(size), size * 1e-9)
        timed = {
            "predict (history)": lambda: pm.predict(*key, "f32[100]", 100.0),
            "predict (regression)": lambda: pm.predict(*key, "f32[555]", 555.0),
            "predict_transfer": lambda: pm.predict_transfer("host0", "cuda0", 4096),
            "record": lambda: pm.record(*key, "f32[100]", 100.0, 1e-7),
        }
        out = {}
        for name, call in timed.items():
            start = time.perf_counter()
            for _ in range(calls):
                call()
            out[name] = (time.perf_counter() - start) / calls * 1e9
    return out


# ---------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per graph (default 10000)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="runs per local measurement; the best is kept (default 5)")
    parser.add_argument("--dask-repeat", type=int, default=1,
                        help="runs per Dask / distributed measurement (default 1: they take "
                             "seconds each)")
    parser.add_argument("--workers", type=int, default=2, help="workers / threads (default 2)")
    parser.add_argument("--dist-tasks", type=int, default=2_000,
                        help="tasks per graph for distributed (default 2000)")
    parser.add_argument("--no-distributed", action="store_true", help="skip the distributed rows")
    parser.add_argument("--readers", type=int, nargs="+", default=[1_000, 5_000, 20_000],
                        help="reader counts of the wide-readers table (default 1000 5000 20000)")
    parser.add_argument("--only", nargs="+",
                        choices=("tasks", "readers", "plans", "perfmodel", "goal", "calls",
                                 "handles", "auto"),
                        default=("tasks", "readers", "plans", "perfmodel", "goal", "handles"),
                        help="tables to measure (default: all)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="local runtimes with overlap=False: tasks run at wait(), as one "
                             "DAG (default: they start as they are submitted)")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    n, repeat, workers, slow = args.tasks, args.repeat, args.workers, args.dask_repeat
    overlap = not args.no_overlap
    os.environ.setdefault("HETERO_NN_CACHE", tempfile.mkdtemp(prefix="hetero_nn-bench-"))
    devices = f"cpu:{workers}"

    rows = []  # (label, tasks, {program: seconds per task})
    doc = {"tasks": n, "dist_tasks": args.dist_tasks, "repeat": repeat, "dask_repeat": slow,
           "overlap": overlap,
           "workers": workers, "cpu_count": os.cpu_count(), "machine": platform.platform(),
           "python": platform.python_version(), "numpy": np.__version__,
           "hetero_nn": hn.__version__}
    pending_tables = (
        ("readers", "readers of one handle, then one writer, one flush", "readers",
         time_wide_readers),
        ("plans", "RW on every part of two plans of one handle", "parts", time_two_plans))
    for name, title, unit, timer in pending_tables:
        if name not in args.only:
            continue
        print(f"{title} (local eager, best of {repeat})")
        print(f"{unit:>8}  {'submit us/task':>14}  {'submit+wait us/task':>19}")
        doc[f"{name}_us_per_task"] = table = {}
        for count in args.readers:
            sub, total = timer(count, repeat, workers)
            table[count] = {"submit": 1e6 * sub, "total": 1e6 * total}
            print(f"{count:>8}  {1e6 * sub:>14.2f}  {1e6 * total:>19.2f}", flush=True)
    if "perfmodel" in args.only:
        doc["perfmodel_ns_per_call"] = calls = time_perfmodel_calls()
        print("perfmodel hot calls: " + ", ".join(f"{k} {v:.0f} ns" for k, v in calls.items()))
    if "goal" in args.only:
        goal = time_goal(n, repeat, workers)
        goal = {k: v if k.endswith("collections") else 1e6 * v for k, v in goal.items()}
        doc["goal_us_per_task"] = goal
        print(f"submission goal (nogil no-op, default Runtime(), {workers} workers, {n} tasks, "
              f"best of {repeat}): chain {goal['chain']:.2f} us/task, wide "
              f"{goal['wide']:.2f} us/task (goal <= 5); the same program on the same "
              f"handles again (auto_capture replays it): chain {goal['chain repeated']:.2f}, "
              f"wide {goal['wide repeated']:.2f} us/task", flush=True)
        print("  medians: chain {:.2f}, wide {:.2f} us/task; garbage collections per run "
              "(young / older / full): chain {}, wide {}".format(
                  goal["chain median"], goal["wide median"],
                  " / ".join(f"{c:g}" for c in goal["chain collections"]),
                  " / ".join(f"{c:g}" for c in goal["wide collections"])), flush=True)
        print("  process CPU per task, through the trace's clear (so the collection a flush "
              "leaves for after it counts): chain {:.2f}, wide {:.2f} us (of which the "
              "collections' CPU {:.2f}, {:.2f})".format(goal["chain cpu"], goal["wide cpu"],
                                                   goal["chain collecting"],
                                                   goal["wide collecting"]), flush=True)
    if "calls" in args.only:
        doc["calls_per_task"] = {}
        for name, (total, top, main) in count_calls(n, workers).items():
            doc["calls_per_task"][name] = {"total": total, "submitting": main, "top": top}
            print(f"{name}: {total:.1f} Python and C calls per task ({main:.1f} in the "
                  "submitting thread); most frequent: "
                  + ", ".join(f"{c:.2f} {k}" for c, k in top[:8]), flush=True)
    if "auto" in args.only:
        sub, cpu, wait = time_auto_split(repeat)
        doc["auto_split_us_per_task"] = {"submit": 1e6 * sub, "submit_cpu": 1e6 * cpu,
                                         "wait": 1e6 * wait}
        print(f"Task Bench's own method (stencil_1d, 2 x 500, 0 iterations, median of "
              f"{repeat}): submission {1e6 * sub:.2f} us/task ({1e6 * cpu:.2f} us CPU), "
              f"wait (the replay) {1e6 * wait:.2f} us/task", flush=True)
    if "handles" in args.only:
        doc["handles_us"] = made = {k: 1e6 * v for k, v in time_handles(repeat).items()}
        print("handles (best of {}): ".format(repeat)
              + ", ".join(f"{k} {v:.2f} us" for k, v in made.items())
              + " (goals: register <= 2, split <= 5)", flush=True)
    if "tasks" not in args.only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
        return 0

    def measure(label, tasks, fn):
        result = {p: fn(p) for p in PROGRAMS}
        rows.append((label, tasks, result))
        print(f"  {label:<44} chain {1e6 * result['chain']:9.2f} us   "
              f"wide {1e6 * result['wide']:9.2f} us", file=sys.stderr, flush=True)

    for policy in POLICIES:
        measure(f"local {policy} (trace, perfmodel off)", n, lambda p, policy=policy: time_runtime(
            lambda: hn.Runtime(devices=devices, policy=policy, perfmodel=False, trace=False,
                               overlap=overlap), p, n, repeat))
    for policy in ("eager", "dmda"):
        measure(f"local {policy} (trace, perfmodel on)", n, lambda p, policy=policy: time_runtime(
            lambda: hn.Runtime(devices=devices, policy=policy, overlap=overlap), p, n, repeat))
    measure("replayed, compiled (trace, perfmodel off)", n, lambda p: time_replayed(
        lambda: hn.Runtime(devices=devices, perfmodel=False, trace=False), p, n, repeat))
    measure("replayed, compiled (trace, perfmodel on)", n, lambda p: time_replayed(
        lambda: hn.Runtime(devices=devices), p, n, repeat))
    measure("replayed, executor (trace, perfmodel off)", n, lambda p: time_replayed(
        lambda: hn.Runtime(devices=devices, perfmodel=False, trace=False,
                           replay_engine="executor"), p, n, repeat))
    measure('executor="dask" (graph build + get)', n, lambda p: time_runtime(
        lambda: hn.Runtime(devices=devices, executor="dask", perfmodel=False, trace=False),
        p, n, slow))
    measure("dask.threaded.get, build_graph graph", n,
            lambda p: time_prebuilt_dask(p, n, slow, workers))
    measure("dask.threaded.get, plain no-op dict", n,
            lambda p: time_plain_dask(p, n, max(slow, repeat), workers))
    if not args.no_distributed:
        import distributed
        nd = args.dist_tasks
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None,
                                      silence_logs=logging.CRITICAL) as cluster, \
                distributed.Client(cluster) as client:
            measure("distributed executor=client (2 procs)", nd, lambda p: time_runtime(
                lambda: hn.Runtime(devices=devices, executor=client, perfmodel=False,
                                   trace=False), p, nd, slow))
            measure("distributed client.get, plain dict", nd,
                    lambda p: time_plain_distributed(client, p, nd, slow))

    by_label = {label: result for label, _, result in rows}
    width = max(len(label) for label, _, _ in rows)
    print(f"\nmicroseconds per task (best of {repeat} local runs, {slow} Dask runs), "
          f"{workers} workers, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{'configuration':<{width}}  {'tasks':>6}  {'chain':>9}  {'wide':>9}")
    for label, tasks, result in rows:
        print(f"{label:<{width}}  {tasks:>6}  {1e6 * result['chain']:>9.2f}  "
              f"{1e6 * result['wide']:>9.2f}")
    ratios = {}
    print("\nratios (dask / local, per task)")
    for local in ("local eager (trace, perfmodel off)", "local dmda (trace, perfmodel off)"):
        for dask_label in ('executor="dask" (graph build + get)',
                           "dask.threaded.get, build_graph graph",
                           "dask.threaded.get, plain no-op dict"):
            r = {p: by_label[dask_label][p] / by_label[local][p] for p in PROGRAMS}
            ratios[f"{dask_label} / {local}"] = r
            print(f"  {dask_label} / {local}: chain {r['chain']:.1f}x, wide {r['wide']:.1f}x")
    if args.json:
        import dask
        doc.update({"dask": dask.__version__,
                    "us_per_task": {label: {p: 1e6 * s for p, s in result.items()}
                                    for label, _, result in rows},
                    "ratios": ratios})
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
