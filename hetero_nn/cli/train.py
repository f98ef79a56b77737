"""``hetero-nn train``: train a built-in model on a dataset.

This module owns the train command's options and their checks, the run's
options as recorded (and resumed), the learning-rate schedule they make, and the
summary printed at the end; the output folder is :mod:`hetero_nn.cli.run_folder`'s::

    hetero-nn train                       # lenet5 on MNIST, 3 epochs, SGD(0.02, momentum 0.9)
    hetero-nn train --dataset cifar10 --model cifar-small --epochs 5 --out runs/c10
    hetero-nn train --out runs/c10 --resume               # continue a killed run
    hetero-nn train --model snn-conv --time-steps 25 --encoding rate --optimizer adam --lr 5e-4

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
different value is an error. ``--epochs`` may be raised to train further. The launch
options (devices, policy, executor, cluster, pipeline, tracing, checkpoint frequency;
:mod:`.launch`) are the run's too unless given again, when they may change freely; one
line says which options the resume took from the run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

from ..errors import ConfigError, HeteroNNError
from ..snn_models import ENCODINGS, SPIKING_MODELS, intensities, spiking_loss
from ..tables import format_table
from ..training.trainer import DEFAULT_GRANULARITY  # the Trainer's default, the CLI's
from . import options
from .connect import connect_cluster, dask_client, make_runtime
from .launch import defer_defaults, note_session, resolve_launch, result_flags, taken_from_run
from .report import pipeline_cut
from .options import PROG, UNSET, dataset_error
from .run_folder import (Interrupts, RunFiles, check_out, environment, resume_command,
                         resumes_own)
from .trace import StepTraces
from ..datasets import DATASETS, load
from ..layers.loss import SoftmaxCrossEntropy
from ..models import MODELS, build_model
from ..optim import CosineAnnealingLR, OPTIMIZERS, OneCycleLR, StepLR
from ..scheduler.policies.policies import POLICIES
from ..training import Trainer
from ..training.checkpoint import CHECKPOINT_NAME, read_checkpoint
from ..training.progress import position
from ..transforms import Normalize, NormalizedData, channel_stats, standard_augmentation

OPTIMIZER_DEFAULTS = {"sgd": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.0},
                      "adam": {"lr": 0.001, "weight_decay": 0.0},
                      "adamw": {"lr": 0.001, "weight_decay": 0.01}}
#: Each schedule's options and their defaults (None: computed from the run, see _schedule_defaults).
SCHEDULE_OPTIONS = {"step": {"step_size": 10, "gamma": 0.1},
                    "cosine": {"t_max": None},
                    "onecycle": {"max_lr": None}}


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``train`` to the subcommands ``sub``."""
    train = sub.add_parser("train", help="train a built-in model on a dataset",
                           description="Train a built-in model. Without options: lenet5 on "
                                       "MNIST for 3 epochs, SGD lr 0.02 momentum 0.9.")
    data = train.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=UNSET, help="default: mnist")
    data.add_argument("--data-dir", help="folder holding mnist/, fashion-mnist/, cifar-10/ "
                                         "(default: $HETERO_NN_DATA or the cache's data/)")
    data.add_argument("--limit", type=options.positive_int, default=UNSET, metavar="N",
                      help="use only the first N samples of each split")
    model = train.add_argument_group("model and optimisation")
    model.add_argument("--model", choices=list(MODELS), default=UNSET, help="default: lenet5")
    model.add_argument("--time-steps", type=options.positive_int, default=UNSET, metavar="T",
                       help="spiking models (snn-*): time steps per sample (default: 25)")
    model.add_argument("--encoding", choices=ENCODINGS, default=UNSET,
                       help="spiking models: 'direct' feeds the image at every step, 'rate' "
                            "Bernoulli spikes of its intensities (default: direct)")
    model.add_argument("--epochs", type=options.positive_int, default=UNSET, help="default: 3")
    model.add_argument("--batch-size", type=options.positive_int, default=UNSET, help="default: 64")
    model.add_argument("--granularity", type=options.granularity, default=UNSET,
                       help=f"partitions per batch, or 'auto' to choose it (and fusion, and "
                            f"a g per layer) from the performance models (default: "
                            f"{DEFAULT_GRANULARITY})")
    model.add_argument("--optimizer", choices=sorted(OPTIMIZER_DEFAULTS), default=UNSET,
                       help="default: sgd")
    model.add_argument("--lr", type=options.positive_float, default=UNSET,
                       help="learning rate (default: 0.02 for sgd, 0.001 for adam)")
    model.add_argument("--momentum", type=options.fraction, default=UNSET,
                       help="SGD momentum (default: 0.9)")
    _add_training_options(train, model)
    model.add_argument("--seed", type=options.non_negative_int, default=UNSET,
                       help="seed of the initial weights and the data order (default: 0)")
    model.add_argument("--dtype", choices=("float32", "float64"), default=UNSET,
                       help="default: float32")
    options.add_runtime_options(train, POLICIES)
    options.add_cluster_options(train)
    options.add_pipeline_options(train)
    run = train.add_argument_group("reproducibility")
    run.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=UNSET,
                     help="run one fixed variant per codelet so results are bit-reproducible "
                          "(default: on)")
    run.add_argument("--calibrate", action="store_true",
                     help="explore every variant until the performance models are calibrated "
                          "(implies --no-deterministic)")
    out = train.add_argument_group("output")
    out.add_argument("--out", metavar="DIR", help="write metrics, trace and checkpoints here")
    out.add_argument("--trace", action=argparse.BooleanOptionalAction, default=False,
                     help="write DIR/trace.json (Chrome trace)")
    out.add_argument("--trace-steps", type=options.non_negative_int, default=100, metavar="N",
                     help="keep the tasks of the last N training steps in the trace "
                          "(0: all; default: 100)")
    out.add_argument("--checkpoint-every", type=options.positive_int, metavar="N",
                     help="also write DIR/checkpoint.npz every N steps")
    out.add_argument("--resume", nargs="?", const="", metavar="FILE",
                     help="continue from FILE (default: DIR/checkpoint.npz) with the run's "
                          "options, data directory, devices, policy, trace and every other "
                          "option not given again (one line says which)")
    out.add_argument("--overwrite", action="store_true",
                     help="start a run (new, or resumed from a FILE elsewhere) in a DIR that "
                          "holds another run's files, removing them first")
    out.add_argument("-q", "--quiet", action="store_true", help="no per-epoch lines or bar")
    defer_defaults(train)  # --resume takes the run's unless given (launch.py)
    return train


