"""MobileNetV2's 1x1 convolutions (width 1.0, CIFAR strides), per shape: the pinned
convolution variant against another and PyTorch, one thread each.

Per layer shape (input channels, output channels, image size; ``x N``: how many layers of
MobileNetV2 have it), the CPU time of one call (the least of ``--repeat`` calls,
``time.thread_time``): the forward pass, the input gradient and the weight gradient on one
partition of ``--images`` images, float32, for the variants named by ``--variants``
(default: the pinned ``cpu:winograd``, whose chain runs ``cpu:gemm``'s kernels on these
layers); PyTorch's forward (``torch.no_grad``) and its backward pass
(both gradients in one autograd call); a plain ``W @ X`` of the forward's FLOPs. With
``--eval``, inference instead: ``conv2d_folded_fwd`` (the batch norm folded, ReLU6 after
the expansions and the last layer, none after the projections) against PyTorch's
evaluation chain (convolution, batch norm, ReLU6) and ``W @ X``. The last line sums each
column over the network's layers (``layer_times.py``)::

    python benchmarks/bench_pointwise.py --images 16 --repeat 5
    python benchmarks/bench_pointwise.py --images 16 --repeat 9 --eval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv, fused_blocks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_times import (Network, bn_stats, cpu_time, eval_chain, load_torch,  # noqa: E402
                         torch_passes)

SHAPES = {  # (in channels, out channels, size): 1x1 layers of MobileNetV2 (CIFAR strides)
    (32, 16, 32): 1, (16, 96, 32): 1, (96, 24, 32): 1, (24, 144, 32): 2, (144, 24, 32): 1,
    (144, 32, 16): 1, (32, 192, 16): 3, (192, 32, 16): 2, (192, 64, 8): 1, (64, 384, 8): 4,
    (384, 64, 8): 3, (384, 96, 8): 1, (96, 576, 8): 3, (576, 96, 8): 2, (576, 160, 4): 1,
    (160, 960, 4): 3, (960, 160, 4): 2, (960, 320, 4): 1, (320, 1280, 4): 1}
VARIANTS = ("cpu:winograd",)


def train_cells(net, torch, args, x, w, count):
    y = np.empty((x.shape[0], w.shape[0], *x.shape[2:]), np.float32)
    dy = np.random.default_rng(1).standard_normal(y.shape, dtype=np.float32)
    dx, dw = np.empty_like(x), np.zeros_like(w)
    cells = [net.cell(v, ("fwd", "bin", "bw"), [
        cpu_time(lambda: conv.conv2d_fwd_nobias.variants[v](x, w, y), args.repeat),
        cpu_time(lambda: conv.conv2d_bwd_input.variants[v](dy, w, dx), args.repeat),
        cpu_time(lambda: conv.conv2d_bwd_weight.variants[v](x, dy, dw), args.repeat)], count)
        for v in args.variants]
    if torch:
        cells.append(net.cell("torch", ("fwd", "bwd"), torch_passes(
            torch, torch.nn.functional.conv2d, x, w, dy, args.repeat), count))
    return cells


def eval_cells(net, torch, args, x, w, count):
    """The folded convolution with its activation against PyTorch's evaluation chain."""
    n_out = w.shape[0]
    activation = "relu6" if n_out > x.shape[1] else "none"  # expansions and the last layer
    rng = np.random.default_rng(1)
    bf = rng.standard_normal(n_out, dtype=np.float32)
    y = np.empty((x.shape[0], n_out, *x.shape[2:]), np.float32)
    cells = [net.cell("hn eval", ("fwd",), [cpu_time(
        lambda: fused_blocks.conv2d_folded_fwd.variants["cpu"](x, w, bf, y,
                                                                activation=activation),
        args.repeat)], count)]
    if torch:
        cells.append(net.cell("torch eval", ("fwd",), [cpu_time(eval_chain(
            torch, x, w, bn_stats(rng, n_out, np.float32), activation), args.repeat)], count))
    return cells


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--sizes", nargs="+", type=int, default=[32, 16, 8, 4],
                    help="only the layers on images of these sizes")
    ap.add_argument("--eval", action="store_true",
                    help="inference: folded batch norm and ReLU6 against torch's eval chain")
    args = ap.parse_args(argv)
    torch = load_torch()
    rng = np.random.default_rng(0)
    net = Network()
    heads = ["hn eval: fwd"] + (["torch eval: fwd"] if torch else []) if args.eval else \
        [f"{v}: fwd bin bw" for v in args.variants] + (["torch: fwd bwd"] if torch else [])
    print(f"{'layer':>18} | " + " | ".join(heads) + " | W@X  (ms)")
    with threadpool_limits(1):
        for (c, o, size), count in SHAPES.items():
            if size not in args.sizes:
                continue
            x = rng.standard_normal((args.images, c, size, size), dtype=np.float32)
            w = rng.standard_normal((o, c, 1, 1), dtype=np.float32)
            cells = (eval_cells if args.eval else train_cells)(net, torch, args, x, w, count)
            a, b = w.reshape(o, c), rng.standard_normal((c, args.images * size * size),
                                                        dtype=np.float32)
            cells.append(net.cell("W@X", ("fwd",), [cpu_time(lambda: a @ b, args.repeat)],
                                  count))
            print(f"{c:4d}->{o:<4d} {size:2d}x{size:<2d} x{count} | " + " | ".join(cells),
                  flush=True)
    print(net.line())
    return net.totals


if __name__ == "__main__":
    main()
