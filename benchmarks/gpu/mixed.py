"""CPU and GPU together (issue 32): training steps on the CPU cores alone, the GPU alone
and both, under ``dmda`` and ``heft``, at ``granularity="auto"`` and at fixed g (float32).

"Both" is ``cpu:N-1,cuda:0`` on N cores: one core drives the GPU, as StarPU reserves
one per GPU (``--mixed-cpus`` to change). The work is larger than a device run's time, so it runs in an order that covers every
model and platform at its most informative point first, and stops starting work after
``--budget`` seconds (a watchdog ends the process at ``--budget`` + 30 s; every row is
on disk as soon as it is measured):

1. per model (in ``--models`` order), per platform (GPU, both, CPU): ``dmda`` at the
   ``"auto"`` choice (``Trainer.tune_granularity`` over ``--grains``: calibrates each
   candidate, predicts each by simulation, measures the choice), or, where a step is
   too slow to calibrate every candidate (``SLOW``), at one fixed g;
2. the same points under ``heft``;
3. the ``--grains`` sweep (``--sweep``: of these models, default all), ``dmda`` then
   ``heft``, both devices first.

``--phases`` gives their order (``1,3,2``: a sweep before the ``heft`` points);
``--no-auto`` puts phase 1 at the ``--fixed`` g everywhere (a run that follows one
whose ``"auto"`` choices are known).

The trainer is the simulator's (``hetero_nn.cli.simulate._trainer``: the model's own
loss, SGD with momentum), so ``benchmarks/gpu/simulate_rows.py`` can replay each row
offline with the calibrated models and the path costs the row measured. Per row:
median step time, images/s, the share of tasks per device, bytes moved, the path's
costs and, with ``--energy``, the GPU's joules per step from NVML over a window of at
least ``--energy-window`` seconds (the first point of each model and platform, and
PyTorch CUDA on the same work). One step of each mixed row is kept as a trace
(``--out``/trace_<model>_<batch>_<policy>_g<g>.json) for its Gantt chart.

    python3 benchmarks/gpu/mixed.py [--quick] [--budget 150] [--energy] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import gpu_common as gc
import hetero_nn as hn
from hetero_nn.cli.simulate import _trainer
from hetero_nn.simulation.paths import PathCosts, step_path

MODELS = "cifar-small:256,dahl-basic-512:100,resnet18:256,cifar-small:1024,resnet18:1024"
SLOW = {("resnet18", "cpu"), ("resnet18", "mixed")}  # fixed g (--fixed), no auto calibration


def nvml_energy():
    """A function giving the GPU's energy counter in joules, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
    except Exception as exc:
        print(f"# NVML energy unavailable: {type(exc).__name__}: {exc}")
        return None


def timed_steps(trainer, x, y, steps, window, energy, rt):
    """``steps`` traced steps (wall seconds, records for the path's costs, bytes moved),
    then, where energy is read, untraced steps for at least ``window`` seconds (reading a
    trace costs host time that is no part of a step): returns the step times (of the
    energy window where there is one), the records, joules per step, the window's
    seconds and the median bytes a step moved between memory nodes."""
    times, runs, moved = [], [], []
    for _ in range(steps):
        rt.trace(clear=True)
        t0 = time.perf_counter()
        trainer.train_step(x, y)
        times.append(time.perf_counter() - t0)
        trace = rt.trace()
        runs.append((times[-1], trace.records))
        moved.append(trace.bytes_moved)
    joules, span = None, 0.0
    if energy and window:
        rt.trace(clear=True)
        plain, joules0, t_start = [], energy(), time.perf_counter()
        while time.perf_counter() - t_start < window:
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            plain.append(time.perf_counter() - t0)
        span = time.perf_counter() - t_start
        joules = (energy() - joules0) / len(plain)
        times = plain
    return times, runs, joules, span, statistics.median(moved)


