"""The Gantt chart stays readable from 1 to 32 workers and 60 codelets (hetero_nn/scheduler/trace/gantt.py).

Readable, as checked on the drawn figure: no matplotlib warning; every worker row at
least a quarter of an inch high, its label clear of its neighbours'; the legend beside
the chart (not over it), inside the figure, one entry per codelet; the time axis in ms;
idle time and copies between memory nodes drawn. Traces of real LeNet-5 and
resnet-small training steps are checked the same way, as PNG files.
"""

import warnings

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import hetero_nn as hn  # noqa: E402
from hetero_nn.scheduler.trace.gantt import IDLE, TRANSFER, gantt_figure  # noqa: E402
from hetero_nn.scheduler.trace.views import TaskRecord, Trace, TransferRecord  # noqa: E402


def synthetic(workers, codelets, tasks=1500, links=1, seed=0):
    """A trace of ``tasks`` random tasks of ``codelets`` codelets on ``workers`` workers."""
    rng = np.random.default_rng(seed)
    names = [f"conv2d_relu_pool_bwd_params_{i:02d}" for i in range(codelets)]
    ws = [f"cpu{i}" for i in range(workers)]
    clock = dict.fromkeys(ws, 0.0)
    records = []
    for t in range(tasks):
        w = ws[t % workers]
        start = clock[w] + rng.exponential(2e-5)
        clock[w] = start + rng.exponential(1e-4)
        records.append(TaskRecord(t, names[t % codelets], "cpu", w, "cpu", "host0",
                                  start, start, start, clock[w]))
    copies = [TransferRecord("host0", f"cuda{j}", 4096, 1e-3 * i, 1e-3 * i + 2e-4)
              for j in range(links) for i in range(4)]
    return Trace(records, ws, copies)


def check_readable(figure, trace):
    """Assert the properties of the module docstring on ``figure`` (the chart of ``trace``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    inside = figure.bbox
    axes = figure.axes[0]
    chart = axes.get_window_extent(renderer)
    rows = len(trace.workers) + len(trace.links())
    assert chart.height / rows >= 0.25 * figure.dpi, "rows thinner than a quarter inch"
    labels = sorted((t.get_window_extent(renderer) for t in axes.get_yticklabels()),
                    key=lambda box: box.y0)
    assert len(labels) == rows
    for below, above in zip(labels, labels[1:]):
        assert below.y1 <= above.y0 + 0.5, "worker labels overlap"
    for box in labels + [axes.title.get_window_extent(renderer),
                         axes.xaxis.label.get_window_extent(renderer)]:
        assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1
        assert inside.y0 - 1 <= box.y0 and box.y1 <= inside.y1 + 1
    assert "ms" in axes.get_xlabel() and "idle" in axes.get_xlabel()
    codelets = {r.codelet for r in trace.records}
    if codelets:
        (legend,) = figure.legends
        box = legend.get_window_extent(renderer)
        assert box.x0 >= chart.x1, "the legend covers the chart"
        assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1
        assert inside.y0 - 1 <= box.y0 and box.y1 <= inside.y1 + 1, "the legend is cut off"
        entries = {t.get_text().rsplit(" ", 1)[0] for t in legend.get_texts()}
        assert entries == codelets
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 7
    colours = {tuple(np.round(c, 3)) for coll in axes.collections for c in coll.get_facecolor()}
    import matplotlib.colors as mc
    assert tuple(np.round(mc.to_rgba(IDLE), 3)) in colours, "idle time is not drawn"
    if trace.transfers:
        assert tuple(np.round(mc.to_rgba(TRANSFER), 3)) in colours, "copies are not drawn"


@pytest.mark.parametrize("workers", [1, 2, 8, 32])
@pytest.mark.parametrize("codelets", [1, 20, 60])
def test_synthetic_traces_stay_readable(workers, codelets):
    trace = synthetic(workers, codelets)
    check_readable(gantt_figure(trace, title=f"{workers} workers, {codelets} codelets"), trace)


def test_the_height_follows_the_workers_and_the_legend_fits_beside():
    heights = [gantt_figure(synthetic(w, 60)).get_size_inches()[1] for w in (1, 8, 16, 32)]
    assert heights == sorted(heights) and heights[-1] > heights[1] > 0
    assert heights[-1] >= 32 * 0.3  # a row per worker, a third of an inch each
    width = gantt_figure(synthetic(32, 60)).get_size_inches()[0]
    assert width < 25, "the legend's columns made the figure too wide to read"


def test_window_zooms_into_milliseconds():
    trace = synthetic(2, 5)
    figure = gantt_figure(trace, window=(1.0, 2.5))
    assert figure.axes[0].get_xlim() == (1.0, 2.5)


def test_empty_trace_draws_a_chart_without_legend():
    trace = Trace([], workers=["cpu0", "cpu1"])
    figure = gantt_figure(trace)
    check_readable(figure, trace)
    assert not figure.legends


def _trained_trace(model, shape, devices, batch, granularity):
    net = hn.build_model(model, shape, 10, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with hn.Runtime(devices=devices, perfmodel=False, trace=True) as rt:
        trainer = hn.Trainer(net, runtime=rt, batch_size=batch, granularity=granularity)
        trainer.train_step(x, y)
        rt.trace(clear=True)  # the first step compiles: keep a steady one
        trainer.train_step(x, y)
        return rt.trace()


@pytest.mark.parametrize("model, shape, devices, batch, g", [
    ("lenet5", (1, 28, 28), "cpu:1,cuda-emu:1", 32, 4),     # with copies between nodes
    ("resnet-small", (3, 16, 16), "cpu:2", 8, 2),
])
def test_gantt_of_real_training_steps(tmp_path, model, shape, devices, batch, g):
    from matplotlib.image import imread

    trace = _trained_trace(model, shape, devices, batch, g)
    assert len({r.codelet for r in trace.records}) >= 15
    figure = gantt_figure(trace, title=model)
    check_readable(figure, trace)
    path = trace.gantt(tmp_path / f"{model}.png", title=model)
    width, height = figure.get_size_inches() * figure.dpi
    rows, columns = imread(path).shape[:2]
    assert abs(rows - height) <= 1 and abs(columns - width) <= 1  # the PNG is that figure


def test_the_longest_codelets_get_distinct_hues_and_the_legend_stays_narrow():
    """Issue 30, item 8: convolution and dense got two near-identical blues, and the
    legend took 40% of the width."""
    import colorsys

    from hetero_nn.scheduler.trace.gantt import _palette, plotting

    colours = [c[:3] for c in _palette(plotting("a test"), 10)]
    hues = [colorsys.rgb_to_hsv(*c)[0] for c in colours[:2]]
    assert min(abs(hues[0] - hues[1]), 1 - abs(hues[0] - hues[1])) > 0.1
    for i, a in enumerate(colours):
        for b in colours[i + 1:]:
            assert np.linalg.norm(np.subtract(a, b)) > 0.25, (a, b)
    assert len(set(_palette(plotting("a test"), 60))) == 60
    figure = gantt_figure(synthetic(2, 20))
    figure.canvas.draw()
    (legend,) = figure.legends
    share = legend.get_window_extent(figure.canvas.get_renderer()).width / figure.bbox.width
    assert share < 0.3, f"the legend takes {share:.0%} of the width"
