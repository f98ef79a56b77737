"""The simulator against measured steps (issues 31, 32): each row ``mixed.py`` measured
on the device, replayed offline with the performance models that run calibrated.

For each row of ``mixed_rows.jsonl`` (PyTorch's left out): the same trainer
(``hetero_nn.cli.simulate._trainer``), granularity and policy, captured here and
replayed by :func:`hetero_nn.cli.simulate.simulate_step` on the row's platform
(``cpu:16,cuda:0`` -> 16 CPU workers and one CUDA worker), with the run's models
(``--models DIR``: a performance-model cache whose ``perfmodels/<--hostname>/`` holds
them, e.g. ``benchmarks/models/<gpu name>`` unpacked under ``perfmodels/vm``) and
the per-task costs the row measured on its path. Prints predicted against measured
per row and the error (and, for an ``"auto"`` row, the prediction its decision made on
the device, at the fusion it chose: the offline replay builds the model unfused or fused
as the trainer does by default); ``--json`` writes the rows with
``predicted_seconds_offline`` added.

    python benchmarks/gpu/simulate_rows.py ROWS.jsonl --models CACHE [--hostname vm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback

import gpu_common as gc
from hetero_nn.cli.simulate import simulate_step
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.simulation.machine import Platform
from hetero_nn.simulation.paths import PathCosts


def predict(row, perfmodel) -> float:
    model, shape = gc.model_shape(row["model"])
    c = row["costs"]
    costs = PathCosts(c["path"], c["dispatch_seconds"], c["handoff_seconds"], c["host_seconds"])
    result = simulate_step(model, tuple(shape), row["batch"], row["granularity"],
                           platform=Platform.from_devices(row["devices"]), policy=row["policy"],
                           dtype="float32", costs=costs, perfmodel=perfmodel)
    return result.step_seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows")
    ap.add_argument("--models", required=True, help="the performance-model cache directory")
    ap.add_argument("--hostname", default="vm", help="whose models (the device's host name)")
    ap.add_argument("--json", help="write the rows with predictions here")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in open(args.rows) if line.strip()]
    perfmodel = PerfModel(args.models, hostname=args.hostname, save_every=None)
    print("| model | batch | platform | policy | g | measured ms | predicted ms | error | "
          "auto's own prediction (error) |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    errors, out = [], []
    for row in rows:
        if row.get("platform") == "torch":
            continue
        try:
            row["predicted_seconds_offline"] = sec = predict(row, perfmodel)
        except Exception as exc:
            print(f"# {row['model']} {row['devices']} {row['policy']} g={row['granularity']}: "
                  f"{type(exc).__name__}: {exc}")
            traceback.print_exc(limit=4)
            continue
        err = (sec - row["seconds"]) / row["seconds"]
        errors.append(abs(err))
        out.append(row)
        g = ("auto=" if row.get("auto") else "") + str(row["granularity"])
        own = row.get("predicted_seconds")  # made on the device, at the fusion auto chose
        own = f"{own * 1e3:.2f} ({100 * (own - row['seconds']) / row['seconds']:+.1f}%)" \
            if own else "-"
        print(f"| {row['model']} | {row['batch']} | {row['devices']} | {row['policy']} | {g} | "
              f"{row['seconds'] * 1e3:.2f} | {sec * 1e3:.2f} | {100 * err:+.1f}% | {own} |",
              flush=True)
    if errors:
        within = sum(e <= 0.15 for e in errors)
        print(f"# {len(errors)} rows: median |error| {100 * statistics.median(errors):.1f}%, "
              f"{within} within 15%")
    if args.json:
        with open(args.json, "w") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