def _add_training_options(train, model):
    """The optimizer, loss, schedule, clipping and data-augmentation options of ``train``."""
    model.add_argument("--weight-decay", type=options.non_negative_float, default=UNSET,
                       help="weight decay (default: 0 for sgd and adam, 0.01 for adamw, "
                            "which decouples it)")
    model.add_argument("--nesterov", action="store_true", default=UNSET,
                       help="Nesterov momentum (sgd)")
    model.add_argument("--label-smoothing", type=options.fraction, default=UNSET, metavar="EPS",
                       help="cross-entropy label smoothing (default: 0)")
    model.add_argument("--clip-grad-norm", type=options.positive_float, default=UNSET, metavar="MAX",
                       help="clip the gradients to this global 2-norm before every step")
    sched = train.add_argument_group("learning-rate schedule")
    sched.add_argument("--schedule", choices=sorted(SCHEDULE_OPTIONS), default=UNSET,
                       help="step: StepLR; cosine: CosineAnnealingLR; onecycle: OneCycleLR "
                            "(default: a constant lr)")
    sched.add_argument("--schedule-interval", choices=("step", "epoch"), default=UNSET,
                       help="step the schedule after every batch or every epoch (default: "
                            "epoch for step and cosine, step for onecycle)")
    sched.add_argument("--step-size", type=options.positive_int, default=UNSET,
                       help="step: multiply the lr by --gamma every N intervals (default: 10)")
    sched.add_argument("--gamma", type=options.positive_float, default=UNSET,
                       help="step: the factor (default: 0.1)")
    sched.add_argument("--t-max", type=options.positive_int, default=UNSET, metavar="N",
                       help="cosine: intervals of the half period (default: the whole run)")
    sched.add_argument("--max-lr", type=options.positive_float, default=UNSET,
                       help="onecycle: the peak lr (default: --lr); it starts at max-lr/25 "
                            "and ends at max-lr/25e4 after the whole run")
    aug = train.add_argument_group("data transforms")
    aug.add_argument("--augment", action="store_true", default=UNSET,
                     help="random crop (padding 4, black) and horizontal flip of training "
                          "images, seeded by (seed, epoch, sample)")
    aug.add_argument("--normalize", action="store_true", default=UNSET,
                     help="standardise each channel with the training split's measured mean "
                          "and std (on top of the dataset's fixed normalisation)")


