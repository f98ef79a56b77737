"""The README's ``snn-conv`` example, timed: its training step and how long an epoch takes.

The README trains ``snn-conv`` on the whole of MNIST, rate-coded, with::

    hetero-nn train --model snn-conv --time-steps 25 --encoding rate --optimizer adam \\
                    --lr 5e-4 --epochs 1 --out runs/snn-conv

which takes minutes, so the docs test runs it with ``--limit 256`` and a slowdown would
go unseen there. This benchmark runs that very command through the CLI on the first
``--limit`` training images (``--dataset``, ``--data-dir``, ``--devices``: the CLI's
defaults otherwise), one epoch, and reads the run's ``metrics.json``: the steady-state
images per second (the first step, which compiles kernels and captures the step's
graph, is timed apart by the trainer), the step time at the batch size, and the epoch
time that rate gives for the full 60,000 images. It prints one line (and ``--json``
writes it with the git commit, versions, machine and load average): figures from a
machine that others load are slower, so the line carries ``os.getloadavg()``.
Examples::

    python benchmarks/bench_readme_snn.py --data-dir ../shared/datasets
    python benchmarks/bench_readme_snn.py --dataset synthetic --limit 64 --time-steps 2
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timing import Parser  # noqa: E402  (puts the checkout first)

from hetero_nn.cli import main as cli_main  # noqa: E402
from hetero_nn.cli.options import positive_int  # noqa: E402

FULL_EPOCH = 60000  # MNIST's training images: what the README's epoch trains on


def run(args) -> dict:
    """Train the README's command on ``args.limit`` images; the figures of its epoch."""
    with tempfile.TemporaryDirectory() as out:
        argv = ["train", "--model", "snn-conv", "--time-steps", str(args.time_steps),
                "--encoding", "rate", "--optimizer", "adam", "--lr", "5e-4", "--epochs", "1",
                "--dataset", args.dataset, "--limit", str(args.limit), "--devices",
                args.devices, "-q"] + (["--data-dir", args.data_dir] if args.data_dir else [])
        with contextlib.redirect_stdout(io.StringIO()):  # the run's own summary
            status = cli_main([*argv, "--out", out])
        if status != 0:
            raise SystemExit(f"{Path(__file__).name}: the training command failed")
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    (epoch,) = metrics["epochs"]
    rate = epoch["images_per_second"]
    batch = metrics["config"]["batch_size"]
    return {"command": "hetero-nn " + " ".join(argv),
            "images": args.limit, "batch_size": batch, "devices": args.devices,
            "time_steps": args.time_steps, "images_per_second": rate,
            "step_ms": 1e3 * batch / rate if rate else None,
            "warmup_seconds": epoch.get("warmup_seconds"),
            "full_epoch_minutes": FULL_EPOCH / rate / 60 if rate else None,
            "loadavg": list(os.getloadavg()),
            **{k: metrics.get(k) for k in ("git_commit", "versions", "machine")}}


def main(argv=None) -> int:
    p = Parser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", help="folder holding mnist/ (default: the CLI's)")
    p.add_argument("--limit", type=positive_int, default=1280,
                   help="training images to time (default 1280: 20 steps of 64)")
    p.add_argument("--time-steps", type=positive_int, default=25)
    p.add_argument("--devices", default="cpu", help="the CLI's --devices (default: cpu)")
    p.add_argument("--json", help="write the figures, with provenance, to this file")
    args = p.parse_args(argv)
    row = run(args)
    print(f"snn-conv (README): {row['images_per_second']:.0f} img/s, step "
          f"{row['step_ms']:.0f} ms at batch {row['batch_size']} on {row['devices']}, "
          f"T={row['time_steps']}; a full MNIST epoch ~{row['full_epoch_minutes']:.1f} min "
          f"(load average {row['loadavg'][0]:.2f}; timed on {row['images']} images)")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
