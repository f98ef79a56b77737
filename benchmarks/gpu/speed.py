"""Training-step speed on the GPU against PyTorch CUDA (float32), and kernel launches
per step.

For each model and batch size: the median wall time of a training step (SGD with
momentum; the step's loss read back, so the step is complete) of hetero_nn on the
GPU alone (``cuda:0``) and of the same network in PyTorch on the same GPU, after
warm-up steps; their ratio (> 1: hetero_nn is faster); and, on a GPU, the CUDA
kernels one hetero_nn step launches, counted by PyTorch's profiler (CUPTI sees every
kernel of the process, CuPy's included); and the GPU memory each used at its peak:
hetero_nn's through CuPy's memory pool (the pool's bytes in use, read at every
allocation by an allocator wrapped around the pool), PyTorch's by
``torch.cuda.max_memory_allocated``. Stops starting new rows once ``--budget``
seconds have passed.

    python3 benchmarks/gpu/speed.py [--quick] [--budget 120] [--models resnet18] [--batches 64,256]
"""

from __future__ import annotations

import argparse
import gc as garbage
import statistics
import sys
import time
import traceback

import gpu_common as gc
import hetero_nn as hn

MODELS = ("lenet5", "cifar-small", "dahl-basic", "resnet18")
BATCHES = (64, 256, 1024)


class PoolPeak:
    """The peak of CuPy's default memory pool's bytes in use, read at each allocation,
    above what was in use when :meth:`reset` was called (the arrays of earlier rows that
    are still referenced are not this row's)."""

    def __init__(self, cp):
        self.cp, self.pool, self.peak, self.base = cp, cp.get_default_memory_pool(), 0, 0
        cp.cuda.set_allocator(self.malloc)

    def malloc(self, nbytes):
        mem = self.pool.malloc(nbytes)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem

    def reset(self):
        garbage.collect()  # the earlier rows' runtimes and models, held in reference cycles
        self.pool.free_all_blocks()
        self.base = self.peak = self.pool.used_bytes()

    def used(self) -> int:
        return self.peak - self.base


def hn_steps(name, devices, batch, steps, granularity=1, policy="eager", dtype="float32"):
    """Median step time (s) of hetero_nn on ``devices``, and the trainer for more probes."""
    hn.manual_seed(0)
    model, shape = gc.zoo_model(name)
    model.build(shape, dtype)
    x, y = gc.batch(shape, batch, dtype)
    times = []
    with hn.Runtime(devices=devices, policy=policy, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.01, momentum=0.9), rt, batch_size=batch,
                             granularity=granularity, dtype=dtype)
        for i in range(steps + 2):
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        launches = count_launches(lambda: trainer.train_step(x, y))
    return statistics.median(times), launches


def count_launches(step):
    """CUDA kernels launched by ``step()`` (PyTorch's profiler), or None without a GPU."""
    try:
        import torch
        if not torch.cuda.is_available() or gc.gpu() is None:
            return None
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA")
                   and not any(w in e.name.lower() for w in ("memcpy", "memset")))
    except Exception as exc:
        print(f"# launch count failed: {type(exc).__name__}: {exc}")
        return None


def torch_steps(name, batch, steps):
    import torch
    if not torch.cuda.is_available() or gc.gpu() is None:
        return None
    hn.manual_seed(0)
    model, shape = gc.zoo_model(name)
    model.build(shape, "float32")
    net = hn.to_torch(model).cuda().train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = gc.batch(shape, batch, "float32")
    x, y = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), torch.cuda.max_memory_allocated()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="LeNet-5 at batch 16 (CI's dry run)")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds before no new row starts")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args(argv)
    checks = gc.Checks("speed")
    cp = gc.gpu()
    spec = gc.device_specs(cp)["gpu"]
    rows = [("lenet5", 16)] if args.quick else [
        (m, int(b)) for b in args.batches.split(",") for m in args.models.split(",")]
    steps = 2 if args.quick else args.steps
    peak = PoolPeak(cp) if cp is not None else None
    t0 = time.perf_counter()
    print("| model | batch | hetero_nn ms/step | PyTorch CUDA ms/step | speed-up | kernels/step "
          "| hetero_nn peak MB | PyTorch peak MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, batch in rows:
        if time.perf_counter() - t0 > args.budget:
            checks.line("SKIP", f"{name} batch {batch}", f"past the {args.budget:.0f} s budget")
            continue
        try:
            if peak:
                peak.reset()
            ours, launches = hn_steps(name, spec, batch, steps)
            ours_mb = f"{peak.used() / 2**20:.0f}" if peak else "-"
            theirs, theirs_mb = (torch_steps(name, batch, steps) or (None, None)) \
                if not args.quick else (None, None)
            ratio = f"{theirs / ours:.2f}x" if theirs else "-"
            print(f"| {name} | {batch} | {ours * 1e3:.2f} | "
                  f"{theirs * 1e3 if theirs else float('nan'):.2f} | {ratio} | "
                  f"{launches if launches is not None else '-'} | {ours_mb} | "
                  f"{theirs_mb / 2**20 if theirs_mb else float('nan'):.0f} |", flush=True)
            if peak:
                print(f"# {name} {batch}: {peak.base / 2**20:.0f} MB in CuPy's pool before the row")
            checks.line("PASS", f"{name} batch {batch} on {spec}", "measured")
        except Exception as exc:
            checks.line("FAIL", f"{name} batch {batch}", f"raised {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=6)
    return checks.done()


if __name__ == "__main__":
    sys.exit(main())
