"""``hetero-nn simulate``: predict a training step's time on a described platform.

This module owns the command and the glue between a built-in model's training step and the
simulator (:mod:`hetero_nn.scheduler.simulate`): it builds the model and a
:class:`~hetero_nn.training.trainer.Trainer` exactly as ``hetero-nn train`` does,
captures the graphs one ``train_step`` flushes (without running them), and
replays them on a platform (this machine's ``--devices``, or ``--platform
FILE``) under a policy. ``--calibrate`` first runs real steps on ``--devices``
until the models know every codelet of the step (and measures the runtime's
per-task dispatch cost); ``--measure`` runs real steps too and prints the
measured step time beside the prediction (the validation in ``docs/simulate.md``).

Inputs are random (timing depends on shapes, not values); the sample shape is the
dataset's (``--dataset``) with ``--image-size`` overriding its height and width.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ..errors import ConfigError
from ..scheduler.simulate import Platform, capture, format_result, measured_dispatch, simulate
from . import options

__all__ = ["SAMPLE_SHAPES", "sample_shape", "simulate_step", "measure_step", "calibrate",
           "kind_specs"]

SAMPLE_SHAPES = {"mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28), "cifar10": (3, 32, 32),
                 "synthetic": (1, 28, 28)}
_perf = time.perf_counter


def sample_shape(dataset="mnist", image_size=None) -> tuple:
    try:
        channels, height, width = SAMPLE_SHAPES[dataset]
    except KeyError:
        raise ConfigError(f"--dataset {dataset!r}: expected one of {', '.join(SAMPLE_SHAPES)}") \
            from None
    if image_size is not None:
        if image_size < 1:
            raise ConfigError(f"--image-size {image_size}: must be positive")
        height = width = int(image_size)
    return channels, height, width


def _trainer(model, shape, batch_size, granularity, dtype, runtime, seed=0):
    from ..models import build_model
    from ..snn_models import spiking_loss
    from ..training import Trainer

    net = build_model(model, shape, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, *shape)).astype(dtype)
    y = rng.integers(0, 10, batch_size)
    trainer = Trainer(net, spiking_loss(model), runtime=runtime, batch_size=batch_size,
                      granularity=granularity, dtype=dtype)
    return trainer, x, y


def measure_step(model="lenet5", shape=(1, 28, 28), batch_size=64, granularity=2,
                 devices="cpu:1", policy="dmda", dtype="float32", steps=12, warmup=4,
                 calibrate=False, perfmodel=None):
    """Run real training steps; returns ``(median step seconds, dispatch seconds, runtime
    stats)``. With ``calibrate`` the runtime explores every variant (StarPU's calibration)."""
    from ..scheduler.runtime import Runtime

    with Runtime(devices=devices, policy=policy, calibrate=calibrate, calibrate_samples=3,
                 perfmodel=perfmodel) as rt:
        trainer, x, y = _trainer(model, shape, batch_size, granularity, dtype, rt)
        times = []
        for i in range(warmup + steps):
            if i == warmup:
                rt.trace(clear=True)
            t0 = _perf()
            trainer.train_step(x, y)
            if i >= warmup:
                times.append(_perf() - t0)
        dispatch = measured_dispatch(rt.trace())
    return statistics.median(times), dispatch


def calibrate(model="lenet5", shape=(1, 28, 28), batch_size=64, granularity=2,
              devices="cpu:1", policy="dmda", dtype="float32", steps=8, perfmodel=None):
    """Fill the models a step needs: real steps on each device kind of ``devices`` alone
    (every task of the step then runs, and is measured, on that kind), exploring every
    variant. Returns the median dispatch cost measured."""
    dispatch = []
    for spec in kind_specs(devices):
        dispatch.append(measure_step(model, shape, batch_size, granularity, spec, policy, dtype,
                                     steps=max(steps, 4), warmup=2, calibrate=True,
                                     perfmodel=perfmodel)[1])
    return statistics.median(dispatch)


def kind_specs(devices) -> list[str]:
    """``"cpu:2,cuda-emu:1"`` -> ``["cpu:2", "cuda-emu:1"]``: one spec per device kind."""
    parts = [p.strip() for p in str(devices).split(",") if p.strip()]
    cpu = [p for p in parts if p.split(":")[0].lower() == "cpu"]
    other = [p for p in parts if p not in cpu]
    return [",".join(group) for group in (cpu, other) if group]


def simulate_step(model="lenet5", shape=(1, 28, 28), batch_size=64, granularity=2,
                  platform: Platform | None = None, devices="cpu:1", policy="dmda",
                  dtype="float32", dispatch=0.0, perfmodel=None):
    """Capture a training step's graphs and replay them on ``platform`` (default: the
    workers of ``devices``); returns a :class:`~hetero_nn.scheduler.simulate.SimulationResult`."""
    from ..scheduler.runtime import Runtime

    platform = platform or Platform.from_devices(devices)
    # deterministic=False: each kind's candidates are all its variants (the fastest modelled)
    with Runtime(devices="cpu:1", trace=False, perfmodel=perfmodel, deterministic=False) as rt:
        trainer, x, y = _trainer(model, shape, batch_size, granularity, dtype, rt)
        steps = capture(rt, lambda: trainer.train_step(x, y), steps=6)[1:]  # after binding
        # the host's submission time, one sample per step: the median, against preemptions
        steps[-1].submit_seconds = statistics.median(s.submit_seconds for s in steps)
        return simulate(steps[-2:], platform, policy, rt, dispatch=dispatch)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``simulate`` to the subcommands ``sub``."""
    from ..models import MODELS
    from ..scheduler.policies import POLICIES

    p = sub.add_parser(
        "simulate", help="predict a training step's time on a platform",
        description="Predict the time of one training step on a platform by replaying its "
                    "task graph in a discrete-event simulation (docs/simulate.md).")
    p.add_argument("--model", choices=sorted(MODELS), default="lenet5")
    p.add_argument("--dataset", choices=sorted(SAMPLE_SHAPES), default="mnist",
                   help="sample shape of this dataset (default: mnist, 1x28x28)")
    p.add_argument("--image-size", type=options.positive_int,
                   help="height and width instead of the dataset's")
    p.add_argument("--batch-size", type=options.positive_int, default=64)
    p.add_argument("--granularity", type=options.positive_int, default=2,
                   help="partitions per batch")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--devices", type=options.devices, default="cpu:1",
                   help="this machine's workers (calibration, measurement; the platform when "
                        "--platform is not given), e.g. 'cpu:2' or 'cpu:1,cuda-emu:1'")
    p.add_argument("--policy", choices=sorted(POLICIES), default="dmda")
    p.add_argument("--platform", metavar="FILE", help="a platform JSON file (docs/simulate.md)")
    p.add_argument("--calibrate", action="store_true",
                   help="run real steps on --devices first, until the models know the step")
    p.add_argument("--measure", action="store_true",
                   help="also run real steps on --devices and print the measured step time")
    p.add_argument("--steps", type=options.positive_int, default=12,
                   help="real steps to time (default 12)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def command(args) -> int:
    """``hetero-nn simulate``: calibrate or measure if asked, then predict and print."""
    shape = sample_shape(args.dataset, args.image_size)
    platform = Platform.load(args.platform) if args.platform else \
        Platform.from_devices(args.devices)
    common = dict(model=args.model, shape=shape, batch_size=args.batch_size,
                  granularity=args.granularity, dtype=args.dtype)
    dispatch = 0.0
    if args.calibrate:
        dispatch = calibrate(**common, devices=args.devices, policy=args.policy,
                             steps=args.steps)
    measured = None
    if args.measure:
        measured, dispatch = measure_step(**common, devices=args.devices,
                                          policy=args.policy, steps=args.steps)
    result = simulate_step(**common, platform=platform, policy=args.policy, dispatch=dispatch)
    if args.json:
        doc = result.to_json()
        if measured is not None:
            doc["measured_step_seconds"] = measured
        print(json.dumps(doc, indent=1))
    else:
        print(format_result(result))
        if measured is not None:
            err = (result.step_seconds - measured) / measured
            print(f"measured step {1e3 * measured:.3f} ms on {args.devices}: prediction "
                  f"{100 * err:+.1f}%")
    return 0
