"""Flat memory: resident set size over a long training run from Python, default Runtime().

The goal (issue 19): over 20,000 ``dahl-basic`` steps with the default ``Runtime()``
(trace on, the default performance models) and a ``Trainer`` driven from Python,
the resident set grows by at most 2 MiB after the first 100 steps. What could grow
is bounded by design: the trace keeps the last ``TRACE_FLUSHES`` flushes
(:mod:`hetero_nn.scheduler.trace.buffer`), the trainer's step cache holds captured
graphs up to a byte budget, performance models hold one entry per footprint.

The run: ``hn.Runtime()`` as a user writes it, ``hn.Trainer(model, runtime=rt,
batch_size=B)`` on the ``synthetic`` dataset (28x28, one channel, 10 classes,
``--samples`` per epoch), ``trainer.fit(train, epochs=...)`` until ``--steps`` steps
are done. Every ``--every`` steps (from ``on_step``) the script reads the resident
set (``VmRSS`` of ``/proc/self/status``), the trace records held in memory, the
captured graphs, and Python's allocated blocks. No timing is taken.

Output: ``experiments/results/memory-flat-<UTC time>.json`` (and
``memory-flat-latest.json``) with the git commit, versions, machine, command line,
the samples, and the verdict: ``growth_bytes`` = RSS at the last sample minus RSS
at step ``--baseline`` (100), ``max_growth_bytes`` the largest such difference, and
``goal_met`` (``max_growth_bytes <= 2 MiB``). Exit status 0 when the goal is met.

Examples::

    python experiments/memory_flat.py                    # the goal: 20,000 steps
    nice python experiments/memory_flat.py --steps 2000  # the trend, on a loaded machine
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import hetero_nn as hn  # noqa: E402
from hetero_nn.fileio import atomic_write_text  # noqa: E402

GOAL_BYTES = 2 << 20


def rss_bytes() -> int:
    """The resident set now (``VmRSS``); the peak (``ru_maxrss``) where /proc is absent."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(args) -> dict:
    train = hn.datasets.load("synthetic", image_size=28, num_samples=args.samples)
    model = hn.build_model("dahl-basic", train.input_shape, train.num_classes, seed=0)
    steps_per_epoch = -(-len(train) // args.batch_size)
    epochs = -(-args.steps // steps_per_epoch)
    samples = []

    class Done(Exception):
        pass

    with hn.Runtime() as rt, hn.Trainer(model, runtime=rt, batch_size=args.batch_size) as trainer:
        def on_step(trainer, _loss):
            step = trainer.global_step
            if step == args.baseline or step % args.every == 0 or step == args.steps:
                gc.collect()
                samples.append({"step": step, "rss_bytes": rss_bytes(),
                                "trace_records": len(rt.trace().records),
                                "graphs": len(trainer.graphs),
                                "graph_bytes": trainer.step_cache.nbytes,
                                "python_blocks": sys.getallocatedblocks()})
                if args.verbose:
                    s = samples[-1]
                    print(f"step {step:6d}  rss {s['rss_bytes'] / 2**20:8.2f} MiB  trace "
                          f"{s['trace_records']:6d}  graphs {s['graphs']}  blocks "
                          f"{s['python_blocks']}", file=sys.stderr, flush=True)
            if step >= args.steps:
                raise Done

        try:
            trainer.fit(train, epochs=epochs, verbose=0, on_step=on_step)
        except Done:
            pass
    base = next(s for s in samples if s["step"] >= args.baseline)
    later = [s for s in samples if s["step"] >= base["step"]]
    growth = later[-1]["rss_bytes"] - base["rss_bytes"]
    max_growth = max(s["rss_bytes"] for s in later) - base["rss_bytes"]
    return {"samples": samples, "baseline_step": base["step"], "growth_bytes": growth,
            "max_growth_bytes": max_growth, "goal_bytes": GOAL_BYTES,
            "goal_met": max_growth <= GOAL_BYTES}


def main(argv=None) -> int:
    from hetero_nn.cli.run_folder import environment, git_commit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--baseline", type=int, default=100,
                        help="growth is measured from this step on (default 100)")
    parser.add_argument("--every", type=int, default=500, help="steps between samples")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8192, help="synthetic samples per epoch")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--quiet", dest="verbose", action="store_false")
    args = parser.parse_args(argv)
    if not 0 < args.baseline < args.steps:
        parser.error("--baseline must be positive and below --steps")
    result = run(args)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    document = {"experiment": "memory-flat", "utc": stamp, "git_commit": git_commit(),
                "command": [sys.executable, *sys.argv], "options": {
                    k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                **environment(), **result}
    args.results.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=1) + "\n"
    for name in (f"memory-flat-{stamp}.json", "memory-flat-latest.json"):
        atomic_write_text(args.results / name, text)
    print(f"RSS growth after step {result['baseline_step']}: {result['growth_bytes'] / 2**20:.3f} MiB "
          f"(max {result['max_growth_bytes'] / 2**20:.3f} MiB; goal <= 2 MiB: "
          f"{'met' if result['goal_met'] else 'NOT met'}) -> {args.results / f'memory-flat-{stamp}.json'}")
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