# ---------------------------------------------------------------------------------------
# The run's options
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
                   ("augment", "--augment", False), ("normalize", "--normalize", False),
                   ("time_steps", "--time-steps", None), ("encoding", "--encoding", None))


def _resolve_run_options(args) -> tuple[dict, object]:
    """The options of a training run: the command line's, or a resumed checkpoint's."""
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
            if key == "granularity" and given is not UNSET and value == "auto" \
                    and given == ckpt.config.get("granularity"):
                given = UNSET  # the value auto chose, given explicitly: the same run
            if given is not UNSET and given != value:
                raise ConfigError(f"{flag} {given} differs from the run's "
                                  f"{'(none)' if value is None else value} in {path}; drop the "
                                  "option to resume it, or start a new run with another --out")
            run[key] = value
        run["epochs"] = args.epochs if args.epochs is not UNSET else saved.get("epochs", 3)
        run["calibrate"] = bool(args.calibrate)
        run["data_dir"] = args.data_dir if args.data_dir is not None else saved.get("data_dir")
        run["schedule_length"] = saved.get("schedule_length")
        given = {key for key, _, _ in _RESULT_OPTIONS if getattr(args, key) is not UNSET}
        taken = result_flags(run, given, _RESULT_OPTIONS, OPTIMIZER_DEFAULTS)
        taken += resolve_launch(args, run, saved)
        if args.data_dir is None and run["data_dir"]:
            taken.append(f"--data-dir {run['data_dir']}")
        args.taken_from_run = taken  # said once the checkpoint has loaded
        return run, ckpt
    run = {key: getattr(args, key) if getattr(args, key) is not UNSET else default
           for key, _, default in _RESULT_OPTIONS}
    run["epochs"] = args.epochs if args.epochs is not UNSET else 3
    defaults = OPTIMIZER_DEFAULTS[run["optimizer"]]
    if run["momentum"] is not None and "momentum" not in defaults:
        raise ConfigError(f"--momentum applies to --optimizer sgd, not {run['optimizer']}")
    for key, value in defaults.items():
        if run[key] is None:
            run[key] = value
    _check_training_options(run)
    _check_spiking_options(run)
    if args.calibrate:
        if args.deterministic is True:
            raise ConfigError("--calibrate explores every variant: it cannot be combined with "
                              "--deterministic")
        run["deterministic"] = False
    run["calibrate"] = bool(args.calibrate)
    run["data_dir"] = str(Path(args.data_dir).expanduser().resolve()) if args.data_dir else None
    resolve_launch(args, run)
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


def _check_spiking_options(run):
    """``--time-steps`` and ``--encoding``: the spiking models' options, and their defaults."""
    if run["model"] not in SPIKING_MODELS:
        for key in ("time_steps", "encoding"):
            if run[key] is not None:
                raise ConfigError(f"--{key.replace('_', '-')} applies to the spiking models "
                                  f"({', '.join(SPIKING_MODELS)}), not {run['model']}")
        return
    run["time_steps"] = run["time_steps"] or 25
    run["encoding"] = run["encoding"] or "direct"
    if run["label_smoothing"]:
        raise ConfigError(f"--label-smoothing: {run['model']} trains with MembraneCrossEntropy, "
                          "which has none")
    if run["normalize"] or run["augment"]:
        raise ConfigError(f"--{'normalize' if run['normalize'] else 'augment'}: {run['model']} "
                          "reads pixel intensities in [0, 1] as they are")


