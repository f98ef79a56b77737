"""Every ``cuda`` variant against its ``ref`` twin, on the operands of real training steps.

Recording: the zoo of models (:func:`gpu_common.zoo_model`) trains one step (fused
and unfused, float64 and float32, SGD with momentum, Adam and AdamW) and evaluates one
batch on ``cpu:1`` pinned to the ``ref`` variants; each codelet's ``ref`` variant is
wrapped to keep a copy of its operands and parameters, once per codelet, shapes and
parameters. Replay: each recorded call runs its ``ref`` variant on NumPy copies and its
``cuda`` variant on device copies (CuPy on a GPU; NumPy under ``HETERO_NN_GPU_EMULATE``
or with no GPU), and every operand but the SCRATCH ones must agree (float64 1e-10,
float32 1e-4 relative to the largest magnitude; integers exactly). Codelets with a
``cuda`` variant that no model reached are listed.

    python3 benchmarks/gpu/variants.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import pkgutil
import sys
import time
import traceback

import numpy as np

import gpu_common as gc
import hetero_nn as hn
import hetero_nn.codelets as codelets_pkg
from hetero_nn.codelets import reduce
from hetero_nn.codelets.codelet import REDUX, SCRATCH, Codelet


def all_codelets() -> dict:
    """Every module-level codelet of ``hetero_nn.codelets`` that has a ``cuda`` variant."""
    found = {}
    for info in pkgutil.iter_modules(codelets_pkg.__path__):
        module = importlib.import_module(f"hetero_nn.codelets.{info.name}")
        for value in vars(module).values():
            if isinstance(value, Codelet) and "cuda" in value.variants:
                found[value.name] = value
    return found


class Recorder:
    """Wraps every ``ref`` variant to keep one copy of the operands of each kind of call."""

    def __init__(self, codelets):
        self.records = {}
        self.codelets = codelets
        self.originals = {}

    def __enter__(self):
        for cl in self.codelets.values():
            if "ref" in cl.variants:
                self.originals[cl.name] = cl.variants["ref"]
                cl.variants["ref"] = self._wrap(cl, cl.variants["ref"])
        return self

    def __exit__(self, *exc):
        for name, fn in self.originals.items():
            self.codelets[name].variants["ref"] = fn

    def _wrap(self, cl, fn):
        def recording(*arrays, **params):
            key = (cl.name, tuple((a.shape, a.dtype.str) if hasattr(a, "shape") else repr(a)
                                  for a in arrays), repr(sorted(params.items())))
            if key not in self.records:
                self.records[key] = (cl, [np.array(a, copy=True) if hasattr(a, "shape") else a
                                          for a in arrays], copy.deepcopy(params))
            return fn(*arrays, **params)
        return recording


#: (model, loss, optimizer, fuse, granularity, clip_grad_norm): the recorded runs.
RUNS = [("lenet5", "xent", "sgd", True, 1, None), ("lenet5", "xent", "adam", False, 2, None),
        ("zoo", "xent", "adamw", True, 1, 1.0), ("zoo-b", "nll", "sgd-plain", True, 2, None),
        ("zoo-c", "mse", "sgd", False, 1, None), ("snn-mlp", "membrane", "adam", True, 1, None),
        ("snn-conv", "count", "sgd", True, 1, None), ("snn-learn", "membrane", "sgd", True, 2, None),
        ("cifar-small", "xent", "sgd", True, 2, None), ("dahl-basic", "xent", "sgd", False, 1, None),
        ("resnet-small", "xent", "sgd", True, 1, None)]
QUICK_RUNS = 8  # the dry run's share: every kind of layer, not every built-in model

OPTIMIZERS = {"sgd": lambda: hn.optim.SGD(lr=0.05, momentum=0.9),
              "sgd-plain": lambda: hn.optim.SGD(lr=0.05),
              "adam": lambda: hn.optim.Adam(lr=1e-3),
              "adamw": lambda: hn.optim.AdamW(lr=1e-3, weight_decay=0.01)}
LOSSES = {"xent": hn.losses.SoftmaxCrossEntropy, "nll": hn.losses.NLLLoss,
          "mse": hn.losses.MSELoss, "membrane": hn.losses.MembraneCrossEntropy,
          "count": hn.losses.SpikeCountCrossEntropy}


def record(quick: bool) -> Recorder:
    """Train the zoo on ``cpu:1`` with the ``ref`` variants; the recorded calls."""
    dtypes = ["float64"] if quick else ["float64", "float32"]
    with Recorder(all_codelets()) as rec:
        for name, loss, opt, fuse, granularity, clip in RUNS[:QUICK_RUNS] if quick else RUNS:
            for dtype in dtypes:
                model, shape = gc.zoo_model(name)
                model.build(shape, dtype)
                model.fuse = fuse
                x, y = gc.batch(shape, 4, dtype)
                with hn.Runtime(devices="cpu:1", variants=("ref",), perfmodel=False) as rt:
                    trainer = hn.Trainer(model, LOSSES[loss](), OPTIMIZERS[opt](), rt,
                                         batch_size=4, dtype=dtype, granularity=granularity,
                                         clip_grad_norm=clip)
                    trainer.train_step(x, y)
                    trainer.evaluate_batch(x, y)
                    trainer.predict(x)
        rng = np.random.default_rng(0)  # the REDUX tree's own codelets, called as the runtime does
        for dtype in dtypes:
            a, b = rng.standard_normal((2, 5, 7)).astype(dtype)
            reduce.add.variants["ref"](a.copy(), b)
            reduce.copy.variants["ref"](b, a.copy())
    return rec


def replay(rec, cp, checks) -> set:
    """Run every recorded call's ``cuda`` variant beside its ``ref`` one; names passed."""
    xp = cp if cp is not None else np
    to_host = (lambda a: cp.asnumpy(a)) if cp is not None else (lambda a: a)
    seen, failed = set(), set()
    for (name, _, _), (cl, arrays, params) in sorted(rec.records.items(), key=lambda kv: kv[0][0]):
        ref_fn = rec.originals[name]
        modes = cl.modes or (None,) * len(arrays)
        expect = [a.copy() if hasattr(a, "shape") else a for a in arrays]
        ref_fn(*expect, **copy.deepcopy(params))
        shapes = [a.shape for a in arrays if hasattr(a, "shape")]
        what = f"{name} {shapes} {arrays[0].dtype if arrays and hasattr(arrays[0], 'dtype') else ''}"
        try:
            got = [xp.asarray(a) if hasattr(a, "shape") else a for a in arrays]
            cl.variants["cuda"](*got, **copy.deepcopy(params))
            if cp is not None:
                cp.cuda.get_current_stream().synchronize()
        except Exception as exc:  # a failure is a result here: report it and go on
            checks.line("FAIL", what, f"raised {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=4)
            failed.add(name)
            continue
        worst, bad = 0.0, []
        terms = max((float(np.max(np.abs(a), initial=0)) for a in arrays
                     if hasattr(a, "dtype") and a.dtype.kind == "f"), default=0.0)
        for i, (mode, e, g) in enumerate(zip(modes, expect, got)):
            if mode is SCRATCH or not hasattr(e, "shape"):
                continue
            g = to_host(g)
            if e.dtype.kind in "iub":
                ok = np.array_equal(e, g)
                err = 0.0 if ok else float("inf")
            else:  # a REDUX sum may cancel to noise: measured against its terms' size
                err = gc.rel_err(g, e, floor=terms if mode is REDUX else 0.0)
                ok = err <= gc.REL.get(e.dtype.name, 1e-4)
            worst = max(worst, err)
            if not ok:
                bad.append(f"operand {i} ({mode.value if mode else '?'}) rel err {err:.3g}")
        if not checks.check(not bad, what, "; ".join(bad) if bad else f"max rel err {worst:.2g}"):
            failed.add(name)
        seen.add(name)
    return seen - failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two models, float64 only (CI's dry run)")
    args = ap.parse_args(argv)
    checks = gc.Checks("variants")
    cp = gc.gpu()
    print(f"# device: {'CuPy ' + cp.__version__ if cp is not None else 'none: cuda variants on NumPy'}")
    t0 = time.perf_counter()
    rec = record(args.quick)
    print(f"# recorded {len(rec.records)} calls of {len({k[0] for k in rec.records})} codelets "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    passed = replay(rec, cp, checks)
    every = set(all_codelets())
    reached = {k[0] for k in rec.records}
    print(f"# cuda variants: {len(every)}; reached by the zoo: {len(reached & every)}; "
          f"every call passed: {len(passed & every)}")
    print("# not reached:", ", ".join(sorted(every - reached)) or "none")
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
