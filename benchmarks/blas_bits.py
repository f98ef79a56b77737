"""Do the dense layers' pinned ``cpu:blas`` variants give their NumPy references' bits?

The pinned dense variants run the references' operations in one Numba kernel: the GEMMs
through Numba's ``np.dot`` (SciPy's BLAS), the bias gradient in NumPy's summation order.
NumPy's ``matmul`` calls NumPy's own BLAS, so the two agree bit for bit only where both
libraries run the same kernels. This script checks it for the shapes the built-in
models' dense layers take (their partitions of batches 12, 16, 64 and 256 at g = 1, 2,
3, 4, 8, and the one-column bias gradient), in float32 and float64, with BLAS held to one
thread as inside a runtime, and prints the BLAS libraries found and the count of
(codelet, shape) cases that differ. A count, not a timing::

    python benchmarks/blas_bits.py
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

#: (in features, out features) of the built-in models' dense layers (28x28 and 32x32
#: inputs) and a one-output layer (the bias gradient's pairwise case).
DENSE = [(676, 10), (400, 120), (120, 84), (84, 10), (576, 120), (4096, 10), (64, 10),
         (120, 1)]


def cases():
    rows = sorted({b // g + e for b in (12, 16, 64, 256) for g in (1, 2, 3, 4, 8)
                   for e in (0, 1)} | {1, 2, 3})
    return [(n, i, o) for (i, o), n in itertools.product(DENSE, rows)]


def compare(dtype, seed=0):
    """``(cases, [(codelet, (n, i, o)), ...] that differ)`` for ``dtype``."""
    from hetero_nn.codelets import dense
    rng = np.random.default_rng(seed)
    differ, total = [], 0
    for n, i, o in cases():
        x = rng.standard_normal((n, i)).astype(dtype)
        w = rng.standard_normal((o, i)).astype(dtype)
        b = rng.standard_normal(o).astype(dtype)
        dy = rng.standard_normal((n, o)).astype(dtype)
        runs = {"dense_fwd": lambda v: _out(v, (x, w, b), (n, o), dtype),
                "dense_fwd_nobias": lambda v: _out(v, (x, w), (n, o), dtype),
                "dense_bwd_input": lambda v: _out(v, (dy, w), (n, i), dtype),
                "dense_bwd_params": lambda v: _acc(v, (x, dy), [(o, i), (o,)], dtype, rng),
                "dense_bwd_weight": lambda v: _acc(v, (x, dy), [(o, i)], dtype, rng)}
        for name, run in runs.items():
            codelet = getattr(dense, name)
            total += 1
            state = rng.bit_generator.state
            ref = run(codelet.variants["ref"])
            rng.bit_generator.state = state
            blas = run(codelet.variants["cpu:blas"])
            if any(r.tobytes() != p.tobytes() for r, p in zip(ref, blas)):
                differ.append((name, (n, i, o)))
    return total, differ


def _out(variant, inputs, shape, dtype):
    y = np.full(shape, np.nan, dtype)
    variant(*inputs, y)
    return [y]


def _acc(variant, inputs, shapes, dtype, rng):
    grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
    variant(*inputs, *grads)
    return grads


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_info, threadpool_limits

    import hetero_nn.codelets  # noqa: F401 - loads SciPy's BLAS, as a runtime does
    for lib in threadpool_info():
        if lib["user_api"] == "blas":
            print(f"{lib['internal_api']} {lib['version']} ({lib['architecture']}): "
                  f"{lib['filepath']}")
    failed = 0
    with threadpool_limits(limits=1, user_api="blas"):
        for dtype in (np.float32, np.float64):
            total, differ = compare(dtype, args.seed)
            failed += len(differ)
            print(f"{np.dtype(dtype).name}: {len(differ)} of {total} (codelet, shape) cases "
                  f"differ from the reference")
            for name, shape in differ[:20]:
                print(f"    {name} (n, in, out) = {shape}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
