"""Time each fused codelet against the unfused chain of the same kernels, one thread.

For the convolution layers of ``bench_codelets_conv_pool.py`` (LeNet-5 and the small
CIFAR network, batch 64) followed by ReLU and 2x2 max pooling, and for LeNet-5's
dense layers followed by ReLU: the fused forward and backward codelets
(``codelets/fused.py``) and the unfused tasks they replace, run one after the other
as the runtime would run them on one worker (``conv2d_fwd``, ``relu_fwd``,
``maxpool2d_fwd``; ``maxpool2d_bwd``, ``relu_bwd``, ``conv2d_bwd_params``,
``conv2d_bwd_input``), per CPU variant of the convolution. No task overhead on either
side: this measures only what fusion changes in the kernels' work. Median and minimum
of round-robin calls::

    python benchmarks/bench_fused.py [--repeat 30] [--dtype float32]
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from bench_codelets_conv_pool import CONVS, parse_args, times_ms
from hetero_nn.codelets import conv, dense, fused, pool
from hetero_nn.codelets.activation import relu_bwd, relu_fwd

DENSES = [("lenet.fc1", (64, 400), 120), ("lenet.fc2", (64, 120), 84)]


def conv_cases(x_shape, out_kernel, padding, dtype, rng):
    """``[(chain, variant, fused call, unfused call)]`` for one convolution layer."""
    n_out, k = out_kernel
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal((n_out, x_shape[1], k, k)) / k).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    z = np.empty(conv.conv2d_output_shape(x.shape, w.shape, 1, padding), dtype)
    r, dr, dz = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    y_shape = pool.maxpool2d_output_shape(z.shape, 2)
    y, a = np.empty(y_shape, dtype), np.empty(y_shape, np.int64)
    dy, dx = rng.standard_normal(y_shape).astype(dtype), np.empty_like(x)
    dw, db = np.zeros_like(w), np.zeros_like(b)
    cp, fp = dict(stride=1, padding=padding), dict(stride=1, padding=padding, pool_size=2)
    fused.conv2d_relu_pool_fwd.variants["ref"](x, w, b, y, a, **fp)
    conv.conv2d_fwd.variants["ref"](x, w, b, z, **cp)
    relu_fwd.variants["cpu"](z, r)
    cases = []
    for v in ("cpu:direct", "cpu:im2col"):
        def unfused_fwd(v=v):
            conv.conv2d_fwd.variants[v](x, w, b, z, **cp)
            relu_fwd.variants["cpu"](z, r)
            pool.maxpool2d_fwd.variants["cpu"](r, y, a, kernel_size=2)

        def unfused_bwd(v=v):
            pool.maxpool2d_bwd.variants["cpu"](dy, a, dr)
            relu_bwd.variants["cpu"](r, dr, dz)
            conv.conv2d_bwd_params.variants[v](x, dz, dw, db, **cp)
            conv.conv2d_bwd_input.variants[v](dz, w, dx, **cp)

        def fused_fwd(v=v):
            fused.conv2d_relu_pool_fwd.variants[v](x, w, b, y, a, **fp)

        def fused_bwd(v=v):
            fused.conv2d_relu_pool_bwd.variants[v](x, w, y, a, dy, dx, dw, db, **fp)

        cases += [("conv+relu+pool fwd", v, fused_fwd, unfused_fwd),
                  ("conv+relu+pool bwd", v, fused_bwd, unfused_bwd)]
    return cases


def dense_cases(x_shape, n_out, dtype, rng):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal((n_out, x_shape[1])) / np.sqrt(x_shape[1])).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    z, y = np.empty((x_shape[0], n_out), dtype), np.empty((x_shape[0], n_out), dtype)
    dy, dz, dx = rng.standard_normal(y.shape).astype(dtype), np.empty_like(y), np.empty_like(x)
    dw, db = np.zeros_like(w), np.zeros_like(b)
    fused.dense_relu_fwd.variants["ref"](x, w, b, y)
    cases = []
    for v in ("ref", "cpu", "cpu:blas"):
        d = "ref" if v == "cpu:blas" else v  # cpu:blas: the reference's GEMMs, Numba's ReLU
        r = "ref" if v == "ref" else "cpu"

        def unfused_fwd(d=d, r=r):
            dense.dense_fwd.variants[d](x, w, b, z)
            relu_fwd.variants[r](z, y)

        def unfused_bwd(d=d, r=r):
            relu_bwd.variants[r](y, dy, dz)
            dense.dense_bwd_params.variants[d](x, dz, dw, db)
            dense.dense_bwd_input.variants[d](dz, w, dx)

        cases += [("dense+relu fwd", v, lambda v=v: fused.dense_relu_fwd.variants[v](x, w, b, y),
                   unfused_fwd),
                  ("dense+relu bwd", v,
                   lambda v=v: fused.dense_relu_bwd.variants[v](x, w, y, dy, dx, dw, db),
                   unfused_bwd)]
    return cases


def main(argv=None):
    args = parse_args(__doc__, argv)
    rng = np.random.default_rng(args.seed)
    dtype = np.dtype(args.dtype)
    layers = [(name, conv_cases(shape, ok, pad, dtype, rng)) for name, shape, ok, pad in CONVS]
    layers += [(name, dense_cases(shape, n, dtype, rng)) for name, shape, n in DENSES]
    print(f"{dtype.name}, 1 thread, {args.repeat} timed calls each; ratio = fused / unfused "
          f"(of medians; 'min' = of minima)")
    header = (f"{'layer':<12} {'chain':<19} {'variant':<11} {'fused ms':>9} {'unfused ms':>11} "
              f"{'ratio':>6} {'min':>6}")
    print(header)
    print("-" * len(header))
    with threadpool_limits(1):
        for name, cases in layers:
            for chain, variant, fused_fn, unfused_fn in cases:
                f, u = times_ms([fused_fn, unfused_fn], args.repeat)
                print(f"{name:<12} {chain:<19} {variant:<11} {f[0]:9.3f} {u[0]:11.3f} "
                      f"{f[0] / u[0]:6.2f} {f[1] / u[1]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
