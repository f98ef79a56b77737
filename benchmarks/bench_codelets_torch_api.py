"""Benchmark the codelets of the layers added with PyTorch's names against PyTorch on one core.

SiLU, ReLU6, Hardswish (forward and backward), Softmax along a sample axis, LayerNorm
(forward, input gradient, parameter gradients), Dropout2d and the batch-norm codelets
as BatchNorm1d runs them, each at a batch of 64 in float32, every CPU variant (``ref``
and ``cpu``) beside the ATen operation PyTorch runs for the same work, with
``torch.set_num_threads(1)`` and BLAS on one thread, timed round-robin (the table and
its columns are ``bench_codelets_dense_misc.py``'s: medians, and hetero_nn/torch, below
1 when hetero_nn is faster).

Not a test. Run::

    python benchmarks/bench_codelets_torch_api.py [--repeat 25] [--batch 64] [--json results.json]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bench_codelets_dense_misc import report
from hetero_nn.codelets import activation, batchnorm, dropout, layernorm, softmax

DTYPE = np.float32
aten = torch.ops.aten


def pointwise_cases(rng, n):
    x = rng.standard_normal((n, 32, 16, 16), dtype=DTYPE) * 4
    dy = rng.standard_normal(x.shape, dtype=DTYPE)
    out = np.empty_like(x)
    tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
    shape = f"{n}x32x16x16"
    return [
        (shape, activation.silu_fwd, (x, out), {}, lambda: torch.nn.functional.silu(tx)),
        (shape, activation.silu_bwd, (x, dy, out), {}, lambda: aten.silu_backward(tdy, tx)),
        (shape, activation.relu6_fwd, (x, out), {}, lambda: torch.nn.functional.relu6(tx)),
        (shape, activation.relu6_bwd, (x, dy, out), {},
         lambda: aten.hardtanh_backward(tdy, tx, 0.0, 6.0)),
        (shape, activation.hardswish_fwd, (x, out), {},
         lambda: torch.nn.functional.hardswish(tx)),
        (shape, activation.hardswish_bwd, (x, dy, out), {},
         lambda: aten.hardswish_backward(tdy, tx)),
    ]


def softmax_cases(rng, n):
    cases = []
    for shape, dim in (((n, 1000), 1), ((n, 32, 16, 16), 1)):
        x = rng.standard_normal(shape, dtype=DTYPE) * 3
        dy = rng.standard_normal(shape, dtype=DTYPE)
        y = np.empty_like(x)
        softmax.softmax_fwd.variants["ref"](x, y, dim=dim)
        dx = np.empty_like(x)
        tx, ty, tdy = (torch.from_numpy(a) for a in (x, y, dy))
        label = "x".join(map(str, shape)) + f" dim {dim}"
        cases += [
            (label, softmax.softmax_fwd, (x, np.empty_like(x)), {"dim": dim},
             lambda tx=tx, dim=dim: aten._softmax(tx, dim, False)),
            (label, softmax.softmax_bwd, (y, dy, dx), {"dim": dim},
             lambda ty=ty, tdy=tdy, dim=dim: aten._softmax_backward_data(tdy, ty, dim,
                                                                          torch.float32)),
        ]
    return cases


def layer_norm_cases(rng, n):
    cases = []
    for shape, norm in (((n, 196, 384), (384,)), ((n, 32, 16, 16), (32, 16, 16))):
        x = rng.standard_normal(shape, dtype=DTYPE)
        dy = rng.standard_normal(shape, dtype=DTYPE)
        w, b = rng.standard_normal(norm, dtype=DTYPE), rng.standard_normal(norm, dtype=DTYPE)
        stats = shape[:len(shape) - len(norm)]
        y, mean, rstd = np.empty_like(x), np.empty(stats), np.empty(stats)
        layernorm.layer_norm_fwd.variants["ref"](x, w, b, y, mean, rstd, eps=1e-5)
        dx, dw, db = np.empty_like(x), np.zeros_like(w), np.zeros_like(b)
        tx, tdy, tw, tb = (torch.from_numpy(a) for a in (x, dy, w, b))
        _, tmean, trstd = aten.native_layer_norm(tx, list(norm), tw, tb, 1e-5)
        label = "x".join(map(str, shape))
        cases += [
            (label, layernorm.layer_norm_fwd, (x, w, b, y, mean, rstd), {"eps": 1e-5},
             lambda tx=tx, norm=norm, tw=tw, tb=tb: aten.native_layer_norm(tx, list(norm), tw,
                                                                           tb, 1e-5)),
            (label, layernorm.layer_norm_bwd_input, (x, dy, mean, rstd, w, dx), {},
             lambda a=(tdy, tx, list(norm), tmean, trstd, tw, tb): aten.native_layer_norm_backward(
                 *a, [True, False, False])),
            (label, layernorm.layer_norm_bwd_params, (x, dy, mean, rstd, dw, db), {},
             lambda a=(tdy, tx, list(norm), tmean, trstd, tw, tb): aten.native_layer_norm_backward(
                 *a, [False, True, True])),
        ]
    return cases


def batch_norm_1d_cases(rng, n):
    """BatchNorm1d over (n, 512) and (n, 64, 128): the normalisation and the input gradient
    (the statistics' REDUX sums are the same codelets as BatchNorm2d's)."""
    cases = []
    for shape in ((n, 512), (n, 64, 128)):
        c = shape[1]
        x = rng.standard_normal(shape, dtype=DTYPE)
        dy = rng.standard_normal(shape, dtype=DTYPE)
        mean = x.reshape(n, c, -1).mean(axis=(0, 2)).astype(DTYPE)
        var = x.reshape(n, c, -1).var(axis=(0, 2)).astype(DTYPE)
        w, b = np.ones(c, DTYPE), np.zeros(c, DTYPE)
        count = x.size // c
        sum_dy = dy.reshape(n, c, -1).sum(axis=(0, 2)).astype(DTYPE)
        dotp = ((x.reshape(n, c, -1) - mean[None, :, None]) * dy.reshape(n, c, -1)).sum(
            axis=(0, 2)).astype(DTYPE)
        out = np.empty_like(x)
        tx, tdy, tw, tb = (torch.from_numpy(a) for a in (x, dy, w, b))
        tmean, tvar = torch.from_numpy(mean), torch.from_numpy(var)
        _, save_mean, save_invstd = aten.native_batch_norm(tx, tw, tb, None, None, True, 0.1,
                                                           1e-5)
        label = "x".join(map(str, shape))
        cases += [
            (label, batchnorm.bn_fwd, (x, mean, var, w, b, out), {"eps": 1e-5},
             lambda a=(tx, tw, tb, tmean, tvar): aten.native_batch_norm(*a, False, 0.1, 1e-5)),
            (label, batchnorm.bn_bwd_input, (x, dy, mean, var, w, sum_dy, dotp, out),
             {"count": count, "eps": 1e-5},
             lambda a=(tdy, tx, tw, None, None, save_mean, save_invstd): aten.native_batch_norm_backward(
                 *a, True, 1e-5, [True, False, False])),
        ]
    return cases


def dropout2d_cases(rng, n):
    x = rng.standard_normal((n, 32, 16, 16), dtype=DTYPE)
    key = dropout.key_data(7, 3)
    tx = torch.from_numpy(x)
    shape = f"{n}x32x16x16"
    params = {"p": 0.2, "start": 0, "block": 256}
    return [(shape, dropout.dropout2d_fwd, (x, np.empty_like(x), key), params,
             lambda: torch.nn.functional.dropout2d(tx, 0.2, training=True))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=25, help="timing rounds per contender")
    parser.add_argument("--batch", type=int, default=64, help="samples per partition")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = args.batch
    cases = (pointwise_cases(rng, n) + softmax_cases(rng, n) + layer_norm_cases(rng, n)
             + batch_norm_1d_cases(rng, n) + dropout2d_cases(rng, n))
    report(cases, args.repeat, args.json)


if __name__ == "__main__":
    main()
