"""Real models against PyTorch on the CPU: training steps and inference, float32.

Models (3x32x32 images, 10 classes): ResNet-18 in the CIFAR layout (the built-in
``resnet18``) and in torchvision's (7x7 stride-2 stem, 3x3 max pool), MobileNetV2 with
CIFAR strides (the built-in ``mobilenetv2``), VGG-11 with batch norm (CIFAR head: one
Linear on 512 features), and the small built-ins (``lenet5`` on 1x28x28,
``cifar-small``). Each is written once as hetero_nn layers; PyTorch runs
``hn.to_torch`` of it (the same modules torchvision's definitions use), and hetero_nn
runs ``hn.from_torch`` of that module (how a PyTorch user brings a model), with the same
initial weights.

Per model and batch size, interleaved rounds (round r times every configuration in
turn), medians:

- ``hn train g=G``: ``Trainer.train_step`` (SGD, momentum 0.9) on ``Runtime(devices=
  "cpu:W")``, granularity G, pinned variants;
- ``torch train``: the same step in PyTorch eager with ``torch.set_num_threads(W)``;
- ``torch.compile train`` (``--no-compile`` leaves it out; a row says why when it cannot
  compile here);
- ``hn infer`` / ``torch infer`` (and ``torch.compile infer``): one forward pass in
  evaluation mode, ``model(x)`` on the trainer's runtime (its captured forward graph
  replayed, one partition: :mod:`hetero_nn.layers.forward_graphs`) and
  ``torch.no_grad``.

Beside each model (``--no-roofline`` leaves it out), per convolution layer: the forward,
input-gradient and weight-gradient kernels of one partition (batch / G images) on one
thread with the pinned variant, as GFLOP/s and as a share of one thread's sgemm rate
measured again just before each layer (:func:`hetero_nn.cli.roofline.sgemm_rate`: on a
loaded machine one figure for the whole run made the shares swing 35-108% for the same
code); ``hetero-nn trace
RUN --roofline`` gives the same share per codelet of a traced training run. Then the
step sums of a traced training step (g = the largest ``--granularities``, the largest
batch, ``--steps`` steps after the warm-up): the convolutions' forward and backward
FLOPs over their kernels' time in the trace, as ``hetero-nn trace RUN --roofline`` sums
them (:func:`hetero_nn.cli.roofline.step_sums`), against sgemm measured again just
before the traced step.

Runs in parts (``--models``, ``--batches``), so a long table can be filled a few rows at
a time on a quiet machine::

    python benchmarks/bench_models.py --models resnet18 resnet18-tv mobilenetv2 vgg11-bn \
        lenet5 cifar-small --batches 32 64 128 --rounds 3 --steps 2 --json models.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import hetero_nn as hn
from hetero_nn.cli.roofline import model_flops, roofline_rows, sgemm_rate, step_sums
from hetero_nn.codelets import conv
from hetero_nn.codelets.pinned import PINNED_VARIANTS
from hetero_nn.layers import (BatchNorm2D, Conv2D, Dense, Flatten, GlobalAvgPool2D, MaxPool2D,
                              ReLU, Sequential)
from hetero_nn.models import _basic_block, build_model


def resnet18_torchvision(num_classes=10):
    """ResNet-18 as torchvision lays it out: 7x7 stride-2 stem, 3x3 stride-2 max pool."""
    layers = [Conv2D(3, 64, 7, stride=2, padding=3, bias=False), BatchNorm2D(64), ReLU(),
              MaxPool2D(3, stride=2, padding=1)]
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [*_basic_block(channels, width, stride), *_basic_block(width, width)]
        channels = width
    return Sequential(*layers, GlobalAvgPool2D(), Flatten(), Dense(512, num_classes))


def vgg11_bn(num_classes=10):
    """VGG-11 with batch norm after every convolution, CIFAR head (one Linear)."""
    layers, channels = [], 3
    for width in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if width == "M":
            layers.append(MaxPool2D(2))
        else:
            layers += [Conv2D(channels, width, 3, padding=1), BatchNorm2D(width), ReLU()]
            channels = width
    return Sequential(*layers, Flatten(), Dense(512, num_classes))


MODELS = {  # name: (build, one sample's shape)
    "resnet18": (lambda: Sequential(*build_model("resnet18", (3, 32, 32)).layers), (3, 32, 32)),
    "resnet18-tv": (resnet18_torchvision, (3, 32, 32)),
    "mobilenetv2": (lambda: Sequential(*build_model("mobilenetv2", (3, 32, 32)).layers),
                    (3, 32, 32)),
    "vgg11-bn": (vgg11_bn, (3, 32, 32)),
    "lenet5": (lambda: Sequential(*build_model("lenet5", (1, 28, 28)).layers), (1, 28, 28)),
    "cifar-small": (lambda: Sequential(*build_model("cifar-small", (3, 32, 32)).layers),
                    (3, 32, 32)),
}


def median_time(fn, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


class HnConfig:
    """hetero_nn training or inference of one model on its own runtime."""

    def __init__(self, module, shape, batch, granularity, workers, infer):
        self.model = hn.from_torch(module, shape, dtype="float32")
        self.rt = hn.Runtime(devices=f"cpu:{workers}", policy="eager")
        self.trainer = hn.Trainer(self.model, optimizer=hn.optim.SGD(
            self.model.parameters(), lr=0.01, momentum=0.9), runtime=self.rt,
            batch_size=batch, granularity=granularity)
        self.infer = infer
        self.model.eval() if infer else self.model.train()
        self.model.bind(self.rt)  # model(x) runs on this runtime

    def step(self, x, y):
        if self.infer:
            self.model(x)
        else:
            self.trainer.train_step(x, y)

    def close(self):
        self.trainer.close()
        self.rt.close()


class TorchConfig:
    """PyTorch eager (or ``torch.compile``) training or inference of one module."""

    def __init__(self, module, infer, compiled):
        import torch
        self.torch, self.module, self.infer = torch, module, infer
        self.opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        module.eval() if infer else module.train()
        self.run = torch.compile(module) if compiled else module

    def step(self, x, y):
        torch = self.torch
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if self.infer:
            with torch.no_grad():
                self.run(xt)
            return
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.run(xt), yt).backward()
        self.opt.step()

    def close(self):
        pass


def problem(name, batch):
    """``(torch module, sample shape, x, y)``: the model ``name`` with seeded weights as a
    torch module, and one seeded batch."""
    build, shape = MODELS[name]
    hn.manual_seed(0)
    model = build()
    model.build(shape, "float32")
    rng = np.random.default_rng(0)
    return (hn.to_torch(model), shape, rng.standard_normal((batch, *shape), dtype=np.float32),
            rng.integers(0, 10, batch))


def bench_model(name, batch, args):
    """One row per configuration: images per second (median over rounds) and the ratio
    to PyTorch eager."""
    import torch
    if args.compile:  # each model and batch compiles afresh: Dynamo's recompile limit (8 a
        torch._dynamo.reset()  # function) is otherwise reached by the 5th, which runs eager
    source, shape, x, y = problem(name, batch)
    configs = {}
    for mode in ("train", "infer"):
        for g in args.granularities if mode == "train" else [args.workers]:
            label = f"hn train g={g}" if mode == "train" else "hn infer model(x)"
            configs[label] = lambda m=mode, g=g: HnConfig(
                _copy(source), shape, batch, g, args.workers, m == "infer")
        configs[f"torch {mode}"] = lambda m=mode: TorchConfig(_copy(source), m == "infer", False)
        if args.compile:
            configs[f"torch.compile {mode}"] = lambda m=mode: TorchConfig(
                _copy(source), m == "infer", True)
    live, failed = {}, {}
    for label, make in configs.items():
        try:
            live[label] = make()
            for _ in range(args.warmup):
                live[label].step(x, y)
        except Exception as exc:  # torch.compile without a compiler, ...
            failed[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            live.pop(label, None)
    times = {label: [] for label in live}
    for _ in range(args.rounds):
        for label, cfg in live.items():
            times[label].append(median_time(lambda: cfg.step(x, y), args.steps))
    for cfg in live.values():
        cfg.close()
    rows = []
    for label in configs:
        if label in failed:
            rows.append({"model": name, "batch": batch, "config": label, "failed": failed[label]})
            continue
        sec = statistics.median(times[label])
        mode = "train" if "train" in label else "infer"
        ref = statistics.median(times[f"torch {mode}"]) if f"torch {mode}" in times else None
        rows.append({"model": name, "batch": batch, "config": label, "ms": sec * 1e3,
                     "img_s": batch / sec, "vs_torch": ref / sec if ref else None})
    torch.set_num_threads(args.workers)
    return rows


def _copy(module):
    import copy
    return copy.deepcopy(module)


def roofline(name, batch, args):
    """Per convolution of ``name``: its kernels' GFLOP/s on one partition, one thread, and
    their shares of the sgemm rate measured just before the layer's."""
    from threadpoolctl import threadpool_limits
    build, shape = MODELS[name]
    model = build()
    model.build(shape, "float32")
    n = max(1, batch // max(args.granularities))
    rng = np.random.default_rng(1)
    rows = []
    with threadpool_limits(1):
        for path, layer in model.named_modules():
            if type(layer).__name__ != "Conv2d" or layer.groups != 1:
                continue
            params = dict(stride=layer.stride, padding=layer.padding)
            x = rng.standard_normal((n, *layer.input_shape), dtype=np.float32)
            w = np.asarray(dict(layer.named_parameters())["weight"].data, dtype=np.float32)
            out = conv.conv2d_output_shape(x.shape, w.shape, **params)
            dy = rng.standard_normal(out, dtype=np.float32)
            flops = 2.0 * np.prod(out) * np.prod(w.shape[1:])
            rate = sgemm_rate(measure=True)  # beside the layer's kernels: the load moves
            row = {"model": name, "layer": path, "gflop": flops / 1e9, "sgemm_gflops": rate,
                   "shape": f"{x.shape[1]}->{out[1]} "
                   f"{x.shape[2]}x{x.shape[3]} k{w.shape[2]} s{layer.stride[0]}", "images": n}
            for label, codelet, ops in (
                    ("fwd", conv.conv2d_fwd_nobias, (x, w, np.empty(out, np.float32))),
                    ("bwd_input", conv.conv2d_bwd_input, (dy, w, np.empty_like(x))),
                    ("bwd_weight", conv.conv2d_bwd_weight, (x, dy, np.zeros_like(w)))):
                variant = next(v for v in PINNED_VARIANTS.get(codelet.name, PINNED_VARIANTS["*"])
                               if v in codelet.variants)
                run = codelet.variants[variant]
                run(*ops, **params)
                t = statistics.median(median_time(lambda: run(*ops, **params), 1)
                                      for _ in range(args.rounds))
                row[f"{label}_gflops"] = flops / t / 1e9
                row[f"{label}_share"] = flops / t / 1e9 / rate
            rows.append(row)
    return rows


def traced_step_sums(name, batch, args, rate):
    """The convolutions' step sums (forward, backward) of ``name``'s traced training steps."""
    source, shape, x, y = problem(name, batch)
    g = max(args.granularities)
    flops = model_flops(hn.from_torch(_copy(source), shape, dtype="float32"), None, batch, g,
                        evaluate=False)
    cfg = HnConfig(_copy(source), shape, batch, g, args.workers, False)
    try:
        for _ in range(max(args.warmup, 2)):  # captured, then replayed
            cfg.step(x, y)
        cfg.rt.trace(clear=True)
        for _ in range(args.steps):
            cfg.step(x, y)
        records = cfg.rt.trace(clear=True).records
    finally:
        cfg.close()
    return [{"model": name, "batch": batch, "granularity": g, "steps": args.steps, **row}
            for row in step_sums(roofline_rows(records, flops, rate), rate)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[32, 64, 128])
    ap.add_argument("--granularities", nargs="+", type=int, default=[2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="leave torch.compile out")
    ap.add_argument("--no-roofline", dest="roofline", action="store_false",
                    help="leave the per-layer kernel GFLOP/s out")
    ap.add_argument("--roofline-only", action="store_true", help="no steps, only the roofline")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.workers)
    out = {"uptime": os.getloadavg(), "workers": args.workers, "rows": [], "roofline": [],
           "step_sums": []}
    rate = None
    if args.roofline or args.roofline_only:
        rate = out["sgemm_gflops_one_thread"] = sgemm_rate(measure=True)
        print(f"sgemm, one thread: {rate:.1f} GFLOP/s")
    for name in args.models:
        for batch in [] if args.roofline_only else args.batches:
            for row in bench_model(name, batch, args):
                out["rows"].append(row)
                if "failed" in row:
                    print(f"{name:12s} {batch:4d} {row['config']:24s} failed: {row['failed']}")
                else:
                    ratio = f"{row['vs_torch']:.2f}x" if row["vs_torch"] else ""
                    print(f"{name:12s} {batch:4d} {row['config']:24s} {row['ms']:9.1f} ms "
                          f"{row['img_s']:8.1f} img/s {ratio}", flush=True)
        if rate is not None:  # beside the model's rows
            for row in roofline(name, max(args.batches), args):
                out["roofline"].append(row)
                print(f"{name:12s} {row['layer']:32s} {row['shape']:24s} " + " ".join(
                    f"{k} {row[k + '_gflops']:5.1f} GF/s {row[k + '_share']:4.0%}"
                    for k in ("fwd", "bwd_input", "bwd_weight"))
                      + f" of sgemm {row['sgemm_gflops']:.1f}", flush=True)
            step_rate = sgemm_rate(measure=True)  # beside the traced step: the load moves
            for row in traced_step_sums(name, max(args.batches), args, step_rate):
                out["step_sums"].append({**row, "sgemm_gflops": step_rate})
                print(f"{name:12s} step sum {row['codelet']:13s} batch {row['batch']} "
                      f"g={row['granularity']}: {row['tasks']} tasks {row['gflop']:.3f} GFLOP "
                      f"in {1e3 * row['seconds']:.1f} ms {row['gflops']:5.1f} GF/s "
                      f"{row['share']:4.0%} of sgemm {step_rate:.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
