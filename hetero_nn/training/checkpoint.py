"""Checkpoints: a training run's whole state in one ``.npz`` that loads without pickle.

This module owns the file format, its atomic writing, its strict reading, and
the checks that a checkpoint fits a model and an optimizer. A checkpoint holds
plain arrays only, so ``numpy.load(path, allow_pickle=False)`` reads it:

=====================================  =============================================
key                                    value
=====================================  =============================================
``format``                             ``"hetero_nn.checkpoint/1"`` (0-d unicode)
``model/<name>``                       each weight under its ``state_dict`` name
``optimizer/type``                     ``"SGD"`` / ``"Adam"`` (0-d unicode)
``optimizer/steps``                    optimizer steps taken (int64)
``optimizer/hyper``                    its hyper-parameters (JSON string)
``optimizer/state/<name>/<buffer>``    momentum / moment buffers per weight
``optimizer/momentum_started``         SGD: per parameter group, whether its momentum
                                       buffers have started (bool; optional: absent,
                                       a group with a momentum started at step 1)
``progress/epoch``                     epochs completed
``progress/step``                      steps done in the epoch in progress (0 at an
                                       epoch boundary)
``progress/global_step``               optimizer steps of the whole run
``progress/loss_sum``, ``/correct``,   the epoch in progress so far: summed loss
``/samples``, ``/seconds``             (times batch size), correct count, samples,
                                       training seconds
``progress/warmup_samples``,           of those, the first step of the process that
``/warmup_seconds``                    ran it (kernel compilation), timed apart;
                                       optional (0 when absent)
``rng/seed``                           the data-order seed; with (epoch, step) it
                                       fixes the next batch, as the order of an
                                       epoch is ``default_rng([seed, epoch])``
``history``                            finished epochs' metrics (JSON string)
``config``                             the run's options (JSON string, 0-d unicode)
``scheduler``                          the learning-rate schedule's ``state_dict``
                                       (JSON string; only when the run has one)
``architecture``                       the model as data: layer classes and their
                                       constructor arguments, nested (JSON string,
                                       :mod:`hetero_nn.layers.registry`), or the
                                       reason it could not be recorded
=====================================  =============================================

:func:`load_model` rebuilds the model from ``architecture`` (any model made of the
package's layers and registered ones), or, for a checkpoint written before that key
existed, from the built-in model ``config["model"]`` names.

Files are written under a temporary name in the target directory, flushed to
disk and renamed with :func:`os.replace`, so a reader (or a run killed midway)
sees the previous complete file or the new one, never a torn one. A run keeps
``checkpoint.npz`` (the latest) and, when it ends, ``checkpoint-final.npz``.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, ConfigError, HeteroNNError, TrainingDiverged
from ..fileio import atomic_write
from ..layers.dropout import dropout_state, load_dropout_state
from ..layers.time import RateEncode
from .granularity import GranularityDecision
from .progress import new_progress, position
from ..layers.registry import architecture
from ..layers.registry import build as build_architecture
from ..models import SPIKING_OPTIONS, build_model

FORMAT = "hetero_nn.checkpoint/1"
#: File names a training run writes in its output directory.
CHECKPOINT_NAME = "checkpoint.npz"
FINAL_NAME = "checkpoint-final.npz"

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")
_ZIP_MAGIC = b"PK\x03\x04"
_PROGRESS_INT = ("epoch", "step", "global_step", "correct", "samples")
_PROGRESS_FLOAT = ("loss_sum", "seconds")
#: Progress keys added later: read as 0 from a checkpoint that lacks them.
_PROGRESS_OPTIONAL = {"warmup_samples": int, "warmup_seconds": float}


@dataclass
class Checkpoint:
    """The content of a checkpoint file, as plain Python and NumPy values.

    Attributes
    ----------
    path : pathlib.Path
    model_state : dict of str to numpy.ndarray
        Weights under their ``state_dict`` names (``"0.weight"``...).
    optimizer : dict or None
        ``{"type", "steps", "hyper", "state": {name: {buffer: array}}}``.
    epoch, step, global_step : int
        Epochs completed, steps done in the next epoch, steps of the run.
    progress : dict
        The epoch in progress so far: ``loss_sum``, ``correct``, ``samples``, ``seconds``.
    seed : int
        The data-order seed.
    history : list of dict
        Metrics of the finished epochs.
    config : dict
        The options of the run (model, dataset, optimizer, batch size...).
    """

    path: Path
    model_state: dict
    optimizer: dict | None
    epoch: int
    step: int
    global_step: int
    seed: int = 0
    progress: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    scheduler: dict | None = None
    architecture: dict | None = None


# ---------------------------------------------------------------------------------------
# Atomic files
# ---------------------------------------------------------------------------------------



def remove_stale_temporaries(directory, names) -> list[Path]:
    """Delete temporary files that :func:`atomic_write` left for ``names`` (a killed run).

    Only files named exactly ``.<name>.<32 hex>.tmp`` with ``name`` in ``names`` go.
    """
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        m = _TEMPORARY.match(p.name)
        if m and m["name"] in names and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def run_folder(trainer, folder) -> Path:
    """``Trainer.fit(checkpoint_dir=folder)``'s folder, made if needed: refused when it
    holds another run's checkpoints (as the CLI's ``--out``), i.e. unless ``trainer``
    saved or loaded its last checkpoint there; a killed run's temporaries go."""
    path, last = Path(folder), trainer.last_checkpoint
    own = last is not None and Path(last["path"]).resolve().parent == path.resolve()
    found = [name for name in (CHECKPOINT_NAME, FINAL_NAME) if (path / name).exists()]
    if found and not own:
        raise ConfigError(f"checkpoint_dir {folder} holds another run ({', '.join(found)}): "
                          f"continue it with trainer.load_checkpoint("
                          f"{str(path / found[0])!r}) before fit, or give another folder")
    path.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path, {CHECKPOINT_NAME, FINAL_NAME})
    trainer._checkpoint_dir = path
    return path


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------

