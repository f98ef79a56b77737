"""Convolution kernels at ResNet-18's shapes: ``cpu:im2col`` (one GEMM per sample) against
``cpu:gemm`` (one GEMM per chunk of the partition), one thread, float32.

For each layer shape (CIFAR layout on 32x32 images, and the torchvision layout's late
layers, whose images are 2x2 and 1x1 at 32x32 input) and each variant: the forward pass,
the input gradient and the weight gradient of one partition, the median of interleaved
rounds, in ms and GFLOP/s, beside the machine's sgemm rate measured in the same run.
Times are the thread's CPU time (``time.thread_time``) unless ``--clock wall``: on a
machine others load, a kernel's CPU time moves less than its wall time.

    python benchmarks/bench_conv_gemm.py --partition 32 --rounds 5
    python benchmarks/bench_conv_gemm.py --variants cpu:gemm cpu:winograd  # forward passes
    python benchmarks/bench_conv_gemm.py --variants cpu:gemm cpu:winograd --shapes 64,64,8,3,1

``--variants A B``: compare those (the speed-up is A's time over B's), on the passes whose
codelet has both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv

SHAPES = [  # (C, O, H=W, kernel, stride): CIFAR-layout ResNet-18, then torchvision's late layers
    (64, 64, 32, 3, 1), (64, 128, 32, 3, 2), (128, 128, 16, 3, 1), (64, 128, 32, 1, 2),
    (128, 256, 16, 3, 2), (256, 256, 8, 3, 1), (256, 512, 8, 3, 2), (512, 512, 4, 3, 1),
    (256, 512, 8, 1, 2), (256, 256, 2, 3, 1), (512, 512, 1, 3, 1)]
VARIANTS = ("cpu:im2col", "cpu:gemm")


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def sgemm_rate(rounds, clock):
    """GFLOP/s of one 512x512 by 512x4096 float32 product (median)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 4096), dtype=np.float32)
    a @ b
    times = []
    for _ in range(rounds):
        t0 = clock()
        a @ b
        times.append(clock() - t0)
    return 2 * 512 * 512 * 4096 / statistics.median(times) / 1e9


def kernels(shape, n):
    """``{pass: (codelet, operands, params)}`` of one layer shape on ``n`` images."""
    c, o, h, k, s = shape
    rng = np.random.default_rng(1)
    params = dict(stride=s, padding=k // 2)
    x = rng.standard_normal((n, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    out = conv.conv2d_output_shape(x.shape, w.shape, **params)
    dy = rng.standard_normal(out, dtype=np.float32)
    return {"fwd": (conv.conv2d_fwd_nobias, (x, w, np.empty(out, np.float32)), params),
            "bwd_input": (conv.conv2d_bwd_input, (dy, w, np.empty_like(x)), params),
            "bwd_weight": (conv.conv2d_bwd_weight, (x, dy, np.zeros_like(w)), params)}, \
        2.0 * np.prod(out) * c * k * k


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partition", type=int, default=32, help="images per task (default 32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--variants", nargs=2, default=list(VARIANTS), metavar="VARIANT")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--shapes", nargs="+", metavar="C,O,H,K,S",
                    help="these layer shapes instead of ResNet-18's (e.g. 64,64,8,3,1)")
    args = ap.parse_args(argv)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else SHAPES
    variants = tuple(args.variants)
    clock = CLOCKS[args.clock]
    rows = []
    with threadpool_limits(1):
        rate = sgemm_rate(args.rounds, clock)
        print(f"sgemm, one thread: {rate:.1f} GFLOP/s; partition of {args.partition} images; "
              f"{args.clock} time")
        print(f"{'layer':26s} {'pass':10s} " + " ".join(f"{v:>20s}" for v in variants)
              + "  speed-up")
        for shape in shapes:
            passes, flops = kernels(shape, args.partition)
            for name, (codelet, operands, params) in passes.items():
                if not all(v in codelet.variants for v in variants):
                    continue
                times = {v: [] for v in variants}
                for v in variants:  # compile and warm
                    codelet.variants[v](*operands, **params)
                for _ in range(args.rounds):  # interleaved rounds
                    for v in variants:
                        t0 = clock()
                        codelet.variants[v](*operands, **params)
                        times[v].append(clock() - t0)
                med = {v: statistics.median(t) for v, t in times.items()}
                c, o, h, k, s = shape
                label = f"{c}->{o} {h}x{h} k{k} s{s}"
                cells = " ".join(f"{med[v] * 1e3:8.2f} ms {flops / med[v] / 1e9:5.1f} GF/s"
                                 for v in variants)
                print(f"{label:26s} {name:10s} {cells}  {med[variants[0]] / med[variants[1]]:5.2f}x",
                      flush=True)
                rows.append({"layer": label, "pass": name, "gflop": flops / 1e9,
                             **{f"{v}_ms": med[v] * 1e3 for v in variants}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sgemm_gflops": rate, "partition": args.partition, "rows": rows}, f,
                      indent=1)
    return rows


if __name__ == "__main__":
    main()
