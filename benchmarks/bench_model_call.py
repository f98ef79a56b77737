"""``model(x)`` before and after captured inference, against PyTorch eager, float32.

Per model and batch, interleaved rounds (each round times every configuration in turn),
medians, on ``Runtime(devices="cpu:W")`` and ``torch.set_num_threads(W)``:

- ``hn model(x)``: the call as it is now, the captured forward graph replayed (one
  partition, :mod:`hetero_nn.layers.forward_graphs`);
- ``hn submitted g=1``: what ``model(x)`` did before, its forward tasks submitted per
  call on one partition (registered batch, dependencies inferred, tasks built): the same
  tasks, so the same bits;
- ``torch eager``: ``module(x)`` under ``torch.no_grad``.

The model is in evaluation mode; both hetero_nn rows give the same outputs as torch to
float32 rounding, and the replayed call the same bits as submitting it.

    python benchmarks/bench_model_call.py --models resnet18-tv resnet18 --batches 64 \\
        --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import hetero_nn as hn
from bench_models import MODELS, problem


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=["resnet18-tv"])
    ap.add_argument("--batches", nargs="+", type=int, default=[64])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.workers)
    out = {"uptime": os.getloadavg(), "workers": args.workers, "rows": []}
    for name in args.models:
        for batch in args.batches:
            source, shape, x, _ = problem(name, batch)
            source.eval()
            model = hn.from_torch(source, shape, dtype="float32").eval()
            with hn.Runtime(devices=f"cpu:{args.workers}") as rt:
                model.bind(rt)

                def submitted():
                    ys = model.forward(rt, [rt.register(x.copy(), name="x")])
                    return np.concatenate([rt.fetch(y, copy=True) for y in ys])

                def eager():
                    with torch.no_grad():
                        return source(torch.from_numpy(x)).numpy()

                configs = {"hn model(x)": lambda: model(x), "hn submitted g=1": submitted,
                           "torch eager": eager}
                outputs = {label: fn() for label, fn in configs.items()}  # warm up
                times = {label: [] for label in configs}
                for _ in range(args.rounds):
                    for label, fn in configs.items():
                        t0 = time.perf_counter()
                        fn()
                        times[label].append(time.perf_counter() - t0)
            ref = statistics.median(times["torch eager"])
            for label, ts in times.items():
                sec = statistics.median(ts)
                err = float(np.abs(outputs[label] - outputs["torch eager"]).max())
                row = {"model": name, "batch": batch, "config": label, "ms": sec * 1e3,
                       "img_s": batch / sec, "vs_torch": ref / sec, "max_abs_diff": err}
                out["rows"].append(row)
                print(f"{name:12s} {batch:4d} {label:18s} {row['ms']:8.1f} ms "
                      f"{row['img_s']:8.1f} img/s {row['vs_torch']:5.2f}x torch  "
                      f"max |diff| {err:.1e}", flush=True)
    out["uptime_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
