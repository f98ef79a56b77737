"""Plots of the CPU+GPU experiment (issue 32), made on any machine from what
``mixed.py`` wrote on the device: images/s against g per device mix (one panel per
model and batch, a line per platform and policy, the ``"auto"`` choices marked, and the
simulated curve each ``"auto"`` decision predicted over its candidates, dotted), and
the Gantt chart of each kept trace (one step on both devices).

    python benchmarks/gpu/plot_mixed.py RUN/mixed --out docs/gpu_results/plots
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import gpu_common  # noqa: F401  (puts the checkout on the path)
from hetero_nn.scheduler.trace import Trace

STYLE = {"gpu": "tab:green", "cpu": "tab:blue", "mixed": "tab:red"}


def throughput_figure(rows):
    from matplotlib.figure import Figure

    panels = sorted({(r["model"], r["batch"]) for r in rows},
                    key=lambda mb: (mb[0], mb[1]))
    cols = min(3, len(panels))
    fig = Figure(figsize=(5 * cols, 3.6 * math.ceil(len(panels) / cols)))
    for i, (model, batch) in enumerate(panels):
        ax = fig.add_subplot(math.ceil(len(panels) / cols), cols, i + 1)
        mine = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
        for r in mine:
            if r["platform"] == "torch":
                ax.axhline(batch / r["seconds"], color="black", lw=0.8, ls=":",
                           label="PyTorch CUDA")
        for platform in ("gpu", "cpu", "mixed"):
            for policy, ls in (("dmda", "-"), ("heft", "--")):
                pts = sorted((r["granularity"], batch / r["seconds"]) for r in mine
                             if r["platform"] == platform and r["policy"] == policy
                             and not r.get("auto"))
                if pts:
                    ax.plot(*zip(*pts), ls=ls, marker="o", ms=3, color=STYLE[platform],
                            label=f"{platform} {policy}")
                autos = [(r["granularity"], batch / r["seconds"]) for r in mine
                         if r["platform"] == platform and r["policy"] == policy and r.get("auto")]
                for r in mine:  # the auto decision's simulated curve over the candidates
                    d = r.get("decision")
                    if r["platform"] == platform and r.get("policy") == policy and d:
                        pred = sorted((c["granularity"], batch / c["predicted_seconds"])
                                      for c in d["candidates"] if c["fuse"] in (True, None))
                        ax.plot(*zip(*pred), ls=":", color=STYLE[platform], alpha=0.7,
                                label=f"{platform} {policy} simulated (auto's candidates)")
                for g, ips in autos:
                    ax.plot([g], [ips], marker="*" if policy == "dmda" else "P", ms=11,
                            color=STYLE[platform], ls="none",
                            label=f"{platform} {policy} auto")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("granularity g (partitions per batch)")
        ax.set_ylabel("images / s")
        ax.set_title(f"{model}, batch {batch}")
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="mixed.py's --out folder (mixed_rows.jsonl, trace_*.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gantt", default="trace_*.json", help="which traces to chart (a glob)")
    args = ap.parse_args(argv)
    folder, out = Path(args.folder), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in open(folder / "mixed_rows.jsonl") if line.strip()]
    throughput_figure(rows).savefig(out / "images_per_s_vs_g.png", dpi=110)
    print(out / "images_per_s_vs_g.png")
    for path in sorted(folder.glob(args.gantt)):
        png = out / (path.stem.replace("trace_", "gantt_") + ".png")
        Trace.from_json(path).gantt(png, title=f"one step on both devices: {path.stem[6:]}")
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
