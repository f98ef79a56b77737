"""``hetero-nn simulate``: predict a training step's time on a described platform.

This module owns the command and the glue between a built-in model's training step and the
simulator (:mod:`hetero_nn.simulation.simulate`): it builds the model and a
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
from ..simulation.paths import PathCosts, engine_serves, step_path
from ..simulation.platforms import load_platform
from ..simulation.simulate import Platform, capture, format_result, simulate
from . import options
from ..models import MODELS, build_model
from ..scheduler.policies.policies import POLICIES
from ..scheduler.runtime import Runtime
from ..snn_models import spiking_loss
from ..training import Trainer

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
    """Run real training steps; returns ``(median step seconds, PathCosts)``: the costs of
    the path the steps ran on (:mod:`hetero_nn.simulation.paths`). With ``calibrate`` the
    runtime explores every variant (StarPU's calibration)."""
    with Runtime(devices=devices, policy=policy, calibrate=calibrate, calibrate_samples=3,
                 perfmodel=perfmodel) as rt:
        trainer, x, y = _trainer(model, shape, batch_size, granularity, dtype, rt)
        timed = []
        for i in range(warmup + steps):
            rt.trace(clear=True)
            t0 = _perf()
            trainer.train_step(x, y)
            if i >= warmup:
                timed.append((_perf() - t0, rt.trace().records))
        costs = PathCosts.measure(step_path(trainer), [timed])
    return statistics.median(wall for wall, _ in timed), costs


def calibrate(model="lenet5", shape=(1, 28, 28), batch_size=64, granularity=2,
              devices="cpu:1", policy="dmda", dtype="float32", steps=8, perfmodel=None):
    """Fill the models a step needs: real steps on each device kind of ``devices`` alone
    (every task of the step then runs, and is measured, on that kind), exploring every
    variant. Returns the costs measured (:class:`~hetero_nn.simulation.paths.PathCosts`:
    the path of the first kind's steps, the medians over kinds)."""
    measured = [measure_step(model, shape, batch_size, granularity, spec, policy, dtype,
                             steps=max(steps, 4), warmup=3, calibrate=True,
                             perfmodel=perfmodel)[1]
                for spec in kind_specs(devices)]
    hosts = [c.host for c in measured if c.host is not None]
    return PathCosts(measured[0].path, statistics.median(c.dispatch for c in measured),
                     statistics.median(c.handoff for c in measured),
                     statistics.median(hosts) if hosts else None)


def kind_specs(devices) -> list[str]:
    """``"cpu:2,cuda-emu:1"`` -> ``["cpu:2", "cuda-emu:1"]``: one spec per device kind."""
    parts = [p.strip() for p in str(devices).split(",") if p.strip()]
    cpu = [p for p in parts if p.split(":")[0].lower() == "cpu"]
    other = [p for p in parts if p not in cpu]
    return [",".join(group) for group in (cpu, other) if group]


def simulate_step(model="lenet5", shape=(1, 28, 28), batch_size=64, granularity=2,
                  platform: Platform | None = None, devices="cpu:1", policy="dmda",
                  dtype="float32", costs: PathCosts | None = None, perfmodel=None):
    """Capture a training step's graphs and replay them on ``platform`` (default: the
    workers of ``devices``); returns a :class:`~hetero_nn.simulation.simulate.SimulationResult`.

    ``costs``: the measured costs of the path the steps run on (dispatch per task; on
    the compiled path, the handoff between workers and the replay's host time); none:
    no per-task cost, the path the platform's steps would take (the compiled engine's
    on CPU workers alone)."""
    platform = platform or Platform.from_devices(devices)
    # deterministic=False: each kind's candidates are all its variants (the fastest modelled)
    with Runtime(devices="cpu:1", trace=False, perfmodel=perfmodel, deterministic=False) as rt:
        trainer, x, y = _trainer(model, shape, batch_size, granularity, dtype, rt)
        replayed = step_path(trainer) != "submitted"
        steps = capture(rt, lambda: trainer.train_step(x, y), steps=6)[1:]  # after binding
        # the host's submission time, one sample per step: the median, against preemptions;
        # a replayed step's, measured on the path (the capture's recorder is no replay)
        host = statistics.median(s.submit_seconds for s in steps)
        if replayed and costs is not None and costs.host is not None:
            host = costs.host
        steps[-1].submit_seconds = host
        engine = replayed and engine_serves(platform, policy) and (costs is None or
                                                           costs.path == "compiled")
        return simulate(steps[-2:], platform, policy, rt,
                        dispatch=costs.dispatch if costs else 0.0,
                        handoff=costs.handoff if costs else 0.0, engine=engine)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``simulate`` to the subcommands ``sub``."""
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
    cluster = p.add_argument_group("the cluster path (docs/cluster.md: data-parallel over Dask "
                                   "workers, one per machine of --platform)")
    cluster.add_argument("--cluster-workers", type=_counts, metavar="N[,N...]",
                         help="predict a step on each of these numbers of workers (e.g. "
                              "1,2,4,8). Without --platform: this machine's 'local:N' "
                              "workers, whose steps --measure runs")
    cluster.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                         help="strong: --batch-size and --granularity are the batch's (the "
                              "same run on more workers); weak: per worker")
    cluster.add_argument("--cluster-threads", type=options.positive_int, metavar="N",
                         help="cores of a worker's runtime (default: all of its machine's; "
                              "1 without --platform)")
    return p


def _counts(text):
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, "
                                         f"got {text!r}")
    return counts


def command(args) -> int:
    """``hetero-nn simulate``: calibrate or measure if asked, then predict and print."""
    shape = sample_shape(args.dataset, args.image_size)
    if args.cluster_workers:
        return cluster_command(args, shape)
    platform = load_platform(args.platform).machine(0).platform() if args.platform else \
        Platform.from_devices(args.devices)
    common = dict(model=args.model, shape=shape, batch_size=args.batch_size,
                  granularity=args.granularity, dtype=args.dtype)
    costs = None
    if args.calibrate:
        costs = calibrate(**common, devices=args.devices, policy=args.policy,
                          steps=args.steps)
    measured = None
    if args.measure:
        measured, costs = measure_step(**common, devices=args.devices,
                                       policy=args.policy, steps=args.steps)
    result = simulate_step(**common, platform=platform, policy=args.policy, costs=costs)
    if args.json:
        doc = result.to_json()
        if costs is not None:
            doc["path"] = costs.to_json()
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


def cluster_command(args, shape) -> int:
    """``--cluster-workers``: the cluster path's step on each worker count, by
    :mod:`hetero_nn.training.cluster.planner`; with ``--measure``, real steps on ``local:N`` beside."""
    # the cluster planner and the platforms it reads (45 ms) load with --cluster-workers only
    from ..training.cluster.planner import (format_scaling, local_platform, measure_cluster_step,
                                            scaling, shares)

    workers = args.cluster_workers
    if args.platform:
        platform = load_platform(args.platform)
        if max(workers) > platform.count:
            raise ConfigError(f"--cluster-workers {max(workers)}: --platform {args.platform} "
                              f"has {platform.count} machine(s)")
        if args.measure:
            raise ConfigError("--measure runs real steps on this machine: leave --platform out")
    else:
        platform = local_platform(max(workers), args.cluster_threads or 1)
    weak = args.scaling == "weak"
    costs = None
    if args.calibrate:  # each worker count's share: its samples and partitions, per core
        found = [calibrate(args.model, shape, n, g, "cpu:1", args.policy, args.dtype,
                           steps=args.steps)
                 for n, g in shares(workers, args.batch_size, args.granularity, weak)]
        hosts = [c.host for c in found if c.host is not None]
        costs = PathCosts(found[0].path, statistics.median(c.dispatch for c in found),
                          statistics.median(c.handoff for c in found),
                          statistics.median(hosts) if hosts else None)
    rows = scaling(args.model, shape, platform, workers, args.batch_size, args.granularity,
                   weak=weak, policy=args.policy, dtype=args.dtype, costs=costs,
                   cpu_workers=args.cluster_threads)
    measured = {}
    if args.measure:
        for r in rows:
            measured[r.ranks] = measure_cluster_step(
                args.model, shape, r.batch, r.granularity, r.ranks, args.cluster_threads or 1,
                steps=args.steps, dtype=args.dtype)
    if args.json:
        print(json.dumps({"platform": platform.name, "scaling": args.scaling,
                          "steps": [{**r.to_json(), "measured_step_seconds":
                                     measured.get(r.ranks)} for r in rows]}, indent=1))
        return 0
    net = platform.network
    per = "per worker" if weak else "per batch"
    print(f"cluster path on {platform.name} ({args.scaling} scaling, {args.model}, "
          f"{args.granularity} partitions {per}); network {1e6 * net.latency:.0f} us + "
          f"{1e6 * net.message_overhead:.0f} us per message, {net.bandwidth / 1e9:.2f} GB/s")
    print(format_scaling(rows, weak))
    for r in rows:
        if r.ranks in measured:
            err = (r.step_seconds - measured[r.ranks]) / measured[r.ranks]
            print(f"measured step {1e3 * measured[r.ranks]:.3f} ms on local:{r.ranks}: "
                  f"prediction {100 * err:+.1f}%")
    ways = {k: v for r in rows for k, v in r.result.predicted_by.items()}
    for kind, row in ways.items():
        print(f"{kind} tasks predicted by " + ", ".join(
            f"{how}: {n}" + (" (no measured model)" if how == "roofline" else "")
            for how, n in sorted(row.items())) + " (the last row's step)")
    return 0
