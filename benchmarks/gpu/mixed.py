"""CPU and GPU together (issue 32): one training step on the CPU cores alone, the GPU
alone and both, under ``dmda`` and ``heft``, at several granularities (float32).

For each model (cifar-small and LeNet-5 at batch 256 by default), platform
(``cpu:N``, ``cuda:0``, ``cpu:N,cuda:0``), policy and granularity ``g``: the median
step time after warm-up steps (the performance model on, so ``dmda``/``heft`` place
by measured costs: the warm-up steps calibrate it), images per second, the share of
tasks each device ran, and bytes moved per step; the best row per platform, and
whether both together beat the faster one alone. With ``--energy`` the GPU's energy
per step is read from NVML (``nvidia-ml-py``) where it is installed. Stops starting
new rows after ``--budget`` seconds.

    python3 benchmarks/gpu/mixed.py [--quick] [--models cifar-small,lenet5] [--batch 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections import Counter

import gpu_common as gc
import hetero_nn as hn


def nvml_energy():
    """A function giving the GPU's energy counter in joules, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
    except Exception:
        return None


def run(name, devices, policy, granularity, batch, steps, energy):
    hn.manual_seed(0)
    model, shape = gc.zoo_model(name)
    model.build(shape, "float32")
    x, y = gc.batch(shape, batch, "float32")
    times = []
    with hn.Runtime(devices=devices, policy=policy) as rt:  # pinned variants, model on
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.01, momentum=0.9), rt, batch_size=batch,
                             granularity=granularity, dtype="float32")
        for _ in range(3):  # warm-up: compiles, buffers, the performance model's samples
            trainer.train_step(x, y)
        seen = len(list(rt.trace()))
        moved0 = getattr(rt.trace(), "bytes_moved", 0)
        joules0 = energy() if energy else None
        for _ in range(steps):
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            times.append(time.perf_counter() - t0)
        joules = (energy() - joules0) / steps if energy else None
        trace = rt.trace()
        share = Counter(r.device for r in list(trace)[seen:])
        moved = (getattr(trace, "bytes_moved", 0) - moved0) / steps
    return statistics.median(times), share, moved, joules


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="LeNet-5, batch 16, g 1, dmda, the GPU alone and mixed (CI's dry run)")
    ap.add_argument("--models", default="cifar-small,lenet5")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--granularities", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--energy", action="store_true")
    args = ap.parse_args(argv)
    checks = gc.Checks("mixed")
    cp = gc.gpu()
    specs = gc.device_specs(cp)
    models = ["lenet5"] if args.quick else args.models.split(",")
    batch = 16 if args.quick else args.batch
    grains = (1,) if args.quick else tuple(int(g) for g in args.granularities.split(","))
    platforms = ("gpu", "mixed") if args.quick else ("gpu", "cpu", "mixed")
    policies = ("dmda",) if args.quick else ("dmda", "heft")
    steps = 2 if args.quick else args.steps
    energy = nvml_energy() if args.energy and cp is not None else None
    t0 = time.perf_counter()
    print("| model | platform | policy | g | ms/step | images/s | tasks per device | "
          "MB moved | J/step (GPU) |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|")
    best = {}
    for name in models:
        for platform in platforms:
            for policy in policies:
                for g in grains:
                    if time.perf_counter() - t0 > args.budget:
                        checks.line("SKIP", f"{name} {specs[platform]} {policy} g={g}",
                                    f"past the {args.budget:.0f} s budget")
                        continue
                    try:
                        sec, share, moved, joules = run(name, specs[platform], policy, g, batch,
                                                        steps, energy)
                    except Exception as exc:
                        checks.line("FAIL", f"{name} {specs[platform]} {policy} g={g}",
                                    f"raised {type(exc).__name__}: {exc}")
                        traceback.print_exc(limit=6)
                        continue
                    key = (name, platform)
                    best[key] = min(best.get(key, float("inf")), sec)
                    print(f"| {name} | {specs[platform]} | {policy} | {g} | {sec * 1e3:.2f} | "
                          f"{batch / sec:.0f} | {dict(share)} | {moved / 1e6:.1f} | "
                          f"{joules if joules is not None else '-'} |", flush=True)
                    checks.line("PASS", f"{name} {specs[platform]} {policy} g={g}", "measured")
        if cp is not None:  # PyTorch CUDA on the same work, for time and energy
            try:
                import speed
                joules0 = energy() if energy else None
                sec = speed.torch_steps(name, batch, steps)
                joules = (energy() - joules0) / (steps + 2) if energy else None
                print(f"| {name} | PyTorch CUDA | - | - | {sec * 1e3:.2f} | {batch / sec:.0f} | - | - | "
                      f"{joules if joules is not None else '-'} |", flush=True)
            except Exception as exc:
                checks.line("FAIL", f"{name} PyTorch CUDA", f"raised {type(exc).__name__}: {exc}")
        if all((name, p) in best for p in ("gpu", "cpu", "mixed")):
            alone = min(best[(name, "gpu")], best[(name, "cpu")])
            print(f"# {name}: best ms/step gpu {best[(name, 'gpu')] * 1e3:.2f}, cpu "
                  f"{best[(name, 'cpu')] * 1e3:.2f}, both {best[(name, 'mixed')] * 1e3:.2f}: both "
                  f"{'FASTER' if best[(name, 'mixed')] < alone else 'not faster'} than the faster "
                  f"alone ({alone / best[(name, 'mixed')]:.2f}x)")
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
