"""``hetero-nn perfmodel``: the performance models of this machine, like
``starpu_perfmodel_display``: the history per footprint, the regressions on
problem size and the transfer links (times in microseconds)."""

from __future__ import annotations

import argparse
import sys

from ..tables import format_table
from .options import PROG
from ..scheduler.perfmodel.model import PerfModel


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``perfmodel`` to the subcommands ``sub``."""
    pm = sub.add_parser("perfmodel", help="show the performance models of this machine",
                        description="Show the performance models recorded on this machine "
                                    "(like starpu_perfmodel_display).")
    pm.add_argument("codelet", nargs="?", help="show only this codelet (exit 1 if it has none)")
    pm.add_argument("--cache-dir", help="cache directory (default: $HETERO_NN_CACHE or "
                                        "~/.cache/hetero_nn)")
    pm.add_argument("--list", action="store_true", help="list the codelets that have a model")
    pm.add_argument("--host", help="show another machine's models (default: this one)")
    return pm


def command(args) -> int:
    """``hetero-nn perfmodel``: the performance models, like ``starpu_perfmodel_display``."""
    model = PerfModel(args.cache_dir, hostname=args.host)
    if args.list:
        names = model.codelets()
        print("\n".join(names) if names else f"no performance model yet in {model.directory} "
                                              "(models are recorded when tasks run)")
        return 0
    if args.codelet is not None and not model.entries(args.codelet):
        print(f"{PROG}: error: no performance model for codelet {args.codelet!r} in "
              f"{model.directory} (`hetero-nn perfmodel --list` names those there are)",
              file=sys.stderr)
        return 1
    print(format_perfmodel(model, args.codelet))
    return 0


def format_perfmodel(model, codelet=None) -> str:
    """``model`` (a PerfModel) as text: history per footprint, regressions, transfer links.

    Times in microseconds; the transfer table only when ``codelet`` is None.
    """
    rows = model.entries(codelet)
    parts = []
    if rows:
        parts.append(format_table(
            ["codelet", "variant", "kind", "footprint", "size", "count", "median (us)",
             "mean (us)", "stddev (us)"],
            [[r["codelet"], r["variant"], r["kind"], r["footprint"], f"{r['size']:.6g}",
              str(r["count"]), f"{r['median'] * 1e6:.3f}", f"{r['mean'] * 1e6:.3f}",
              f"{r['stddev'] * 1e6:.3f}"] for r in rows]))
        reg_rows = []
        for group in sorted({(r["codelet"], r["variant"], r["kind"]) for r in rows}):
            fit = model.fit(*group)
            if fit is None:
                reg_rows.append([*group, "-", "-", "-", "-", "need >= 2 distinct sizes"])
            else:
                reg_rows.append([*group, f"{fit.a:.6g}", f"{fit.b:.4f}", f"{fit.c * 1e6:.3f}",
                                 str(fit.points), f"{fit.min_size:.6g} .. {fit.max_size:.6g}"])
        parts.append("regression t = a * size^b + c\n" + format_table(
            ["codelet", "variant", "kind", "a (s)", "b", "c (us)", "points", "sizes"], reg_rows))
    elif codelet is not None:
        parts.append(f"no performance model for codelet {codelet!r} in {model.directory}")
    if codelet is None:
        links = model.transfer_entries()
        if links:
            parts.append("transfers t = latency + bytes / bandwidth\n" + format_table(
                ["src", "dst", "count", "mean bytes", "latency (us)", "bandwidth (GB/s)"],
                [[lk["src"], lk["dst"], str(lk["count"]), f"{lk['mean_bytes']:.6g}",
                  f"{lk['latency'] * 1e6:.3f}", f"{lk['bandwidth'] / 1e9:.3f}"] for lk in links]))
        if not parts:
            parts.append(f"no performance model yet in {model.directory} "
                         "(models are recorded when tasks run)")
    return "\n\n".join(parts)
