"""MobileNetV2's depthwise layers (width 1.0, CIFAR strides), per shape: the ``cpu`` and
``cpu:stacked`` variants of the five depthwise codelets against PyTorch, one thread each.

Per layer shape (channels, image size, stride; ``x N``: how many layers of MobileNetV2 have
it), the CPU time of one call (the least of ``--repeat`` calls, ``time.thread_time``, so a
loaded machine inflates it less than wall time): the forward pass, the input gradient and
the weight gradient on one partition of ``--images`` images, float32; PyTorch's forward
(``torch.no_grad``) and its backward pass (both gradients in one autograd call). The last
line sums each column over the network's layers::

    python benchmarks/bench_depthwise.py --images 16 --repeat 7
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import depthwise

SHAPES = {  # (channels, size, stride): layers of MobileNetV2 (CIFAR strides) with that shape
    (32, 32, 1): 1, (96, 32, 1): 1, (144, 32, 1): 1, (144, 32, 2): 1, (192, 16, 1): 2,
    (192, 16, 2): 1, (384, 8, 1): 4, (576, 8, 1): 2, (576, 8, 2): 1, (960, 4, 1): 3}


def cpu_time(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    totals: dict = {}
    print(f"{'layer':>14} | " + " | ".join(f"{v:>11}: fwd  bin   bw" for v in ("cpu", "cpu:stacked"))
          + (" | torch: fwd   bwd" if torch else "") + "  (ms)")
    with threadpool_limits(1):
        for (c, size, stride), count in SHAPES.items():
            x = rng.standard_normal((args.images, c, size, size), dtype=np.float32)
            w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
            out = (size + 2 - 3) // stride + 1
            y = np.empty((args.images, c, out, out), np.float32)
            dy = rng.standard_normal(y.shape, dtype=np.float32)
            dx, dw = np.empty_like(x), np.zeros_like(w)
            params = {"stride": stride, "padding": 1}
            cells = []
            for v in ("cpu", "cpu:stacked"):
                row = [cpu_time(lambda: depthwise.conv2d_depthwise_fwd_nobias.variants[v](
                           x, w, y, **params), args.repeat),
                       cpu_time(lambda: depthwise.conv2d_depthwise_bwd_input.variants[v](
                           dy, w, dx, **params), args.repeat),
                       cpu_time(lambda: depthwise.conv2d_depthwise_bwd_weight.variants[v](
                           x, dy, dw, **params), args.repeat)]
                cells.append(f"{v:>11}: " + " ".join(f"{1e3 * t:4.2f}" for t in row))
                for key, t in zip(("fwd", "bin", "bw"), row):
                    totals[(v, key)] = totals.get((v, key), 0.0) + count * t
            if torch:
                xt = torch.from_numpy(x).requires_grad_()
                wt = torch.from_numpy(w).requires_grad_()

                def forward():
                    with torch.no_grad():
                        torch.nn.functional.conv2d(xt, wt, stride=stride, padding=1, groups=c)
                yt = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=1, groups=c)
                g = torch.from_numpy(dy)
                row = [cpu_time(forward, args.repeat),
                       cpu_time(lambda: torch.autograd.grad(yt, (xt, wt), g, retain_graph=True),
                                args.repeat)]
                cells.append("torch: " + " ".join(f"{1e3 * t:5.2f}" for t in row))
                for key, t in zip(("fwd", "bwd"), row):
                    totals[("torch", key)] = totals.get(("torch", key), 0.0) + count * t
            print(f"{c:4d} {size:2d}x{size:<2d} s{stride} x{count} | " + " | ".join(cells),
                  flush=True)
    print("network (ms): " + ", ".join(f"{v} {k} {1e3 * t:.1f}" for (v, k), t in totals.items()))
    return totals


if __name__ == "__main__":
    main()
