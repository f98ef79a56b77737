"""Every CPU codelet variant against PyTorch at LeNet-5 and CIFAR-small shapes, and a whole
LeNet-5 training step: hetero_nn's ``Trainer.train_step`` against a PyTorch step.

Codelets (batch 64, float32, one thread on both sides: ``torch.set_num_threads(1)``
and BLAS held to one thread by threadpoolctl, as one runtime worker runs): each
codelet at each shape is timed with all its CPU variants (``ref`` and ``cpu*``)
and the ATen operations PyTorch runs for the same work, round-robin so that
background load hits every contender alike. One row per (codelet, shape): the
fastest variant, its median in microseconds, PyTorch's median, their ratio (below
1: hetero_nn is faster) and the medians of the other variants.

Shapes: LeNet-5 (1x28x28: conv 6@5x5 pad 2, pool 2, conv 16@5x5, pool 2, dense
400-120-84-10) and CIFAR-small (3x32x32: conv 32@3x3 pad 1, pool 2, conv 64@3x3
pad 1, pool 2, dense 4096-10). The convolution and pooling shapes come from
``bench_codelets_conv_pool.py``; the dense, ReLU, loss and optimizer cases and the
round-robin timer from ``bench_codelets_dense_misc.py``; this script adds the
codelets those two leave out (bias-free convolution and dense, ReLU at CIFAR
shapes, the buffer codelets ``fill_zero``/``add``/``copy`` and the REDUX combine).

Training step (LeNet-5, batch 64, float32, SGD with momentum): hetero_nn on
``cpu:1`` and ``cpu:2`` at granularity 1 and 2, the performance model choosing
variants (warmed up first, kept in a temporary directory), against PyTorch with
the same number of threads.

Not a test. Run::

    python benchmarks/bench_codelets.py [--repeat 25] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import hetero_nn as hn
from hetero_nn.codelets import activation, conv, dense, pool, reduce

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_codelets_dense_misc as dense_misc  # noqa: E402

try:  # may still be changing under another engineer: fall back to the same shapes
    from bench_codelets_conv_pool import CONVS, POOLS
except Exception:  # pragma: no cover - depends on the other script's state
    CONVS = [("lenet.conv1", (64, 1, 28, 28), (6, 5), 2), ("lenet.conv2", (64, 6, 14, 14), (16, 5), 0),
             ("cifar.conv1", (64, 3, 32, 32), (32, 3), 1), ("cifar.conv2", (64, 32, 16, 16), (64, 3), 1)]
    POOLS = [("lenet.pool1", (64, 6, 28, 28), 2), ("lenet.pool2", (64, 16, 10, 10), 2),
             ("cifar.pool1", (64, 32, 32, 32), 2), ("cifar.pool2", (64, 64, 16, 16), 2)]

DTYPE = np.float32
BATCH = 64
CIFAR_SMALL_PARAMS = 3 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 4096 * 10 + 10
aten = torch.ops.aten


def _label(name):
    """``lenet.conv1`` -> ``LeNet conv1``."""
    net, layer = name.split(".")
    return f"{'LeNet' if net == 'lenet' else 'CIFAR-small'} {layer}"


def _dims(shape):
    return "x".join(map(str, shape))


# --------------------------------------------------------------------------- cases
# A case is (shape label, codelet, arrays, params, torch callable), as in dense_misc.

def conv_cases(rng, name, x_shape, out_kernel, padding):
    """All five convolution codelets at one layer's shapes."""
    n_out, k = out_kernel
    x = rng.standard_normal(x_shape, dtype=DTYPE)
    w = rng.standard_normal((n_out, x_shape[1], k, k), dtype=DTYPE)
    b = rng.standard_normal(n_out, dtype=DTYPE)
    y = np.empty(conv.conv2d_output_shape(x.shape, w.shape, 1, padding), DTYPE)
    dy = rng.standard_normal(y.shape, dtype=DTYPE)
    dx, dw, db = np.empty_like(x), np.zeros_like(w), np.zeros_like(b)
    tx, tw, tb, tdy = (torch.from_numpy(a) for a in (x, w, b, dy))
    params = dict(stride=1, padding=padding)
    shape = f"{_label(name)} {_dims(x_shape)} {n_out}@{k}x{k}" + (f" p{padding}" if padding else "")

    def torch_bwd(mask):  # the ATen call autograd makes for conv2d's backward
        return lambda: aten.convolution_backward(tdy, tx, tw, [n_out], [1, 1], [padding, padding],
                                                 [1, 1], False, [0, 0], 1, mask)

    return [
        (shape, conv.conv2d_fwd, (x, w, b, y), params, lambda: F.conv2d(tx, tw, tb, 1, padding)),
        (shape, conv.conv2d_fwd_nobias, (x, w, y), params, lambda: F.conv2d(tx, tw, None, 1, padding)),
        (shape, conv.conv2d_bwd_input, (dy, w, dx), params, torch_bwd([True, False, False])),
        (shape, conv.conv2d_bwd_params, (x, dy, dw, db), params, torch_bwd([False, True, True])),
        (shape, conv.conv2d_bwd_weight, (x, dy, dw), params, torch_bwd([False, True, False])),
    ]


