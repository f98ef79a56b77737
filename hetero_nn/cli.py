"""The ``hetero-nn`` command: train, evaluate, datasets, perfmodel, models.

This module owns what a user of the command meets: the options and their
checks, the progress display and summary, and the files of a run's output
directory::

    hetero-nn train                       # lenet5 on MNIST, 3 epochs, SGD(0.02, momentum 0.9)
    hetero-nn train --dataset cifar10 --model cifar-small --epochs 5 --out runs/c10
    hetero-nn train --out runs/c10 --resume               # continue a killed run
    hetero-nn evaluate --checkpoint runs/c10/checkpoint-final.npz
    hetero-nn datasets list | download mnist
    hetero-nn perfmodel [codelet]

Output directory (``--out DIR``), every file written under a temporary name and
renamed: ``metrics.json`` (config, devices, per-epoch metrics, final test
accuracy; rewritten after every epoch), ``metrics.csv``, ``trace.json`` (Chrome
trace of the last ``--trace-steps`` steps, with ``--trace``), ``checkpoint.npz``
(every ``--checkpoint-every`` steps and every epoch end) and
``checkpoint-final.npz`` (the end of training).

Reproducibility: by default the runtime runs one fixed variant per codelet and
device kind (``Runtime(deterministic=True, variants=FIXED_VARIANTS)``: the
Numba kernels, im2col convolutions, BLAS dense layers), because variants differ in the last bits
and a performance model would pick them by timing. With a fixed granularity
(recorded in the checkpoint, ``auto`` included) and REDUX trees whose shape
does not depend on the schedule, a run on CPU workers gives the same weights
bit for bit whatever the policy, the worker count, or a SIGKILL and
``--resume`` halfway. ``--no-deterministic`` (or ``--calibrate``) lets the
performance models choose variants instead: faster on some machines,
reproducible only up to rounding.

``--resume`` takes every option that changes the numbers (dataset, model,
batch size, granularity, dtype, optimizer, lr, momentum, seed, limit,
determinism) from the checkpoint's config; giving a different value is an
error. ``--epochs`` may be raised to train further; devices, policy, executor,
tracing and checkpoint frequency may change freely.

Errors: a bad option, missing dataset files, a device that is not there, a
checkpoint that does not fit: one line ``hetero-nn: error: ...`` on stderr,
exit status 2. Training that diverges, a failing task or download: one line,
exit status 1.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections import deque
from pathlib import Path

from .errors import (ArenaError, ClusterError, ConfigError, HeteroNNError, TaskError,
                     TrainingDiverged)

PROG = "hetero-nn"
#: Variants run when results must be reproducible (the first one a codelet has wins):
#: the fastest in benchmarks/bench_codelets.py — im2col convolutions, Numba kernels,
#: and the NumPy (BLAS) references for the dense layers.
FIXED_VARIANTS = {"*": ("cpu:im2col", "cpu", "cuda"),
                  **{name: ("ref", "cuda") for name in (
                      "dense_fwd", "dense_fwd_nobias", "dense_bwd_input", "dense_bwd_params",
                      "dense_bwd_weight")}}
DEFAULT_GRANULARITY = 2
OPTIMIZER_DEFAULTS = {"sgd": {"lr": 0.02, "momentum": 0.9}, "adam": {"lr": 0.001}}
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
    sub.required = True

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
                       help=f"partitions per batch, or 'auto' to time the candidates "
                            f"(default: {DEFAULT_GRANULARITY})")
    model.add_argument("--optimizer", choices=sorted(OPTIMIZER_DEFAULTS), default=_UNSET,
                       help="default: sgd")
    model.add_argument("--lr", type=_positive_float, default=_UNSET,
                       help="learning rate (default: 0.02 for sgd, 0.001 for adam)")
    model.add_argument("--momentum", type=_fraction, default=_UNSET,
                       help="SGD momentum (default: 0.9)")
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
    ds_sub = ds.add_subparsers(dest="action", metavar="ACTION")
    ds_sub.required = True
    ls = ds_sub.add_parser("list", help="which datasets are in the data directory")
    ls.add_argument("--data-dir")
    dl = ds_sub.add_parser("download", help="download a dataset (checksums verified)")
    dl.add_argument("name", choices=[d for d in DATASETS if d != "synthetic"])
    dl.add_argument("--data-dir")
    dl.add_argument("--force", action="store_true", help="download again files that are there")

    sub.add_parser("perfmodel", help="show the performance models (hetero-nn perfmodel --help)",
                   add_help=False)
    sub.add_parser("models", help="list the built-in models")
    return parser


def _add_runtime_options(parser, policies):
    group = parser.add_argument_group("runtime")
    group.add_argument("--devices", type=_devices, default="cpu",
                       help="workers, e.g. 'cpu:2' or 'cpu:1,cuda:0' (default: one per core)")
    group.add_argument("--policy", choices=sorted(policies), default="eager",
                       help="scheduling policy (default: eager)")
    group.add_argument("--executor", type=_executor, default="local",
                       help="local, dask, distributed or distributed=ADDRESS (default: local)")


def _add_cluster_options(parser):
    group = parser.add_argument_group("cluster (data-parallel over Dask; see docs/cluster.md)")
    group.add_argument("--cluster", metavar="SPEC",
                       help="compute gradients on Dask workers: 'local:N' (N worker processes "
                            "here) or a scheduler address 'tcp://HOST:PORT'")
    group.add_argument("--cluster-threads", type=_positive_int, default=1, metavar="N",
                       help="cores of each worker's runtime (default: 1)")
    group.add_argument("--cluster-devices", type=_devices, metavar="SPEC",
                       help="each worker's devices instead, e.g. 'cpu:2'")
    group.add_argument("--cluster-timeout", type=_positive_float, default=10.0, metavar="S",
                       help="seconds to reach a --cluster address (default: 10)")


def _connect_cluster(args):
    """The ``--cluster`` the run computes on (None without it); says where it is."""
    if args.cluster is None:
        if args.cluster_devices is not None or args.cluster_threads != 1:
            raise ConfigError("--cluster-threads and --cluster-devices need --cluster")
        return None
    from .cluster import connect

    try:
        cluster = connect(args.cluster, threads=args.cluster_threads,
                          devices=args.cluster_devices, timeout=args.cluster_timeout)
    except ConfigError as exc:
        raise ConfigError(f"--cluster: {exc}") from None
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
                   ("deterministic", "--deterministic", True))


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
    if args.calibrate:
        if args.deterministic is True:
            raise ConfigError("--calibrate explores every variant: it cannot be combined with "
                              "--deterministic")
        run["deterministic"] = False
    run["calibrate"] = bool(args.calibrate)
    run["data_dir"] = str(Path(args.data_dir).expanduser().resolve()) if args.data_dir else None
    return run, None


def _check_run(run, args):
    g, bs = run["granularity"], run["batch_size"]
    if g != "auto" and g > bs:
        raise ConfigError(f"--granularity {g} is larger than --batch-size {bs}")
    if args.checkpoint_every and not args.out:
        raise ConfigError("--checkpoint-every needs --out DIR to write the checkpoints in")
    if args.trace and not args.out:
        raise ConfigError("--trace needs --out DIR to write trace.json in")


def _load_datasets(run, data_dir):
    from .datasets import load

    try:
        train = load(run["dataset"], "train", data_dir=data_dir, limit=run["limit"])
        test = load(run["dataset"], "test", data_dir=data_dir, limit=run["limit"])
    except HeteroNNError as exc:
        raise type(exc)(f"--dataset {run['dataset']}: {exc}") from None
    return train, test


def make_runtime(devices, policy, executor, *, deterministic=True, calibrate=False, trace=False):
    """The Runtime the CLI trains on; a failing device or executor names its option."""
    from .errors import DeviceError
    from .scheduler.runtime import Runtime

    try:
        return Runtime(devices=devices, policy=policy, executor=executor,
                       deterministic=deterministic,
                       variants=FIXED_VARIANTS if deterministic else None,
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
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def document(self, status, error=None) -> dict:
        t = self.trainer
        history = t.history
        last = history[-1] if history else {}
        return {"status": status, "error": error, "config": self.run,
                "devices": {"spec": str(self.rt.devices), "workers": _worker_facts(self.rt),
                            "policy": self.rt.policy_name, "executor": self.rt.executor_name,
                            "deterministic": self.rt.deterministic,
                            "variants": list(self.rt.preferred)},
                "cluster": t.cluster.facts() if t.cluster is not None else None,
                "granularity": t.granularity,
                "granularity_timings": {str(g): s for g, s in t.granularity_timings.items()},
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
    rows = [("epoch", "train loss", "train acc", "test loss", "test acc", "seconds", "images/s")]
    for r in history:
        rows.append((str(r["epoch"]), f"{r['train_loss']:.4f}", f"{r['train_accuracy']:.2%}",
                     "-" if r["test_loss"] is None else f"{r['test_loss']:.4f}",
                     "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.2%}",
                     f"{r['seconds']:.1f}",
                     "-" if r["images_per_second"] is None else f"{r['images_per_second']:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    acc = document["test_accuracy"]
    tail = (f"final test accuracy {acc:.2%} (loss {document['test_loss']:.4f})"
            if acc is not None else "no test set evaluated")
    lines.append(f"{tail}; {len(history)} epoch(s), {document['train_seconds']:.1f} s training, "
                 f"{document['wall_seconds']:.1f} s wall in this process, granularity "
                 f"{document['granularity']}")
    return "\n".join(lines)


def cmd_train(args) -> int:
    """``hetero-nn train``."""
    from .models import build_model
    from .optim import OPTIMIZERS
    from .scheduler.trace import Trace
    from .trainer import Trainer

    run, ckpt = _resolve_run_options(args)
    _check_run(run, args)
    # A diverging run overflows before its loss turns NaN; the error says so in one line.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message="(overflow|invalid value|divide by zero) encountered")
    train, test = _load_datasets(run, run["data_dir"])
    model = build_model(run["model"], train.input_shape, train.num_classes, dtype=run["dtype"],
                        seed=run["seed"])
    hyper = {"lr": run["lr"]}
    if run["optimizer"] == "sgd":
        hyper["momentum"] = run["momentum"]
    optimizer = OPTIMIZERS[run["optimizer"]](**hyper)
    rt = make_runtime(args.devices, args.policy, args.executor,
                      deterministic=run["deterministic"], calibrate=run["calibrate"],
                      trace=args.trace)
    cluster = None
    try:
        cluster = _connect_cluster(args)
        granularity = run["granularity"]
        if ckpt is not None and isinstance(ckpt.config.get("granularity"), int):
            granularity = ckpt.config["granularity"]  # what the run used, 'auto' resolved
        trainer = Trainer(model, optimizer=optimizer, runtime=rt, batch_size=run["batch_size"],
                          granularity=granularity, dtype=run["dtype"], seed=run["seed"],
                          cluster=cluster)
        trainer.config = {"run": run}
        if ckpt is not None:
            trainer.load_checkpoint(ckpt.path)
            if not args.quiet:
                print(f"{PROG}: resuming {ckpt.path} at epoch {ckpt.epoch + 1}, step {ckpt.step} "
                      f"(global step {ckpt.global_step})", file=sys.stderr)
        files = _RunFiles(args.out, run, rt, environment(), trainer)
        steps = deque(maxlen=args.trace_steps or None)

        def on_step(_trainer, _loss):
            steps.append(rt.trace(clear=True).records)

        def on_epoch_end(_trainer, _record):
            files.write_metrics("running")

        try:
            trainer.fit(train, epochs=run["epochs"], validation=test, checkpoint_dir=args.out,
                        checkpoint_every=args.checkpoint_every, verbose=0 if args.quiet else 1,
                        on_step=on_step if args.trace else None, on_epoch_end=on_epoch_end)
        except BaseException as exc:  # the metrics say how the run ended, then it propagates
            status = ("diverged" if isinstance(exc, TrainingDiverged) else
                      "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
            files.write_metrics(status, _one_line(exc))
            raise
        document = files.document("completed")
        files.write_metrics("completed")
        if args.trace:
            steps.append(rt.trace(clear=True).records)
            trace = Trace([r for records in steps for r in records], [w.name for w in rt.workers])
            trace.to_chrome(Path(args.out) / "trace.json")
            if not args.quiet:
                print(trace.format_stats(), file=sys.stderr)
        print(_summary(trainer.history, document))
        if args.out:
            print(f"wrote {args.out}/metrics.json, metrics.csv, checkpoint-final.npz"
                  + (", trace.json" if args.trace else ""))
        return 0
    finally:
        if cluster is not None:
            cluster.close()
        rt.close()


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
        raise type(exc)(f"--dataset {name}: {exc}") from None
    if tuple(data.input_shape) != tuple(model.input_shape):
        raise ConfigError(f"--dataset {name}: samples of shape {data.input_shape}, but the "
                          f"checkpoint's model expects {tuple(model.input_shape)}")
    if data.num_classes != ckpt.config["model"]["num_classes"]:
        raise ConfigError(f"--dataset {name}: {data.num_classes} classes, the checkpoint's model "
                          f"has {ckpt.config['model']['num_classes']}")
    batch_size = args.batch_size or ckpt.config.get("batch_size", 64)
    g = ckpt.config.get("granularity") or 1
    rt = make_runtime(args.devices, args.policy, args.executor,
                      deterministic=run.get("deterministic", True))
    try:
        trainer = Trainer(model, runtime=rt, batch_size=batch_size,
                          granularity=min(g, batch_size), dtype=model.dtype)
        t0 = time.perf_counter()
        loss, accuracy = trainer.evaluate(data)
        seconds = time.perf_counter() - t0
    finally:
        rt.close()
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

    if args.action == "list":
        print(f"data directory: {resolve_data_dir(args.data_dir)}")
        rows = [("dataset", "present", "train", "test", "files")]
        for info in describe(args.data_dir):
            samples = info.samples or {}
            rows.append((info.name, "yes" if info.present else "no",
                         str(samples.get("train", "-")), str(samples.get("test", "-")),
                         "generated" if info.name == "synthetic" else str(len(info.files))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return 0
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
                             progress=progress)
    finally:
        for bar in bars.values():
            bar.close()
    print(f"{args.name}: ready in {directory}")
    return 0


def cmd_models(args) -> int:
    """``hetero-nn models``: each built-in model with its parameter count for MNIST."""
    from .models import MODELS, build_model

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
             "models": cmd_models}
_RUN_ERRORS = (TrainingDiverged, TaskError, ArenaError, ClusterError)


def _one_line(exc) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv=None) -> int:
    """Run ``hetero-nn`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "perfmodel":
        from .scheduler.perfmodel import main as perfmodel_main
        return perfmodel_main(argv[1:])
    from .datasets import DownloadError

    try:
        args = build_parser().parse_args(argv)
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
