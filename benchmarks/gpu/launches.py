"""Kernel launches, host syncs and transfers per training step on ``cuda-emu``, counted by
the strict CuPy stand-in (``hetero_nn.codelets.strict_xp``), in total and per codelet.

    python benchmarks/gpu/launches.py lenet5 resnet18 [--batch 64] [--granularity 1 2]

One SGD-momentum step (the second: the first builds the graphs and takes momentum's first
step) of each built-in model at the batch size and granularities given, float32, on
``cuda-emu:1``; LeNet-5 on 1x28x28 inputs, the others on 3x32x32. No GPU needed: a count,
not a timing (each whole-operation kernel of ``codelets/kernels_cuda*.py`` counts one).
"""

from __future__ import annotations

import argparse

import numpy as np

import gpu_common  # noqa: F401  (the checkout's hetero_nn on sys.path)
import hetero_nn as hn
from hetero_nn.codelets.strict_xp import checking, counters
from hetero_nn.models import build_model


def step_counts(name: str, batch: int = 64, granularity: int | None = None) -> dict:
    """``{"total": snapshot, "tasks": n, "by_codelet": {name: (launches, tasks)}}``."""
    shape = (1, 28, 28) if name == "lenet5" else (3, 32, 32)
    model = build_model(name, shape, 10, dtype="float32", seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with checking(), hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.01, momentum=0.9), rt, batch_size=batch,
                             granularity=granularity)
        trainer.train_step(x, y)
        counters.reset()
        trainer.train_step(x, y)
        return {"total": counters.snapshot(), "tasks": sum(counters.variants.values()),
                "by_codelet": {k: (c["launches"], counters.variants[k])
                               for k, c in counters.by_codelet.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["lenet5", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--granularity", type=int, nargs="*", default=[None])
    args = parser.parse_args(argv)
    for name in args.models:
        for g in args.granularity:
            counts = step_counts(name, args.batch, g)
            total = counts["total"]
            print(f"{name}, batch {args.batch}, granularity {g or 'default'}: "
                  f"{total['launches']} launches, {total['syncs']} syncs, "
                  f"{total['implicit']} implicit conversions, {total['unordered']} unordered, "
                  f"{total['transfers']} transfers over {counts['tasks']} tasks")
            rows = sorted(counts["by_codelet"].items(), key=lambda kv: -kv[1][0])
            for codelet, (launches, tasks) in rows:
                print(f"  {codelet:30s} {launches:5d} launches  {tasks:4d} tasks")


if __name__ == "__main__":
    main()
