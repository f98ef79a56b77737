"""The memory study: arenas against plain per-task allocation, and what recomputation saves,
with PyTorch's step time and peak RSS beside them.

For each built-in model (``--models``) and batch size (``--batches``), these sides train
on the same seeded synthetic batches (``benchmarks/step_timing.py``: SGD with momentum,
float32, ``--workers`` CPU workers, granularity ``--g``, capture and replay), each in a
child process of its own so its peak resident set size is its own:

- ``arena``: the runtime as it is: a step's temporaries laid out once in one region per
  memory node from their lifetimes (``scheduler/lifetimes.py``);
- ``per-task``: the same runtime with ``Runtime(arenas=False)``: every temporary a plain
  allocation of its own, made when its first task runs, dropped after its last;
- ``recompute``: ``arena`` with the model's residual blocks in ``hn.layers.Checkpoint``
  (models without residual blocks have none: the row is left out, with the reason);
- ``pytorch``: PyTorch's twin, as many threads as workers (``--no-torch``: left out).

Per side: the step time (median of interleaved rounds' medians), peak RSS (MiB), the
temporaries' high-water (bytes: the arena's, or the most that per-task arrays held at
once) and the real allocations per step after warm-up (arena blocks, or per-task
arrays: the arena's are 0 once it has grown). Then, in this process, one replayed step
of ``--trace-model`` at the smallest batch with and without recomputation, traced: the
live bytes per memory node over the step (``Trace.live_bytes``).

Output: ``experiments/results/memory-<UTC time>.json`` (and ``memory-latest.json``) with
the provenance, the rows, the recomputation savings, the skipped sides and an energy
reading of the sweep (``null`` with the reason where the machine has no counter); PNGs
in ``--plots`` (default ``docs/memory/``): ``high-water.png`` and ``live-bytes.png``.
``docs/memory.md`` says what they show.

Examples::

    python experiments/memory.py                                   # every model, 3 batches
    python experiments/memory.py --models resnet-small --batches 256 --rounds 5
    python experiments/memory.py --models lenet5 --batches 8 --rounds 1 --steps 1 --warmup 1
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
from _results import SHAPES  # noqa: E402
from step_timing import Parser, Remote, interleave, synthetic_batches  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402

MIB = 2 ** 20


def has_residual_blocks(name) -> bool:
    import hetero_nn as hn
    from hetero_nn.layers import Residual
    return any(isinstance(layer, Residual)
               for layer in hn.build_model(name, SHAPES[name], 10).layers)


def specs(name, batch, args) -> tuple[list, list]:
    """The sides of one (model, batch) and the skipped ones with their reasons."""
    common = {"model": name, "shape": list(SHAPES[name]), "batch": batch}
    hetero = {"kind": "hetero_nn", "g": args.g, "fuse": True, "workers": args.workers,
              "policy": args.policy, "cache": args.cache, **common}
    out = [("arena", hetero), ("per-task", {**hetero, "arenas": False})]
    skipped = []
    if has_residual_blocks(name):
        out.append(("recompute", {**hetero, "checkpoint": True}))
    else:
        skipped.append({**common, "side": "recompute", "reason": "no residual block"})
    if args.no_torch:
        skipped.append({**common, "side": "pytorch", "reason": "--no-torch"})
    else:
        out.append(("pytorch", {"kind": "pytorch", "threads": args.workers, **common}))
    return out, skipped


def sweep(args) -> tuple[list, list]:
    rows, skipped = [], []
    for name in args.models:
        for batch in args.batches:
            sides, skip = specs(name, batch, args)
            skipped += skip
            runners = [Remote(spec) for _, spec in sides]
            try:
                interleave(runners, args.warmup, args.rounds, args.steps)
                summaries = [r.summary() for r in runners]
            finally:
                for r in runners:
                    r.close()
            for (side, spec), s in zip(sides, summaries):
                memory = s.get("memory") or {}
                rows.append({"model": name, "batch": batch, "side": side,
                             "config": s["config"], "step_ms": 1e3 * s["step_s"],
                             "images_per_s": batch / s["step_s"],
                             "peak_rss_mib": s.get("peak_rss_mib"),
                             "setup_rss_mib": s.get("setup_rss_mib"),
                             "high_water": memory.get("high_water"),
                             "allocations_per_step": memory.get("allocations_per_step")})
    return rows, skipped


def savings(rows) -> list[dict]:
    """Per (model, batch) with a ``recompute`` row: its high-water and step time against
    the ``arena`` row's."""
    out = []
    by = {(r["model"], r["batch"], r["side"]): r for r in rows}
    for (model, batch, side), r in by.items():
        base = by.get((model, batch, "arena"))
        if side != "recompute" or base is None:
            continue
        out.append({"model": model, "batch": batch,
                    "high_water_arena": base["high_water"], "high_water_recompute": r["high_water"],
                    "high_water_saved": 1 - r["high_water"] / base["high_water"],
                    "step_time_ratio": r["step_ms"] / base["step_ms"]})
    return out