def _text(value) -> np.ndarray:
    return np.array(str(value))  # a 0-d unicode array: no pickle needed to read it back


def write_checkpoint(path, *, model_state, optimizer=None, epoch=0, step=0, global_step=0,
                     seed=0, progress=None, history=(), config=None, scheduler=None,
                     architecture=None) -> Path:
    """Write a checkpoint atomically (see the module docstring for the layout).

    Parameters
    ----------
    path : path-like
    model_state : mapping of str to array
        ``model.state_dict()``.
    optimizer : dict, optional
        ``{"type": str, **optimizer.state_dict()}``.
    epoch, step, global_step, seed : int
    progress : dict, optional
        ``loss_sum``, ``correct``, ``samples``, ``seconds`` of the epoch in progress.
    history : list of dict
    config : dict
        JSON-serialisable options.
    scheduler : dict, optional
        ``scheduler.state_dict()`` (JSON-serialisable).
    architecture : dict, optional
        :func:`model_architecture` of the model.

    Returns
    -------
    pathlib.Path
    """
    arrays = {"format": _text(FORMAT)}
    for name, value in model_state.items():
        arrays[f"model/{name}"] = np.asarray(value)
    if optimizer is not None:
        arrays["optimizer/type"] = _text(optimizer["type"])
        arrays["optimizer/steps"] = np.int64(optimizer["steps"])
        arrays["optimizer/hyper"] = _text(json.dumps(optimizer.get("hyper", {})))
        for name, buffers in optimizer.get("state", {}).items():
            for buffer, value in buffers.items():
                arrays[f"optimizer/state/{name}/{buffer}"] = np.asarray(value)
        if "momentum_started" in optimizer:
            arrays["optimizer/momentum_started"] = np.array(optimizer["momentum_started"], bool)
    progress = dict(progress or {})
    for key, value in (("epoch", epoch), ("step", step), ("global_step", global_step)):
        progress[key] = value
    for key in _PROGRESS_INT:
        arrays[f"progress/{key}"] = np.int64(progress.get(key, 0))
    for key in _PROGRESS_FLOAT:
        arrays[f"progress/{key}"] = np.float64(progress.get(key, 0.0))
    for key, kind in _PROGRESS_OPTIONAL.items():
        arrays[f"progress/{key}"] = (np.int64 if kind is int else np.float64)(progress.get(key, 0))
    arrays["rng/seed"] = np.int64(seed)
    arrays["history"] = _text(json.dumps(list(history)))
    arrays["config"] = _text(json.dumps(config or {}, sort_keys=True))
    if scheduler is not None:
        arrays["scheduler"] = _text(json.dumps(scheduler))
    if architecture is not None:
        arrays["architecture"] = _text(json.dumps(architecture))
    for key, value in arrays.items():
        if value.dtype.hasobject:
            raise CheckpointError(f"{path}: {key} is an object array, which needs pickle")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: np.savez(f, **arrays))


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------

