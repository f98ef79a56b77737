"""Per-shape CPU times of MobileNetV2's layers, one thread: what ``bench_pointwise.py``
and ``bench_depthwise.py`` share.

- ``cpu_time``: the least of ``repeat`` calls' ``time.thread_time`` (a loaded machine
  inflates it less than wall time);
- ``Network``: a row's cells, each column summed over the network's layers (weighted by
  how many layers have the shape), printed as the last line;
- ``torch_passes``: PyTorch's forward (``torch.no_grad``) and its backward pass (both
  gradients in one autograd call) on the same operands;
- ``eval_chain``: PyTorch's evaluation chain of a layer (convolution, batch norm with
  running statistics, ReLU6 or none) under ``torch.no_grad``, what ``--eval`` times
  against the folded codelets.
"""

from __future__ import annotations

import time


def cpu_time(fn, repeat):
    """The least CPU time of ``repeat`` calls of ``fn`` (after one call not counted)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def load_torch():
    """``torch`` held to one thread, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


class Network:
    """Cells of one row at a time, each column summed over the network's layers."""

    def __init__(self):
        self.totals: dict = {}

    def cell(self, label, keys, times, count):
        """``label: t1 t2 ...`` (ms), the times added ``count`` times into the columns
        ``(label, key)``."""
        for key, t in zip(keys, times):
            self.totals[(label, key)] = self.totals.get((label, key), 0.0) + count * t
        return f"{label}: " + " ".join(f"{1e3 * t:5.2f}" for t in times)

    def line(self):
        return "network (ms): " + ", ".join(f"{v} {k} {1e3 * t:.1f}"
                                           for (v, k), t in self.totals.items())


def torch_passes(torch, conv, x, w, dy, repeat, **params):
    """``[forward, backward]`` CPU times of ``conv(x, w, **params)`` (a torch functional)."""
    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()

    def forward():
        with torch.no_grad():
            conv(xt, wt, **params)
    yt = conv(xt, wt, **params)
    g = torch.from_numpy(dy)
    return [cpu_time(forward, repeat),
            cpu_time(lambda: torch.autograd.grad(yt, (xt, wt), g, retain_graph=True), repeat)]


def eval_chain(torch, x, w, stats, activation, **params):
    """A call of PyTorch's evaluation chain: ``conv2d(x, w, **params)``, batch norm on
    ``stats`` (running mean, variance, weight, bias), then ReLU6 unless ``activation`` is
    ``"none"``."""
    F = torch.nn.functional
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    mean, var, weight, bias = (torch.from_numpy(a) for a in stats)

    def run():
        with torch.no_grad():
            y = F.batch_norm(F.conv2d(xt, wt, **params), mean, var, weight, bias,
                             training=False)
            if activation != "none":
                F.relu6(y, inplace=True)
    return run


def bn_stats(rng, channels, dtype):
    """Running mean, variance, weight and bias of a batch norm over ``channels``."""
    return [rng.standard_normal(channels).astype(dtype),
            rng.uniform(0.5, 2.0, channels).astype(dtype),
            rng.uniform(0.5, 2.0, channels).astype(dtype),
            rng.standard_normal(channels).astype(dtype)]
