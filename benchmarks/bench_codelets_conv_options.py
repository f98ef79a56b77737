"""Time every CPU variant of the codelets issue 17 added or extended against PyTorch.

Depthwise convolutions (MobileNet's 3x3 layers, stride 1 and 2), dilated and
grouped convolutions, the padding modes and an even kernel padded 'same'
(PyTorch pads apart there, so its side is ``F.pad`` + ``conv2d`` and autograd's
backward), max pooling with padding and ceil mode (ResNet's stem pooling),
average pooling in ceil mode without the padding in its divisors, and adaptive
average pooling (global, to a size the input is no multiple of, and to a larger
one). Batch 64 by default. Both sides run on one thread
(``torch.set_num_threads(1)``, BLAS limited by threadpoolctl), as one worker of
the runtime does, round-robin with a warm-up call each (``bench_codelets_conv_pool.py``'s
timer). The table gives each variant's median, PyTorch's median, their ratio
(< 1: hetero_nn is faster) and the ratio of the minima; a last table names the
fastest non-reference variant per row (what the performance model would pick)::

    python benchmarks/bench_codelets_conv_options.py [--repeat 30] [--dtype float32] [--batch 64]

The goal of issue 17: depthwise and dilated convolutions at batch 64 at most
1.25x PyTorch's time (>= 0.8x its speed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import avgpool, conv, depthwise, pool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_codelets_conv_pool import parse_args, report, timed_rows  # noqa: E402

# name, x shape without the batch, (out channels, kernel), convolution parameters
CONVS = [
    ("mobilenet.dw1", (32, 56, 56), (32, 3), {"padding": 1, "groups": 32}),
    ("mobilenet.dw2", (64, 56, 56), (64, 3), {"stride": 2, "padding": 1, "groups": 64}),
    ("mobilenet.dw3", (128, 28, 28), (128, 3), {"padding": 1, "groups": 128}),
    ("dilated.d2", (32, 32, 32), (32, 3), {"padding": 2, "dilation": 2}),
    ("dilated.d4", (64, 16, 16), (64, 3), {"padding": 4, "dilation": 4}),
    ("dilated.rgb", (3, 32, 32), (32, 3), {"padding": 2, "dilation": 2}),
    ("grouped.g4", (32, 16, 16), (64, 3), {"padding": 1, "groups": 4}),
    ("reflect", (3, 32, 32), (32, 3), {"padding": 1, "padding_mode": "reflect"}),
    ("circular", (32, 16, 16), (32, 3), {"padding": 1, "padding_mode": "circular"}),
    ("same.even", (16, 16, 16), (16, 4), {"padding": "same"}),
]
# name, x shape without the batch, codelet parameters
MAX_POOLS = [
    ("resnet.stem", (16, 56, 56), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("ceil", (32, 27, 27), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
]
AVG_POOLS = [
    ("ceil.exclude", (32, 28, 28), {"kernel_size": 3, "stride": 2, "padding": 1,
                                    "ceil_mode": True, "count_include_pad": False}),
]
ADAPTIVE = [  # name, x shape without the batch, output plane
    ("global", (64, 7, 7), (1, 1)),
    ("5x5", (32, 14, 14), (5, 5)),
    ("up.7x7", (32, 6, 6), (7, 7)),
]


def _timed(name, cases, params, repeat):
    """``timed_rows`` of each ``(codelet, arrays, torch call)`` of ``cases``."""
    rows = []
    for codelet, arrays, torch_fn in cases:
        rows += timed_rows(name, codelet.name, codelet, arrays, params, torch_fn, repeat)
    return rows


def conv_rows(name, shape, out_kernel, params, batch, dtype, repeat, rng):
    """Timed rows for the forward, input-gradient and parameter-gradient codelets."""
    n_out, k = out_kernel
    groups = params.get("groups", 1)
    is_depthwise = groups == shape[0] > 1
    x = rng.standard_normal((batch, *shape)).astype(dtype)
    w = rng.standard_normal((n_out, shape[0] // groups, k, k)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    task = {k: v for k, v in params.items() if not (is_depthwise and k == "groups")}
    y = np.empty(conv.conv2d_output_shape(x.shape, w.shape, **params), dtype=dtype)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dw, db = np.empty_like(x), np.zeros_like(w), np.zeros_like(b)
    codelets = ((depthwise.conv2d_depthwise_fwd, depthwise.conv2d_depthwise_bwd_input,
                 depthwise.conv2d_depthwise_bwd_params) if is_depthwise else
                (conv.conv2d_fwd, conv.conv2d_bwd_input, conv.conv2d_bwd_params))
    fwd, bwd_input, bwd_params = _torch_conv(x, w, b, dy, params)
    cases = [(codelets[0], (x, w, b, y), fwd), (codelets[1], (dy, w, dx), bwd_input),
             (codelets[2], (x, dy, dw, db), bwd_params)]
    return _timed(name, cases, task, repeat)


def _torch_conv(x, w, b, dy, params):
    """PyTorch's forward, input-gradient and parameter-gradient calls for one convolution:
    the ATen operations autograd runs (``F.pad`` then a padding-free convolution for the
    modes and for an even 'same' kernel, as ``torch.nn.Conv2d`` does, with autograd's
    backward through both)."""
    xt, wt, bt, dyt = (torch.from_numpy(a) for a in (x, w, b, dy))
    stride, dilation = params.get("stride", 1), params.get("dilation", 1)
    groups, pad = params.get("groups", 1), params.get("padding", 0)
    mode = params.get("padding_mode", "zeros")
    if mode == "zeros" and pad != "same":
        s, d, p = (stride,) * 2, (dilation,) * 2, (pad,) * 2

        def bwd(mask):
            return lambda: torch.ops.aten.convolution_backward(
                dyt, xt, wt, [w.shape[0]], s, p, d, False, [0, 0], groups, mask)
        return (lambda: F.conv2d(xt, wt, bt, s, p, d, groups), bwd([True, False, False]),
                bwd([False, True, True]))
    module = torch.nn.Conv2d(x.shape[1], w.shape[0], w.shape[2:], stride=stride, padding=pad,
                             dilation=dilation, groups=groups, padding_mode=mode).to(xt.dtype)
    with torch.no_grad():
        module.weight.copy_(wt)
        module.bias.copy_(bt)
    xg = xt.clone().requires_grad_(True)
    yg = module(xg)
    return (lambda: module(xt),
            lambda: torch.autograd.grad(yg, (xg,), dyt, retain_graph=True),
            lambda: torch.autograd.grad(yg, (module.weight, module.bias), dyt,
                                        retain_graph=True))


def max_pool_rows(name, shape, params, batch, dtype, repeat, rng):
    x = np.maximum(rng.standard_normal((batch, *shape)), 0).astype(dtype)  # ReLU output
    y_shape = pool.maxpool2d_output_shape(x.shape, **params)
    y, argmax = np.empty(y_shape, dtype=dtype), np.empty(y_shape, dtype=np.int64)
    pool.maxpool2d_fwd.variants["ref"](x, y, argmax, **params)
    dy, dx = rng.standard_normal(y_shape).astype(dtype), np.empty_like(x)
    xt, dyt, argt = torch.from_numpy(x), torch.from_numpy(dy), torch.from_numpy(argmax)
    k, s = params["kernel_size"], params.get("stride", params["kernel_size"])
    p, ceil = params.get("padding", 0), params.get("ceil_mode", False)
    cases = [
        (pool.maxpool2d_fwd, (x, y, argmax),
         lambda: F.max_pool2d(xt, k, s, p, ceil_mode=ceil, return_indices=True)),
        (pool.maxpool2d_bwd, (dy, argmax, dx),
         lambda: torch.ops.aten.max_pool2d_with_indices_backward(
             dyt, xt, [k, k], [s, s], [p, p], [1, 1], ceil, argt)),
    ]
    return _timed(name, cases, params, repeat)


def avg_pool_rows(name, shape, params, batch, dtype, repeat, rng):
    x = rng.standard_normal((batch, *shape)).astype(dtype)
    y = np.empty(avgpool.avgpool2d_output_shape(x.shape, **params), dtype=dtype)
    dy, dx = rng.standard_normal(y.shape).astype(dtype), np.empty_like(x)
    xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)
    k, s, p = params["kernel_size"], params["stride"], params["padding"]
    ceil, include = params["ceil_mode"], params["count_include_pad"]
    cases = [
        (avgpool.avgpool2d_fwd, (x, y), lambda: F.avg_pool2d(xt, k, s, p, ceil, include)),
        (avgpool.avgpool2d_bwd, (dy, dx), lambda: torch.ops.aten.avg_pool2d_backward(
            dyt, xt, [k, k], [s, s], [p, p], ceil, include, None)),
    ]
    return _timed(name, cases, params, repeat)


def adaptive_rows(name, shape, out, batch, dtype, repeat, rng):
    x = rng.standard_normal((batch, *shape)).astype(dtype)
    y = np.empty((batch, shape[0], *out), dtype=dtype)
    dy, dx = rng.standard_normal(y.shape).astype(dtype), np.empty_like(x)
    xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)
    cases = [
        (avgpool.adaptive_avgpool2d_fwd, (x, y), lambda: F.adaptive_avg_pool2d(xt, out)),
        (avgpool.adaptive_avgpool2d_bwd, (dy, dx),
         lambda: torch.ops.aten._adaptive_avg_pool2d_backward(dyt, xt)),
    ]
    return _timed(name, cases, {}, repeat)


def main(argv=None):
    args = parse_args(__doc__, argv, batch=True)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    dtype = np.dtype(args.dtype)
    rows = []

    def run(rows_of, *case):
        return rows_of(*case, args.batch, dtype, args.repeat, rng)

    with threadpool_limits(1):
        for name, shape, out_kernel, params in CONVS:
            rows += run(conv_rows, name, shape, out_kernel, params)
        for name, shape, params in MAX_POOLS:
            rows += run(max_pool_rows, name, shape, params)
        for name, shape, params in AVG_POOLS:
            rows += run(avg_pool_rows, name, shape, params)
        for name, shape, out in ADAPTIVE:
            rows += run(adaptive_rows, name, shape, out)

    report(rows, f"{dtype.name}, batch {args.batch}, 1 thread, {args.repeat} timed calls each",
           widths=(14, 28))
    return 0


if __name__ == "__main__":
    sys.exit(main())
