"""MobileNetV2's depthwise layers (width 1.0, CIFAR strides), per shape: the ``cpu`` and
``cpu:stacked`` variants of the five depthwise codelets against PyTorch, one thread each.

Per layer shape (channels, image size, stride; ``x N``: how many layers of MobileNetV2 have
it), the CPU time of one call (the least of ``--repeat`` calls, ``time.thread_time``, so a
loaded machine inflates it less than wall time): the forward pass, the input gradient and
the weight gradient on one partition of ``--images`` images, float32; PyTorch's forward
(``torch.no_grad``) and its backward pass (both gradients in one autograd call). With
``--eval``, inference instead: ``conv2d_depthwise_folded_fwd`` (the batch norm folded,
ReLU6) against PyTorch's evaluation chain (convolution, batch norm, ReLU6). The last
line sums each column over the network's layers (``layer_times.py``)::

    python benchmarks/bench_depthwise.py --images 16 --repeat 7
    python benchmarks/bench_depthwise.py --images 16 --repeat 9 --eval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import depthwise, depthwise_fused

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_times import (Network, bn_stats, cpu_time, eval_chain, load_torch,  # noqa: E402
                         torch_passes)

SHAPES = {  # (channels, size, stride): layers of MobileNetV2 (CIFAR strides) with that shape
    (32, 32, 1): 1, (96, 32, 1): 1, (144, 32, 1): 1, (144, 32, 2): 1, (192, 16, 1): 2,
    (192, 16, 2): 1, (384, 8, 1): 4, (576, 8, 1): 2, (576, 8, 2): 1, (960, 4, 1): 3}


def train_cells(net, torch, args, x, w, y, params, count):
    dy = np.random.default_rng(1).standard_normal(y.shape, dtype=np.float32)
    dx, dw = np.empty_like(x), np.zeros_like(w)
    cells = [net.cell(v, ("fwd", "bin", "bw"), [
        cpu_time(lambda: depthwise.conv2d_depthwise_fwd_nobias.variants[v](x, w, y, **params),
                 args.repeat),
        cpu_time(lambda: depthwise.conv2d_depthwise_bwd_input.variants[v](dy, w, dx, **params),
                 args.repeat),
        cpu_time(lambda: depthwise.conv2d_depthwise_bwd_weight.variants[v](x, dy, dw,
                                                                             **params),
                 args.repeat)], count) for v in ("cpu", "cpu:stacked")]
    if torch:
        cells.append(net.cell("torch", ("fwd", "bwd"), torch_passes(
            torch, torch.nn.functional.conv2d, x, w, dy, args.repeat, groups=x.shape[1],
            **params), count))
    return cells


def eval_cells(net, torch, args, x, w, y, params, count):
    """The folded depthwise convolution with ReLU6 against PyTorch's evaluation chain."""
    rng = np.random.default_rng(1)
    bf = rng.standard_normal(w.shape[0], dtype=np.float32)
    cells = [net.cell("hn eval", ("fwd",), [cpu_time(
        lambda: depthwise_fused.conv2d_depthwise_folded_fwd.variants["cpu"](
            x, w, bf, y, activation="relu6", **params), args.repeat)], count)]
    if torch:
        cells.append(net.cell("torch eval", ("fwd",), [cpu_time(eval_chain(
            torch, x, w, bn_stats(rng, w.shape[0], np.float32), "relu6", groups=x.shape[1],
            **params), args.repeat)], count))
    return cells


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--eval", action="store_true",
                    help="inference: folded batch norm and ReLU6 against torch's eval chain")
    args = ap.parse_args(argv)
    torch = load_torch()
    rng = np.random.default_rng(0)
    net = Network()
    heads = ["hn eval: fwd"] + (["torch eval: fwd"] if torch else []) if args.eval else \
        [f"{v}: fwd bin bw" for v in ("cpu", "cpu:stacked")] + (["torch: fwd bwd"] if torch
                                                                else [])
    print(f"{'layer':>14} | " + " | ".join(heads) + "  (ms)")
    with threadpool_limits(1):
        for (c, size, stride), count in SHAPES.items():
            x = rng.standard_normal((args.images, c, size, size), dtype=np.float32)
            w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
            out = (size + 2 - 3) // stride + 1
            y = np.empty((args.images, c, out, out), np.float32)
            params = {"stride": stride, "padding": 1}
            cells = (eval_cells if args.eval else train_cells)(net, torch, args, x, w, y, params,
                                                               count)
            print(f"{c:4d} {size:2d}x{size:<2d} s{stride} x{count} | " + " | ".join(cells),
                  flush=True)
    print(net.line())
    return net.totals


if __name__ == "__main__":
    main()