class Experiment:
    def __init__(self, args, specs, energy, out):
        self.args, self.specs, self.energy, self.out = args, specs, energy, out
        self.t0 = time.perf_counter()
        self.done = set()
        self.step_s = {}          # (model, platform) -> last median step seconds
        self.rows = out / "mixed_rows.jsonl"

    def left(self):
        return self.args.budget - (time.perf_counter() - self.t0)

    def row(self, name, batch, platform, policy, g, auto=False, energy=False):
        key = (name, batch, platform, policy, "auto" if auto else g)
        if key in self.done:
            return
        self.done.add(key)
        if (name, str(batch), platform) in getattr(self, "skip", ()):
            self.checks.line("SKIP", f"{name}/{batch} {self.specs[platform]} {policy} g={g}",
                             "cut beforehand (--skip)")
            return
        est = self.step_s.get((name, batch, platform), 0) * (self.args.steps + 3)
        what = f"{name}/{batch} {self.specs[platform]} {policy} g={'auto' if auto else g}"
        if self.left() <= est or self.left() <= 0:
            self.checks.line("SKIP", what, f"past the {self.args.budget:.0f} s budget "
                             f"({self.left():.0f} s left, ~{est:.0f} s needed)")
            return
        try:
            doc = self.measure(name, batch, platform, policy, g, auto, energy)
        except Exception as exc:
            self.checks.line("FAIL", what, f"raised {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=8)
            return
        self.step_s[(name, batch, platform)] = doc["seconds"]
        with open(self.rows, "a") as f:
            f.write(json.dumps(doc) + "\n")
        share = ", ".join(f"{k} {v}" for k, v in doc["tasks"].items())
        pred = f"{doc['predicted_seconds'] * 1e3:.2f}" if doc.get("predicted_seconds") else "-"
        joules = f"{doc['joules_per_step'] / batch:.4f}" if doc.get("joules_per_step") else "-"
        print(f"| {name} | {batch} | {self.specs[platform]} | {policy} | "
              f"{('auto=' if auto else '') + str(doc['granularity'])} | {doc['seconds'] * 1e3:.2f} | "
              f"{batch / doc['seconds']:.0f} | {share} | {doc['mb_moved']:.1f} | {pred} | "
              f"{joules} |", flush=True)
        self.checks.line("PASS", what, f"{doc['wall']:.1f} s")

    def measure(self, name, batch, platform, policy, g, auto, energy):
        model, shape = gc.model_shape(name)
        spec = self.specs[platform]
        t_start = time.perf_counter()
        with hn.Runtime(devices=spec, policy=policy) as rt:  # the performance model on
            trainer, x, y = _trainer(model, shape, batch, g or 1, "float32", rt)
            decision = None
            if auto:
                trainer.tune_granularity(x, y, candidates=self.grains, per_layer=False)
                decision = trainer.granularity_decision
                g = trainer.granularity
            first = time.perf_counter()
            trainer.train_step(x, y)
            slow = time.perf_counter() - first > 1.0
            for _ in range(0 if slow else 2):  # replay binds, plans again after its second
                trainer.train_step(x, y)
            if platform == "mixed":  # one step of each mixed row, for its Gantt chart
                rt.trace(clear=True)
                trainer.train_step(x, y)
                rt.trace().to_json(self.out / f"trace_{name}_{batch}_{policy}_g{g}.json")
            window = self.args.energy_window if energy and self.energy else 0
            times, runs, joules, span, moved = timed_steps(trainer, x, y, 2 if slow else self.args.steps,
                                                    window, self.energy, rt)
            share = Counter()
            for _, records in runs:
                share.update(r.device for r in records)
            costs = PathCosts.measure(step_path(trainer), [runs])
        doc = {"model": name, "batch": batch, "platform": platform, "devices": spec,
               "policy": policy, "granularity": g, "auto": auto,
               "fuse": getattr(trainer.model, "fuse", None), "seconds": statistics.median(times),
               "steps": len(times), "window_seconds": span, "joules_per_step": joules,
               "tasks": {k: v // len(runs) for k, v in share.items()},
               "mb_moved": moved / 1e6, "costs": costs.to_json(),
               "wall": time.perf_counter() - t_start}
        if decision is not None:
            doc["decision"] = decision.to_json() if hasattr(decision, "to_json") else str(decision)
            doc["predicted_seconds"] = decision.predicted_seconds
            doc["decision_measured_seconds"] = decision.measured_seconds
        return doc

    def torch_row(self, name, batch):
        import torch
        if not torch.cuda.is_available():
            return
        if self.left() <= 0:
            self.checks.line("SKIP", f"{name}/{batch} PyTorch CUDA", "past the budget")
            return
        model, shape = gc.model_shape(name)
        net = hn.to_torch(_built(model, shape)).cuda().train()
        opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
        x, y = gc.batch(shape, batch, "float32")
        x, y = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        joules0 = self.energy() if self.energy else None
        n, t0 = 0, time.perf_counter()
        times = []
        while n < self.args.steps or time.perf_counter() - t0 < self.args.energy_window:
            t1 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t1)
            n += 1
        joules = (self.energy() - joules0) / n if self.energy else None
        sec = statistics.median(times)
        with open(self.rows, "a") as f:
            f.write(json.dumps({"model": name, "batch": batch, "platform": "torch",
                                "devices": "PyTorch CUDA", "seconds": sec, "steps": n,
                                "window_seconds": time.perf_counter() - t0,
                                "joules_per_step": joules}) + "\n")
        print(f"| {name} | {batch} | PyTorch CUDA | - | - | {sec * 1e3:.2f} | {batch / sec:.0f} "
              f"| - | - | - | {joules / batch if joules else '-'} |", flush=True)


def _built(model, shape):
    from hetero_nn.models import build_model
    return build_model(model, shape, dtype="float32", seed=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="cifar-small at batch 16, g 1 and 2, on each platform (CI's dry run)")
    ap.add_argument("--models", default=MODELS, help="name:batch,... in order of priority")
    ap.add_argument("--grains", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--energy", action="store_true")
    ap.add_argument("--energy-window", type=float, default=2.0)
    ap.add_argument("--phases", default="1,2,3", help="the phases, in the order to run them")
    ap.add_argument("--skip", default="",
                    help="configurations cut beforehand, name:batch:platform,... (a step "
                         "known to take seconds: ResNet-18 at 1024 on the cores alone)")
    ap.add_argument("--sweep", help="phase 3 for these (name:batch,...; default: --models)")
    ap.add_argument("--no-auto", action="store_true",
                    help="phase 1 at the fixed g of --fixed everywhere (no auto calibration)")
    ap.add_argument("--fixed", default="gpu=1,mixed=4,cpu=16",
                    help="the g of phase 1 where it does not run auto")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--mixed-cpus", type=int, default=0,
                    help="CPU workers beside the GPU (default: all but one core, which "
                         "drives the GPU, as StarPU reserves one per GPU)")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.grains, args.steps, args.energy_window = "cifar-small:16", "1,2", 2, 0.2
        args.sweep = None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    watchdog = threading.Timer(args.budget + 30, lambda: (print("# watchdog: past the budget",
                                                                flush=True), os._exit(3)))
    watchdog.daemon = True
    watchdog.start()
    cp = gc.gpu()
    specs = gc.device_specs(cp)
    if cp is not None:
        ncpu = int(specs["cpu"].split(":")[1])
        specs["mixed"] = f"cpu:{args.mixed_cpus or max(1, ncpu - 1)},cuda:0"
    exp = Experiment(args, specs, nvml_energy() if args.energy and cp is not None
                     else None, out)
    exp.checks = checks = gc.Checks("mixed")
    exp.grains = [int(g) for g in args.grains.split(",")]
    exp.skip = {tuple(k.split(":")) for k in args.skip.split(",") if k}
    models = [(m.split(":")[0], int(m.split(":")[1])) for m in args.models.split(",")]
    platforms = ("gpu", "mixed", "cpu")
    phases = args.phases.split(",")
    fixed = {k: int(v) for k, v in (kv.split("=") for kv in args.fixed.split(","))}
    sweep = [(m.split(":")[0], int(m.split(":")[1])) for m in args.sweep.split(",")] \
        if args.sweep else models
    print("| model | batch | platform | policy | g | ms/step | images/s | tasks per device | "
          "MB moved | predicted ms (auto) | J/image (GPU) |")
    print("|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|")
    first_g = {}
    for name, batch in models:
        for platform in platforms:
            auto = not (args.no_auto or (name, platform) in SLOW)
            first_g[(name, batch, platform)] = None if auto else fixed[platform]
    for phase in phases:
        if phase == "3":  # dmda's sweep first, both devices first: the most informative
            for name, batch in sweep:
                for policy in ("dmda", "heft"):
                    for platform in ("mixed", "gpu", "cpu"):
                        for g in exp.grains:
                            exp.row(name, batch, platform, policy, g)
            continue
        for name, batch in models:
            if phase == "1":
                for platform in platforms:
                    g = first_g[(name, batch, platform)]
                    exp.row(name, batch, platform, "dmda", g, auto=g is None, energy=True)
                if cp is not None and args.energy:
                    try:
                        exp.torch_row(name, batch)
                    except Exception as exc:
                        checks.line("FAIL", f"{name}/{batch} PyTorch CUDA",
                                    f"raised {type(exc).__name__}: {exc}")
            elif phase == "2":
                for platform in platforms:
                    g = first_g[(name, batch, platform)]
                    exp.row(name, batch, platform, "heft", g, auto=g is None)
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