def read_checkpoint(path) -> Checkpoint:
    """Read and check a checkpoint file.

    Raises
    ------
    CheckpointError
        The file is missing, is not a zip of ``.npy`` arrays, fails its CRC, needs
        pickle, or lacks a key; the message names the file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _ZIP_MAGIC:
        raise CheckpointError(f"{path}: not a hetero_nn checkpoint (expected a .npz zip of "
                              f"arrays, the file starts with {magic!r})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except ValueError as exc:  # numpy's message would suggest allow_pickle: never here
        reason = ("it holds object arrays, which are never unpickled" if "pickle" in str(exc)
                  else f"ValueError: {exc}")
        raise CheckpointError(f"{path}: not a hetero_nn checkpoint ({reason})") from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a hetero_nn checkpoint, or a damaged one "
                              f"({type(exc).__name__}: {exc})") from None

    def take(key):
        if key not in arrays:
            raise CheckpointError(f"{path}: not a hetero_nn checkpoint (no {key!r} entry)")
        return arrays[key]

    def scalar(key, kind):
        value = take(key)
        if value.shape != () or value.dtype.kind not in kind:
            raise CheckpointError(f"{path}: {key!r} should be a scalar, got "
                                  f"{value.dtype} array of shape {value.shape}")
        return value[()]

    def document(key):
        text = scalar(key, "U")
        try:
            return json.loads(str(text))
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: {key!r} is not valid JSON ({exc})") from None

    fmt = str(scalar("format", "U"))
    if fmt != FORMAT:
        raise CheckpointError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
    model_state = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
    optimizer = None
    if "optimizer/type" in arrays:
        state: dict = {}
        for key, value in arrays.items():
            if key.startswith("optimizer/state/"):
                name, _, buffer = key[len("optimizer/state/"):].rpartition("/")
                state.setdefault(name, {})[buffer] = value
        optimizer = {"type": str(scalar("optimizer/type", "U")),
                     "steps": int(scalar("optimizer/steps", "iu")),
                     "hyper": document("optimizer/hyper"), "state": state}
        if "optimizer/momentum_started" in arrays:
            started = take("optimizer/momentum_started")
            if started.ndim != 1 or started.dtype != bool:
                raise CheckpointError(f"{path}: 'optimizer/momentum_started' should be a bool "
                                      f"vector, got {started.dtype} array of shape "
                                      f"{started.shape}")
            optimizer["momentum_started"] = started.tolist()
    progress = {k: int(scalar(f"progress/{k}", "iu")) for k in _PROGRESS_INT}
    progress.update({k: float(scalar(f"progress/{k}", "f")) for k in _PROGRESS_FLOAT})
    progress.update({k: kind(scalar(f"progress/{k}", "iuf")) for k, kind in _PROGRESS_OPTIONAL.items()
                     if f"progress/{k}" in arrays})
    return Checkpoint(path=path, model_state=model_state, optimizer=optimizer,
                      epoch=progress.pop("epoch"), step=progress.pop("step"),
                      global_step=progress.pop("global_step"),
                      seed=int(scalar("rng/seed", "iu")), progress=progress,
                      history=document("history"), config=document("config"),
                      scheduler=document("scheduler") if "scheduler" in arrays else None,
                      architecture=document("architecture") if "architecture" in arrays
                      else None)


# ---------------------------------------------------------------------------------------
# Fitting a checkpoint to a model and an optimizer
# ---------------------------------------------------------------------------------------

def check_model_state(ckpt: Checkpoint, model) -> dict:
    """The checkpoint's weights cast to ``model``'s dtypes, after checking names and shapes.

    Raises
    ------
    CheckpointError
        Naming the file and the first missing, unexpected or misshapen key.
    """
    params = dict(model.named_state())  # weights and buffers (running statistics)
    for name, p in params.items():  # in the model's order: the first layer at fault is named
        value = ckpt.model_state.get(name)
        if value is None:
            raise CheckpointError(f"{ckpt.path}: no weight 'model/{name}' for the model's "
                                  f"parameter of shape {p.data.shape}")
        if value.shape != p.data.shape:
            raise CheckpointError(f"{ckpt.path}: 'model/{name}' has shape {value.shape}, the "
                                  f"model expects {p.data.shape}")
        if value.dtype.kind not in ("f", p.data.dtype.kind):
            raise CheckpointError(f"{ckpt.path}: 'model/{name}' has dtype {value.dtype}, "
                                  "expected floating point")
    for name, value in ckpt.model_state.items():
        if name not in params:
            raise CheckpointError(f"{ckpt.path}: 'model/{name}' (shape {value.shape}) is not a "
                                  f"parameter of the model (it has {', '.join(params)})")
    return {name: np.asarray(ckpt.model_state[name], dtype=p.data.dtype)
            for name, p in params.items()}


def check_optimizer_state(ckpt: Checkpoint, optimizer, model) -> dict | None:
    """The checkpoint's optimizer state fitted to ``optimizer`` and ``model``.

    Returns the ``state_dict`` to give ``optimizer.load_state_dict`` (buffers cast to
    each weight's dtype), or None when the checkpoint has no optimizer state.

    Raises
    ------
    CheckpointError
        Another optimizer type, a buffer for an unknown weight, a missing or
        misshapen buffer.
    """
    sd = ckpt.optimizer
    if sd is None:
        return None
    kind = type(optimizer).__name__
    if sd["type"] != kind:
        raise CheckpointError(f"{ckpt.path}: optimizer state is for {sd['type']}, the trainer "
                              f"uses {kind}")
    params = dict(model.named_parameters())
    buffers = tuple(optimizer.state_buffers)
    state = {}
    for name, bufs in sd["state"].items():
        if name not in params:
            raise CheckpointError(f"{ckpt.path}: optimizer state for {name!r}, which is not a "
                                  "parameter of the model")
        p = params[name]
        state[name] = {}
        for b, value in bufs.items():
            if b not in buffers:
                raise CheckpointError(f"{ckpt.path}: 'optimizer/state/{name}/{b}' is not a "
                                      f"{kind} buffer (expected {', '.join(buffers) or 'none'})")
            if value.shape != p.data.shape:
                raise CheckpointError(f"{ckpt.path}: 'optimizer/state/{name}/{b}' has shape "
                                      f"{value.shape}, the model expects {p.data.shape}")
            state[name][b] = np.asarray(value, dtype=p.data.dtype)
    if sd["steps"] > 0:  # every weight has the buffers the optimizer keeps or any weight has
        kept = set(optimizer.buffers).union(*(bufs for bufs in state.values()))
        for name in params:
            missing = [b for b in buffers if b in kept and b not in state.get(name, {})]
            if missing:
                raise CheckpointError(f"{ckpt.path}: no 'optimizer/state/{name}/{missing[0]}' "
                                      f"after {sd['steps']} {kind} steps")
    fitted = {"steps": sd["steps"], "hyper": sd["hyper"], "state": state}
    if "momentum_started" in sd:
        fitted["momentum_started"] = sd["momentum_started"]
    return fitted


def model_architecture(model) -> dict:
    """What a checkpoint records of ``model``'s architecture: the registry's document, or
    ``{"error": reason}`` when an argument is not data (the weights are saved anyway)."""
    try:
        return architecture(model)
    except HeteroNNError as exc:
        return {"error": str(exc)}


def rebuild_model(ckpt: Checkpoint, dtype=None):
    """The model ``ckpt`` holds, constructed anew, built and given its weights (see
    :func:`load_model`)."""

    dtype = dtype or ckpt.config.get("dtype", "float32")
    doc, spec = ckpt.architecture, ckpt.config.get("model")
    try:
        if doc is not None and "error" in doc:
            raise CheckpointError(f"{ckpt.path}: its model could not be recorded as data "
                                  f"({doc['error']}); build it yourself and use "
                                  "Trainer.load_checkpoint")
        if doc is not None:
            model = build_architecture(doc)
            shape = ckpt.config.get("input_shape")
            if not shape:
                raise CheckpointError(f"{ckpt.path}: no input_shape in its config to build "
                                      "the model for")
            model.build(tuple(shape), dtype)
        elif isinstance(spec, dict) and "name" in spec:
            options = {k: spec[k] for k in SPIKING_OPTIONS if k in spec}  # a spiking model's
            model = build_model(spec["name"], spec["input_shape"], spec["num_classes"],
                                dtype=dtype, **options)
        else:
            raise CheckpointError(f"{ckpt.path}: it records no architecture and no built-in "
                                  "model; build the model yourself and use "
                                  "Trainer.load_checkpoint")
    except CheckpointError:
        raise
    except (HeteroNNError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{ckpt.path}: cannot rebuild its model: {exc}") from None
    if isinstance(spec, dict) and "name" in spec:
        model.spec = dict(spec)  # still a built-in model: its next checkpoint says so too
    model.load_state_dict(check_model_state(ckpt, model))
    load_dropout_state(model, ckpt.config.get("dropout", {}))
    load_dropout_state(model, ckpt.config.get("rate_encode", {}), RateEncode)
    return model


def load_model(path, dtype=None):
    """``hn.load_model(path)``: the model a checkpoint holds, rebuilt without its source.

    The layers and their constructor arguments come from the checkpoint's
    ``architecture`` (custom classes must be registered with
    :func:`hetero_nn.layers.register` first), the input shape and dtype from its config
    unless ``dtype`` is given, the weights, buffers and dropout seeds from the file.
    The model is in training mode, as a model just constructed; call ``model.eval()``
    to predict.

    Returns
    -------
    Sequential (or the recorded model's class)

    Raises
    ------
    CheckpointError
        One line naming the file and what is missing: an unknown layer class (register
        it), an argument that was not recorded, weights that do not fit.
    """
    ckpt = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    return rebuild_model(ckpt, dtype)


# ---------------------------------------------------------------------------------------
# A trainer's state
# ---------------------------------------------------------------------------------------

def trainer_config(trainer) -> dict:
    """What a checkpoint records about ``trainer``'s run: its settings, the model's spec,
    the dropout layers' seeds and steps, and ``trainer.config`` (the CLI's options)."""
    opt, model, rt = trainer.optimizer, trainer.model, trainer.runtime
    granularities = getattr(model, "granularities", None)
    cfg = {"batch_size": trainer.batch_size, "granularity": trainer.granularity,
           "auto_granularity": trainer.auto_granularity,
           "layer_granularity": None if granularities is None else list(granularities),
           "fuse": getattr(model, "fuse", None), "dtype": trainer.dtype.name,
           "seed": trainer.seed, "loss": type(trainer.loss).__name__,
           "optimizer": {"name": type(opt).__name__.lower(), **opt.hyper()},
           "input_shape": list(model.input_shape) if model.input_shape else None,
           "runtime": {"devices": str(rt.devices), "policy": rt.policy_name,
                       "executor": rt.executor_name, "deterministic": rt.deterministic,
                       "variants": list(rt.preferred)}}
    spec = getattr(model, "spec", None)
    if spec is not None:
        cfg["model"] = dict(spec)
    cfg["dropout"] = dropout_state(model)  # seeds and steps: the masks after resume
    cfg["rate_encode"] = dropout_state(model, RateEncode)  # and the spikes
    if trainer.scheduler is not None:
        cfg["scheduler"] = {"repr": repr(trainer.scheduler),
                            "interval": trainer.scheduler_interval}
    if trainer.clip_grad_norm is not None:
        cfg["clip_grad_norm"] = trainer.clip_grad_norm
    if trainer.augment is not None:
        cfg["augment"] = repr(trainer.augment)
    decision = getattr(trainer, "granularity_decision", None)
    if decision is not None:  # what 'auto' chose and why: a resumed run still says it
        cfg["granularity_decision"] = decision.to_json()
    cfg.update(trainer.config)
    return cfg


def save_trainer(trainer, path, require_finite: bool = False) -> Path:
    """Write ``trainer``'s whole state to ``path`` (:meth:`Trainer.save_checkpoint`)."""
    opt = {"type": type(trainer.optimizer).__name__, **trainer.optimizer.state_dict()}
    model_state = trainer.model.state_dict()
    if require_finite:
        arrays = [("model/" + k, v) for k, v in model_state.items()]
        arrays += [(f"optimizer/state/{k}/{b}", v) for k, st in opt["state"].items()
                   for b, v in st.items()]
        for key, value in arrays:
            if not np.isfinite(value).all():
                where = position(trainer.epoch, trainer.step_in_epoch, trainer.global_step)
                raise TrainingDiverged(f"training diverged: {key} holds NaN or infinite "
                                       f"values after {where}; "
                                       f"{trainer.describe_last_checkpoint()}")
    path = write_checkpoint(path, model_state=model_state, optimizer=opt,
                            epoch=trainer.epoch, step=trainer.step_in_epoch,
                            global_step=trainer.global_step, seed=trainer.seed,
                            progress=trainer.progress, history=trainer.history,
                            config=trainer_config(trainer),
                            scheduler=None if trainer.scheduler is None
                            else trainer.scheduler.state_dict(),
                            architecture=model_architecture(trainer.model))
    trainer.last_checkpoint = {"path": str(path), "epoch": trainer.epoch,
                               "step": trainer.step_in_epoch, "global_step": trainer.global_step}
    return path


def load_trainer(trainer, path) -> Checkpoint:
    """Restore ``trainer``'s weights, optimizer state and position from ``path``
    (:meth:`Trainer.load_checkpoint`)."""
    ckpt = read_checkpoint(path)
    model, scheduler = trainer.model, trainer.scheduler
    shape = ckpt.config.get("input_shape")
    shape = tuple(shape) if shape else model.input_shape
    if shape is not None and (model.input_shape != shape or model.dtype != trainer.dtype):
        model.build(shape, trainer.dtype)  # weights in the trainer's dtype before loading
    state = check_model_state(ckpt, model)
    opt_state = check_optimizer_state(ckpt, trainer.optimizer, model)
    model.load_state_dict(state)
    load_dropout_state(model, ckpt.config.get("dropout", {}))
    load_dropout_state(model, ckpt.config.get("rate_encode", {}), RateEncode)
    if opt_state is not None:
        trainer.optimizer.load_state_dict(opt_state)
    if (ckpt.scheduler is None) != (scheduler is None):
        raise CheckpointError(f"{ckpt.path}: " + (
            f"no schedule state, but the trainer has {scheduler!r}"
            if ckpt.scheduler is None else
            f"it holds a {ckpt.scheduler.get('type')} schedule's state; give the trainer "
            f"that scheduler"))
    if scheduler is not None:
        scheduler.load_state_dict(ckpt.scheduler)
    trainer.unbind()  # bind the restored arrays at the next batch
    trainer.epoch, trainer.step_in_epoch = ckpt.epoch, ckpt.step
    trainer.global_step, trainer.seed = ckpt.global_step, ckpt.seed
    trainer.history = [dict(r) for r in ckpt.history]
    trainer.progress = {**new_progress(), **ckpt.progress}
    g = ckpt.config.get("granularity")
    if trainer.auto_granularity and isinstance(g, int) and 1 <= g <= trainer.batch_size:
        trainer.granularity = g
    if ckpt.config.get("auto_granularity") and g == trainer.granularity:
        _adopt_layout(model, ckpt.config)  # the fusion and per-layer g 'auto' chose
        decision = ckpt.config.get("granularity_decision")
        if isinstance(decision, dict) and trainer.granularity_decision is None:
            layers = decision.get("layer_granularity")
            trainer.granularity_decision = GranularityDecision(**{
                **decision, "layer_granularity": None if layers is None else tuple(layers)})
    trainer.last_checkpoint = {"path": str(ckpt.path), "epoch": ckpt.epoch, "step": ckpt.step,
                               "global_step": ckpt.global_step}
    return ckpt


def _adopt_layout(model, config):
    """The fusion and per-layer granularities an ``"auto"`` run chose, from a checkpoint."""
    if isinstance(config.get("fuse"), bool) and hasattr(model, "fuse"):
        model.fuse = config["fuse"]
    layers = config.get("layer_granularity")
    if hasattr(model, "granularities") and (layers is None or len(layers) == len(model)):
        model.granularities = layers
