"""This session's changes to real models against the configuration before them, in one
process, interleaved: ``cpu:winograd`` pinned for the 3x3 forward passes and input
gradients plus the fused block runs (``layers/fused_blocks.py``), against ``cpu:gemm``
pinned and no fused block runs. Both are hetero_nn on ``Runtime(devices="cpu:W")``, so on a
machine others load the ratio between them moves less than a ratio to PyTorch does.

Per model: training steps (``Trainer.train_step``, SGD with momentum) and inference
(``Trainer.predict``, eval mode), medians of interleaved rounds, float32.

    python benchmarks/bench_models_fusion.py --models resnet18 vgg11-bn --batch 64 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import hetero_nn.layers.fused as fused
from hetero_nn.codelets import pinned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import MODELS, HnConfig, _copy, problem  # noqa: E402

BEFORE = {name: ("cpu:gemm", "cpu:im2col", "cuda")
          for name in ("conv2d_fwd", "conv2d_fwd_nobias", "conv2d_bwd_input")}


@contextlib.contextmanager
def before():
    """The configuration before Winograd and the fused block runs."""
    saved = {name: pinned.PINNED_VARIANTS[name] for name in BEFORE}
    runs, fused.RUNS = fused.RUNS, ()
    pinned.PINNED_VARIANTS.update(BEFORE)
    try:
        yield
    finally:
        pinned.PINNED_VARIANTS.update(saved)
        fused.RUNS = runs


def bench(name, args):
    source, shape, x, y = problem(name, args.batch)
    rows = []
    for infer in (False, True):
        configs = {}
        for label, scope in (("before", before), ("now", contextlib.nullcontext)):
            with scope():
                cfg = HnConfig(_copy(source), shape, args.batch, args.granularity,
                               args.workers, infer)
                for _ in range(args.warmup):
                    cfg.step(x, y)
            configs[label] = (scope, cfg)
        times = {label: [] for label in configs}
        for _ in range(args.rounds):
            for label, (scope, cfg) in configs.items():
                with scope():
                    t0 = time.perf_counter()
                    cfg.step(x, y)
                    times[label].append(time.perf_counter() - t0)
        for _, cfg in configs.values():
            cfg.close()
        med = {label: statistics.median(t) for label, t in times.items()}
        mode = "infer" if infer else "train"
        rows.append((name, mode, med["before"], med["now"]))
        print(f"{name:12s} {args.batch:4d} {mode:6s} before {med['before'] * 1e3:9.1f} ms  "
              f"now {med['now'] * 1e3:9.1f} ms  {med['before'] / med['now']:5.2f}x", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=["resnet18"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--granularity", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    return [row for name in args.models for row in bench(name, args)]


if __name__ == "__main__":
    main()
