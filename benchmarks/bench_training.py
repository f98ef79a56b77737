"""Whole training steps: hetero_nn (fused and unfused, per granularity) against PyTorch.

For each model (``dahl-basic`` and ``lenet5`` on 1x28x28, ``cifar-small`` on 3x32x32)
and each batch size, the same network with the same initial weights is trained by
SGD with momentum (lr 0.01, momentum 0.9) on seeded synthetic batches, float32:

- hetero_nn with ``--workers`` CPU workers (``Runtime(devices="cpu:W")``, BLAS held
  to one thread per worker by the runtime), per granularity, fused (``Sequential.fuse``
  True) and unfused, the performance model active (variants explored during the
  warm-up steps, in a private temporary cache);
- PyTorch with ``torch.set_num_threads(W)``: the same thread count (``--torch-threads``
  adds others; on a loaded machine PyTorch's OpenMP threads suffer most).

Every configuration gets ``--warmup`` steps, then ``--rounds`` interleaved rounds of
``--steps`` timed steps each (round r times every configuration in turn, so load on
a shared machine spreads over all of them); the figures are medians over the
rounds. Reported per configuration: images per second, milliseconds per step, the
ratio to PyTorch, tasks per step and, from the trace, the per-step overhead: step
wall time minus the busiest worker's kernel time (what the runtime costs over the
critical worker), as a share of the step; the JSON adds the kernel time per step of
every (codelet, variant) that ran. Example (a few minutes on 2 cores)::

    python benchmarks/bench_training.py --batches 16 64 --granularities 1 2 4 \
        --rounds 5 --json training.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from twins import torch_twin  # noqa: E402  (the tests' PyTorch twin of a model)

MODELS = {"dahl-basic": (1, 28, 28), "lenet5": (1, 28, 28), "cifar-small": (3, 32, 32)}
LR, MOMENTUM = 0.01, 0.9


class HeteroConfig:
    """One hetero_nn configuration: a runtime, a trainer, its timings."""

    def __init__(self, name, shape, batch, g, fuse, workers, cache):
        import hetero_nn as hn
        self.label = f"hetero_nn g={g} {'fused' if fuse else 'unfused'}"
        self.model = hn.build_model(name, shape, 10, seed=0)
        self.model.fuse = fuse
        self.rt = hn.Runtime(devices=f"cpu:{workers}", policy="dmda", perfmodel=cache)
        self.trainer = hn.Trainer(self.model, optimizer=hn.optim.SGD(lr=LR, momentum=MOMENTUM),
                                  runtime=self.rt, batch_size=batch, granularity=g)
        self.steps, self.overheads, self.tasks = [], [], []
        self.kernels = {}  # (codelet, variant) -> seconds over the timed steps

    def run(self, data, timed=True):
        for x, y in data:
            self.rt.trace(clear=True)
            t0 = time.perf_counter()
            self.trainer.train_step(x, y)
            wall = time.perf_counter() - t0
            if not timed:
                continue
            records = list(self.rt.trace())
            busy = {}
            for r in records:
                busy[r.worker] = busy.get(r.worker, 0.0) + (r.end - r.start)
                key = (r.codelet, r.variant)
                self.kernels[key] = self.kernels.get(key, 0.0) + (r.end - r.start)
            self.steps.append(wall)
            self.overheads.append(wall - max(busy.values(), default=0.0))
            self.tasks.append(len(records))

    def close(self):
        self.trainer.close()
        self.rt.close()


class TorchConfig:
    def __init__(self, model, torch, threads):
        self.label = f"pytorch {threads} thread{'s' if threads > 1 else ''}"
        self.threads = threads
        self.torch = torch
        self.twin = torch_twin(model, "float32")
        self.opt = torch.optim.SGD(self.twin.parameters(), lr=LR, momentum=MOMENTUM)
        self.steps, self.overheads, self.tasks = [], [], []
        self.kernels = {}

    def run(self, data, timed=True):
        torch = self.torch
        torch.set_num_threads(self.threads)
        for x, y in data:
            t0 = time.perf_counter()
            self.opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.twin(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            self.opt.step()
            loss.item()
            if timed:
                self.steps.append(time.perf_counter() - t0)

    def close(self):
        pass


def batches(shape, batch, n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, *shape)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int64)) for _ in range(n)]


def bench(name, batch, args, torch, cache):
    import hetero_nn as hn
    shape = MODELS[name]
    configs = [TorchConfig(hn.build_model(name, shape, 10, seed=0), torch, t)
               for t in args.torch_threads]
    for g in args.granularities:
        if g > batch:
            continue
        for fuse in args.fuse:
            configs.append(HeteroConfig(name, shape, batch, g, fuse, args.workers, cache))
    try:
        warm = batches(shape, batch, args.warmup, 1)
        for c in configs:
            c.run(warm, timed=False)
        rounds = {c.label: [] for c in configs}
        for r in range(args.rounds):
            data = batches(shape, batch, args.steps, 100 + r)
            for c in configs:
                start = len(c.steps)
                c.run(data)
                rounds[c.label].append(statistics.median(c.steps[start:]))
        rows = []
        torch_step = statistics.median(rounds[configs[0].label])  # same threads as workers
        for c in configs:
            step = statistics.median(rounds[c.label])
            over = statistics.median(c.overheads) if c.overheads else None
            rows.append({"model": name, "batch": batch, "config": c.label, "step_ms": 1e3 * step,
                         "images_per_s": batch / step, "ratio": torch_step / step,
                         "tasks": int(statistics.median(c.tasks)) if c.tasks else None,
                         "overhead_ms": None if over is None else 1e3 * over,
                         "overhead_share": None if over is None else over / step,
                         # kernel ms per step by codelet and variant: which variants ran
                         "kernels_ms": {f"{k[0]}/{k[1]}": 1e3 * t / len(c.steps)
                                        for k, t in sorted(c.kernels.items())}})
        return rows
    finally:
        for c in configs:
            c.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batches", nargs="+", type=int, default=[16, 64, 256])
    p.add_argument("--granularities", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--fuse", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--torch-threads", nargs="+", type=int,
                   help="PyTorch thread counts to run (default: --workers); the ratio "
                        "is to the first")
    p.add_argument("--warmup", type=int, default=12,
                   help="untimed steps per configuration (variant exploration, compiles)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--json", help="write the rows, versions and machine here")
    args = p.parse_args(argv)
    args.fuse = [f == "on" for f in args.fuse]
    args.torch_threads = args.torch_threads or [args.workers]
    import torch
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-training-") as cache:
        print(f"{'model':12} {'batch':>5} {'configuration':26} {'ms/step':>8} {'img/s':>9} "
              f"{'vs torch':>8} {'tasks':>5} {'overhead':>9}")
        for name in args.models:
            for batch in args.batches:
                for row in bench(name, batch, args, torch, cache):
                    rows.append(row)
                    over = ("" if row["overhead_share"] is None
                            else f"{100 * row['overhead_share']:8.1f}%")
                    tasks = "" if row["tasks"] is None else row["tasks"]
                    print(f"{row['model']:12} {row['batch']:5d} {row['config']:26} "
                          f"{row['step_ms']:8.2f} {row['images_per_s']:9.0f} "
                          f"{row['ratio']:8.2f} {tasks:>5} {over:>9}", flush=True)
    if args.json:
        import hetero_nn
        doc = {"command": " ".join([sys.executable, *sys.argv]), "rows": rows,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "load": os.getloadavg()},
               "versions": {"python": platform.python_version(), "numpy": np.__version__,
                            "torch": torch.__version__, "hetero_nn": hetero_nn.__version__}}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
