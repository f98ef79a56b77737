"""The Gantt chart of a trace: a PNG that stays readable from 1 to 32 workers and 60 codelets.

This module owns :func:`gantt`, :func:`plotting` (the one place the package loads
matplotlib, the optional plot extra, and says how to install it) and :func:`agg_figure`,
behind :meth:`Trace.gantt <hetero_nn.scheduler.trace.Trace.gantt>` and ``hetero-nn trace --gantt``.

Layout policy (sizes in inches, so that nothing depends on matplotlib's layout engines,
whose constrained layout collapsed on wide legends):

- A row per worker, top to bottom in the trace's worker order, each
  ``ROW_INCHES`` high, then a row per memory-node link that copied data
  (``host0 -> cuda0``): the figure's height follows the rows.
- A row's background is grey: what shows through between the tasks is the worker's
  idle time; the label beside the row gives its utilisation (busy share of the
  makespan), or the bytes a link moved.
- One colour per codelet: the codelets that ran longest first, on the 20 colours
  of ``tab20``, then those of ``tab20b`` and ``tab20c`` (60 in all before any repeats),
  each map's hues first and their lighter shades after (the first ten are tab10's, so
  the longest codelets never get two shades of one hue).
  The legend sits beside the chart, one entry per codelet with its share of the
  busy time, in one column (``MAX_LEGEND_COLUMNS``: the figure grows taller rather
  than give the legend the width the chart needs).
- The time axis is in milliseconds since the first submit; ``window=(t0, t1)``
  (ms) zooms in.
"""

from __future__ import annotations

import math
from pathlib import Path

from ...fileio import atomic_write

__all__ = ["agg_figure", "gantt", "gantt_figure", "plotting"]

ROW_INCHES = 0.3            # height of a worker's row
CHART_INCHES = 9.0          # width of the time axis
MIN_CHART_INCHES = 1.2      # height of the chart with few rows
LEGEND_ENTRY_INCHES = 0.19  # height of a legend entry at LEGEND_FONT points
LEGEND_FONT = 7.5
MAX_LEGEND_COLUMNS = 1
TOP, BOTTOM, GAP, RIGHT = 0.55, 0.6, 0.2, 0.15   # margins (inches)
IDLE = "#e6e6e6"
TRANSFER = "#404040"


def plotting(what):
    """matplotlib, with the parts the charts use (Agg, figures, patches, colour maps),
    loaded on first use; without it, an ImportError saying how to install it for
    ``what``. The one place the package loads matplotlib."""
    try:
        # matplotlib: the optional plot extra, and heavy at start-up
        import matplotlib.backends.backend_agg, matplotlib.figure, matplotlib.patches  # noqa: E401
    except ImportError as exc:
        raise ImportError(f"{what} needs matplotlib: pip install hetero-nn[plot]") from exc
    return matplotlib


def agg_figure(what, **kwargs):
    """A matplotlib ``Figure(**kwargs)`` drawn off-screen by Agg (its ``canvas``), for the
    plots of ``what``; without matplotlib, an ImportError saying how to install it."""
    mpl = plotting(what)
    figure = mpl.figure.Figure(**kwargs)
    mpl.backends.backend_agg.FigureCanvasAgg(figure)
    return figure


def _palette(mpl, n):
    """``n`` distinct colours: tab20, then tab20b and tab20c, each hues first (tab20 pairs
    a hue with its lighter shade, the others group four shades), then repeats."""
    colours = [mpl.colormaps[name](hue + shade)
               for name, shades in (("tab20", 2), ("tab20b", 4), ("tab20c", 4))
               for shade in range(shades) for hue in range(0, 20, shades)]
    return [colours[i % len(colours)] for i in range(n)]


def gantt(trace, path, title: str | None = None, window: tuple | None = None) -> Path:
    """Write the Gantt chart of ``trace`` (a Trace) to ``path`` as a PNG (module docstring).

    Parameters
    ----------
    trace : Trace
    path : path-like
    title : str, optional
        A first line above the chart's own (tasks, workers, makespan, utilisation).
    window : (float, float), optional
        The milliseconds since the first submit to show (default: the whole makespan).
    """
    figure = gantt_figure(trace, title, window)
    return atomic_write(path, lambda f: figure.savefig(f, format="png"))


