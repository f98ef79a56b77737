"""The tables of docs/heterogeneous.md from the rows ``mixed.py`` measured (one or more
runs' ``mixed_rows.jsonl``; a later run's row replaces an earlier one of the same
configuration): per model and batch, the best step per platform and whether both
devices together beat the faster one alone; energy per image beside PyTorch CUDA's (the
GPU board's mean power over the row's window times its median step, per image).

    python benchmarks/gpu/mixed_tables.py RUN5/mixed_rows.jsonl RUN6/mixed_rows.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys

NAMES = {"gpu": "GPU alone", "cpu": "16 cores alone", "mixed": "both"}


def load(paths):
    rows = {}
    for path in paths:
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                key = (r["model"], r["batch"], r["platform"], r.get("policy"),
                       r.get("granularity"), r.get("auto"))
                rows[key] = r
    return list(rows.values())


def label(r):
    return f"{r['policy']}, g={'auto ' if r.get('auto') else ''}{r['granularity']}"


def best_table(rows):
    out = ["| model | batch | GPU alone | 16 cores alone | both (15 cores + GPU) | "
           "both vs the faster alone | PyTorch CUDA |", "|---|---:|---|---|---|---:|---:|"]
    for model, batch in sorted({(r["model"], r["batch"]) for r in rows}):
        mine = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
        best = {}
        for r in mine:
            p = r["platform"]
            if p not in best or r["seconds"] < best[p]["seconds"]:
                best[p] = r
        cells = [f"{best[p]['seconds'] * 1e3:.2f} ms ({label(best[p])})" if p in best else "-"
                 for p in ("gpu", "cpu", "mixed")]
        ratio = "-"
        if all(p in best for p in ("gpu", "cpu", "mixed")):
            alone = min(best["gpu"]["seconds"], best["cpu"]["seconds"])
            ratio = f"{alone / best['mixed']['seconds']:.2f}x"
        torch = f"{best['torch']['seconds'] * 1e3:.2f} ms" if "torch" in best else "-"
        out.append(f"| {model} | {batch} | {' | '.join(cells)} | {ratio} | {torch} |")
    return "\n".join(out)


def energy_table(rows):
    out = ["| model | batch | platform | configuration | ms/step | GPU W (mean) | J/image (GPU board) "
           "| window s |", "|---|---:|---|---|---:|---:|---:|---:|"]
    for r in sorted((r for r in rows if r.get("joules_per_step")),
                    key=lambda r: (r["model"], r["batch"], r["platform"])):
        # the window's mean power times the median step: run 5's windows also held the
        # reading of each step's trace, which is no part of a step
        watts = r["joules_per_step"] * r["steps"] / r["window_seconds"]
        conf = label(r) if r["platform"] != "torch" else "-"
        out.append(f"| {r['model']} | {r['batch']} | {r['devices']} | {conf} | "
                   f"{r['seconds'] * 1e3:.2f} | {watts:.0f} | "
                   f"{watts * r['seconds'] / r['batch']:.5f} | {r['window_seconds']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    args = ap.parse_args(argv)
    rows = load(args.rows)
    print(best_table(rows))
    print()
    print(energy_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
