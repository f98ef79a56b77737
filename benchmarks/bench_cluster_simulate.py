"""The simulator against measured steps of the cluster path on this machine (issue 22's goal).

For LeNet-5 (1x28x28) and cifar-small (3x32x32), batches 64 and 256, and
``--cluster local:1`` and ``local:2`` (one core per worker, ``--granularity`` partitions
per worker): calibrates the performance models on each worker's share (real steps on
``cpu:1``, every variant explored), measures this machine's links between processes
(:func:`hetero_nn.training.cluster.planner.measure_network`), predicts the step
(:func:`hetero_nn.training.cluster.planner.predict_cluster_step` on
:func:`~hetero_nn.training.cluster.planner.local_platform`), and measures it (median of
``--steps`` real steps after 4 of warm-up). Goal: every prediction within 20%.

Example (several minutes on 2 idle cores)::

    python benchmarks/bench_cluster_simulate.py --steps 20 --json runs/bench_cluster_simulate.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from hetero_nn.cli.simulate import calibrate
from hetero_nn.training.cluster.planner import (local_platform, measure_cluster_step,
                                        measure_network, predict_cluster_step)

MODELS = {"lenet5": (1, 28, 28), "cifar-small": (3, 32, 32)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--granularity", type=int, default=1, help="partitions per worker")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    network = measure_network()
    print(f"links between processes: {1e6 * network.message_overhead:.0f} us per message, "
          f"{network.bandwidth / 1e9:.2f} GB/s", file=sys.stderr)
    rows = []
    for model, shape in MODELS.items():
        if model not in args.models:
            continue
        for batch in args.batches:
            for w in args.workers:
                share = batch // w
                costs = calibrate(model, shape, share, args.granularity, "cpu:1", "dmda",
                                  steps=8)
                platform = local_platform(w, 1, network)
                p = predict_cluster_step(model, shape, batch, args.granularity * w, platform, w,
                                         costs=costs)
                measured = measure_cluster_step(model, shape, batch, args.granularity * w, w,
                                                steps=args.steps)
                row = {"model": model, "batch": batch, "workers": w,
                       "measured_ms": 1e3 * measured, "predicted_ms": 1e3 * p.step_seconds,
                       "error": (p.step_seconds - measured) / measured,
                       "path": costs.to_json()}
                rows.append(row)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                  for k, v in row.items()}), file=sys.stderr, flush=True)
    print(f"{'model':<12} {'batch':>5} {'cluster':>8} {'measured ms':>12} {'predicted ms':>13} "
          f"{'error':>7}")
    for r in rows:
        print(f"{r['model']:<12} {r['batch']:>5} {'local:' + str(r['workers']):>8} "
              f"{r['measured_ms']:>12.2f} {r['predicted_ms']:>13.2f} {100 * r['error']:>+6.1f}%")
    within = sum(abs(r["error"]) <= 0.2 for r in rows)
    print(f"goal (every prediction within 20%): {within} of {len(rows)} "
          f"{'met' if within == len(rows) else 'NOT met'}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "network": vars(network), "args": vars(args),
                       "load": os.getloadavg(),
                       "median_abs_error": statistics.median(abs(r["error"]) for r in rows)},
                      f, indent=2)


if __name__ == "__main__":
    main()
