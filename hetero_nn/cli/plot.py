"""``hetero-nn plot``: training curves of one or several runs on one figure.

::

    hetero-nn plot runs/sgd runs/adam -o curves.png

Each ``RUN_DIR`` is a ``hetero-nn train --out`` folder; its ``metrics.json`` gives one
record per finished epoch. The figure has three panels side by side, epoch on the
x axis: the loss (training solid, test dashed), the accuracy (the same), and the
training images per second (the warm-up step, kernel compilation, timed apart). A
colour per run, labelled with the folder, model and dataset. A run that has not
finished an epoch is named in one line on stderr and left out; none at all is an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from ..fileio import atomic_write
from ..scheduler.trace.gantt import agg_figure
from .options import PROG

__all__ = ["add_parser", "command", "read_run", "figure"]


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``plot`` to the subcommands ``sub``."""
    p = sub.add_parser("plot", help="plot loss, accuracy and images/s per epoch of runs",
                       description="Plot the training curves of one or several run folders "
                                   "(train --out DIR) on one figure.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (train --out)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png",
                   help="the PNG to write")
    p.add_argument("--title", help="a title above the panels")
    return p


def read_run(folder) -> dict:
    """The ``metrics.json`` of the run folder ``folder`` (ConfigError naming what is wrong)."""
    path = Path(folder) / "metrics.json"
    if not Path(folder).is_dir():
        raise ConfigError(f"{folder}: no such run folder")
    if not path.is_file():
        raise ConfigError(f"{folder}: no metrics.json (a folder written by "
                          f"'{PROG} train --out {folder}' has one)")
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("epochs"), list):
        raise ConfigError(f"{path}: no 'epochs' list: not written by '{PROG} train'")
    return document


def _label(folder, document) -> str:
    config = document.get("config") or {}
    what = ", ".join(str(config[k]) for k in ("model", "dataset") if config.get(k))
    return f"{folder} ({what})" if what else str(folder)


def figure(runs, title=None):
    """The matplotlib Figure of ``runs``: ``[(label, metrics.json document)]``."""
    fig = agg_figure(f"{PROG} plot", figsize=(15, 4.6), dpi=110, layout="constrained")
    loss, accuracy, speed = fig.subplots(1, 3)
    palette = [f"C{i}" for i in range(10)]
    for i, (label, document) in enumerate(runs):
        colour = palette[i % len(palette)]
        epochs = document["epochs"]
        x = [r["epoch"] for r in epochs]
        for axes, key, scale in ((loss, "loss", 1.0), (accuracy, "accuracy", 100.0)):
            axes.plot(x, [r[f"train_{key}"] * scale for r in epochs], color=colour,
                      marker="o", markersize=3, label=f"{label}, train")
            test = [(e, r[f"test_{key}"] * scale) for e, r in zip(x, epochs)
                    if r.get(f"test_{key}") is not None]
            if test:
                axes.plot(*zip(*test), color=colour, linestyle="--", marker="s", markersize=3,
                          label=f"{label}, test")
        rates = [(e, r["images_per_second"]) for e, r in zip(x, epochs)
                 if r.get("images_per_second") is not None]
        if rates:
            speed.plot(*zip(*rates), color=colour, marker="o", markersize=3, label=label)
    for axes, name in ((loss, "loss"), (accuracy, "accuracy (%)"),
                       (speed, "training images/s")):
        axes.set_xlabel("epoch")
        axes.set_title(name)
        axes.grid(alpha=0.3)
        axes.xaxis.get_major_locator().set_params(integer=True)
    speed.set_ylim(bottom=0)
    fig.legend(*loss.get_legend_handles_labels(), loc="outside lower center",
               ncols=min(4, 2 * len(runs)), fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def command(args) -> int:
    """``hetero-nn plot``: read every run first, then draw what has finished epochs."""
    runs = []
    for folder in args.runs:
        document = read_run(folder)
        if not document["epochs"]:
            print(f"{PROG}: {folder}: no finished epoch yet; left out", file=sys.stderr)
            continue
        runs.append((_label(folder, document), document))
    if not runs:
        raise ConfigError("no run given has a finished epoch to plot")
    try:
        fig = figure(runs, title=args.title)
    except ImportError:
        raise ConfigError(f"{PROG} plot needs matplotlib: pip install hetero-nn[plot]") \
            from None
    path = atomic_write(args.output, lambda f: fig.savefig(f, format="png"))
    print(f"wrote {path}", file=sys.stderr)
    return 0
