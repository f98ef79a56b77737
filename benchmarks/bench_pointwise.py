"""MobileNetV2's 1x1 convolutions (width 1.0, CIFAR strides), per shape: the pinned
convolution variant against another and PyTorch, one thread each.

Per layer shape (input channels, output channels, image size; ``x N``: how many layers of
MobileNetV2 have it), the CPU time of one call (the least of ``--repeat`` calls,
``time.thread_time``): the forward pass, the input gradient and the weight gradient on one
partition of ``--images`` images, float32, for the variants named by ``--variants``
(default: the pinned ``cpu:winograd``, whose chain runs ``cpu:gemm``'s kernels on these
layers); PyTorch's forward (``torch.no_grad``) and its backward pass
(both gradients in one autograd call); a plain ``W @ X`` of the forward's FLOPs. The last
line sums each column over the network's layers::

    python benchmarks/bench_pointwise.py --images 16 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_depthwise import cpu_time  # noqa: E402

SHAPES = {  # (in channels, out channels, size): 1x1 layers of MobileNetV2 (CIFAR strides)
    (32, 16, 32): 1, (16, 96, 32): 1, (96, 24, 32): 1, (24, 144, 32): 2, (144, 24, 32): 1,
    (144, 32, 16): 1, (32, 192, 16): 3, (192, 32, 16): 2, (192, 64, 8): 1, (64, 384, 8): 4,
    (384, 64, 8): 3, (384, 96, 8): 1, (96, 576, 8): 3, (576, 96, 8): 2, (576, 160, 4): 1,
    (160, 960, 4): 3, (960, 160, 4): 2, (960, 320, 4): 1, (320, 1280, 4): 1}
VARIANTS = ("cpu:winograd",)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--sizes", nargs="+", type=int, default=[32, 16, 8, 4],
                    help="only the layers on images of these sizes")
    args = ap.parse_args(argv)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    totals: dict = {}
    print(f"{'layer':>18} | " + " | ".join(f"{v}: fwd bin bw" for v in args.variants)
          + (" | torch: fwd bwd" if torch else "") + " | W@X  (ms)")
    with threadpool_limits(1):
        for (c, o, size), count in SHAPES.items():
            if size not in args.sizes:
                continue
            x = rng.standard_normal((args.images, c, size, size), dtype=np.float32)
            w = rng.standard_normal((o, c, 1, 1), dtype=np.float32)
            y = np.empty((args.images, o, size, size), np.float32)
            dy = rng.standard_normal(y.shape, dtype=np.float32)
            dx, dw = np.empty_like(x), np.zeros_like(w)
            cells = []
            for v in args.variants:
                row = [cpu_time(lambda: conv.conv2d_fwd_nobias.variants[v](x, w, y), args.repeat),
                       cpu_time(lambda: conv.conv2d_bwd_input.variants[v](dy, w, dx), args.repeat),
                       cpu_time(lambda: conv.conv2d_bwd_weight.variants[v](x, dy, dw),
                                args.repeat)]
                cells.append(f"{v}: " + " ".join(f"{1e3 * t:5.2f}" for t in row))
                for key, t in zip(("fwd", "bin", "bw"), row):
                    totals[(v, key)] = totals.get((v, key), 0.0) + count * t
            if torch:
                xt = torch.from_numpy(x).requires_grad_()
                wt = torch.from_numpy(w).requires_grad_()

                def forward():
                    with torch.no_grad():
                        torch.nn.functional.conv2d(xt, wt)
                yt = torch.nn.functional.conv2d(xt, wt)
                g = torch.from_numpy(dy)
                row = [cpu_time(forward, args.repeat),
                       cpu_time(lambda: torch.autograd.grad(yt, (xt, wt), g, retain_graph=True),
                                args.repeat)]
                cells.append("torch: " + " ".join(f"{1e3 * t:5.2f}" for t in row))
                for key, t in zip(("fwd", "bwd"), row):
                    totals[("torch", key)] = totals.get(("torch", key), 0.0) + count * t
            a, b = w.reshape(o, c), rng.standard_normal((c, args.images * size * size),
                                                        dtype=np.float32)
            t = cpu_time(lambda: a @ b, args.repeat)
            totals[("W@X", "fwd")] = totals.get(("W@X", "fwd"), 0.0) + count * t
            cells.append(f"{1e3 * t:5.2f}")
            print(f"{c:4d}->{o:<4d} {size:2d}x{size:<2d} x{count} | " + " | ".join(cells),
                  flush=True)
    print("network (ms): " + ", ".join(f"{v} {k} {1e3 * t:.1f}" for (v, k), t in totals.items()))
    return totals


if __name__ == "__main__":
    main()