def pool_cases(rng, name, x_shape, kernel):
    """Max pooling forward and backward; the input is a ReLU output (ties of zeros)."""
    x = np.maximum(rng.standard_normal(x_shape, dtype=DTYPE), 0)
    y_shape = pool.maxpool2d_output_shape(x.shape, kernel)
    y, argmax = np.empty(y_shape, DTYPE), np.empty(y_shape, np.int64)
    pool.maxpool2d_fwd.variants["ref"](x, y, argmax, kernel_size=kernel)
    dy, dx = rng.standard_normal(y_shape, dtype=DTYPE), np.empty_like(x)
    tx, tdy, targ = torch.from_numpy(x), torch.from_numpy(dy), torch.from_numpy(argmax)
    params = dict(kernel_size=kernel, stride=kernel)
    shape = f"{_label(name)} {_dims(x_shape)} k{kernel}"
    return [
        (shape, pool.maxpool2d_fwd, (x, y, argmax), params,
         lambda: F.max_pool2d(tx, kernel, kernel, return_indices=True)),
        (shape, pool.maxpool2d_bwd, (dy, argmax, dx), params,
         lambda: aten.max_pool2d_with_indices_backward(tdy, tx, [kernel, kernel], [kernel, kernel],
                                                       [0, 0], [1, 1], False, targ)),
    ]


def relu_cases_at(rng, label, shape):
    """``relu_fwd``/``relu_bwd`` at another activation shape (dense_misc covers LeNet's first)."""
    x = rng.standard_normal(shape, dtype=DTYPE)
    dy = rng.standard_normal(shape, dtype=DTYPE)
    y, dx = np.maximum(x, 0), np.empty_like(x)
    tx, ty, tdy = (torch.from_numpy(a) for a in (x, y, dy))
    text = f"{label} {_dims(shape)}"
    return [(text, activation.relu_fwd, (x, y), {}, lambda: torch.relu(tx)),
            (text, activation.relu_bwd, (y, dy, dx), {}, lambda: aten.threshold_backward(tdy, ty, 0))]


def dense_nobias_cases(rng, n_in, n_out, label):
    """The bias-free dense codelets (``Dense(bias=False)``)."""
    x = rng.standard_normal((BATCH, n_in), dtype=DTYPE)
    w = rng.standard_normal((n_out, n_in), dtype=DTYPE)
    dy = rng.standard_normal((BATCH, n_out), dtype=DTYPE)
    y, dw = np.empty((BATCH, n_out), DTYPE), np.zeros((n_out, n_in), DTYPE)
    tx, tw, tdy = (torch.from_numpy(a) for a in (x, w, dy))
    shape = f"{label} {BATCH}x{n_in}->{n_out}"
    return [(shape, dense.dense_fwd_nobias, (x, w, y), {}, lambda: F.linear(tx, tw)),
            (shape, dense.dense_bwd_weight, (x, dy, dw), {}, lambda: tdy.t().mm(tx))]


