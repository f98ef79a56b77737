"""The ``hetero-nn`` command: train, evaluate, datasets, perfmodel, models.

This module owns what a user of the command meets: the options and their
checks, the progress display and summary, and the files of a run's output
directory::

    hetero-nn train                       # lenet5 on MNIST, 3 epochs, SGD(0.02, momentum 0.9)
    hetero-nn train --dataset cifar10 --model cifar-small --epochs 5 --out runs/c10
    hetero-nn train --out runs/c10 --resume               # continue a killed run
    hetero-nn evaluate --checkpoint runs/c10/checkpoint-final.npz
    hetero-nn datasets list [--verify] | download mnist [--mirror URL]
    hetero-nn perfmodel [codelet]

``hetero-nn`` alone, or ``hetero-nn datasets`` alone, prints its usage (exit 0).

Output directory (``--out DIR``), every file written under a temporary name and
renamed: ``metrics.json`` (config, devices, the variants that ran per codelet,
per-epoch metrics, final test accuracy; rewritten after every epoch), ``metrics.csv``, ``trace.json`` (Chrome
trace of the last ``--trace-steps`` steps, with ``--trace``), ``checkpoint.npz``
(every ``--checkpoint-every`` steps and every epoch end) and
``checkpoint-final.npz`` (the end of training). The folder is checked before
anything is loaded or trained: one that cannot be written is refused, and so is
one holding another run's files unless the run is resumed (``--resume``) or
replaced (``--overwrite``, which removes those files first).

Reproducibility: by default the runtime runs one fixed variant per codelet and
device kind (``Runtime()``'s default, the table ``codelets/pinned.py``: the
Numba kernels, im2col convolutions, BLAS dense layers), because variants differ in the last bits
and a performance model would pick them by timing. With a fixed granularity
(recorded in the checkpoint, ``auto`` included) and REDUX trees whose shape
does not depend on the schedule, a run on CPU workers gives the same weights
bit for bit whatever the policy, the worker count, or a SIGKILL and
``--resume`` halfway. ``--no-deterministic`` (or ``--calibrate``) lets the
performance models choose variants instead: faster on some machines,
reproducible only up to rounding.

``--resume`` takes every option that changes the numbers (dataset, model,
batch size, granularity, dtype, optimizer, lr, momentum, weight decay, Nesterov,
label smoothing, schedule and its settings, clipping, augmentation,
normalisation, seed, limit, determinism) from the checkpoint's config; giving a
different value is an error. ``--epochs`` may be raised to train further; devices, policy, executor,
tracing and checkpoint frequency may change freely.

Errors: a bad option, missing dataset files, a device that is not there, a
checkpoint that does not fit, an ``--out`` that cannot be written, a Dask scheduler
that does not answer within ``--connect-timeout``: one line ``hetero-nn: error:
...`` on stderr, exit status 2. Training that diverges, a failing task or
download, a codelet with no performance model: one line, exit status 1. Ctrl-C
ends a run at the end of the step in progress: one line ``hetero-nn:
interrupted``, exit status 130 (Dask's worker processes ignore it and its logs
are silenced while the run shuts down; see :class:`_Interrupts`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import deque
from pathlib import Path

from .errors import (ArenaError, ClusterError, ConfigError, HeteroNNError, TaskError,
                     TrainingDiverged)
from .tables import format_table

PROG = "hetero-nn"
DEFAULT_GRANULARITY = 2
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds to reach a distributed=ADDRESS scheduler
#: The files of a run in its --out folder besides its checkpoints (another run's refuse
#: a new run there).
RUN_FILES = ("metrics.json", "metrics.csv", "trace.json")
OPTIMIZER_DEFAULTS = {"sgd": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.0},
                      "adam": {"lr": 0.001, "weight_decay": 0.0},
                      "adamw": {"lr": 0.001, "weight_decay": 0.01}}
#: Each schedule's options and their defaults (None: computed from the run, see _schedule_defaults).
SCHEDULE_OPTIONS = {"step": {"step_size": 10, "gamma": 0.1},
                    "cosine": {"t_max": None},
                    "onecycle": {"max_lr": None}}
_UNSET = None  # an option not given on the command line


class UsageError(HeteroNNError):
    """A command line argparse refused (unknown option, bad value)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised instead of printed."""

    def error(self, message):
        raise UsageError(message)


# ---------------------------------------------------------------------------------------
# Option types: each names the option in its message
# ---------------------------------------------------------------------------------------

def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _granularity(text):
    if text == "auto":
        return "auto"
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', "
                                         f"got {text!r}") from None


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _devices(text):
    from .scheduler.devices import parse_devices

    try:
        parse_devices(text)
    except HeteroNNError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _executor(text):
    name, sep, address = text.partition("=")
    if name not in ("local", "dask", "distributed") or (sep and (name != "distributed"
                                                                 or not address)):
        raise argparse.ArgumentTypeError(f"expected 'local', 'dask', 'distributed' or "
                                         f"'distributed=ADDRESS', got {text!r}")
    return text


# ---------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The ``hetero-nn`` argument parser (subcommands train, evaluate, datasets, perfmodel, models)."""
    from .datasets import DATASETS
    from .models import MODELS
    from .scheduler.policies import POLICIES

    parser = _Parser(prog=PROG, description="Task-based heterogeneous CNN training "
                                             "(StarPU-style codelets over Dask).")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="train a built-in model on a dataset",
                           description="Train a built-in model. Without options: lenet5 on "
                                       "MNIST for 3 epochs, SGD lr 0.02 momentum 0.9.")
    data = train.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=_UNSET, help="default: mnist")
    data.add_argument("--data-dir", help="folder holding mnist/, fashion-mnist/, cifar-10/ "
                                         "(default: $HETERO_NN_DATA or the cache's data/)")
    data.add_argument("--limit", type=_positive_int, default=_UNSET, metavar="N",
                      help="use only the first N samples of each split")
    model = train.add_argument_group("model and optimisation")
    model.add_argument("--model", choices=list(MODELS), default=_UNSET, help="default: lenet5")
    model.add_argument("--epochs", type=_non_negative_int, default=_UNSET, help="default: 3")
    model.add_argument("--batch-size", type=_positive_int, default=_UNSET, help="default: 64")
    model.add_argument("--granularity", type=_granularity, default=_UNSET,
                       help=f"partitions per batch, or 'auto' to choose it (and fusion, and "
                            f"a g per layer) from the performance models (default: "
                            f"{DEFAULT_GRANULARITY})")
    model.add_argument("--optimizer", choices=sorted(OPTIMIZER_DEFAULTS), default=_UNSET,
                       help="default: sgd")
    model.add_argument("--lr", type=_positive_float, default=_UNSET,
                       help="learning rate (default: 0.02 for sgd, 0.001 for adam)")
    model.add_argument("--momentum", type=_fraction, default=_UNSET,
                       help="SGD momentum (default: 0.9)")
    _add_training_options(train, model)
    model.add_argument("--seed", type=_non_negative_int, default=_UNSET,
                       help="seed of the initial weights and the data order (default: 0)")
    model.add_argument("--dtype", choices=("float32", "float64"), default=_UNSET,
                       help="default: float32")
    _add_runtime_options(train, POLICIES)
    _add_cluster_options(train)
    run = train.add_argument_group("reproducibility")
    run.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=_UNSET,
                     help="run one fixed variant per codelet so results are bit-reproducible "
                          "(default: on)")
    run.add_argument("--calibrate", action="store_true",
                     help="explore every variant until the performance models are calibrated "
                          "(implies --no-deterministic)")
    out = train.add_argument_group("output")
    out.add_argument("--out", metavar="DIR", help="write metrics, trace and checkpoints here")
    out.add_argument("--trace", action="store_true", help="write DIR/trace.json (Chrome trace)")
    out.add_argument("--trace-steps", type=_non_negative_int, default=100, metavar="N",
                     help="keep the tasks of the last N training steps in the trace "
                          "(0: all; default: 100)")
    out.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                     help="also write DIR/checkpoint.npz every N steps")
    out.add_argument("--resume", nargs="?", const="", metavar="FILE",
                     help="continue from FILE (default: DIR/checkpoint.npz) with the run's "
                          "options and data directory")
    out.add_argument("--overwrite", action="store_true",
                     help="start a new run in a DIR that holds another run's files, "
                          "removing them first")
    out.add_argument("-q", "--quiet", action="store_true", help="no per-epoch lines or bar")

    ev = sub.add_parser("evaluate", help="loss and accuracy of a checkpoint on a dataset",
                        description="Evaluate a checkpoint; the model and dtype come from it.")
    ev.add_argument("--checkpoint", required=True, metavar="FILE")
    ev.add_argument("--dataset", choices=DATASETS, help="default: the checkpoint's")
    ev.add_argument("--data-dir", help="default: the one the checkpoint was trained from")
    ev.add_argument("--split", choices=("train", "test"), default="test")
    ev.add_argument("--limit", type=_positive_int, metavar="N")
    ev.add_argument("--batch-size", type=_positive_int, help="default: the checkpoint's")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_runtime_options(ev, POLICIES)

    ds = sub.add_parser("datasets", help="list or download datasets")
    ds.set_defaults(datasets_usage=ds.format_help)  # ``hetero-nn datasets`` alone prints it
    ds_sub = ds.add_subparsers(dest="action", metavar="ACTION")
    ls = ds_sub.add_parser("list", help="which datasets are in the data directory (file "
                                        "sizes checked)")
    ls.add_argument("--data-dir")
    ls.add_argument("--verify", action="store_true",
                    help="also check published MD5s and read every file whole")
    dl = ds_sub.add_parser("download", help="download a dataset (checksums verified)")
    dl.add_argument("name", choices=[d for d in DATASETS if d != "synthetic"])
    dl.add_argument("--data-dir")
    dl.add_argument("--force", action="store_true", help="download again files that are there")
    dl.add_argument("--mirror", action="append", metavar="URL",
                    help="base URL to use instead of the official ones (repeatable, tried in "
                         "order; file:// works)")

    pm = sub.add_parser("perfmodel", help="show the performance models of this machine",
                        description="Show the performance models recorded on this machine "
                                    "(like starpu_perfmodel_display).")
    pm.add_argument("codelet", nargs="?", help="show only this codelet (exit 1 if it has none)")
    pm.add_argument("--cache-dir", help="cache directory (default: $HETERO_NN_CACHE or "
                                        "~/.cache/hetero_nn)")
    pm.add_argument("--list", action="store_true", help="list the codelets that have a model")
    pm.add_argument("--host", help="show another machine's models (default: this one)")
    sub.add_parser("simulate", help="predict a training step's time on a platform "
                   "(hetero-nn simulate --help)", add_help=False)
    models = sub.add_parser("models", help="list the built-in models, or one's layer summary")
    models.add_argument("--summary", choices=list(MODELS), metavar="MODEL",
                        help="print MODEL's layers: output shapes and parameter counts")
    models.add_argument("--input-shape", type=_input_shape, default=(3, 32, 32), metavar="CxHxW",
                        help="one sample's shape for --summary (default: 3x32x32)")
    return parser


