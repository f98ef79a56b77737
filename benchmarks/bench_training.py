"""Whole training steps: hetero_nn (fused and unfused, per granularity) against PyTorch.

For each model (``dahl-basic`` and ``lenet5`` on 1x28x28, ``cifar-small`` on 3x32x32;
``--image-size S`` makes the images SxS with the model's channels, e.g. 1x512x512) and
each batch size, the same network with the same initial weights is trained by SGD with
momentum (lr 0.01, momentum 0.9) on seeded synthetic batches, float32:

- hetero_nn with ``--workers`` CPU workers (``Runtime(devices="cpu:W")``, BLAS held
  to one thread per worker by the runtime), per granularity, fused (``Sequential.fuse``
  True) and unfused, the performance model active (in a private temporary cache);
- PyTorch with ``torch.set_num_threads(W)``: the same thread count (``--torch-threads``
  adds others; on a loaded machine PyTorch's OpenMP threads suffer most).

Every configuration gets ``--warmup`` steps, then ``--rounds`` interleaved rounds of
``--steps`` timed steps each (round r times every configuration in turn, so load on
a shared machine spreads over all of them); the figures are medians over the
rounds. Reported per configuration: images per second, milliseconds per step, the
ratio to PyTorch, tasks per step, from the trace the per-step overhead (step wall
time minus the busiest worker's kernel time: what the runtime costs over the
critical worker) as a share of the step, and each worker's busy share of the step
(``busy %``, one figure per worker); the JSON adds the kernel time per step of every
(codelet, variant) that ran. ``--rss`` runs every configuration in a process of its
own (still interleaved, round by round; PyTorch's process never imports hetero_nn)
and adds its peak RSS (``ru_maxrss``, MiB). The measuring code is
``benchmarks/step_timing.py``. Examples (a few minutes on 2 cores)::

    python benchmarks/bench_training.py --batches 16 64 --granularities 1 2 4 \
        --rounds 5 --json training.json
    python benchmarks/bench_training.py --models dahl-basic --image-size 512 --batches 100 \
        --granularities 1 2 4 --fuse on --rss --warmup 3 --steps 3
"""

from __future__ import annotations

import os
import sys
import tempfile

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timing import (Local, Parser, Remote, figures, interleave,  # noqa: E402
                         save_twin, utilisation_text)

from hetero_nn.cli.options import positive_int  # noqa: E402

MODELS = {"dahl-basic": (1, 28, 28), "lenet5": (1, 28, 28), "cifar-small": (3, 32, 32)}


def model_shape(name, image_size):
    """The model's native input shape, or its channels at ``image_size`` x ``image_size``."""
    channels, height, width = MODELS[name]
    return (channels, image_size, image_size) if image_size else (channels, height, width)


def bench(name, batch, args, cache):
    """Time every configuration of one (model, batch); one row per configuration."""
    shape = model_shape(name, args.image_size)
    common = {"model": name, "shape": list(shape), "batch": batch}
    specs = [{"kind": "pytorch", "threads": t, **common} for t in args.torch_threads]
    for g in args.granularities:
        if g > batch:
            continue
        for fuse in args.fuse:
            for policy in args.policies:
                specs.append({"kind": "hetero_nn", "g": g, "fuse": fuse, "policy": policy,
                              "workers": args.workers, "cache": cache, **common})
    if args.rss:
        twin = save_twin(specs[0], os.path.join(cache, f"twin-{name}.pt"))
        for spec in specs:
            if spec["kind"] == "pytorch":
                spec["twin"] = twin
    runners = []
    try:
        for spec in specs:
            runners.append((Remote if args.rss else Local)(spec))
        interleave(runners, args.warmup, args.rounds, args.steps)
        summaries = [r.summary() for r in runners]
    finally:
        for r in runners:
            r.close()
    torch_step = summaries[0]["step_s"]  # same threads as workers
    rows = []
    for s in summaries:
        row = {"model": name, "shape": list(shape), "batch": batch,
               **figures(s, batch, torch_step)}
        if args.rss:
            row.update(peak_rss_mib=s["peak_rss_mib"], setup_rss_mib=s["setup_rss_mib"])
        rows.append(row)
    return rows


def format_row(row) -> str:
    over = "" if row["overhead_share"] is None else f"{100 * row['overhead_share']:8.1f}%"
    tasks = "" if row["tasks"] is None else row["tasks"]
    busy = utilisation_text(row["utilisation"]) if row["utilisation"] else ""
    text = (f"{row['model']:12} {row['batch']:5d} {row['config']:30} {row['step_ms']:8.2f} "
            f"{row['images_per_s']:9.0f} {row['ratio']:8.2f} {tasks:>5} {over:>9} {busy:>7}")
    if "peak_rss_mib" in row:
        text += f" {row['peak_rss_mib']:8.0f}"
    return text


def main(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batches", nargs="+", type=positive_int, default=[16, 64, 256])
    p.add_argument("--granularities", nargs="+", type=positive_int, default=[1, 2, 4])
    p.add_argument("--fuse", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--policies", nargs="+", default=["dmda"],
                   choices=["eager", "random", "ws", "dmda", "heft"],
                   help="hetero_nn's scheduling policies (a row each; default dmda)")
    p.add_argument("--torch-threads", nargs="+", type=positive_int,
                   help="PyTorch thread counts to run (default: --workers); the ratio "
                        "is to the first")
    p.add_argument("--image-size", type=positive_int, metavar="S",
                   help="synthetic SxS images with the model's channels (default: the "
                        "model's own 28x28 or 32x32)")
    p.add_argument("--rss", action="store_true",
                   help="every configuration in a process of its own; report its peak RSS")
    p.add_argument("--warmup", type=positive_int, default=12,
                   help="untimed steps per configuration (compiles, capture)")
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per round")
    p.add_argument("--json", help="write the rows, commit, versions and machine here")
    args = p.parse_args(argv)
    args.fuse = [f == "on" for f in args.fuse]
    args.torch_threads = args.torch_threads or [args.workers]
    try:
        import torch  # noqa: F401  (both sides are needed)
    except ImportError:
        p.error("PyTorch is not installed; this benchmark compares with it")
    import hetero_nn as hn
    for name in args.models:
        try:
            hn.build_model(name, model_shape(name, args.image_size), 10)
        except hn.HeteroNNError as exc:
            p.error(f"--image-size {args.image_size}: {exc}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-training-") as cache:
        print(f"{'model':12} {'batch':>5} {'configuration':30} {'ms/step':>8} {'img/s':>9} "
              f"{'vs torch':>8} {'tasks':>5} {'overhead':>9} {'busy %':>7}"
              + (f" {'peak MiB':>8}" if args.rss else ""))
        for name in args.models:
            for batch in args.batches:
                for row in bench(name, batch, args, cache):
                    rows.append(row)
                    print(format_row(row), flush=True)
    if args.json:
        write_json(args.json, rows)
    return 0


def write_json(path, rows):
    import json

    from hetero_nn.cli.run_folder import environment
    from hetero_nn.fileio import atomic_write_text
    doc = {"command": " ".join([sys.executable, *sys.argv]), "rows": rows, **environment()}
    doc["machine"].update(cpus=os.cpu_count(), load=os.getloadavg())
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
