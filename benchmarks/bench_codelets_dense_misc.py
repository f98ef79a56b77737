"""Benchmark the dense, ReLU, loss and optimizer codelets against PyTorch on one core.

Every CPU variant (``ref`` and ``cpu*``) of each codelet runs at the shapes of
LeNet-5 with batch 64 (dense 400->120->84->10, ReLU on 64x6x28x28, loss on
64x10, SGD/Adam on 61,706 parameters) and of CIFAR-small (dense 4096->10),
float32, beside the ATen operations PyTorch runs for the same work, with
``torch.set_num_threads(1)`` and BLAS limited to one thread (threadpoolctl),
as a runtime worker runs them. The contenders of a case are timed round-robin
so background load hits them alike; the table gives medians and the ratio
hetero_nn/torch (below 1: hetero_nn is faster). ``best`` is the variant a
performance model would settle on.

Not a test. Run::

    python benchmarks/bench_codelets_dense_misc.py [--repeat 25] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import activation, dense, loss, optim

DTYPE = np.float32
LENET_PARAMS = 61_706


def _timed(fn, number):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _calls_per_round(fn, target_s=2e-3):
    """How many calls make one timing round of about ``target_s``."""
    once = _timed(fn, 1)
    return max(1, min(1000, int(target_s / max(once, 1e-7))))


def measure(contenders, repeat):
    """Median seconds per call of each contender, timed round-robin after a warm-up."""
    for fn in contenders.values():
        fn()  # compile, allocate, warm the caches
    numbers = {name: _calls_per_round(fn) for name, fn in contenders.items()}
    samples = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            samples[name].append(_timed(fn, numbers[name]))
    return {name: float(np.median(s)) for name, s in samples.items()}


# --------------------------------------------------------------------------- cases

def dense_cases(rng, n, n_in, n_out, label):
    x = rng.standard_normal((n, n_in), dtype=DTYPE)
    w = rng.standard_normal((n_out, n_in), dtype=DTYPE)
    b = rng.standard_normal(n_out, dtype=DTYPE)
    dy = rng.standard_normal((n, n_out), dtype=DTYPE)
    y, dx = np.empty((n, n_out), DTYPE), np.empty((n, n_in), DTYPE)
    dw, db = np.zeros((n_out, n_in), DTYPE), np.zeros(n_out, DTYPE)
    tx, tw, tb, tdy = (torch.from_numpy(a) for a in (x, w, b, dy))
    shape = f"{label} {n}x{n_in}->{n_out}"
    return [
        (shape, dense.dense_fwd, (x, w, b, y), {},
         lambda: torch.nn.functional.linear(tx, tw, tb)),
        (shape, dense.dense_bwd_input, (dy, w, dx), {}, lambda: tdy.mm(tw)),
        (shape, dense.dense_bwd_params, (x, dy, dw, db), {},
         lambda: (tdy.t().mm(tx), tdy.sum(0))),
    ]


def relu_cases(rng):
    x = rng.standard_normal((64, 6, 28, 28), dtype=DTYPE)
    dy = rng.standard_normal(x.shape, dtype=DTYPE)
    y, dx = np.maximum(x, 0), np.empty_like(x)
    tx, ty, tdy = (torch.from_numpy(a) for a in (x, y, dy))
    return [
        ("LeNet 64x6x28x28", activation.relu_fwd, (x, y), {}, lambda: torch.relu(tx)),
        ("LeNet 64x6x28x28", activation.relu_bwd, (y, dy, dx), {},
         lambda: torch.ops.aten.threshold_backward(tdy, ty, 0)),
    ]


def loss_cases(rng):
    n, k = 64, 10
    logits = rng.standard_normal((n, k), dtype=DTYPE)
    labels = rng.integers(0, k, n).astype(np.int64)
    dlogits, pred = np.empty_like(logits), np.empty(n, np.int64)
    total, correct = np.zeros((), DTYPE), np.zeros((), np.int64)
    tl, tlab = torch.from_numpy(logits), torch.from_numpy(labels)
    aten = torch.ops.aten

    def torch_train():
        # The ATen ops autograd runs for cross_entropy(reduction='mean') and its backward.
        log_probs = aten._log_softmax(tl, 1, False)
        value, total_weight = aten.nll_loss_forward(log_probs, tlab, None, 1, -100)
        grad_lp = aten.nll_loss_backward(torch.ones(()), log_probs, tlab, None, 1, -100,
                                         total_weight)
        grad = aten._log_softmax_backward_data(grad_lp, log_probs, 1, tl.dtype)
        return value, grad, (tl.argmax(1) == tlab).sum()

    def torch_eval():
        log_probs = aten._log_softmax(tl, 1, False)
        value, _ = aten.nll_loss_forward(log_probs, tlab, None, 1, -100)
        return value, (tl.argmax(1) == tlab).sum()

    return [
        ("LeNet 64x10", loss.softmax_xent, (logits, labels, dlogits, total, correct),
         {"batch": n}, torch_train),
        ("LeNet 64x10", loss.softmax_xent_eval, (logits, labels, total, correct),
         {"batch": n}, torch_eval),
        ("LeNet 64x10", loss.argmax_rows, (logits, pred), {}, lambda: tl.argmax(1)),
    ]


def optim_cases(rng):
    size = LENET_PARAMS
    param = rng.standard_normal(size, dtype=DTYPE)
    grad = rng.standard_normal(size, dtype=DTYPE)
    buf, exp_avg, exp_avg_sq = (np.zeros(size, DTYPE) for _ in range(3))
    tp, tg, tbuf, tm, tv = (torch.from_numpy(a.copy()) for a in
                            (param, grad, buf, exp_avg, exp_avg_sq))
    sgd = dict(lr=0.01, momentum=0.9, dampening=0.0, weight_decay=5e-4, nesterov=False)
    adam = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)

    def torch_sgd():
        # The tensor ops of torch.optim.SGD's _single_tensor_sgd (no optimizer bookkeeping).
        g = tg.add(tp, alpha=sgd["weight_decay"])
        tbuf.mul_(sgd["momentum"]).add_(g, alpha=1 - sgd["dampening"])
        tp.add_(tbuf, alpha=-sgd["lr"])

    def torch_sgd_plain():
        tp.add_(tg, alpha=-sgd["lr"])

    def torch_adam(step=10):
        # The tensor ops of torch.optim.Adam's _single_tensor_adam.
        tm.lerp_(tg, 1 - adam["beta1"])
        tv.mul_(adam["beta2"]).addcmul_(tg, tg, value=1 - adam["beta2"])
        bias_correction1 = 1 - adam["beta1"] ** step
        bias_correction2_sqrt = (1 - adam["beta2"] ** step) ** 0.5
        denom = (tv.sqrt() / bias_correction2_sqrt).add_(adam["eps"])
        tp.addcdiv_(tm, denom, value=-adam["lr"] / bias_correction1)

    label = f"LeNet {size} params"
    return [
        (label, optim.sgd_step, (param, grad, buf, optim.sgd_hyper(sgd["lr"], sgd["momentum"])),
         {k: sgd[k] for k in ("dampening", "weight_decay", "nesterov")}, torch_sgd),
        (label, optim.sgd_step_plain, (param, grad, optim.sgd_hyper(sgd["lr"])),
         dict(weight_decay=0.0), torch_sgd_plain),
        (label, optim.adam_step, (param, grad, exp_avg, exp_avg_sq,
                                  optim.adam_hyper(adam["lr"], adam["beta1"], adam["beta2"], 10)),
         dict(eps=adam["eps"], weight_decay=adam["weight_decay"]), torch_adam),
    ]


# --------------------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=25, help="timing rounds per contender")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    cases = (dense_cases(rng, 64, 400, 120, "LeNet") + dense_cases(rng, 64, 120, 84, "LeNet")
             + dense_cases(rng, 64, 84, 10, "LeNet") + dense_cases(rng, 64, 4096, 10, "CIFAR-small")
             + relu_cases(rng) + loss_cases(rng) + optim_cases(rng))
    report(cases, args.repeat, args.json)


def report(cases, repeat, json_path=None):
    """Time every CPU variant of each case's codelet beside its torch call; print the table
    (and write it to ``json_path``). A case is ``(shape, codelet, arrays, params, torch_fn)``."""
    rows = []
    header = (f"{'shape':<26} {'codelet':<22} {'variant':<8} {'median us':>10} "
              f"{'torch us':>9} {'ratio':>6}")
    print(f"float32, 1 thread, numpy {np.__version__}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}")
    print(header)
    print("-" * len(header))
    with threadpool_limits(1):
        for shape, codelet, arrays, params, torch_fn in cases:
            contenders = {name: (lambda v=codelet.variants[name]: v(*arrays, **params))
                          for name in codelet.kinds["cpu"]}
            contenders["torch"] = torch_fn
            medians = measure(contenders, repeat)
            torch_s = medians.pop("torch")
            best = min(medians, key=medians.get)
            for name, seconds in medians.items():
                rows.append(dict(shape=shape, codelet=codelet.name, variant=name,
                                 median_us=seconds * 1e6, torch_us=torch_s * 1e6,
                                 ratio=seconds / torch_s, best=name == best))
                mark = "*" if name == best else " "
                print(f"{shape:<26} {codelet.name:<22} {name + mark:<8} {seconds * 1e6:>10.1f} "
                      f"{torch_s * 1e6:>9.1f} {seconds / torch_s:>6.2f}")
    slower = [r for r in rows if r["best"] and r["ratio"] > 1]
    print("\n* = fastest variant. Codelets whose fastest variant is slower than torch: "
          + (", ".join(f"{r['codelet']} ({r['shape']}, {r['ratio']:.2f}x)" for r in slower)
             or "none"))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
