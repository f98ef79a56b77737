"""Time every CPU variant of the convolution and max-pooling codelets against PyTorch.

Shapes are those of LeNet-5 (batch 64, 1x28x28: conv 6@5x5 pad 2, pool 2,
conv 16@5x5, pool 2) and of a small CIFAR network (batch 64, 3x32x32: conv
32@3x3 pad 1, pool 2, conv 64@3x3 pad 1, pool 2). Both sides run on one
thread (``torch.set_num_threads(1)``, BLAS limited by threadpoolctl), as one
worker of the runtime does. The table gives the median time of each variant,
of the matching PyTorch operator (the same ATen call autograd makes) and their
ratio (< 1: hetero_nn is faster), and the ratio of the minima, which a shared,
busy machine disturbs less::

    python benchmarks/bench_codelets_conv_pool.py [--repeat 30] [--dtype float32]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv, pool

CONVS = [  # name, x shape, (out channels, kernel), padding
    ("lenet.conv1", (64, 1, 28, 28), (6, 5), 2),
    ("lenet.conv2", (64, 6, 14, 14), (16, 5), 0),
    ("cifar.conv1", (64, 3, 32, 32), (32, 3), 1),
    ("cifar.conv2", (64, 32, 16, 16), (64, 3), 1),
]
POOLS = [  # name, x shape, kernel (= stride)
    ("lenet.pool1", (64, 6, 28, 28), 2),
    ("lenet.pool2", (64, 16, 10, 10), 2),
    ("cifar.pool1", (64, 32, 32, 32), 2),
    ("cifar.pool2", (64, 64, 16, 16), 2),
]


def times_ms(fns, repeat):
    """``(median, min)`` wall time of each of ``fns`` in milliseconds.

    The functions run round-robin (after one warm-up call each, which also
    compiles the Numba kernels), so a load that comes and goes on the machine
    weighs on all of them alike; the minimum shows what an idle core gives.
    """
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [(1e3 * statistics.median(spent), 1e3 * min(spent)) for spent in times]


def timed_rows(layer, op, codelet, arrays, params, torch_fn, repeat):
    """Rows ``(layer, op, variant, (median, min), torch (median, min))`` per CPU variant."""
    names = [v for v in codelet.variants if v != "cuda"]
    fns = [torch_fn] + [functools.partial(codelet.variants[v], *arrays, **params) for v in names]
    torch_ms, *variant_ms = times_ms(fns, repeat)
    return [(layer, op, v, ms, torch_ms) for v, ms in zip(names, variant_ms)]


def conv_rows(name, x_shape, out_kernel, padding, dtype, repeat, rng):
    """Timed rows (see ``timed_rows``) for the three convolution codelets."""
    n_out, k = out_kernel
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((n_out, x_shape[1], k, k)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    y = np.empty(conv.conv2d_output_shape(x.shape, w.shape, 1, padding), dtype=dtype)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dw, db = np.empty_like(x), np.zeros_like(w), np.zeros_like(b)
    xt, wt, bt, dyt = (torch.from_numpy(a) for a in (x, w, b, dy))
    params = dict(stride=1, padding=padding)

    def aten_bwd(mask):
        return lambda: torch.ops.aten.convolution_backward(
            dyt, xt, wt, [n_out], [1, 1], [padding, padding], [1, 1], False, [0, 0], 1, mask)

    cases = [
        ("conv2d_fwd", conv.conv2d_fwd, (x, w, b, y),
         lambda: F.conv2d(xt, wt, bt, 1, padding)),
        ("conv2d_bwd_input", conv.conv2d_bwd_input, (dy, w, dx), aten_bwd([True, False, False])),
        ("conv2d_bwd_params", conv.conv2d_bwd_params, (x, dy, dw, db),
         aten_bwd([False, True, True])),
    ]
    rows = []
    for op, codelet, arrays, torch_fn in cases:
        rows += timed_rows(name, op, codelet, arrays, params, torch_fn, repeat)
    return rows


def pool_rows(name, x_shape, kernel, dtype, repeat, rng):
    """Timed rows (see ``timed_rows``) for the two max-pooling codelets."""
    x = np.maximum(rng.standard_normal(x_shape), 0).astype(dtype)  # ReLU output: ties of zeros
    y_shape = pool.maxpool2d_output_shape(x.shape, kernel)
    y, argmax = np.empty(y_shape, dtype=dtype), np.empty(y_shape, dtype=np.int64)
    pool.maxpool2d_fwd.variants["ref"](x, y, argmax, kernel_size=kernel)
    dy, dx = rng.standard_normal(y_shape).astype(dtype), np.empty_like(x)
    xt, dyt, argt = torch.from_numpy(x), torch.from_numpy(dy), torch.from_numpy(argmax)
    cases = [
        ("maxpool2d_fwd", pool.maxpool2d_fwd, (x, y, argmax),
         lambda: F.max_pool2d(xt, kernel, kernel, return_indices=True)),
        ("maxpool2d_bwd", pool.maxpool2d_bwd, (dy, argmax, dx),
         lambda: torch.ops.aten.max_pool2d_with_indices_backward(
             dyt, xt, [kernel, kernel], [kernel, kernel], [0, 0], [1, 1], False, argt)),
    ]
    params = dict(kernel_size=kernel, stride=kernel)
    rows = []
    for op, codelet, arrays, torch_fn in cases:
        rows += timed_rows(name, op, codelet, arrays, params, torch_fn, repeat)
    return rows


def parse_args(doc, argv=None, batch=False):
    """``--repeat``, ``--dtype`` and ``--seed``, the options of the one-thread benchmarks
    (and ``--batch`` where the benchmark's shapes take one)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per median")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=0)
    if batch:
        parser.add_argument("--batch", type=int, default=64, help="samples per call")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(__doc__, argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    dtype = np.dtype(args.dtype)
    rows = []
    with threadpool_limits(1):
        for name, x_shape, out_kernel, padding in CONVS:
            rows += conv_rows(name, x_shape, out_kernel, padding, dtype, args.repeat, rng)
        for name, x_shape, kernel in POOLS:
            rows += pool_rows(name, x_shape, kernel, dtype, args.repeat, rng)

    report(rows, f"{dtype.name}, 1 thread, {args.repeat} timed calls each")


def report(rows, title, widths=(12, 18)):
    """Print ``rows`` (``timed_rows``'s), then the fastest non-reference variant per
    (layer, codelet)."""
    print(f"{title}; ratio = hetero_nn / torch (of medians; 'min' = of minima)")
    header = (f"{'layer':<{widths[0]}} {'codelet':<{widths[1]}} {'variant':<11} {'ms':>8} "
              f"{'torch ms':>9} {'ratio':>6} {'min':>6}")
    print(header)
    print("-" * len(header))
    best = {}
    for layer, op, variant, ms, torch_ms in rows:
        print(_row(layer, op, variant, ms, torch_ms, widths))
        key = (layer, op)
        if variant != "ref" and (key not in best or ms[0] < best[key][1][0]):
            best[key] = (variant, ms, torch_ms)
    print()
    print("fastest non-reference variant per codelet (what the performance model should pick):")
    for (layer, op), (variant, ms, torch_ms) in best.items():
        print(_row(layer, op, variant, ms, torch_ms, widths))


def _row(layer, op, variant, ms, torch_ms, widths=(12, 18)):
    return (f"{layer:<{widths[0]}} {op:<{widths[1]}} {variant:<11} {ms[0]:8.3f} "
            f"{torch_ms[0]:9.3f} {ms[0] / torch_ms[0]:6.2f} {ms[1] / torch_ms[1]:6.2f}")


if __name__ == "__main__":
    main()