def buffer_cases(rng, size, label):
    """The buffer codelets a step runs around the kernels: gradient reset, REDUX combine."""
    a = rng.standard_normal(size, dtype=DTYPE)
    b = rng.standard_normal(size, dtype=DTYPE)
    c = np.empty_like(a)
    ta, tb, tc = (torch.from_numpy(v) for v in (a, b, c))
    redux = hn.Codelet("add_redux", modes=(hn.RW, hn.R), variants={"ref": reduce.add_redux})
    shape = f"{label} {size}"
    return [(shape, reduce.fill_zero, (c,), {}, lambda: tc.zero_()),
            (shape, reduce.add, (a, b), {}, lambda: ta.add_(tb)),
            (shape, redux, (a, b), {}, lambda: ta.add_(tb)),
            (shape, reduce.copy, (b, c), {}, lambda: tc.copy_(tb))]


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    for name, x_shape, out_kernel, padding in CONVS:
        cases += conv_cases(rng, name, x_shape, out_kernel, padding)
    for name, x_shape, kernel in POOLS:
        cases += pool_cases(rng, name, x_shape, kernel)
    for n_in, n_out, label in [(400, 120, "LeNet"), (120, 84, "LeNet"), (84, 10, "LeNet"),
                               (4096, 10, "CIFAR-small")]:
        cases += dense_misc.dense_cases(rng, BATCH, n_in, n_out, label)
    cases += dense_nobias_cases(rng, 400, 120, "LeNet") + dense_nobias_cases(rng, 4096, 10, "CIFAR-small")
    cases += dense_misc.relu_cases(rng)
    cases += relu_cases_at(rng, "LeNet", (BATCH, 16, 10, 10))
    cases += relu_cases_at(rng, "CIFAR-small", (BATCH, 32, 32, 32))
    cases += relu_cases_at(rng, "CIFAR-small", (BATCH, 64, 16, 16))
    cases += dense_misc.loss_cases(rng)
    cases += dense_misc.optim_cases(rng)
    cases += buffer_cases(rng, 120 * 400, "LeNet grad 7.weight")
    cases += buffer_cases(rng, 64 * 32 * 9, "CIFAR-small grad 3.weight")
    return cases


# --------------------------------------------------------------------------- codelet table

def measure_codelets(repeat, seed=0, only=None):
    """One dict per (codelet, shape): every CPU variant's median, torch's, the best."""
    rows = []
    torch.set_num_threads(1)
    with threadpool_limits(1):
        for shape, codelet, arrays, params, torch_fn in all_cases(seed):
            if only and only not in codelet.name:
                continue
            contenders = {name: (lambda v=codelet.variants[name]: v(*arrays, **params))
                          for name in codelet.kinds["cpu"]}
            contenders["torch"] = torch_fn
            medians = dense_misc.measure(contenders, repeat)
            torch_s = medians.pop("torch")
            best = min(medians, key=medians.get)
            rows.append(dict(codelet=codelet.name, shape=shape, best=best,
                             best_us=medians[best] * 1e6, torch_us=torch_s * 1e6,
                             ratio=medians[best] / torch_s,
                             variants_us={k: v * 1e6 for k, v in medians.items()}))
            print(_format_row(rows[-1]), flush=True)
    return rows


def _format_row(r):
    others = ", ".join(f"{k} {v:.0f}" for k, v in r["variants_us"].items() if k != r["best"])
    return (f"{r['codelet']:<22} {r['shape']:<40} {r['best']:<11} {r['best_us']:>10.1f} "
            f"{r['torch_us']:>9.1f} {r['ratio']:>6.2f}  {others}")


CODELET_HEADER = (f"{'codelet':<22} {'shape':<40} {'best':<11} {'median us':>10} {'torch us':>9} "
                  f"{'ratio':>6}  other variants (median us)")


# --------------------------------------------------------------------------- training step

def lenet5():
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120), hn.ReLU(), hn.Dense(120, 84), hn.ReLU(), hn.Dense(84, 10))


def _batches(seed, count=4):
    rng = np.random.default_rng(seed)
    return [(rng.random((BATCH, 1, 28, 28), dtype=DTYPE), rng.integers(0, 10, BATCH))
            for _ in range(count)]