def gantt_figure(trace, title: str | None = None, window: tuple | None = None):
    """The matplotlib Figure :func:`gantt` saves, laid out (its chart is ``axes[0]``)."""
    mpl = plotting("Trace.gantt")

    origin, makespan_ms = trace.origin, 1e3 * trace.makespan
    lo, hi = window if window is not None else (0.0, makespan_ms)
    hi = max(hi, lo + 1e-3)
    busy = {}  # seconds per codelet
    for r in trace.records:
        busy[r.codelet] = busy.get(r.codelet, 0.0) + r.duration
    codelets = sorted(busy, key=lambda c: (-busy[c], c))
    colour = dict(zip(codelets, _palette(mpl, len(codelets))))
    total = math.fsum(busy.values())

    utilisation = trace.utilisation()
    links = trace.links()
    labels = [f"{w}  {100 * utilisation[w]:.0f}%" for w in trace.workers]
    labels += [f"{src} \u2192 {dst}  {_bytes(row['bytes'])}" for (src, dst), row in links.items()]
    rows = len(labels)

    chart_h = max(MIN_CHART_INCHES, ROW_INCHES * rows)
    per_column = max(1, int(chart_h / LEGEND_ENTRY_INCHES))
    columns = min(MAX_LEGEND_COLUMNS, max(1, math.ceil(len(codelets) / per_column)))
    fig_h = TOP + max(chart_h, LEGEND_ENTRY_INCHES * math.ceil(len(codelets) / columns)) \
        + BOTTOM  # a first guess: the legend is measured once drawn
    label_w = 0.1 + 0.075 * max((len(s) for s in labels), default=4)

    figure = agg_figure("Trace.gantt", figsize=(label_w + CHART_INCHES + RIGHT, fig_h), dpi=110)
    canvas = figure.canvas
    axes = figure.add_axes((0, 0, 1, 1))  # placed below, once the legend's width is known

    row_of = {w: i for i, w in enumerate(trace.workers)}
    for i in range(rows):
        axes.broken_barh([(lo, hi - lo)], (i - 0.42, 0.84), facecolors=IDLE, linewidth=0)
    spans: dict = {}
    for r in trace.records:
        spans.setdefault((r.worker, r.codelet), []).append(
            (1e3 * (r.start - origin), 1e3 * r.duration))
    for (worker, codelet), bars in spans.items():
        axes.broken_barh(bars, (row_of[worker] - 0.42, 0.84), facecolors=colour[codelet],
                         linewidth=0)
    link_row = {link: len(trace.workers) + i for i, link in enumerate(links)}
    copies: dict = {}
    for t in trace.transfers:
        copies.setdefault((t.src, t.dst), []).append((1e3 * (t.start - origin),
                                                      1e3 * (t.end - t.start)))
    for link, bars in copies.items():
        axes.broken_barh(bars, (link_row[link] - 0.3, 0.6), facecolors=TRANSFER, linewidth=0)
    if links:
        axes.axhline(len(trace.workers) - 0.5, color="black", linewidth=0.6)

    axes.set_yticks(range(rows), labels, fontsize=8)
    axes.set_ylim(rows - 0.5, -0.5)
    axes.set_xlim(lo, hi)
    axes.set_xlabel("time since the first submit (ms); grey: idle"
                    + ("; dark bars: copies between memory nodes" if links else ""))
    axes.grid(axis="x", alpha=0.4, linewidth=0.5)
    axes.set_axisbelow(True)
    mean = sum(utilisation.values()) / len(utilisation) if utilisation else 0.0
    workers = len(trace.workers)
    heading = (f"{len(trace.records)} tasks on {workers} worker{'s' * (workers != 1)}, makespan "
               f"{makespan_ms:.3f} ms, mean utilisation {100 * mean:.0f}%")
    axes.set_title(f"{title}\n{heading}" if title else heading, fontsize=10)

    legend = None
    if codelets:
        patch = mpl.patches.Patch
        handles = [patch(facecolor=colour[c], label=f"{c} {_share(busy[c], total)}")
                   for c in codelets]
        legend = figure.legend(handles=handles, loc="upper left", ncols=columns,
                               fontsize=LEGEND_FONT, title="codelet, share of busy time",
                               title_fontsize=LEGEND_FONT + 0.5, frameon=False,
                               borderaxespad=0, handlelength=1.2, columnspacing=1.0,
                               bbox_transform=figure.dpi_scale_trans,
                               bbox_to_anchor=(label_w + CHART_INCHES + GAP, fig_h - TOP))
    # Size the figure to what the labels and the legend take, measured once drawn.
    renderer = canvas.get_renderer()
    ticks = [t.get_window_extent(renderer).width for t in axes.get_yticklabels()]
    label_w = 0.15 + max(ticks, default=30) / figure.dpi
    legend_w = legend_h = 0.0
    if legend is not None:
        extent = legend.get_window_extent(renderer)
        legend_w, legend_h = extent.width / figure.dpi, extent.height / figure.dpi
    width = label_w + CHART_INCHES + (GAP + legend_w if legend is not None else 0) + RIGHT
    fig_h = TOP + max(chart_h, legend_h) + BOTTOM
    figure.set_size_inches(width, fig_h)
    axes.set_position((label_w / width, (fig_h - TOP - chart_h) / fig_h,
                       CHART_INCHES / width, chart_h / fig_h))
    if legend is not None:
        legend.set_bbox_to_anchor((label_w + CHART_INCHES + GAP, fig_h - TOP),
                                  transform=figure.dpi_scale_trans)
    return figure


def _share(part, total) -> str:
    if total <= 0:
        return ""
    share = 100 * part / total
    return "<0.1%" if share < 0.05 else f"{share:.1f}%"


def _bytes(n) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