def make_schedule(run, optimizer, steps_per_epoch):
    """The run's learning-rate schedule (None without ``--schedule``).

    Cosine's half period and OneCycle's length default to the whole run,
    ``epochs`` in intervals; both are fixed at the start (``run["schedule_length"]``)
    so a resumed run keeps them.
    """
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


def _load_datasets(run, data_dir):
    try:
        train = load(run["dataset"], "train", data_dir=data_dir, limit=run["limit"])
        test = load(run["dataset"], "test", data_dir=data_dir, limit=run["limit"])
    except HeteroNNError as exc:
        raise dataset_error(run["dataset"], exc) from None
    return train, test


def _transformed_data(run, train, test):
    """``--normalize`` (the training split's channel statistics, for both splits) and
    ``--augment``; returns ``(train, test, {"augment": ..., "config": ...})``."""
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


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

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
    acc, limit = document["test_accuracy"], document["config"].get("limit")
    tail = (f"final test accuracy {acc:.2%} (loss {document['test_loss']:.4f})"
            if acc is not None else "no test set evaluated")
    if acc is not None and limit:  # evaluate reads the whole split: say this one is not
        tail += f" on the first {limit} test samples (--limit {limit}), not the whole split"
    lines.append(f"{tail}; {len(history)} epoch(s), {document['train_seconds']:.1f} s training, "
                 f"{document['wall_seconds']:.1f} s wall in this process, granularity "
                 f"{document['granularity']}")
    return "\n".join(lines)


def _checkpoint(args) -> Path:
    return Path(args.out) / CHECKPOINT_NAME


def _stop_here(args, trainer, write: bool) -> str:
    """At a step boundary after a signal: the checkpoint of this very step (``write``),
    and what to say: where the run stopped and the command that resumes it."""
    where = position(trainer.epoch, trainer.step_in_epoch, trainer.global_step)
    if not args.out:
        return f"stopped at {where}; nothing was saved (no --out)"
    path = trainer.save_checkpoint(_checkpoint(args), require_finite=True) if write \
        else _checkpoint(args)
    return f"stopped at {where}, saved in {path}; resume with: {resume_command(args)}"


def command(args) -> int:
    """``hetero-nn train``: options, output folder and scheduler checked before any work."""
    if args.overwrite and args.resume == "":
        raise ConfigError("--overwrite would remove the checkpoint --resume continues from "
                          "(DIR/checkpoint.npz): resume a FILE of another folder, or drop one")
    run, ckpt = _resolve_run_options(args)
    own = ckpt is not None and resumes_own(args.out, ckpt.path)  # this folder's run goes on
    if args.overwrite and own:
        raise ConfigError(f"--overwrite would remove {ckpt.path}, the checkpoint --resume "
                          "continues from: resume a FILE of another folder, or drop one")
    _check_run(run, args)
    earlier_run = check_out(args.out, resuming=own, overwrite=args.overwrite)
    with contextlib.ExitStack() as stack:
        client = dask_client(args.executor, args.devices, stack, args.connect_timeout)
        cluster = connect_cluster(args, stack)
        train, test = _load_datasets(run, run["data_dir"])
        rt = make_runtime(args.devices, args.policy, client or args.executor,
                          deterministic=run["deterministic"], calibrate=run["calibrate"],
                          trace=True)  # the task records say which variants ran
        stack.callback(rt.close)
        note_session(run, rt, ckpt.global_step if ckpt is not None else 0)
        with Interrupts() as interrupts:
            return _train(args, run, ckpt, rt, train, test, earlier_run, interrupts, cluster)


