"""Whole training steps on the GPU equal PyTorch's (float64, 1e-9), bit-identical across
policies and runs.

Each model trains a few SGD-momentum steps from the same seeded weights and batches
on the GPU alone (``cuda:0``) under every policy, twice under ``eager``, and on the
CPU cores beside it (``cpu:N,cuda:0``) under ``dmda`` and ``heft``. Every run's losses
and final weights must equal a PyTorch float64 run (CPU) to 1e-9; the GPU-alone runs
must give the same bits under every policy and on every run. (On the mixed platform
the bits depend on which device ran each convolution, so only the agreement with
PyTorch is checked there, and whether the bits agreed is printed.)

    python3 benchmarks/gpu/steps.py [--quick] [--models resnet18 --policies eager,dmda]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import traceback

import numpy as np

import gpu_common as gc
import hetero_nn as hn

POLICIES = ("eager", "random", "ws", "dmda", "heft")
STEPS, BATCH, SEED = 3, 8, 7


def initial(name):
    hn.manual_seed(SEED)
    model, shape = gc.zoo_model(name)
    model.build(shape, "float64")
    return model.state_dict(), shape


def data(shape, steps):
    return [gc.batch(shape, BATCH, "float64", seed=SEED + i) for i in range(steps)]


def torch_run(name, steps):
    import torch
    state, shape = initial(name)
    model, _ = gc.zoo_model(name)
    model.build(shape, "float64")
    model.load_state_dict(state)
    twin = hn.to_torch(model).train()
    opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in data(shape, steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy().copy() for k, v in twin.state_dict().items()}


def hn_run(name, devices, policy, steps, variants=None):
    state, shape = initial(name)
    model, _ = gc.zoo_model(name)
    model.build(shape, "float64")
    model.load_state_dict(state)
    with hn.Runtime(devices=devices, policy=policy, perfmodel=False, seed=1,
                    variants=variants) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.05, momentum=0.9), rt, batch_size=BATCH,
                             granularity=2, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in data(shape, steps)]
        weights = model.state_dict()
        where = {r.device for r in rt.trace()}
    return losses, weights, where


def digest(losses, weights) -> str:
    h = hashlib.sha256(np.asarray(losses, dtype=np.float64).tobytes())
    for k in sorted(weights):
        h.update(np.ascontiguousarray(weights[k]).tobytes())
    return h.hexdigest()[:16]


def compare(checks, what, got, ref) -> str | None:
    losses, weights, where = got
    errs = [gc.rel_err(losses, ref[0])] + [gc.rel_err(weights[k], ref[1][k]) for k in ref[1]]
    checks.check(max(errs) <= gc.REL_STEP, f"{what} equals PyTorch float64",
                 f"max rel err {max(errs):.2g} (devices used: {', '.join(sorted(where))})")
    return digest(losses, weights)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="LeNet-5 only, two policies (CI's dry run)")
    ap.add_argument("--models", default="lenet5,cifar-small,dahl-basic,resnet-small")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="policies on the GPU alone (dmda,heft on the mixed platform if listed)")
    args = ap.parse_args(argv)
    checks = gc.Checks("steps")
    try:
        import torch  # noqa: F401
    except ImportError:
        checks.line("SKIP", "all", "PyTorch is not installed")
        return checks.done()
    cp = gc.gpu()
    specs = gc.device_specs(cp)
    print(f"# platforms: {specs['gpu']} and {specs['mixed']}")
    models = ["lenet5"] if args.quick else args.models.split(",")
    policies = ("eager", "heft") if args.quick else tuple(args.policies.split(","))
    steps = 2 if args.quick else STEPS
    refs = {}
    for name in models:  # the GPU alone first: a timeout in the mixed runs loses only those
        try:
            refs[name] = ref = torch_run(name, steps)
            digests = {}
            for policy in policies:
                digests[policy] = compare(checks, f"{name} {specs['gpu']} {policy}",
                                          hn_run(name, specs["gpu"], policy, steps), ref)
            again = compare(checks, f"{name} {specs['gpu']} eager (again)",
                            hn_run(name, specs["gpu"], "eager", steps), ref)
            checks.check(len(set(digests.values()) | {again}) == 1,
                         f"{name} {specs['gpu']} bit-identical across policies and runs",
                         " ".join(f"{p}={d}" for p, d in digests.items()) + f" again={again}")
        except Exception as exc:
            checks.line("FAIL", f"{name} {specs['gpu']}", f"raised {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=6)
    for name, ref in refs.items():
        try:
            mixed = {}
            for policy in [p for p in ("dmda", "heft") if p in policies] or ["dmda"]:
                mixed[policy] = compare(checks, f"{name} {specs['mixed']} {policy}",
                                        hn_run(name, specs["mixed"], policy, steps,
                                               ("ref", "cuda") if args.quick else None), ref)
            print(f"# {name} {specs['mixed']}: digests {mixed} "
                  f"({'same bits' if len(set(mixed.values())) == 1 else 'bits differ: placement'})")
        except Exception as exc:
            checks.line("FAIL", f"{name} {specs['mixed']}", f"raised {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=6)
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