def _input_shape(text):
    parts = text.replace(",", "x").split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected C x H x W such as 3x32x32, got {text!r}")
    return tuple(int(p) for p in parts)


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _add_training_options(train, model):
    """The optimizer, loss, schedule, clipping and data-augmentation options of ``train``."""
    model.add_argument("--weight-decay", type=_non_negative_float, default=_UNSET,
                       help="weight decay (default: 0 for sgd and adam, 0.01 for adamw, "
                            "which decouples it)")
    model.add_argument("--nesterov", action="store_true", default=_UNSET,
                       help="Nesterov momentum (sgd)")
    model.add_argument("--label-smoothing", type=_fraction, default=_UNSET, metavar="EPS",
                       help="cross-entropy label smoothing (default: 0)")
    model.add_argument("--clip-grad-norm", type=_positive_float, default=_UNSET, metavar="MAX",
                       help="clip the gradients to this global 2-norm before every step")
    sched = train.add_argument_group("learning-rate schedule")
    sched.add_argument("--schedule", choices=sorted(SCHEDULE_OPTIONS), default=_UNSET,
                       help="step: StepLR; cosine: CosineAnnealingLR; onecycle: OneCycleLR "
                            "(default: a constant lr)")
    sched.add_argument("--schedule-interval", choices=("step", "epoch"), default=_UNSET,
                       help="step the schedule after every batch or every epoch (default: "
                            "epoch for step and cosine, step for onecycle)")
    sched.add_argument("--step-size", type=_positive_int, default=_UNSET,
                       help="step: multiply the lr by --gamma every N intervals (default: 10)")
    sched.add_argument("--gamma", type=_positive_float, default=_UNSET,
                       help="step: the factor (default: 0.1)")
    sched.add_argument("--t-max", type=_positive_int, default=_UNSET, metavar="N",
                       help="cosine: intervals of the half period (default: the whole run)")
    sched.add_argument("--max-lr", type=_positive_float, default=_UNSET,
                       help="onecycle: the peak lr (default: --lr); it starts at max-lr/25 "
                            "and ends at max-lr/25e4 after the whole run")
    aug = train.add_argument_group("data transforms")
    aug.add_argument("--augment", action="store_true", default=_UNSET,
                     help="random crop (padding 4, black) and horizontal flip of training "
                          "images, seeded by (seed, epoch, sample)")
    aug.add_argument("--normalize", action="store_true", default=_UNSET,
                     help="standardise each channel with the training split's measured mean "
                          "and std (on top of the dataset's fixed normalisation)")