def live_bytes_of_one_step(name, batch, args) -> dict:
    """``{"arena": {node: [[ms, bytes], ...]}, "recompute": ...}`` of one replayed step."""
    import hetero_nn as hn
    from hetero_nn.layers.recompute import checkpoint_blocks

    out = {}
    for side in ("arena", "recompute"):
        model = hn.build_model(name, SHAPES[name], 10, seed=0)
        if side == "recompute" and not checkpoint_blocks(model)[1]:
            continue
        x, y = next(synthetic_batches(SHAPES[name], batch, 1, 7))
        with (hn.Runtime(devices=f"cpu:{args.workers}", policy=args.policy,
                         perfmodel=args.cache, replay_engine="executor") as rt,
              hn.Trainer(model, runtime=rt, batch_size=batch, granularity=args.g) as trainer):
            trainer.train_step(x, y)  # the capture
            rt.trace(clear=True)
            trainer.train_step(x, y)  # one replay, traced
            trace = rt.trace()
        origin = trace.origin
        out[side] = {node: [[1e3 * (t - origin), int(b)] for t, b in series]
                     for node, series in trace.live_bytes().items()}
    return out


# ---------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------

def plot_high_water(rows, folder) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["batch"]) for r in rows if r["high_water"] is not None})
    sides = [s for s in ("arena", "per-task", "recompute")
             if any(r["side"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups)), 4), constrained_layout=True)
    width = 0.8 / max(len(sides), 1)
    by = {(r["model"], r["batch"], r["side"]): r for r in rows}
    for i, side in enumerate(sides):
        values = [(by.get((m, b, side)) or {}).get("high_water") or 0 for m, b in groups]
        ax.bar([g + i * width for g in range(len(groups))], [v / MIB for v in values],
               width, label=side)
    ax.set_xticks([g + width * (len(sides) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{m}\nbatch {b}" for m, b in groups], fontsize=8)
    ax.set_ylabel("temporaries' high-water (MiB)")
    ax.set_title("Temporaries of one training step: arena, per-task allocation, recomputation")
    ax.legend()
    return _save(fig, folder, "high-water.png")


def plot_live_bytes(live, title, folder) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for side, nodes in live.items():
        for node, series in nodes.items():
            ms = [p[0] for p in series]
            mib = [p[1] / MIB for p in series]
            ax.step(ms, mib, where="post", label=f"{side}, {node}")
    ax.set_xlabel("ms since the step's first task was submitted")
    ax.set_ylabel("live temporaries (MiB)")
    ax.set_title(title)
    ax.legend()
    return _save(fig, folder, "live-bytes.png")


def _save(fig, folder, name) -> Path:
    import matplotlib.pyplot as plt

    from hetero_nn.fileio import atomic_write

    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------

def parse(argv):
    p = Parser(prog="memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--batches", nargs="+", type=positive_int, default=[32, 128, 256])
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--g", type=positive_int, default=2, help="granularity")
    p.add_argument("--policy", default="dmda")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per round")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per side")
    p.add_argument("--trace-model", default="resnet-small", choices=list(SHAPES),
                   help="model of the live-bytes plot (at the smallest batch)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--results", default=str(HERE / "results"), help="where the JSON goes")
    p.add_argument("--plots", default=str(REPO / "docs" / "memory"), help="where the PNGs go")
    args = p.parse_args(argv)
    if args.g > min(args.batches):
        p.error(f"--g {args.g} is larger than the smallest batch {min(args.batches)}")
    return args


def main(argv=None) -> int:
    import tempfile

    from hetero_nn.energy import EnergyMeter

    args = parse(argv)
    if not args.no_torch and _results.torch_missing("memory.py", "give --no-torch to leave it out"):
        return 2
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    meter = EnergyMeter()
    with tempfile.TemporaryDirectory(prefix="hetero_nn-memory-") as cache:
        args.cache = cache
        meter.start()
        rows, skipped = sweep(args)
        energy = meter.stop()
        live = live_bytes_of_one_step(args.trace_model, min(args.batches), args)
    images = sum(r["batch"] * (args.warmup + args.rounds * args.steps) for r in rows)
    options = {k: v for k, v in vars(args).items() if k != "cache"}
    document = {**_results.head("memory", started, argv, options),
                "wall_seconds": time.perf_counter() - t0, "rows": rows,
                "recomputation": savings(rows), "skipped": skipped,
                "live_bytes": {"model": args.trace_model, "batch": min(args.batches),
                               "sides": live},
                "energy": energy.to_json(images)}
    path = _results.write(document, args.results, "memory", started)
    print(f"wrote {path}")
    for png in (plot_high_water(rows, args.plots),
                plot_live_bytes(live, f"{args.trace_model}, batch {min(args.batches)}: one "
                                      f"replayed step", args.plots)):
        print(f"wrote {png}")
    for s in savings(rows):
        print(f"{s['model']} batch {s['batch']}: recomputation saves "
              f"{100 * s['high_water_saved']:.0f}% of the high-water, step time "
              f"x{s['step_time_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
