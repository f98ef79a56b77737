"""The granularity study: images/s, worker utilisation, tasks and runtime overhead
per step against the granularity g, hetero_nn next to PyTorch in the same run.

The sweep is granularity (``--granularities``, default 1 2 4 8) x batch size
(``--batches``, 16 64 256) x image size (``--sizes``, 28 64 128 256: synthetic
standard-normal SxS images, labels drawn uniformly from 10 classes) x workers
(``--workers``, 1 2) x fusion (``--fuse``, on off) for these built-in models, whose
convolutional part follows the input and whose dense layer takes its size from it:

- ``dahl-basic`` on 1xSxS (one 3x3 convolution with 4 channels, pooling, dense);
- ``lenet5`` on 1xSxS (two 5x5 convolutions, 6 and 16 channels, three dense layers);
- ``cifar-small`` on 3xSxS (two 3x3 convolutions, 32 and 64 channels, one dense).

A group is one (model, image size, batch, workers): PyTorch's twin with as many
threads as hetero_nn has workers, and hetero_nn at every g <= batch, fused and not,
timed by ``benchmarks/step_timing.py`` (the code ``bench_training.py`` uses): warm-up
steps, then interleaved rounds, medians (SGD with momentum, float32, ``dmda``,
replay). Configurations are bounded two ways, each recorded with its reason in the
JSON's ``skipped``:

- ``--max-pixels`` (default 2**20): a batch's pixels (batch x C x S x S) above it are
  not run, so the default sweep stays to about 10 minutes on 2 cores; ``--full`` lifts
  it and takes more rounds;
- ``--max-memory-gib`` (default 4): an estimate of what a configuration holds
  (activations, their gradients, convolution unfold buffers, for the whole batch) above
  it is not run; a group whose configurations do not fit together is timed in chunks
  that do, PyTorch's twin in every chunk.

Output: ``experiments/results/granularity-<UTC time>.json`` (and a copy as
``granularity-latest.json``) with the git commit, versions, machine, command line,
options, one row per configuration and the skipped ones; and PNG plots in
``--plots`` (default ``docs/granularity/``): ``throughput-<model>.png`` (images/s
against g, one panel per batch and image size), ``utilisation.png`` (workers' mean busy
share of the step), ``tasks.png`` (tasks per step) and ``overhead.png`` (step wall time
minus the busiest worker's kernel time, as a share of the step). ``docs/granularity.md``
says what they show. ``--replot FILE`` redraws the plots of a result file.

Examples::

    python experiments/granularity.py                       # about 10 minutes on 2 cores
    python experiments/granularity.py --full                # the whole grid: hours
    python experiments/granularity.py --models lenet5 --sizes 28 64 --batches 64
    python experiments/granularity.py --replot experiments/results/granularity-latest.json
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from step_timing import Local, Parser, figures, interleave, utilisation_text  # noqa: E402

sys.path.insert(0, str(HERE))
import _results  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402

#: Model -> channels of its input.
MODELS = {"dahl-basic": 1, "lenet5": 1, "cifar-small": 3}
ITEMSIZE = 4  # float32
QUICK = {"rounds": 3, "steps": 2, "warmup": 2, "max_pixels": 2**20}
FULL = {"rounds": 5, "steps": 5, "warmup": 5, "max_pixels": None}


# ---------------------------------------------------------------------------------------
# the grid
# ---------------------------------------------------------------------------------------

def estimated_bytes(model, batch) -> int:
    """What a training step of ``model`` (built) on ``batch`` samples holds, roughly:
    every layer's output and its gradient, plus each convolution's unfolded input."""
    from hetero_nn import Conv2D
    per_sample = math.prod(model.layers[0].input_shape)
    for layer in model:
        per_sample += 2 * math.prod(layer.output_shape)
        if isinstance(layer, Conv2D):
            kh, kw = layer.kernel_size
            per_sample += layer.in_channels * kh * kw * math.prod(layer.output_shape[1:])
    return per_sample * batch * ITEMSIZE


def groups(args):
    """``(model, size, batch, workers, [spec, ...])`` for every group to run, and the
    skipped configurations as ``{"model", "size", "batch", ..., "reason"}``."""
    import hetero_nn as hn
    todo, skipped = [], []
    for name in args.models:
        for size in args.sizes:
            shape = (MODELS[name], size, size)
            model = hn.build_model(name, shape, 10, seed=0)
            for batch in args.batches:
                where = {"model": name, "size": size, "batch": batch}
                pixels = batch * math.prod(shape)
                if args.max_pixels and pixels > args.max_pixels:
                    skipped.append({**where, "reason": f"{pixels} pixels per batch > "
                                                       f"--max-pixels {args.max_pixels}"})
                    continue
                need = estimated_bytes(model, batch)
                if need > args.max_memory_gib * 2**30:
                    skipped.append({**where, "reason": f"estimated {need / 2**30:.1f} GiB per "
                                                       f"configuration > --max-memory-gib "
                                                       f"{args.max_memory_gib}"})
                    continue
                for workers in args.workers:
                    common = {"model": name, "shape": list(shape), "batch": batch}
                    specs = [{"kind": "pytorch", "threads": workers, **common}]
                    for g in args.granularities:
                        if g > batch:
                            skipped.append({**where, "workers": workers, "g": g,
                                            "reason": "g > batch"})
                            continue
                        specs += [{"kind": "hetero_nn", "g": g, "fuse": fuse, "workers": workers,
                                   "cache": args.cache, **common} for fuse in args.fuse]
                    if len(specs) > 1:
                        todo.append((name, size, batch, workers, need, specs))
    return todo, skipped


def run_group(specs, need, args):
    """Time one group (PyTorch first) in chunks that fit ``--max-memory-gib``; one
    summary per spec, in order."""
    per_chunk = max(1, int(args.max_memory_gib * 2**30 // max(need, 1)) - 1)
    torch = Local(specs[0])
    summaries = []
    try:
        for start in range(1, len(specs), per_chunk):
            chunk = []
            try:
                for spec in specs[start:start + per_chunk]:
                    chunk.append(Local(spec))
                interleave([torch, *chunk], args.warmup, args.rounds, args.steps)
                summaries += [runner.summary() for runner in chunk]
            finally:
                for runner in chunk:
                    runner.close()
        return [torch.summary(), *summaries]
    finally:
        torch.close()


def sweep(args) -> tuple[list, list]:
    todo, skipped = groups(args)
    print(f"{len(todo)} groups, {sum(len(g[-1]) for g in todo)} configurations, "
          f"{len(skipped)} skipped", flush=True)
    print(f"{'model':11} {'size':>4} {'batch':>5} {'W':>2} {'configuration':22} {'ms/step':>8} "
          f"{'img/s':>8} {'vs torch':>8} {'tasks':>5} {'overhead':>8} {'busy %':>7}")
    rows = []
    for name, size, batch, workers, need, specs in todo:
        summaries = run_group(specs, need, args)
        torch_step = summaries[0]["step_s"]
        for spec, s in zip(specs, summaries):
            row = {"model": name, "size": size, "shape": spec["shape"], "batch": batch,
                   "workers": workers, "side": spec["kind"], "g": spec.get("g"),
                   "fuse": spec.get("fuse"), **figures(s, batch, torch_step)}
            rows.append(row)
            config = s["config"].replace("hetero_nn ", "").replace("pytorch", "torch")
            over = "" if row["overhead_share"] is None else f"{100 * row['overhead_share']:7.1f}%"
            busy = utilisation_text(row["utilisation"]) if row["utilisation"] else ""
            print(f"{name:11} {size:4d} {batch:5d} {workers:2d} {config:22} {row['step_ms']:8.2f} "
                  f"{row['images_per_s']:8.0f} {row['ratio']:8.2f} {row['tasks'] or '':>5} "
                  f"{over:>8} {busy:>7}", flush=True)
    return rows, skipped


# ---------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------

_WORKER_COLOURS = {1: "tab:blue", 2: "tab:orange"}
_BATCH_COLOURS = {16: "tab:green", 64: "tab:purple", 256: "tab:red"}


def _colour(table, key, index):
    return table.get(key, f"C{(index + 3) % 10}")


def _figure(nrows, ncols, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 1, 2.6 * nrows + 0.8),
                             squeeze=False, sharex=True)
    fig.suptitle(title)
    return fig, axes


def _grid(title, row_keys, col_keys, cell_title, cells, draw, ylabel, gs):
    """A figure of panels ``row_keys`` x ``col_keys``: ``draw(ax, cells(row, col))`` in
    each panel that has rows ("not run" in the others), g on every x axis."""
    fig, axes = _figure(len(row_keys), len(col_keys), title)
    for i, row in enumerate(row_keys):
        for j, col in enumerate(col_keys):
            ax = axes[i][j]
            ax.set_title(cell_title(row, col), fontsize="medium")
            cell = cells(row, col)
            if not cell:
                ax.text(0.5, 0.5, "not run", transform=ax.transAxes, ha="center",
                        va="center", color="grey")
                continue
            draw(ax, cell)
            _g_axis(ax, gs)
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(row_keys) - 1:
                ax.set_xlabel("granularity g")
    return fig


def _g_axis(ax, gs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(gs)
    ax.set_xticklabels([str(g) for g in gs])


def _save(fig, path) -> Path:
    """Write ``fig`` with one legend (every label once) under its panels, then close it."""
    from hetero_nn.fileio import atomic_write
    import matplotlib.pyplot as plt
    handles, labels = [], []
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    width, height = fig.get_size_inches()
    ncol = max(1, min(len(labels), int(width // 2.6)))
    legend_height = (0.3 * math.ceil(len(labels) / ncol) + 0.1) / height
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, legend_height, 1, 1))
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return Path(path)


def _fused_choice(rows):
    """The fusion setting the single-setting plots show: on where it was run."""
    return any(r["fuse"] for r in rows if r["side"] == "hetero_nn")


def _series(rows, **match):
    """Rows matching ``match``, sorted by g, as ``(gs, rows)``."""
    picked = sorted((r for r in rows if all(r[k] == v for k, v in match.items())),
                    key=lambda r: r["g"])
    return [r["g"] for r in picked], picked


def _plural(n, word):
    return f"{n} {word}{'s' * (n > 1)}"


def plot_throughput(rows, model, folder) -> Path:
    mine = [r for r in rows if r["model"] == model]

    def draw(ax, cell):
        for k, workers in enumerate(sorted({r["workers"] for r in cell})):
            colour = _colour(_WORKER_COLOURS, workers, k)
            for fuse in (True, False):
                x, picked = _series(cell, side="hetero_nn", workers=workers, fuse=fuse)
                if picked:
                    ax.plot(x, [r["images_per_s"] for r in picked], marker="o", color=colour,
                            linestyle="-" if fuse else "--",
                            label=f"hetero_nn {_plural(workers, 'worker')} "
                                  f"{'fused' if fuse else 'unfused'}")
            for r in cell:
                if r["side"] == "pytorch" and r["workers"] == workers:
                    ax.axhline(r["images_per_s"], color=colour, linestyle=":",
                               label=f"PyTorch {_plural(workers, 'thread')}")
        ax.set_ylim(bottom=0)

    fig = _grid(f"{model}: images/s against granularity", sorted({r["batch"] for r in mine}),
                sorted({r["size"] for r in mine}), lambda b, s: f"batch {b}, {s}x{s}",
                lambda b, s: [r for r in mine if r["batch"] == b and r["size"] == s],
                draw, "images/s", sorted({r["g"] for r in mine if r["g"]}))
    return _save(fig, Path(folder) / f"throughput-{model}.png")


def _per_model_size(rows, title, value, ylabel, goal, path) -> Path:
    """Rows = models, columns = image sizes; a line per (batch, workers), fusion on;
    ``value(row)`` gives one or more values (one per worker): the line is their mean,
    a bar spans them."""
    fuse = _fused_choice(rows)
    hetero = [r for r in rows if r["side"] == "hetero_nn" and r["fuse"] == fuse]

    def draw(ax, cell):
        for k, batch in enumerate(sorted({r["batch"] for r in cell})):
            for workers in sorted({r["workers"] for r in cell}):
                x, picked = _series(cell, batch=batch, workers=workers)
                values = [value(r) for r in picked]
                mean = [sum(v) / len(v) for v in values]
                spread = None
                if any(len(v) > 1 for v in values):
                    spread = [[m - min(v) for m, v in zip(mean, values)],
                              [max(v) - m for m, v in zip(mean, values)]]
                ax.errorbar(x, mean, yerr=spread, marker="o", capsize=3,
                            color=_colour(_BATCH_COLOURS, batch, k),
                            linestyle="-" if workers > 1 else "--",
                            label=f"batch {batch}, {_plural(workers, 'worker')}")
        ax.axhline(goal, color="grey", linewidth=0.8, linestyle=":",
                   label=f"issue 8's goal ({goal:g}%)")
        ax.set_ylim(0, 105)

    fig = _grid(f"{title} ({'fused' if fuse else 'unfused'})",
                [m for m in MODELS if any(r["model"] == m for r in hetero)],
                sorted({r["size"] for r in hetero}), lambda m, s: f"{m}, {s}x{s}",
                lambda m, s: [r for r in hetero if r["model"] == m and r["size"] == s],
                draw, ylabel, sorted({r["g"] for r in hetero}))
    return _save(fig, path)


def plot_utilisation(rows, folder) -> Path:
    return _per_model_size(
        rows, "workers' busy share of the step: mean, bars from the least to the most busy",
        lambda r: [100 * share for share in r["utilisation"].values()],
        "busy % of the step", 85, Path(folder) / "utilisation.png")


def plot_overhead(rows, folder) -> Path:
    return _per_model_size(
        rows, "overhead: step wall time minus the busiest worker's kernel time",
        lambda r: [100 * r["overhead_share"]], "overhead % of the step", 5,
        Path(folder) / "overhead.png")


def plot_tasks(rows, folder) -> Path:
    hetero = [r for r in rows if r["side"] == "hetero_nn"]

    def draw(ax, cell):
        for fuse in (True, False):
            tasks = {}
            for r in cell:
                if r["fuse"] == fuse:
                    tasks.setdefault(r["g"], r["tasks"])  # the same at every size and batch
            if tasks:
                x = sorted(tasks)
                ax.plot(x, [tasks[g] for g in x], marker="o", linestyle="-" if fuse else "--",
                        color="black", label="fused" if fuse else "unfused")
        ax.set_ylim(bottom=0)

    fig = _grid("tasks per training step", ["tasks"],
                [m for m in MODELS if any(r["model"] == m for r in hetero)],
                lambda _, m: m, lambda _, m: [r for r in hetero if r["model"] == m],
                draw, "tasks per step", sorted({r["g"] for r in hetero}))
    return _save(fig, Path(folder) / "tasks.png")


def plot(document, folder) -> list[Path]:
    """Every PNG of a result document, written into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = document["rows"]
    if not any(r["side"] == "hetero_nn" for r in rows):
        return []
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    return [*(plot_throughput(rows, m, folder) for m in models), plot_utilisation(rows, folder),
            plot_tasks(rows, folder), plot_overhead(rows, folder)]


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------