def _add_runtime_options(parser, policies):
    group = parser.add_argument_group("runtime")
    group.add_argument("--devices", type=_devices, default="cpu",
                       help="workers, e.g. 'cpu:2' or 'cpu:1,cuda:0' (default: one per core)")
    group.add_argument("--policy", choices=sorted(policies), default="eager",
                       help="scheduling policy (default: eager)")
    group.add_argument("--executor", type=_executor, default="local",
                       help="local, dask, distributed or distributed=ADDRESS (default: local)")
    group.add_argument("--connect-timeout", type=_positive_float,
                       default=DEFAULT_CONNECT_TIMEOUT, metavar="SECONDS",
                       help="give up on a distributed=ADDRESS or --cluster scheduler that does "
                            "not answer "
                            f"within this time (default: {DEFAULT_CONNECT_TIMEOUT:g})")


def _add_cluster_options(parser):
    group = parser.add_argument_group("cluster (data-parallel over Dask; see docs/cluster.md)")
    group.add_argument("--cluster", metavar="SPEC",
                       help="compute gradients on Dask workers: 'local:N' (N worker processes "
                            "here) or a scheduler address 'tcp://HOST:PORT'")
    group.add_argument("--cluster-threads", type=_positive_int, default=1, metavar="N",
                       help="cores of each worker's runtime (default: 1)")
    group.add_argument("--cluster-devices", type=_devices, metavar="SPEC",
                       help="each worker's devices instead, e.g. 'cpu:2'")


def _connect_cluster(args, stack):
    """The ``--cluster`` the run computes on (None without it), closed by ``stack``; says
    where it is. Worker processes it starts ignore SIGINT, as ``dask_client``'s do."""
    if args.cluster is None:
        if args.cluster_devices is not None or args.cluster_threads != 1:
            raise ConfigError("--cluster-threads and --cluster-devices need --cluster")
        return None
    from .cluster import connect

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        cluster = connect(args.cluster, threads=args.cluster_threads,
                          devices=args.cluster_devices, timeout=args.connect_timeout)
    except ConfigError as exc:
        raise ConfigError(f"--cluster: {exc}") from None
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    stack.callback(cluster.close)
    if not args.quiet:
        print(f"{PROG}: {cluster.describe()}", file=sys.stderr, flush=True)
    return cluster


# ---------------------------------------------------------------------------------------
# Run facts: versions, machine, commit
# ---------------------------------------------------------------------------------------

def _version() -> str:
    from . import __version__
    return __version__