def hn_step_seconds(workers, granularity, repeat, warmup, cache_dir, seed=0):
    """Median seconds of ``Trainer.train_step`` (the variants the performance model picks)."""
    hn.manual_seed(seed)
    data = _batches(seed)
    with hn.Runtime(devices=f"cpu:{workers}", policy="dmda", perfmodel=cache_dir) as rt:
        trainer = hn.Trainer(lenet5(), optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                             batch_size=BATCH, granularity=granularity, dtype="float32")
        for i in range(warmup):  # compile, explore every variant, fill the arenas
            trainer.train_step(*data[i % len(data)])
        rt.trace(clear=True)
        times = []
        for i in range(repeat):
            start = time.perf_counter()
            trainer.train_step(*data[i % len(data)])
            times.append(time.perf_counter() - start)
        chosen = {}
        for record in rt.trace():
            chosen.setdefault(record.codelet, set()).add(record.variant)
    return statistics.median(times), {k: sorted(v) for k, v in chosen.items()}


def torch_step_seconds(threads, repeat, warmup, seed=0):
    """Median seconds of the same step in PyTorch on ``threads`` threads."""
    torch.set_num_threads(threads)
    hn.manual_seed(seed)
    model = lenet5()
    twin = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(400, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU(),
        torch.nn.Linear(84, 10))
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in _batches(seed)]

    def step(i):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = F.cross_entropy(twin(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    with threadpool_limits(threads, user_api="blas"):
        for i in range(warmup):
            step(i)
        times = []
        for i in range(repeat):
            start = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_steps(repeat, warmup):
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetero_nn-bench-") as cache_dir:
        for workers in (1, 2):
            torch_s = torch_step_seconds(workers, repeat, warmup)
            for granularity in (1, 2):
                hn_s, chosen = hn_step_seconds(workers, granularity, repeat, warmup, cache_dir)
                rows.append(dict(threads=workers, granularity=granularity, hn_ms=hn_s * 1e3,
                                 torch_ms=torch_s * 1e3, ratio=hn_s / torch_s,
                                 conv_variants={k: v for k, v in chosen.items()
                                                if k.startswith("conv2d") and ".redux" not in k}))
                r = rows[-1]
                print(f"cpu:{workers:<4} {granularity:>11} {r['hn_ms']:>12.2f} {r['torch_ms']:>9.2f} "
                      f"{r['ratio']:>6.2f}  {r['conv_variants']}", flush=True)
    return rows


STEP_HEADER = (f"{'devices':<8} {'granularity':>11} {'hetero_nn ms':>12} {'torch ms':>9} {'ratio':>6}  "
               "convolution variants the performance model ran")


# --------------------------------------------------------------------------- main

def machine():
    return dict(python=platform.python_version(), numpy=np.__version__, torch=torch.__version__,
                hetero_nn=hn.__version__, cpu=platform.processor() or platform.machine(),
                cores=os.cpu_count(), load_average=os.getloadavg())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=25,
                        help="timing rounds per codelet contender, and timed training steps")
    parser.add_argument("--warmup", type=int, default=15,
                        help="training steps before timing (compiles, explores variants)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    parser.add_argument("--only", help="only codelets whose name contains this text")
    parser.add_argument("--no-step", action="store_true", help="skip the training-step comparison")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")

    info = machine()
    print(f"float32, batch {BATCH}; {info['cpu']}, {info['cores']} cores, load average "
          f"{info['load_average'][0]:.1f}; numpy {info['numpy']}, torch {info['torch']}")
    print(f"\nCodelets, 1 thread on both sides, median of {args.repeat} rounds; "
          "ratio = best variant / torch\n")
    print(CODELET_HEADER)
    print("-" * len(CODELET_HEADER))
    codelet_rows = measure_codelets(args.repeat, only=args.only)
    slower = [r for r in codelet_rows if r["ratio"] > 1]
    print(f"\n{len(codelet_rows) - len(slower)} of {len(codelet_rows)} codelets at or below torch; "
          "slower: " + (", ".join(f"{r['codelet']} ({r['shape']}: {r['ratio']:.2f}x)" for r in slower)
                        or "none"))

    step_rows = []
    if not args.no_step:
        print(f"\nLeNet-5 training step, batch {BATCH}, SGD momentum, median of {args.repeat} steps "
              f"after {args.warmup}; torch on as many threads as hetero_nn has workers\n")
        print(STEP_HEADER)
        print("-" * len(STEP_HEADER))
        step_rows = measure_steps(args.repeat, args.warmup)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=info, argv=sys.argv[1:], repeat=args.repeat, codelets=codelet_rows,
                           training_step=step_rows), f, indent=1)


if __name__ == "__main__":
    main()
