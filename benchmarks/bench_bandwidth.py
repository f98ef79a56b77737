"""Memory-bound kernels against the machine's copy bandwidth (issue 8, item 4).

Pooling, ReLU, the REDUX add and the optimizer steps do a few flops per byte:
their speed is the memory bandwidth they reach. For each, on one thread, the
pinned variant (``hetero_nn.codelets.pinned``) runs on operands of about
``--mib`` MiB (past the caches: DRAM bandwidth) and of a LeNet-5 layer's size
(batch 64: in cache); its bandwidth is the bytes its access modes move (``R``
and ``W`` operands once, ``RW`` twice) over its median time. The reference is
``np.copyto`` between two arrays of the same total size, one thread (read +
write counted, as for the kernels). Example::

    python benchmarks/bench_bandwidth.py --mib 64 --repeat 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _median_seconds(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(nbytes, repeat):
    """Bytes per second of ``np.copyto`` (read + write) over ``nbytes`` per array."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / _median_seconds(lambda: np.copyto(dst, src), repeat)


def cases(elements):
    """``(codelet, operands, params)`` for each memory-bound codelet, ``elements``
    float32 elements in its largest operand."""
    from hetero_nn.codelets.activation import relu_bwd, relu_fwd
    from hetero_nn.codelets.optim import sgd_hyper, sgd_step
    from hetero_nn.codelets.pool import maxpool2d_bwd, maxpool2d_fwd
    from hetero_nn.codelets.reduce import add

    rng = np.random.default_rng(0)
    channels = 16
    side = max(2, int(np.sqrt(elements / channels / 64)) // 2 * 2)
    batch = max(1, elements // (channels * side * side))
    x4 = rng.standard_normal((batch, channels, side, side)).astype(np.float32)
    y4 = np.empty((batch, channels, side // 2, side // 2), np.float32)
    arg = np.empty(y4.shape, np.int64)
    from hetero_nn.codelets.pool import maxpool2d_fwd as fwd
    _pinned(fwd)(x4, y4, arg, kernel_size=2)
    flat = [rng.standard_normal(elements).astype(np.float32) for _ in range(3)]
    return [
        ("relu_fwd", relu_fwd, (flat[0], flat[1]), {}),
        ("relu_bwd", relu_bwd, (flat[0], flat[1], flat[2]), {}),
        ("maxpool2d_fwd", maxpool2d_fwd, (x4, y4, arg), {"kernel_size": 2}),
        ("maxpool2d_bwd", maxpool2d_bwd, (y4, arg, x4.copy()), {"kernel_size": 2}),
        ("add (REDUX)", add, (flat[0], flat[1]), {}),
        ("sgd_step (momentum)", sgd_step, (flat[0], flat[1], flat[2], sgd_hyper(0.01, 0.9)), {}),
    ]


def _pinned(codelet):
    from hetero_nn.codelets.pinned import PINNED_VARIANTS
    for name in PINNED_VARIANTS.get(codelet.name, PINNED_VARIANTS["*"]):
        if name in codelet.variants:
            return codelet.variants[name]
    return next(iter(codelet.variants.values()))


def moved_bytes(codelet, operands):
    """Bytes the access modes move: ``R``/``W`` operands once, ``RW`` twice."""
    return sum(a.nbytes * (2 if m.reads and m.writes else 1)
               for a, m in zip(operands, codelet.modes))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=float, default=64, help="size of the large operands (MiB)")
    p.add_argument("--small", type=int, default=64 * 6 * 28 * 28,
                   help="elements of the in-cache case (default: LeNet-5's first layer, batch 64)")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    large = int(args.mib * 2 ** 20) // 4
    rows = []
    for label, elements in (("large", large), ("lenet", args.small)):
        copy = copy_bandwidth(elements * 4, args.repeat)
        rows.append((label, "np.copyto", elements * 8, copy, 1.0))
        for name, codelet, operands, params in cases(elements):
            fn = _pinned(codelet)
            seconds = _median_seconds(lambda: fn(*operands, **params), args.repeat)
            nbytes = moved_bytes(codelet, operands)
            rows.append((label, name, nbytes, nbytes / seconds, nbytes / seconds / copy))
    print("one thread; bandwidth = bytes moved by the access modes / median time; "
          "ratio = against np.copyto of the same size")
    print(f"{'size':6s} {'kernel':22s} {'MiB moved':>10s} {'GB/s':>8s} {'ratio':>6s}")
    for label, name, nbytes, bw, ratio in rows:
        print(f"{label:6s} {name:22s} {nbytes / 2 ** 20:10.1f} {bw / 1e9:8.2f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
