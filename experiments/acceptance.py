"""Acceptance runs: the three trainings the project promises, through the real CLI.

Each run is ``hetero-nn train`` as a user types it, with the CLI's default
optimizer settings (SGD, lr 0.02, momentum 0.9), on the real files of the data
directory:

=============  =============  ===========  ======  ==========  ===========
name           dataset        model        epochs  batch size  target
=============  =============  ===========  ======  ==========  ===========
mnist-lenet5   mnist          lenet5       3       64          >= 98.5 %
fmnist-dahl    fashion-mnist  dahl-basic   3       64          >= 85 %
cifar10-small  cifar10        cifar-small  5       64          >= 45 %
=============  =============  ===========  ======  ==========  ===========

(test accuracy after the last epoch). Every run writes its output directory
(metrics, checkpoints, and with ``--trace`` a Chrome trace plus the per-codelet
statistics) under ``--out`` (a temporary folder unless given: they are large); the script then writes one JSON document with the
git commit, the versions, the machine, every run's command line, config,
per-epoch metrics, wall time and images per second, and whether it met its
target: ``experiments/results/acceptance-<UTC time>.json`` and a copy as
``acceptance-latest.json``. Exit status 0 when every run met its target.

Example (about 10 minutes on 2 cores)::

    python experiments/acceptance.py --data-dir ../shared/datasets
    python experiments/acceptance.py --only cifar10-small --trace
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

RUNS = {
    "mnist-lenet5": dict(dataset="mnist", model="lenet5", epochs=3, batch_size=64, target=0.985),
    "fmnist-dahl": dict(dataset="fashion-mnist", model="dahl-basic", epochs=3, batch_size=64,
                        target=0.85),
    "cifar10-small": dict(dataset="cifar10", model="cifar-small", epochs=5, batch_size=64,
                          target=0.45),
}


def _command(spec, args, out):
    cmd = [sys.executable, "-m", "hetero_nn", "train", "--dataset", spec["dataset"],
           "--model", spec["model"], "--epochs", str(spec["epochs"]),
           "--batch-size", str(spec["batch_size"]), "--out", str(out)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    for option in ("devices", "policy", "granularity", "seed"):
        value = getattr(args, option)
        if value is not None:
            cmd += [f"--{option}", str(value)]
    if args.trace:
        cmd += ["--trace", "--trace-steps", str(args.trace_steps)]
    return cmd


def run_one(name, spec, args) -> dict:
    """Run one training through the CLI and collect what its metrics.json says."""
    out = Path(args.out) / name
    if out.exists():
        shutil.rmtree(out)
    cmd = _command(spec, args, out)
    result, metrics, stderr = _results.train_through_cli(name, cmd, out, spec["target"])
    if metrics is not None:
        history = metrics["epochs"]
        seconds = sum(r["seconds"] for r in history)
        images = sum(r["samples"] for r in history)
        result.update(train_seconds=seconds,
                      images_per_second=images / seconds if seconds else None,
                      images_per_second_last_epoch=history[-1]["images_per_second"]
                      if history else None)
    if args.trace:
        # the CLI prints the per-codelet statistics table on stderr after the summary
        stats = stderr[stderr.find("codelet "):] if "codelet " in stderr else ""
        result["codelet_stats"] = stats
        (out / "trace-stats.txt").write_text(stats)
    return _results.verdict(result)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with mnist/, fashion-mnist/, cifar-10/")
    parser.add_argument("--only", action="append", choices=list(RUNS),
                        help="run only this one (repeatable)")
    parser.add_argument("--devices", help="passed to hetero-nn train (default: its own)")
    parser.add_argument("--policy")
    parser.add_argument("--granularity")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--trace", action="store_true", help="trace each run and keep the "
                                                             "per-codelet statistics")
    parser.add_argument("--trace-steps", type=int, default=200)
    parser.add_argument("--out", help="where the runs' output folders (checkpoints, metrics, "
                                      "traces) go (default: a new temporary folder)")
    parser.add_argument("--results", default=str(HERE / "results"),
                        help="where the summary JSON goes")
    args = parser.parse_args(argv)

    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="hetero_nn-acceptance-")
    started = datetime.now(timezone.utc)
    runs = [run_one(name, RUNS[name], args) for name in (args.only or RUNS)]
    document = {**_results.head("acceptance", started, argv, vars(args)), "runs": runs,
                "all_passed": all(r["passed"] for r in runs)}
    path = _results.write(document, args.results, "acceptance", started)
    print(f"\n{'run':15s} {'test acc':>9s} {'target':>7s} {'wall s':>7s} {'img/s':>7s}  result")
    for r in runs:
        acc = r.get("test_accuracy")
        ips = r.get("images_per_second")
        print(f"{r['name']:15s} {(f'{acc:.2%}' if acc is not None else '-'):>9s} "
              f"{r['target_test_accuracy']:>7.1%} {r['wall_seconds']:>7.0f} "
              f"{(f'{ips:.0f}' if ips else '-'):>7s}  {'PASS' if r['passed'] else 'FAIL'}")
    print(f"wrote {path}")
    return 0 if document["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