def git_commit(path=None) -> str | None:
    """The commit of the git checkout holding ``path`` (default: this package), or None."""
    where = Path(path) if path else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                           capture_output=True, text=True, timeout=10)
    return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def environment() -> dict:
    """Versions of the stack and a description of the machine, for result files."""
    import numba
    import numpy

    versions = {"hetero_nn": _version(), "python": platform.python_version(),
                "numpy": numpy.__version__, "numba": numba.__version__}
    for name in ("dask", "distributed", "torch", "cupy"):
        module = sys.modules.get(name)
        if module is None and name in ("dask", "distributed"):
            try:
                module = __import__(name)
            except ImportError:
                module = None
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    machine = {"hostname": platform.node(), "platform": platform.platform(),
               "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count()}
    try:
        machine["sched_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return {"git_commit": git_commit(), "versions": versions, "machine": machine}


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------

#: Options that change the numbers: (attribute, flag, default). ``--resume`` takes them
#: from the checkpoint.
_RESULT_OPTIONS = (("dataset", "--dataset", "mnist"), ("model", "--model", "lenet5"),
                   ("batch_size", "--batch-size", 64),
                   ("granularity", "--granularity", DEFAULT_GRANULARITY),
                   ("dtype", "--dtype", "float32"), ("optimizer", "--optimizer", "sgd"),
                   ("lr", "--lr", None), ("momentum", "--momentum", None),
                   ("seed", "--seed", 0), ("limit", "--limit", None),
                   ("deterministic", "--deterministic", True),
                   ("weight_decay", "--weight-decay", None), ("nesterov", "--nesterov", False),
                   ("label_smoothing", "--label-smoothing", 0.0),
                   ("clip_grad_norm", "--clip-grad-norm", None),
                   ("schedule", "--schedule", None),
                   ("schedule_interval", "--schedule-interval", None),
                   ("step_size", "--step-size", None), ("gamma", "--gamma", None),
                   ("t_max", "--t-max", None), ("max_lr", "--max-lr", None),
                   ("augment", "--augment", False), ("normalize", "--normalize", False))


def _resolve_run_options(args) -> tuple[dict, object]:
    """The options of a training run: the command line's, or a resumed checkpoint's."""
    from .checkpoint import CHECKPOINT_NAME, read_checkpoint

    ckpt = None
    if args.resume is not None:
        if args.resume:
            path = Path(args.resume)
        elif args.out:
            path = Path(args.out) / CHECKPOINT_NAME
        else:
            raise ConfigError("--resume: give a checkpoint FILE, or --out DIR holding "
                              f"{CHECKPOINT_NAME}")
        if not path.is_file():
            raise ConfigError(f"--resume: no checkpoint at {path}")
        ckpt = read_checkpoint(path)
        if args.out is None:
            args.out = str(path.parent)
        saved = ckpt.config.get("run")
        if not isinstance(saved, dict):
            raise ConfigError(f"--resume: {path} was not written by 'hetero-nn train' (its config "
                              "has no 'run' options)")
        run = {}
        for key, flag, _ in _RESULT_OPTIONS:
            given, value = getattr(args, key), saved.get(key)
            if key == "granularity" and given is not _UNSET and value == "auto" \
                    and given == ckpt.config.get("granularity"):
                given = _UNSET  # the value auto chose, given explicitly: the same run
            if given is not _UNSET and given != value:
                raise ConfigError(f"{flag} {given} differs from the {value} of the run in {path}; "
                                  "drop the option to resume it, or start a new run with another "
                                  "--out")
            run[key] = value
        run["epochs"] = args.epochs if args.epochs is not _UNSET else saved.get("epochs", 3)
        run["calibrate"] = bool(args.calibrate)
        run["data_dir"] = args.data_dir if args.data_dir is not None else saved.get("data_dir")
        run["schedule_length"] = saved.get("schedule_length")
        return run, ckpt
    run = {key: getattr(args, key) if getattr(args, key) is not _UNSET else default
           for key, _, default in _RESULT_OPTIONS}
    run["epochs"] = args.epochs if args.epochs is not _UNSET else 3
    defaults = OPTIMIZER_DEFAULTS[run["optimizer"]]
    if run["momentum"] is not None and "momentum" not in defaults:
        raise ConfigError(f"--momentum applies to --optimizer sgd, not {run['optimizer']}")
    for key, value in defaults.items():
        if run[key] is None:
            run[key] = value
    _check_training_options(run)
    if args.calibrate:
        if args.deterministic is True:
            raise ConfigError("--calibrate explores every variant: it cannot be combined with "
                              "--deterministic")
        run["deterministic"] = False
    run["calibrate"] = bool(args.calibrate)
    run["data_dir"] = str(Path(args.data_dir).expanduser().resolve()) if args.data_dir else None
    return run, None


def _check_training_options(run):
    """Options that apply only to some optimizers or schedules, and the schedule's defaults."""
    if run["nesterov"] and (run["optimizer"] != "sgd" or not run["momentum"]):
        raise ConfigError("--nesterov needs --optimizer sgd with a --momentum above 0")
    own = SCHEDULE_OPTIONS.get(run["schedule"], {})
    for options in SCHEDULE_OPTIONS.values():
        for key in options:
            if run[key] is not None and key not in own:
                raise ConfigError(f"--{key.replace('_', '-')} applies to --schedule "
                                  f"{next(n for n, o in SCHEDULE_OPTIONS.items() if key in o)}")
    if run["schedule"] is None:
        if run["schedule_interval"] is not None:
            raise ConfigError("--schedule-interval needs a --schedule")
        return
    for key, value in own.items():
        if run[key] is None and value is not None:
            run[key] = value
    if run["schedule_interval"] is None:
        run["schedule_interval"] = "step" if run["schedule"] == "onecycle" else "epoch"
    if run["schedule"] == "onecycle" and run["max_lr"] is None:
        run["max_lr"] = run["lr"]


def make_schedule(run, optimizer, steps_per_epoch):
    """The run's learning-rate schedule (None without ``--schedule``).

    Cosine's half period and OneCycle's length default to the whole run,
    ``epochs`` in intervals; both are fixed at the start (``run["schedule_length"]``)
    so a resumed run keeps them.
    """
    from .optim import CosineAnnealingLR, OneCycleLR, StepLR

    kind = run.get("schedule")
    if kind is None:
        return None
    if run.get("schedule_length") is None:
        per = steps_per_epoch if run["schedule_interval"] == "step" else 1
        run["schedule_length"] = max(1, run["epochs"] * per)
    length = run["schedule_length"]
    if kind == "step":
        return StepLR(optimizer, run["step_size"], run["gamma"])
    if kind == "cosine":
        return CosineAnnealingLR(optimizer, run["t_max"] or length)
    return OneCycleLR(optimizer, run["max_lr"], total_steps=length)


def _check_run(run, args):
    g, bs = run["granularity"], run["batch_size"]
    if g != "auto" and g > bs:
        raise ConfigError(f"--granularity {g} is larger than --batch-size {bs}")
    if args.checkpoint_every and not args.out:
        raise ConfigError("--checkpoint-every needs --out DIR to write the checkpoints in")
    if args.trace and not args.out:
        raise ConfigError("--trace needs --out DIR to write trace.json in")


def _check_out(out, *, resuming, overwrite) -> list[Path]:
    """Refuse an ``--out`` that cannot be written or holds another run; return that run's files.

    Runs before any data is loaded or any step trained, and writes nothing that
    stays: writing is tried in the folder, or in its nearest existing parent when it
    is not there yet (a probe file, created and removed), so read-only mounts and
    immutable folders are caught for root too. Nothing of an earlier run is touched.
    """
    if out is None:
        return []
    path = Path(out)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "exists and is not a folder" if existing == path else f"{existing} is not a folder"
        raise ConfigError(f"--out {out}: {where}")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".hetero_nn-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    from .checkpoint import CHECKPOINT_NAME, FINAL_NAME

    names = (*RUN_FILES, CHECKPOINT_NAME, FINAL_NAME)
    found = [path / name for name in names if (path / name).exists()]
    if found and not resuming and not overwrite:
        raise ConfigError(f"--out {out} holds another run ({', '.join(p.name for p in found)}); "
                          "continue it with --resume, or pass --overwrite to replace it")
    return [] if resuming else found


def _dataset_error(name, exc) -> HeteroNNError:
    """``exc`` with ``--dataset NAME:`` in front, the dataset named once."""
    text = str(exc)
    if text.startswith(f"{name}: "):
        text = text[len(name) + 2:]
    return type(exc)(f"--dataset {name}: {text}")


def _load_datasets(run, data_dir):
    from .datasets import load

    try:
        train = load(run["dataset"], "train", data_dir=data_dir, limit=run["limit"])
        test = load(run["dataset"], "test", data_dir=data_dir, limit=run["limit"])
    except HeteroNNError as exc:
        raise _dataset_error(run["dataset"], exc) from None
    return train, test


def dask_client(executor, devices, stack, timeout=DEFAULT_CONNECT_TIMEOUT):
    """The ``distributed.Client`` of ``--executor distributed[=ADDRESS]``, ready now; else None.

    ``distributed=ADDRESS`` connects at start, so an unreachable scheduler fails within
    ``timeout`` seconds naming the option, not with a long hang and a traceback at
    the first step. ``distributed`` starts the ``LocalCluster`` here (one
    single-threaded worker process per CPU worker, as the runtime would) with SIGINT
    ignored, a disposition its worker processes inherit: Ctrl-C reaches this process
    alone, which prints one line and closes the cluster. Both are closed by ``stack``.
    """
    name, _, address = executor.partition("=")
    if name != "distributed":
        return None
    from distributed import Client, LocalCluster

    if address:
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"--executor {executor}: no Dask scheduler answered at {address} "
                              f"within {timeout:g} s (--connect-timeout): {reason}") from None
        stack.callback(client.close)
        return client
    from .scheduler.devices import parse_devices

    cpu_workers = parse_devices(devices)[0]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        cluster = LocalCluster(n_workers=max(1, cpu_workers), threads_per_worker=1,
                               processes=True, dashboard_address=":0")  # no port clash
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    stack.callback(cluster.close)
    client = Client(cluster, set_as_default=False)
    stack.callback(client.close)
    return client


class _Interrupts:
    """Ctrl-C during a run: noted by the handler, raised at the next step boundary.

    A KeyboardInterrupt raised wherever the main thread happens to be can land in a
    Dask callback that swallows it (the run goes on) or in the middle of a graph
    submission; raised from :meth:`check` (called between steps) it always ends the
    run cleanly. A second Ctrl-C raises at once. While the interrupted run shuts
    down, the logs of Dask (its client and cluster closing) are silenced, so the
    user sees one line. With ``defer=False`` (no step boundary to wait for) only
    the logs are silenced.
    """

    def __init__(self, defer: bool = True):
        self.requested = False
        self._defer = defer
        self._previous = None

    def __enter__(self):
        if self._defer and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, _signum, _frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one raises at once

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed since the run began."""
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, kind, _exc, _tb):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            for name in ("distributed", "tornado", "asyncio"):
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        return False


def _transformed_data(run, train, test):
    """``--normalize`` (the training split's channel statistics, for both splits) and
    ``--augment``; returns ``(train, test, {"augment": ..., "config": ...})``."""
    from .transforms import Normalize, NormalizedData, channel_stats, standard_augmentation

    out = {}
    if run.get("normalize"):
        mean, std = channel_stats(train)
        normalize = Normalize(mean, std)
        train, test = NormalizedData(train, normalize), NormalizedData(test, normalize)
        out["config"] = {"normalize": {"mean": list(mean), "std": list(std)}}
    if run.get("augment"):
        if len(train.input_shape) != 3:
            raise ConfigError(f"--augment: expected images (C, H, W), --dataset {run['dataset']} "
                              f"has samples of shape {train.input_shape}")
        out["augment"] = standard_augmentation(train)
    return train, test, out


def make_runtime(devices, policy, executor, *, deterministic=True, calibrate=False, trace=False):
    """The Runtime the CLI trains on; a failing device or executor names its option."""
    from .errors import DeviceError
    from .scheduler.runtime import Runtime

    try:
        return Runtime(devices=devices, policy=policy, executor=executor,
                       deterministic=deterministic,
                       calibrate=calibrate, trace=trace)
    except DeviceError as exc:
        option = "--executor" if "executor" in str(exc) else "--devices"
        raise DeviceError(f"{option}: {exc}") from None
    except (OSError, TimeoutError) as exc:  # a distributed scheduler that cannot be reached
        raise ConfigError(f"--executor {executor}: {type(exc).__name__}: {exc}") from None


def _worker_facts(rt) -> list[dict]:
    return [{"name": w.name, "kind": w.kind, "node": w.node.name} for w in rt.workers]


class _RunFiles:
    """The output directory of a training run: metrics.json, metrics.csv, trace.json."""

    def __init__(self, out, run, rt, env, trainer):
        self.dir = Path(out) if out else None
        self.run, self.rt, self.env, self.trainer = run, rt, env, trainer
        self.t0 = time.perf_counter()
        #: {codelet: {variant: tasks}}: what actually ran, from the runtime's task records.
        self.variants_run: dict[str, dict[str, int]] = {}
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def count_variants(self, records) -> None:
        """Add the variants of ``records`` (TaskRecords) to :attr:`variants_run`."""
        for r in records:
            per_codelet = self.variants_run.setdefault(r.codelet, {})
            per_codelet[r.variant] = per_codelet.get(r.variant, 0) + 1

    def document(self, status, error=None) -> dict:
        t = self.trainer
        history = t.history
        last = history[-1] if history else {}
        return {"status": status, "error": error, "config": self.run,
                "devices": {"spec": str(self.rt.devices), "workers": _worker_facts(self.rt),
                            "policy": self.rt.policy_name, "executor": self.rt.executor_name,
                            "deterministic": self.rt.deterministic,
                            "variants": list(self.rt.preferred)},
                "variants_run": {c: dict(sorted(v.items()))
                                 for c, v in sorted(self.variants_run.items())},
                "cluster": t.cluster.facts() if t.cluster is not None else None,
                "granularity": t.granularity,
                "granularity_decision": None if t.granularity_decision is None
                else t.granularity_decision.to_json(),
                "epochs": history,
                "test_accuracy": last.get("test_accuracy"), "test_loss": last.get("test_loss"),
                "train_seconds": sum(r["seconds"] for r in history),
                "wall_seconds": time.perf_counter() - self.t0,
                "global_step": t.global_step, **self.env}

    def write_metrics(self, status, error=None):
        from .fileio import atomic_write_text
        from .trainer import HISTORY_KEYS

        if self.dir is None:
            return
        atomic_write_text(self.dir / "metrics.json",
                          json.dumps(self.document(status, error), indent=2) + "\n")
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(HISTORY_KEYS)
        for record in self.trainer.history:
            writer.writerow(["" if record.get(k) is None else record[k] for k in HISTORY_KEYS])
        atomic_write_text(self.dir / "metrics.csv", buf.getvalue())


def _summary(history, document) -> str:
    rows = []
    for r in history:
        rows.append((str(r["epoch"]), f"{r['train_loss']:.4f}", f"{r['train_accuracy']:.2%}",
                     "-" if r["test_loss"] is None else f"{r['test_loss']:.4f}",
                     "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.2%}",
                     f"{r['seconds']:.1f}",
                     "-" if r["images_per_second"] is None else f"{r['images_per_second']:.0f}"))
    lines = [format_table(("epoch", "train loss", "train acc", "test loss", "test acc",
                           "seconds", "images/s"), rows)]
    acc = document["test_accuracy"]
    tail = (f"final test accuracy {acc:.2%} (loss {document['test_loss']:.4f})"
            if acc is not None else "no test set evaluated")
    lines.append(f"{tail}; {len(history)} epoch(s), {document['train_seconds']:.1f} s training, "
                 f"{document['wall_seconds']:.1f} s wall in this process, granularity "
                 f"{document['granularity']}")
    return "\n".join(lines)


def cmd_train(args) -> int:
    """``hetero-nn train``: options, output folder and scheduler checked before any work."""
    if args.overwrite and args.resume is not None:
        raise ConfigError("--overwrite starts a new run: it cannot be combined with --resume")
    run, ckpt = _resolve_run_options(args)
    _check_run(run, args)
    earlier_run = _check_out(args.out, resuming=ckpt is not None, overwrite=args.overwrite)
    with contextlib.ExitStack() as stack:
        client = dask_client(args.executor, args.devices, stack, args.connect_timeout)
        cluster = _connect_cluster(args, stack)
        train, test = _load_datasets(run, run["data_dir"])
        rt = make_runtime(args.devices, args.policy, client or args.executor,
                          deterministic=run["deterministic"], calibrate=run["calibrate"],
                          trace=True)  # the task records say which variants ran
        stack.callback(rt.close)
        with _Interrupts() as interrupts:
            return _train(args, run, ckpt, rt, train, test, earlier_run, interrupts, cluster)


def _train(args, run, ckpt, rt, train, test, earlier_run, interrupts, cluster=None) -> int:
    """The training run proper, on ``rt``: writes the output folder, prints the summary."""
    from .models import build_model
    from .layers.loss import SoftmaxCrossEntropy
    from .optim import OPTIMIZERS
    from .scheduler.trace import Trace
    from .trainer import Trainer

    # A diverging run overflows before its loss turns NaN; the error says so in one line.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message="(overflow|invalid value|divide by zero) encountered")
    train, test, transforms = _transformed_data(run, train, test)
    model = build_model(run["model"], train.input_shape, train.num_classes, dtype=run["dtype"],
                        seed=run["seed"])
    hyper = {"lr": run["lr"]}
    if run["optimizer"] == "sgd":
        hyper.update(momentum=run["momentum"], nesterov=bool(run.get("nesterov")))
    if run.get("weight_decay") is not None:
        hyper["weight_decay"] = run["weight_decay"]
    optimizer = OPTIMIZERS[run["optimizer"]](**hyper)
    if run.get("schedule") == "onecycle" and ckpt is not None \
            and run["epochs"] > ckpt.config["run"]["epochs"]:
        raise ConfigError(f"--epochs {run['epochs']}: the onecycle schedule of {ckpt.path} "
                          f"ends after {ckpt.config['run']['epochs']} epochs")
    scheduler = make_schedule(run, optimizer, -(-len(train) // run["batch_size"]))
    granularity = run["granularity"]
    if ckpt is not None and isinstance(ckpt.config.get("granularity"), int):
        granularity = ckpt.config["granularity"]  # what the run used, 'auto' resolved
    trainer = Trainer(model, loss=SoftmaxCrossEntropy(
                          label_smoothing=run.get("label_smoothing") or 0.0),
                      optimizer=optimizer, runtime=rt, batch_size=run["batch_size"],
                      granularity=granularity, seed=run["seed"],  # dtype: the model's
                      scheduler=scheduler, scheduler_interval=run.get("schedule_interval"),
                      clip_grad_norm=run.get("clip_grad_norm"),
                      augment=transforms.get("augment"), cluster=cluster)
    trainer.config = {"run": run, **transforms.get("config", {})}
    if ckpt is not None:
        trainer.load_checkpoint(ckpt.path)
        if not args.quiet:
            print(f"{PROG}: resuming {ckpt.path} at epoch {ckpt.epoch + 1}, step {ckpt.step} "
                  f"(global step {ckpt.global_step})", file=sys.stderr)
    for path in earlier_run:  # --overwrite: the earlier run's files go, nothing else
        path.unlink()
    files = _RunFiles(args.out, run, rt, environment(), trainer)
    steps = deque(maxlen=args.trace_steps or None)

    decided = [trainer.granularity_decision is not None]

    def on_step(_trainer, _loss):
        if not decided[0] and trainer.granularity_decision is not None:
            decided[0] = True  # 'auto' resolved on the first batch: say what and why
            if not args.quiet:
                print(trainer.granularity_decision.format(), file=sys.stderr, flush=True)
        records = rt.trace(clear=True).records
        files.count_variants(records)
        if args.trace:
            steps.append(records)
        interrupts.check()

    def on_epoch_end(_trainer, _record):
        files.write_metrics("running")
        interrupts.check()

    try:
        trainer.fit(train, epochs=run["epochs"], validation=test, checkpoint_dir=args.out,
                    checkpoint_every=args.checkpoint_every, verbose=0 if args.quiet else 1,
                    on_step=on_step, on_epoch_end=on_epoch_end)
    except BaseException as exc:  # the metrics say how the run ended, then it propagates
        status = ("diverged" if isinstance(exc, TrainingDiverged) else
                  "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        files.write_metrics(status, _one_line(exc))
        raise
    last = rt.trace(clear=True).records  # the last validation pass
    files.count_variants(last)
    document = files.document("completed")
    files.write_metrics("completed")
    if args.trace:
        steps.append(last)
        trace = Trace([r for records in steps for r in records], [w.name for w in rt.workers])
        trace.to_chrome(Path(args.out) / "trace.json")
        if not args.quiet:
            print(trace.format_stats(), file=sys.stderr)
    print(_summary(trainer.history, document))
    if args.out:
        print(f"wrote {args.out}/metrics.json, metrics.csv, checkpoint-final.npz"
              + (", trace.json" if args.trace else ""))
    return 0


# ---------------------------------------------------------------------------------------
# evaluate, datasets, models
# ---------------------------------------------------------------------------------------

def cmd_evaluate(args) -> int:
    """``hetero-nn evaluate``: the model and dtype come from the checkpoint."""
    from .checkpoint import load_model
    from .datasets import load
    from .trainer import Trainer

    model, ckpt = load_model(args.checkpoint)
    run = ckpt.config.get("run", {})
    name = args.dataset or run.get("dataset")
    if name is None:
        raise ConfigError(f"--dataset: {args.checkpoint} does not say which dataset it was "
                          "trained on; give --dataset")
    try:
        data = load(name, args.split, data_dir=args.data_dir or run.get("data_dir"),
                    limit=args.limit)
    except HeteroNNError as exc:
        raise _dataset_error(name, exc) from None
    stats = ckpt.config.get("normalize")
    if stats:  # the run standardised its channels (--normalize): evaluate the same way
        from .transforms import Normalize, NormalizedData
        data = NormalizedData(data, Normalize(stats["mean"], stats["std"]))
    if tuple(data.input_shape) != tuple(model.input_shape):
        raise ConfigError(f"--dataset {name}: samples of shape {data.input_shape}, but the "
                          f"checkpoint's model expects {tuple(model.input_shape)}")
    if data.num_classes != ckpt.config["model"]["num_classes"]:
        raise ConfigError(f"--dataset {name}: {data.num_classes} classes, the checkpoint's model "
                          f"has {ckpt.config['model']['num_classes']}")
    batch_size = args.batch_size or ckpt.config.get("batch_size", 64)
    g = ckpt.config.get("granularity") or 1
    with contextlib.ExitStack() as stack:
        client = dask_client(args.executor, args.devices, stack, args.connect_timeout)
        rt = make_runtime(args.devices, args.policy, client or args.executor,
                          deterministic=run.get("deterministic", True))
        stack.callback(rt.close)
        trainer = Trainer(model, runtime=rt, batch_size=batch_size,
                          granularity=min(g, batch_size))
        t0 = time.perf_counter()
        with _Interrupts(defer=False):
            loss, accuracy = trainer.evaluate(data)
        seconds = time.perf_counter() - t0
    result = {"checkpoint": str(args.checkpoint), "dataset": name, "split": args.split,
              "samples": len(data), "loss": loss, "accuracy": accuracy, "seconds": seconds,
              "model": ckpt.config["model"]["name"], "dtype": model.dtype.name}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{name} {args.split}: loss {loss:.4f}, accuracy {accuracy:.2%} on {len(data)} "
              f"samples ({result['model']}, {result['dtype']}, {seconds:.1f} s)")
    return 0


def cmd_datasets(args) -> int:
    """``hetero-nn datasets list|download``."""
    from .datasets import describe, download, resolve_data_dir

    if args.action is None:
        print(args.datasets_usage(), end="")
        return 0
    if args.action == "list":
        print(f"data directory: {resolve_data_dir(args.data_dir)}")
        infos = describe(args.data_dir, verify=args.verify)
        rows = []
        for info in infos:
            samples = info.samples or {}
            rows.append((info.name, "yes" if info.present else "damaged" if info.problem else "no",
                         str(samples.get("train", "-")), str(samples.get("test", "-")),
                         "generated" if info.name == "synthetic" else str(len(info.files))))
        print(format_table(("dataset", "present", "train", "test", "files"), rows))
        for info in infos:
            if info.problem:
                print(f"{info.name}: {info.problem}")
        return 1 if args.verify and any(info.problem for info in infos) else 0
    bars = {}

    def progress(url, done, total):
        from tqdm import tqdm
        bar = bars.get(url)
        if bar is None:
            bar = bars[url] = tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr,
                                   desc=url.rsplit("/", 1)[-1], leave=False,
                                   disable=not sys.stderr.isatty())
        bar.update(done - bar.n)

    try:
        directory = download(args.name, data_dir=args.data_dir, force=args.force,
                             mirrors=args.mirror, progress=progress)
    finally:
        for bar in bars.values():
            bar.close()
    print(f"{args.name}: ready in {directory}")
    return 0


def cmd_perfmodel(args) -> int:
    """``hetero-nn perfmodel``: the performance models, like ``starpu_perfmodel_display``."""
    from .scheduler.perfmodel import PerfModel

    model = PerfModel(args.cache_dir, hostname=args.host)
    if args.list:
        names = model.codelets()
        print("\n".join(names) if names else f"no performance model yet in {model.directory} "
                                              "(models are recorded when tasks run)")
        return 0
    if args.codelet is not None and not model.entries(args.codelet):
        print(f"{PROG}: error: no performance model for codelet {args.codelet!r} in "
              f"{model.directory} (`hetero-nn perfmodel --list` names those there are)",
              file=sys.stderr)
        return 1
    print(format_perfmodel(model, args.codelet))
    return 0


def format_perfmodel(model, codelet=None) -> str:
    """``model`` (a PerfModel) as text: history per footprint, regressions, transfer links.

    Times in microseconds; the transfer table only when ``codelet`` is None.
    """
    rows = model.entries(codelet)
    parts = []
    if rows:
        parts.append(format_table(
            ["codelet", "variant", "kind", "footprint", "size", "count", "mean (us)", "stddev (us)"],
            [[r["codelet"], r["variant"], r["kind"], r["footprint"], f"{r['size']:.6g}",
              str(r["count"]), f"{r['mean'] * 1e6:.3f}", f"{r['stddev'] * 1e6:.3f}"]
             for r in rows]))
        reg_rows = []
        for group in sorted({(r["codelet"], r["variant"], r["kind"]) for r in rows}):
            fit = model.fit(*group)
            if fit is None:
                reg_rows.append([*group, "-", "-", "-", "-", "need >= 2 distinct sizes"])
            else:
                reg_rows.append([*group, f"{fit.a:.6g}", f"{fit.b:.4f}", f"{fit.c * 1e6:.3f}",
                                 str(fit.points), f"{fit.min_size:.6g} .. {fit.max_size:.6g}"])
        parts.append("regression t = a * size^b + c\n" + format_table(
            ["codelet", "variant", "kind", "a (s)", "b", "c (us)", "points", "sizes"], reg_rows))
    elif codelet is not None:
        parts.append(f"no performance model for codelet {codelet!r} in {model.directory}")
    if codelet is None:
        links = model.transfer_entries()
        if links:
            parts.append("transfers t = latency + bytes / bandwidth\n" + format_table(
                ["src", "dst", "count", "mean bytes", "latency (us)", "bandwidth (GB/s)"],
                [[lk["src"], lk["dst"], str(lk["count"]), f"{lk['mean_bytes']:.6g}",
                  f"{lk['latency'] * 1e6:.3f}", f"{lk['bandwidth'] / 1e9:.3f}"] for lk in links]))
        if not parts:
            parts.append(f"no performance model yet in {model.directory} "
                         "(models are recorded when tasks run)")
    return "\n\n".join(parts)


def cmd_models(args) -> int:
    """``hetero-nn models``: each built-in model with its parameter count for MNIST and
    CIFAR-10 inputs; with ``--summary MODEL``, that model's layer table."""
    from .models import MODELS, build_model

    if args.summary:
        model = build_model(args.summary, args.input_shape, 10, seed=0)
        print(f"{args.summary} for input {'x'.join(map(str, args.input_shape))}, 10 classes")
        print(model.summary())
        return 0
    for name in MODELS:
        for shape in ((1, 28, 28), (3, 32, 32)):
            model = build_model(name, shape, 10, seed=0)
            count = sum(p.data.size for p in model.parameters())
            print(f"{name:12s} input {'x'.join(map(str, shape)):8s} {count:>9,d} parameters")
    return 0


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------

_COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "datasets": cmd_datasets,
             "perfmodel": cmd_perfmodel, "models": cmd_models}
_RUN_ERRORS = (TrainingDiverged, TaskError, ArenaError, ClusterError)


def _one_line(exc) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv=None) -> int:
    """Run ``hetero-nn`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "simulate":  # its own parser (hetero_nn/simulation.py)
        from .simulation import main as simulate_main
        return simulate_main(argv[1:])
    from .datasets import DownloadError

    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            print(parser.format_help(), end="")
            return 0
        return _COMMANDS[args.command](args)
    except (*_RUN_ERRORS, DownloadError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except HeteroNNError as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
