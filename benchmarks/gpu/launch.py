"""The per-task cost of a replayed graph of small GPU kernels against CUDA's own launch
cost (issue 31).

``N`` tiny kernels (``x += 1`` on a few floats, one launch each) three ways, on
``cuda:0`` (or ``cuda-emu`` without a GPU):

- ``cupy``: raw CuPy, ``N`` launches on the current stream, then one synchronize;
- ``replay``: the same ``N`` as hetero_nn tasks (a chain on one handle, and ``N``
  independent handles), captured once with ``rt.capture()`` and replayed;
- ``submit``: the same tasks submitted each time (dependency inference, task objects).

Printed per way: microseconds per kernel (median of ``--repeats`` timed rounds after
a warm-up); the replayed graph's cost per task less CuPy's per launch is what the
runtime adds to each task.

    python3 benchmarks/gpu/launch.py [--quick] [--tasks 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import gpu_common as gc
import hetero_nn as hn
from hetero_nn.codelets.xp import array_module


def _add_one_ref(x):
    x += 1


def _add_one_cuda(x):
    xp = array_module(x)
    xp.add(x, 1, out=x)


ADD_ONE = hn.Codelet("launch_add_one", modes=(hn.RW,),
                     variants={"ref": _add_one_ref, "cuda": _add_one_cuda})


def timed(fn, repeats):
    fn()  # warm-up: compiles, binds, first touch
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def raw_cupy(cp, n, repeats):
    x = cp.zeros(16, np.float32)

    def run():
        for _ in range(n):
            cp.add(x, 1, out=x)
        cp.cuda.get_current_stream().synchronize()
    return timed(run, repeats)


def runtime_ways(spec, n, repeats, chain):
    """``(replay seconds, submit seconds)`` for ``n`` tasks on ``spec``."""
    with hn.Runtime(devices=spec, policy="eager", perfmodel=False, trace=False) as rt:
        if chain:
            handles = [rt.register(np.zeros(16, np.float32))] * n
        else:
            handles = [rt.register(np.zeros(16, np.float32)) for _ in range(n)]

        def submit():
            for h in handles:
                rt.submit(ADD_ONE, h)
            rt.wait()
        submitted = timed(submit, repeats)
        with rt.capture() as graph:
            for h in handles:
                rt.submit(ADD_ONE, h)
        rt.wait()

        def replay():
            graph.replay()
            rt.wait()
        replayed = timed(replay, repeats)
    return replayed, submitted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 tasks, 2 rounds (CI's dry run)")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    checks = gc.Checks("launch")
    cp = gc.gpu()
    spec = gc.device_specs(cp)["gpu"]
    n, repeats = (100, 2) if args.quick else (args.tasks, args.repeats)
    base = raw_cupy(cp, n, repeats) / n if cp is not None else None
    print(f"# {n} tiny kernels on {spec}; us per kernel (median of {repeats} rounds)")
    print("| way | graph | us per kernel | added per task vs raw CuPy |")
    print("|---|---|---:|---:|")
    if base is not None:
        print(f"| raw CuPy launch | - | {base * 1e6:.2f} | - |")
    for chain in (True, False):
        graph = "chain on one handle" if chain else f"{n} independent handles"
        try:
            replayed, submitted = runtime_ways(spec, n, repeats, chain)
        except Exception as exc:
            checks.line("FAIL", graph, f"raised {type(exc).__name__}: {exc}")
            continue
        for way, sec in (("hetero_nn replay", replayed), ("hetero_nn submit", submitted)):
            added = f"{(sec / n - base) * 1e6:.2f}" if base is not None else "-"
            print(f"| {way} | {graph} | {sec / n * 1e6:.2f} | {added} |", flush=True)
        checks.line("PASS", graph, "measured")
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