def parse(argv):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--sizes", nargs="+", type=positive_int, default=[28, 64, 128, 256],
                   metavar="S", help="image sizes (SxS)")
    p.add_argument("--batches", nargs="+", type=positive_int, default=[16, 64, 256])
    p.add_argument("--granularities", nargs="+", type=positive_int, default=[1, 2, 4, 8])
    p.add_argument("--workers", nargs="+", type=positive_int, default=[1, 2],
                   help="hetero_nn CPU workers; PyTorch gets as many threads")
    p.add_argument("--fuse", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--full", action="store_true",
                   help=f"no --max-pixels bound, rounds/steps/warmup {FULL['rounds']}/"
                        f"{FULL['steps']}/{FULL['warmup']} (default {QUICK['rounds']}/"
                        f"{QUICK['steps']}/{QUICK['warmup']})")
    p.add_argument("--max-pixels", type=positive_int,
                   help=f"skip batches with more pixels (default {QUICK['max_pixels']}; "
                        "none with --full)")
    p.add_argument("--max-memory-gib", type=float, default=4.0,
                   help="skip configurations estimated to hold more; time groups in chunks "
                        "that fit (default 4)")
    p.add_argument("--rounds", type=positive_int)
    p.add_argument("--steps", type=positive_int, help="timed steps per round")
    p.add_argument("--warmup", type=positive_int, help="untimed steps per configuration")
    p.add_argument("--results", default=str(HERE / "results"), help="where the JSON goes")
    p.add_argument("--plots", default=str(REPO / "docs" / "granularity"),
                   help="where the PNGs go (default docs/granularity/)")
    p.add_argument("--replot", metavar="JSON", help="only redraw the plots of this result file")
    args = p.parse_args(argv)
    if not args.max_memory_gib > 0:
        p.error(f"--max-memory-gib: expected a positive number, got {args.max_memory_gib}")
    preset = FULL if args.full else QUICK
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.fuse = [f == "on" for f in dict.fromkeys(args.fuse)]
    args.cache = None  # main() gives the run a private performance-model cache
    if args.replot:
        try:
            args.document = json.loads(Path(args.replot).read_text())
            args.document["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--replot {args.replot}: not a granularity result file ({exc})")
        return args
    import hetero_nn as hn
    for name in args.models:
        for size in args.sizes:
            try:
                hn.build_model(name, (MODELS[name], size, size), 10)
            except hn.HeteroNNError as exc:
                p.error(f"--sizes {size}: {exc}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.replot:
        for path in plot(args.document, args.plots):
            print(f"wrote {path}")
        return 0
    if _results.torch_missing("granularity.py", "the study compares with it"):
        return 2

    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hetero_nn-granularity-") as cache:
        args.cache = cache  # a private performance-model cache for the run
        rows, skipped = sweep(args)
    options = {k: v for k, v in vars(args).items() if k not in ("cache", "document")}
    document = {**_results.head("granularity", started, argv, options),
                "wall_seconds": time.perf_counter() - t0, "rows": rows, "skipped": skipped}
    path = _results.write(document, args.results, "granularity", started)
    print(f"wrote {path}")
    for png in plot(document, args.plots):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
