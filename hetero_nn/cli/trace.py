"""``hetero-nn trace``: read a run's trace, as tables, a Gantt chart, a DAG, a Perfetto file.

::

    hetero-nn train --epochs 1 --out runs/quick --trace --trace-steps 3
    hetero-nn trace runs/quick                       # workers' utilisation
    hetero-nn trace runs/quick --gantt gantt.png --stats --links
    hetero-nn trace runs/quick/trace.json --dot dag.dot --perfetto perfetto.json
    hetero-nn trace runs/quick --roofline              # GFLOP/s per codelet, share of sgemm

``PATH`` is a run folder (its ``trace.json``) or a trace file: the Chrome trace
``train --trace`` writes, or a :meth:`Trace.to_json <hetero_nn.scheduler.trace.Trace.to_json>`
file. Without an action it prints the workers' utilisation.

This module also owns what ``train --trace`` records (:class:`StepTraces`): the task
and copy records of the run's last ``--trace-steps`` training steps (and of the
validation pass that ends the run), written as one Chrome trace whatever way the
session ends (completed, interrupted, failed), so a resumed run leaves the trace of
its own steps; the file says which global steps it covers (``global_steps``) and how
many of its records are theirs (``step_tasks``: the validation pass's come after).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from pathlib import Path

from ..errors import ConfigError
from ..scheduler.trace.views import Trace
from .roofline import (codelet_flops, format_roofline, roofline_rows, sgemm_rate,
                       step_records, step_sums)

__all__ = ["StepTraces", "TRACE_NAME", "add_parser", "command", "describe", "read"]

TRACE_NAME = "trace.json"


class StepTraces:
    """The traces of a run's last ``keep`` training steps (0: every step), for ``--trace``."""

    def __init__(self, keep: int, workers: list[str]):
        self.steps: deque = deque(maxlen=keep or None)
        self.workers = list(workers)
        self.tail = None

    def add(self, global_step: int, trace) -> None:
        """The records of training step ``global_step`` (1-based, counted over the run)."""
        self.steps.append((global_step, trace))

    def end(self, trace) -> None:
        """The records after the last step (the validation pass that ends the run)."""
        self.tail = trace

    def merged(self):
        """One Trace of every step kept (and the tail), with ``global_steps`` metadata."""
        parts = [t for _, t in self.steps] + ([self.tail] if self.tail is not None else [])
        trace = Trace([r for t in parts for r in t.records], self.workers,
                      transfers=[c for t in parts for c in t.transfers])
        if self.steps:
            trace.metadata["global_steps"] = [self.steps[0][0], self.steps[-1][0]]
            trace.metadata["step_tasks"] = sum(len(t.records) for _, t in self.steps)
        trace.metadata["validation"] = self.tail is not None
        return trace

    def write(self, folder):
        """Write :meth:`merged` to ``folder/trace.json``; returns the trace written."""
        trace = self.merged()
        trace.to_chrome(Path(folder) / TRACE_NAME, metadata=trace.metadata)
        return trace


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``trace`` to the subcommands ``sub``."""
    p = sub.add_parser("trace", help="read a run's trace: utilisation, statistics, Gantt chart",
                       description="Read the trace of a run folder (train --trace --out DIR) "
                                   "or a trace file. Without an action: the workers' "
                                   "utilisation.")
    p.add_argument("path", metavar="PATH", help="a run folder or a trace file")
    p.add_argument("--gantt", metavar="FILE.png", help="write a Gantt chart (PNG)")
    p.add_argument("--stats", action="store_true",
                   help="print the time per codelet and variant")
    p.add_argument("--links", action="store_true",
                   help="print the bytes copied per link between memory nodes")
    p.add_argument("--dot", metavar="FILE", help="write the executed DAG as Graphviz DOT")
    p.add_argument("--perfetto", metavar="FILE",
                   help="write a Chrome trace JSON (ui.perfetto.dev, chrome://tracing)")
    p.add_argument("--roofline", action="store_true",
                   help="print each codelet's GFLOP/s and its share of this machine's sgemm "
                        "rate on one thread (FLOPs from the run's model, time from the trace), "
                        "then the convolutions' forward and backward sums over the steps")
    p.add_argument("--window", type=_window, metavar="START:END",
                   help="the Gantt chart shows these milliseconds since the first submit")
    p.add_argument("--title", help="a title line above the Gantt chart")
    return p


def _window(text):
    start, sep, end = text.partition(":")
    try:
        lo, hi = float(start or 0), float(end)
    except ValueError:
        lo = hi = float("nan")
    if not sep or not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"expected START:END in milliseconds with "
                                         f"0 <= START < END, got {text!r}")
    return lo, hi


def read(path):
    """The trace at ``path`` (a run folder or a trace file), and the run folder or None."""
    path = Path(path)
    folder = None
    if path.is_dir():
        folder, path = path, path / TRACE_NAME
        if not path.is_file():
            raise ConfigError(f"{folder}: no {TRACE_NAME} (train with --trace --out "
                              f"{folder} to record one)")
    elif not path.is_file():
        raise ConfigError(f"{path}: no such run folder or trace file")
    try:
        return Trace.from_json(path), folder
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def describe(trace, path, folder) -> list[str]:
    """The lines that say what the trace holds, and whether the run went on after it."""
    workers = len(trace.workers)
    lines = [f"{path}: {len(trace)} tasks on {workers} worker{'s' * (workers != 1)}, "
             f"makespan {1e3 * trace.makespan:.3f} ms"]
    steps = trace.metadata.get("global_steps")
    if steps:
        lines[0] += (f", training steps {steps[0]}..{steps[1]}"
                     + (" and the validation pass" if trace.metadata.get("validation") else ""))
        last = _run_step(folder)
        if last is not None and last > steps[1]:
            lines.append(f"note: the run's metrics.json is at global step {last}: this trace is "
                         "from an earlier session (train --resume --trace records a new one)")
    return lines


def _run_step(folder):
    if folder is None or not (Path(folder) / "metrics.json").is_file():
        return None
    try:
        return json.loads((Path(folder) / "metrics.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None


def command(args) -> int:
    """``hetero-nn trace``: the summary, then each table and file asked for."""
    trace, folder = read(args.path)
    shown = folder if folder is not None else args.path
    print("\n".join(describe(trace, shown, folder)))
    acted = False
    if args.stats:
        print(trace.format_stats())
        acted = True
    if args.roofline:
        flops = codelet_flops(folder if folder is not None else Path(args.path).parent)
        rate = sgemm_rate()
        records, covers = step_records(trace)
        rows = roofline_rows(records, flops, rate)
        print(format_roofline(rows, rate, step_sums(rows, rate), covers))
        acted = True
    if args.links:
        print(trace.format_links() if trace.transfers else
              "no copies between memory nodes were recorded")
        acted = True
    for option, write in (("gantt", _gantt), ("dot", lambda t, f, a: t.to_dot(f)),
                          ("perfetto", lambda t, f, a: t.to_chrome(f, metadata=t.metadata))):
        target = getattr(args, option)
        if target is not None:
            print(f"wrote {write(trace, target, args)}", file=sys.stderr)
            acted = True
    if not acted:
        print(trace.format_utilisation())
    return 0


def _gantt(trace, path, args):
    try:
        return trace.gantt(path, title=args.title, window=args.window)
    except ImportError as exc:
        raise ConfigError(f"--gantt: {exc}") from None

