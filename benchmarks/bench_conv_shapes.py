"""Convolution variants on ResNet-18's late-layer shapes against the plain GEMM of the same
FLOPs: where the forward, input-gradient and weight-gradient time goes beside BLAS.

For each layer shape and pass, one partition of images, one thread, float32: the
codelet's variants and ``np.matmul`` of the im2col-equivalent GEMM (forward ``[O,
C*K*K] @ [C*K*K, N*OH*OW]``, input gradient ``[C*K*K, O] @ [O, N*OH*OW]``, weight gradient
``[O, N*OH*OW] @ [N*OH*OW, C*K*K]``), interleaved in one process, medians of the
rounds. A cell is the variant's time in ms, its GFLOP/s (the codelet's FLOP count: the
padded window's taps included) and its time over the GEMM's (``x gemm``: 1.00 runs at the
GEMM's rate; under 1 beats it by doing less work). Ratios to the GEMM measured in the same
rounds survive a loaded machine better than absolute times. The summary line sums each
variant over ResNet-18 at 32x32 input (``--layout tv``, the default: torchvision's,
layer1 on 8x8 images ... layer4 on 1x1; ``--layout cifar``: layer1 on 32x32 ... layer4 on
4x4; each shape times its count in the network, the stem left out) for the forward pass and the two gradients: GFLOP/s
and share of the GEMMs' rate and of the machine's sgemm rate
(``bench_conv_gemm.sgemm_rate``, measured in the same run: the roofline's reference).
Times are the thread's CPU time (``time.thread_time``) unless ``--clock wall``.

    python benchmarks/bench_conv_shapes.py                         # 32 images, 5 rounds
    python benchmarks/bench_conv_shapes.py --layout cifar --partition 16 --json shapes.json
    python benchmarks/bench_conv_shapes.py --variants cpu:gemm cpu:unrolled --shapes 256,256,2,3,1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from bench_conv_gemm import kernels, sgemm_rate

def resnet18(side):
    """``(C, O, H=W, kernel, stride): count`` of ResNet-18's layers 1-4 (the stem left out)
    when layer1 runs on ``side x side`` images."""
    shapes = {(64, 64, side, 3, 1): 4}
    for c, h in ((64, side), (128, side // 2), (256, side // 4)):
        shapes.update({(c, 2 * c, h, 3, 2): 1, (c, 2 * c, h, 1, 2): 1,
                       (2 * c, 2 * c, max(1, h // 2), 3, 1): 3})
    return shapes


#: At 32x32 input: torchvision's layout (layer1 on 8x8 images ... layer4 on 1x1) and the
#: CIFAR layout (layer1 on 32x32 ... layer4 on 4x4).
LAYOUTS = {"tv": resnet18(8), "cifar": resnet18(32)}
VARIANTS = ("cpu:gemm", "cpu:winograd", "cpu:unrolled")
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def passes(shape, n):
    """``{pass: (codelet, operands, params, (a, b, out) of the equivalent GEMM)}`` and the
    FLOPs of one pass (the three have the same)."""
    by_pass, flops = kernels(shape, n)
    c, o, _, k, _ = shape
    out = by_pass["fwd"][1][2].shape
    rows, cols = c * k * k, n * out[2] * out[3]
    rng = np.random.default_rng(2)

    def gemm(m, kk, nn):
        return (rng.standard_normal((m, kk), dtype=np.float32),
                rng.standard_normal((kk, nn), dtype=np.float32), np.empty((m, nn), np.float32))
    dims = {"fwd": (o, rows, cols), "bwd_input": (rows, o, cols), "bwd_weight": (o, cols, rows)}
    return {name: (*by_pass[name], gemm(*dims[name])) for name in by_pass}, flops


def measure(codelet, operands, params, gemm, variants, rounds, clock):
    """Median seconds of ``"gemm"`` and each variant, interleaved rounds after a warm-up."""
    a, b, out = gemm
    runs = {"gemm": lambda: np.matmul(a, b, out=out)}
    for v in variants:
        runs[v] = lambda v=v: codelet.variants[v](*operands, **params)
    times = {name: [] for name in runs}
    for run in runs.values():  # compile and warm
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = clock()
            run()
            times[name].append(clock() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partition", type=int, default=32, help="images per task (default 32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="tv")
    ap.add_argument("--shapes", nargs="+", metavar="C,O,H,K,S",
                    help="these layer shapes (count 1 each) instead of ResNet-18's")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    shapes = ({tuple(map(int, s.split(","))): 1 for s in args.shapes} if args.shapes
              else LAYOUTS[args.layout])
    clock, rows = CLOCKS[args.clock], []
    sums = {}  # (direction, name) -> [flops, seconds]
    with threadpool_limits(1):
        rate = sgemm_rate(args.rounds, clock) * 1e9
        print(f"sgemm {rate / 1e9:.1f} GFLOP/s; partition of {args.partition} images, one "
              f"thread, float32, {args.clock} time; cells: ms, GFLOP/s, time over the "
              "equivalent GEMM's")
        for shape, count in shapes.items():
            by_pass, flops = passes(shape, args.partition)
            c, o, h, k, s = shape
            label = f"{c}->{o} {h}x{h} k{k} s{s}"
            for name, (codelet, operands, params, gemm) in by_pass.items():
                variants = [v for v in args.variants if v in codelet.variants]
                med = measure(codelet, operands, params, gemm, variants, args.rounds, clock)
                cells = "  ".join(f"{v} {med[v] * 1e3:7.2f} ms {flops / med[v] / 1e9:5.1f} GF/s "
                                  f"{med[v] / med['gemm']:5.2f}x" for v in med)
                print(f"{label:22s} {name:10s} {cells}", flush=True)
                rows.append({"layer": label, "count": count, "pass": name,
                             "gflop": flops / 1e9, **{f"{v}_ms": t * 1e3 for v, t in med.items()}})
                direction = "forward" if name == "fwd" else "backward"
                for v, t in med.items():
                    acc = sums.setdefault((direction, v), [0.0, 0.0])
                    acc[0] += count * flops
                    acc[1] += count * t
    for direction in ("forward", "backward"):
        gemm = sums.get((direction, "gemm"))
        if not gemm or not gemm[1]:
            continue
        cells = "  ".join(f"{v} {f / t / 1e9:5.1f} GF/s ({gemm[1] / t:4.0%} of the GEMMs', "
                          f"{f / t / rate:4.0%} of sgemm)"
                          for (d, v), (f, t) in sums.items() if d == direction and v != "gemm")
        print(f"summed, {direction}: gemm {gemm[0] / gemm[1] / 1e9:5.1f} GF/s  {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sgemm_gflops": rate / 1e9, "partition": args.partition,
                       "clock": args.clock, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
