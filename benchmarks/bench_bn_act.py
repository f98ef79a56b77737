"""MobileNetV2's batch norm + ReLU6 pairs in training (width 1.0, CIFAR strides), per shape:
the unfused tasks against ``codelets/batchnorm_act.py``'s fused ones, one thread.

Per shape (channels, image size; ``x N``: how many pairs of MobileNetV2 have it), the CPU
time of one partition of ``--images`` images, float32 (the least of ``--repeat`` calls,
``time.thread_time``): the forward tasks after the statistics (``bn_fwd``, ``relu6_fwd``
against ``bn_act_fwd``) and the backward ones (``relu6_bwd``, ``bn_bwd_sums``,
``bn_bwd_input`` against ``bn_act_bwd_sums``, ``bn_act_bwd_input``). The statistics
(``bn_sum``, ``bn_sqdev``: two passes more, fused or not) are left out. The last line sums
each column over the network::

    python benchmarks/bench_bn_act.py --images 16 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hetero_nn.codelets import activation as act
from hetero_nn.codelets import batchnorm as bn
from hetero_nn.codelets import batchnorm_act as bna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_times import cpu_time  # noqa: E402

SHAPES = {  # (channels, size): BatchNorm2d + ReLU6 pairs of MobileNetV2 (CIFAR strides)
    (32, 32): 2, (96, 32): 2, (144, 32): 3, (144, 16): 1, (192, 16): 5, (192, 8): 1,
    (384, 8): 8, (576, 8): 5, (576, 4): 1, (960, 4): 6, (1280, 4): 1}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    v = "cpu"
    totals = dict.fromkeys(("unfused fwd", "fused fwd", "unfused bwd", "fused bwd"), 0.0)
    print(f"{'shape':>14} | unfused fwd  bwd | fused fwd  bwd  (ms)")
    for (c, size), count in SHAPES.items():
        x = rng.standard_normal((args.images, c, size, size), dtype=np.float32) * 3 + 1
        dy = rng.standard_normal(x.shape, dtype=np.float32)
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        weight, bias = np.ones(c, np.float32), np.zeros(c, np.float32)
        stats = (mean, var, weight, bias)
        u, y, g, dx = (np.empty_like(x) for _ in range(4))
        s0, s1 = np.zeros(c, np.float32), np.zeros(c, np.float32)
        count_ = x.size // c

        def unfused_fwd():
            bn.bn_fwd.variants[v](x, *stats, u, eps=1e-5)
            act.relu6_fwd.variants[v](u, y)

        def unfused_bwd():
            act.relu6_bwd.variants[v](u, dy, g)
            bn.bn_bwd_sums.variants[v](x, g, mean, s0, s1)
            bn.bn_bwd_input.variants[v](x, g, mean, var, weight, s0, s1, dx, count=count_,
                                        eps=1e-5)

        def fused_fwd():
            bna.bn_act_fwd.variants[v](x, *stats, y, eps=1e-5, activation="relu6")

        def fused_bwd():
            bna.bn_act_bwd_sums.variants[v](x, dy, *stats, s0, s1, eps=1e-5, activation="relu6")
            bna.bn_act_bwd_input.variants[v](x, dy, *stats, s0, s1, dx, count=count_, eps=1e-5,
                                             activation="relu6")
        row = {"unfused fwd": unfused_fwd, "unfused bwd": unfused_bwd, "fused fwd": fused_fwd,
               "fused bwd": fused_bwd}
        times = {k: cpu_time(f, args.repeat) for k, f in row.items()}
        for k, t in times.items():
            totals[k] += count * t
        print(f"{c:5d} {size:2d}x{size:<2d} x{count} | "
              f"{1e3 * times['unfused fwd']:6.2f} {1e3 * times['unfused bwd']:6.2f} | "
              f"{1e3 * times['fused fwd']:6.2f} {1e3 * times['fused bwd']:6.2f}", flush=True)
    print("network (ms): " + ", ".join(f"{k} {1e3 * t:.1f}" for k, t in totals.items()))
    return totals


if __name__ == "__main__":
    main()
