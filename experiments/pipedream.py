"""PipeDream's accuracy: LeNet-5 on MNIST trained through the CLI with
``--pipeline-schedule pipedream`` beside the same run synchronous (``1f1b``, whose
weights are those of no pipeline) and without a pipeline.

Each run is ``hetero-nn train --dataset mnist --model lenet5`` with the CLI's default
optimizer (SGD, lr 0.02, momentum 0.9), ``--devices cpu:P --pipeline P
--granularity G`` (the G partitions are the micro-batches: pipedream updates after
each one, from its share of the batch's mean loss, with weights up to P - 1 updates
stale; see docs/pipeline.md), ``--epochs``, ``--batch-size`` and ``--seed`` the same for
every side. The document records each run's test accuracy and loss per epoch and
what its ``metrics.json`` says of the pipeline (the stages, the measured bubble):
``experiments/results/pipedream-<UTC time>.json`` and ``pipedream-latest.json``.
Accuracy is the figure; the machine's load does not change it (the runs are
deterministic from the seed), so it may run beside other work.

Example (about 5 minutes on 2 cores)::

    python experiments/pipedream.py --data-dir ../shared/datasets
    python experiments/pipedream.py --stages 3 --granularity 8 --epochs 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402

SIDES = ("none", "1f1b", "pipedream")


def command(side, args, out) -> list:
    cmd = [sys.executable, "-m", "hetero_nn", "train", "--dataset", "mnist", "--model",
           "lenet5", "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
           "--granularity", str(args.granularity), "--devices", f"cpu:{args.stages}",
           "--seed", str(args.seed), "--out", str(out)]
    if side != "none":
        cmd += ["--pipeline", str(args.stages), "--pipeline-schedule", side]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    return cmd


def run_side(side, args) -> dict:
    out = Path(args.out) / side
    if out.exists():
        shutil.rmtree(out)
    result, metrics, _ = _results.train_through_cli(side, command(side, args, out), out, None)
    if metrics is not None:
        result["pipeline"] = metrics.get("pipeline")
        result["test_accuracy_per_epoch"] = [r.get("test_accuracy") for r in metrics["epochs"]]
    return _results.verdict(result)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with mnist/ (default: the CLI's)")
    parser.add_argument("--stages", type=positive_int, default=2, help="P (default 2)")
    parser.add_argument("--granularity", type=positive_int, default=4,
                        help="micro-batches per batch (default 4)")
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=positive_int,
                        help="train on the first N samples only (a quick check)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--out", help="where the runs' folders go (default: a temporary one)")
    parser.add_argument("--results", default=str(HERE / "results"),
                        help="where the summary JSON goes")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="hetero_nn-pipedream-")
    started = datetime.now(timezone.utc)
    runs = [run_side(side, args) for side in args.sides]
    document = {**_results.head("pipedream", started, argv, vars(args)), "runs": runs}
    path = _results.write(document, args.results, "pipedream", started)
    print(f"\n{'side':10s} {'test acc':>9s} {'bubble':>7s}  per epoch")
    for r in runs:
        acc, pipe = r.get("test_accuracy"), r.get("pipeline") or {}
        bubble = pipe.get("bubble")
        epochs = " ".join(f"{a:.2%}" for a in r.get("test_accuracy_per_epoch") or [] if a)
        print(f"{r['name']:10s} {(f'{acc:.2%}' if acc is not None else '-'):>9s} "
              f"{(f'{bubble:.2f}' if bubble is not None else '-'):>7s}  {epochs}")
    print(f"wrote {path}")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