def _train(args, run, ckpt, rt, train, test, earlier_run, interrupts, cluster=None) -> int:
    """The training run proper, on ``rt``: writes the output folder, prints the summary."""
    # A diverging run overflows before its loss turns NaN; the error says so in one line.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message="(overflow|invalid value|divide by zero) encountered")
    spiking = {"time_steps": run["time_steps"], "encoding": run["encoding"]} \
        if run["model"] in SPIKING_MODELS else {}
    if spiking:
        intensities(train, test)
    train, test, transforms = _transformed_data(run, train, test)
    model = build_model(run["model"], train.input_shape, train.num_classes, dtype=run["dtype"],
                        seed=run["seed"], **spiking)
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
    trainer = Trainer(model, loss=spiking_loss(run["model"]) or SoftmaxCrossEntropy(
                          label_smoothing=run.get("label_smoothing") or 0.0),
                      optimizer=optimizer, runtime=rt, batch_size=run["batch_size"],
                      granularity=granularity, seed=run["seed"],  # dtype: the model's
                      scheduler=scheduler, scheduler_interval=run.get("schedule_interval"),
                      clip_grad_norm=run.get("clip_grad_norm"),
                      augment=transforms.get("augment"), cluster=cluster,
                      pipeline=args.pipeline, stage_devices=args.stage_devices,
                      pipeline_schedule=args.pipeline_schedule)
    trainer.config = {"run": run, **transforms.get("config", {})}
    if ckpt is not None:
        trainer.load_checkpoint(ckpt.path)
        if not args.quiet:
            where = (f"{ckpt.path} at epoch {ckpt.epoch + 1}, step {ckpt.step} (global step "
                     f"{ckpt.global_step})")
            print(f"{PROG}: {taken_from_run(where, args.taken_from_run)}", file=sys.stderr)
    for path in earlier_run:  # --overwrite: the earlier run's files go, nothing else
        path.unlink()
    files = RunFiles(args.out, run, rt, environment(), trainer)
    if args.out and (ckpt is None or ckpt.path.resolve() != _checkpoint(args).resolve()):
        trainer.save_checkpoint(_checkpoint(args))  # the folder's first file: resumable at once
    traces = StepTraces(args.trace_steps, [w.name for w in rt.workers]) if args.trace else None

    decided = [trainer.granularity_decision is not None, trainer.pipeline is None]

    def on_step(_trainer, _loss):
        if not decided[0] and trainer.granularity_decision is not None:
            decided[0] = True  # 'auto' resolved on the first batch: say what and why
            if not args.quiet:
                print(trainer.granularity_decision.format(), file=sys.stderr, flush=True)
        if not decided[1] and trainer.pipeline.stages:
            decided[1] = True  # the stages are cut at the first batch: say where
            if not args.quiet:
                print(f"{PROG}: {pipeline_cut(trainer.pipeline)}", file=sys.stderr, flush=True)
        trace = rt.trace(clear=True)
        files.count_variants(trace.records)
        files.count_bubble(trace.records)
        if traces is not None:
            traces.add(trainer.global_step, trace)
        interrupts.check(lambda: _stop_here(args, trainer, write=True))

    def on_epoch_end(_trainer, _record):
        files.write_metrics("running")
        interrupts.check(lambda: _stop_here(args, trainer, write=False))  # fit wrote it

    try:
        trainer.fit(train, epochs=run["epochs"], validation=test, checkpoint_dir=args.out,
                    checkpoint_every=args.checkpoint_every, verbose=0 if args.quiet else 1,
                    on_step=on_step, on_epoch_end=on_epoch_end)
    except BaseException as exc:  # the metrics say how the run ended, then it propagates
        files.write_metrics_after(exc)
        if traces is not None:  # this session's steps, not an earlier session's trace
            with contextlib.suppress(OSError):  # a full disk must not hide what ended the run
                traces.write(args.out)
        raise
    last = rt.trace(clear=True)  # the last validation pass
    files.count_variants(last.records)
    document = files.document("completed")
    files.write_metrics("completed")
    if traces is not None:
        traces.end(last)
        trace = traces.write(args.out)
        if not args.quiet:
            print(trace.format_stats(), file=sys.stderr)
    print(_summary(trainer.history, document))
    if args.out:
        print(f"wrote {args.out}/metrics.json, metrics.csv, checkpoint.npz, checkpoint-final.npz"
              + (", trace.json" if args.trace else ""))
    else:
        print("nothing was kept: no --out DIR (give one to keep the model, its checkpoints and "
              "metrics)")
    return 0
