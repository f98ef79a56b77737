"""The trainer: one optimizer step per batch as one task graph, epochs, metrics, checkpoints.

``train_step(x, y)`` registers the batch, splits it into ``granularity``
partitions, and submits in program order: zero the gradients, the forward
pass, the loss and its gradient, the backward pass (REDUX parameter gradients)
and the optimizer update; then waits and reads the loss. It is the only path
that updates weights: :meth:`Trainer.fit` is a loop over it.

``fit`` owns the run's position: epochs completed (``epoch``), steps done in the
epoch in progress (``step_in_epoch``), optimizer steps in all
(``global_step``), the history of finished epochs and the running sums of the
epoch in progress. The order of the samples of epoch ``e`` is
``dataset.epoch_order(seed, e)``, a function of (seed, epoch) alone, so that
position plus the weights, optimizer buffers and the schedule's state is the
whole state of a run (an augmentation draws from (seed, epoch, sample index)):
a checkpoint holding them resumes bit for bit (given the same granularity and
the same codelet variants, see :class:`~hetero_nn.scheduler.runtime.Runtime`'s
``deterministic``).

Replay: with ``replay=True`` (the default) the first step of each *step key*
(batch shape, dtype, granularity, the layers' train/eval modes, the model's ``fuse`` and ``granularities``, the
optimizer's :meth:`~hetero_nn.optim.Optimizer.replay_key`: what stays fixed of its
hyper-parameters) is captured with
:meth:`Runtime.capture <hetero_nn.scheduler.runtime.Runtime.capture>` into
a graph that owns copies of the batch; later steps of that key copy the new batch
into those buffers and replay the graph (no task built, no dependency inferred),
bit for bit the same as submitting. What changes every step lives in the data of
small *step inputs* that the captured tasks read: the optimizer's hyper handle (lr,
momentum or betas, step count: so Adam, AdamW and schedules stepped per step
replay), a Dropout's mask key, a BatchNorm2D's momentum. Each object that registered
one while the step was captured (``step_input``) is asked before every replay for
the next values (``replayed()``, which also counts the step on the host as a
submission would), written into its captured handle. The runtime (devices, policy,
variants) is fixed per trainer and rebinding the model drops the graphs. A layer
whose ``replayable`` is False makes its steps submitted. ``evaluate_batch`` (and so
``evaluate``) captures and replays the same way (key ``"eval"``, layers in eval
mode); ``predict`` is submitted; the calibration steps of ``granularity="auto"`` are
ordinary steps whose graphs are dropped once the choice is made. At most ``_MAX_GRAPHS``
graphs are kept, the oldest dropped. Before its second replay a graph fuses the
chains of tasks too small for their dispatch (the runtime's ``fuse_chains``, on
by default); :attr:`Trainer.graphs` shows each graph and its ``bundles``.

``granularity="auto"`` decides when the first batch arrives, from the performance
models after calibration (:mod:`hetero_nn.granularity`): the granularity, the
model's fusion and, where the models say a block pays at its own g, the model's
per-block granularities; the decision, with the predicted and the measured step
time, lands in ``granularity_decision``. A checkpoint records the choice and a
resumed ``"auto"`` run adopts it.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .arena.arena import ArenaPair
from .checkpoint import (CHECKPOINT_NAME, FINAL_NAME, check_model_state, check_optimizer_state,
                         read_checkpoint, remove_stale_temporaries, write_checkpoint)
from .errors import CheckpointError, ConfigError, TrainingDiverged
from .layers.base import evaluating
from .layers.dropout import dropout_state, load_dropout_state
from .layers.loss import SoftmaxCrossEntropy
from .optim import SGD, LRScheduler, submit_clip_grad_norm
from .scheduler.runtime import Runtime

#: Keys of every per-epoch record :meth:`Trainer.fit` returns.
HISTORY_KEYS = ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                "seconds", "images_per_second", "warmup_seconds")

_MAX_GRAPHS = 6  # captured steps kept (oldest dropped)


class _ArrayData:
    """``(x, y)`` arrays seen through the part of the Dataset interface ``fit`` uses."""

    def __init__(self, x, y):
        self.x = np.asarray(x)
        self.y = np.asarray(y)
        if self.x.ndim < 2 or self.y.shape != (len(self.x),):
            raise ConfigError(f"fit: expected images (N, ...) and labels (N,), got shapes "
                              f"{self.x.shape} and {self.y.shape}")
        self.input_shape = tuple(self.x.shape[1:])

    def __len__(self):
        return len(self.y)

    def epoch_order(self, seed=0, epoch=0):
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self))

    def batch(self, indices, dtype="float32", out=None):
        x, y = self.x[indices], self.y[indices]
        if out is None:
            return np.ascontiguousarray(x, dtype=dtype), np.asarray(y, dtype=np.int64)
        xb, yb = out(x.shape, dtype), out(y.shape, np.int64)
        xb[...] = x
        yb[...] = y
        return xb, yb


def prefetched_batches(data, order, batch_size, start, stop, dtype, pair, transform=None):
    """Yield batches ``start..stop-1`` of ``order``, loading the next while a step runs.

    Batch ``b`` lives in one arena of ``pair`` while a loader thread fills
    batch ``b + 1`` into the other; the arena is reset only once the step that
    used it has returned, so no reset ever waits for the step in flight.
    ``transform(x, indices)``, if given, changes each batch in place on the
    loader thread (the augmentation).
    """
    if start >= stop:
        return

    def load(b):
        indices = order[b * batch_size:(b + 1) * batch_size]
        x, y = data.batch(indices, dtype=dtype, out=pair.current.empty)
        if transform is not None:
            transform(x, indices)
        return x, y

    with ThreadPoolExecutor(1, thread_name_prefix="hetero_nn-loader") as loader:
        pair.swap()
        pending = loader.submit(load, start)
        for b in range(start, stop):
            x, y = pending.result()
            if b + 1 < stop:
                pair.swap()  # the arena of batch b - 1, whose step has returned
                pending = loader.submit(load, b + 1)
            yield x, y


def _as_data(data, what):
    if hasattr(data, "epoch_order") and hasattr(data, "batch"):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _ArrayData(*data)
    raise ConfigError(f"{what}: expected a hetero_nn Dataset or an (images, labels) pair, "
                      f"got {type(data).__name__}")


def _trainer_dtype(model, dtype) -> np.dtype:
    """The trainer's dtype: ``dtype``, else the built model's, else float32 (see Trainer)."""
    built = getattr(model, "dtype", None) if getattr(model, "input_shape", None) else None
    if dtype is None:
        return np.dtype(built) if built is not None else np.dtype(np.float32)
    try:
        chosen = np.dtype(dtype)
    except TypeError:
        chosen = None
    if chosen not in (np.float32, np.float64):
        raise ConfigError(f"dtype must be float32 or float64, got {dtype!r}")
    if built is not None and chosen != built:
        raise ConfigError(f"Trainer(dtype={chosen.name!r}) contradicts the model, which is "
                          f"built in {np.dtype(built).name}; leave dtype out to train in "
                          f"{np.dtype(built).name}, or build the model with dtype="
                          f"{chosen.name!r}")
    return chosen


def _new_progress():
    return {"loss_sum": 0.0, "correct": 0, "samples": 0, "seconds": 0.0,
            "warmup_samples": 0, "warmup_seconds": 0.0}


class Trainer:
    """Trains ``model`` with ``loss`` and ``optimizer`` on ``runtime``.

    Parameters
    ----------
    model : Sequential
    loss : SoftmaxCrossEntropy, optional
    optimizer : Optimizer, optional
        Built without parameters (``hn.optim.SGD(lr=0.05, momentum=0.9)``);
        the trainer binds the model's. Default: SGD(lr=0.02, momentum=0.9), the CLI's default.
    runtime : Runtime, optional
        Default: ``Runtime(devices="cpu", trace=False)``, closed by :meth:`close`.
    batch_size : int
    granularity : int or "auto"
        Partitions per batch: every per-sample codelet is submitted that many
        times. ``"auto"``: chosen from the performance models on the first batch
        (:mod:`hetero_nn.granularity`), per block of the model where they say so.
    dtype : str, optional
        ``"float32"`` or ``"float64"``. Default: the model's dtype when it is built,
        float32 otherwise. A built model is never silently converted: a ``dtype``
        that contradicts it raises :class:`~hetero_nn.errors.ConfigError` (rebuild
        the model, or load its weights into one built for that dtype).
    seed : int
        The data-order seed: epoch ``e`` visits ``dataset.epoch_order(seed, e)``.
    scheduler : LRScheduler, optional
        Built on ``optimizer`` (``hn.optim.OneCycleLR(opt, max_lr=0.1, total_steps=...)``);
        ``fit`` steps it after every optimizer step or at every epoch's end, as
        ``scheduler_interval`` says. Its state goes into checkpoints.
    scheduler_interval : "step" or "epoch", optional
        Default: the schedule's own ``interval`` -- ``"step"`` for OneCycleLR,
        ``"epoch"`` for StepLR and CosineAnnealingLR, as PyTorch's examples step them.
    clip_grad_norm : float, optional
        Clip the gradients to this global 2-norm before every optimizer step
        (:func:`hetero_nn.optim.clip_grad_norm`); the norm before clipping lands in
        ``last_grad_norm``.
    augment : callable, optional
        ``augment(x, indices, seed=, epoch=)`` applied to every training batch on the
        loader thread (:mod:`hetero_nn.transforms`), e.g.
        ``hn.transforms.standard_augmentation(train)``.
    replay : bool
        Capture a step's task graph once per step key and replay it (module docstring).
    cluster : distributed.Client, str or Cluster, optional
        Compute each step's gradients on a Dask cluster (``"local:N"``, ``"tcp://HOST:PORT"``,
        a client or a :class:`hetero_nn.cluster.Cluster`); the optimizer step runs here.
        See :mod:`hetero_nn.cluster`; a cluster made from a string or client is closed
        by :meth:`close`.

    Examples
    --------
    >>> import hetero_nn as hn
    >>> train = hn.datasets.load("synthetic", image_size=12, num_samples=256)
    >>> model = hn.build_model("dahl-basic", train.input_shape, train.num_classes, seed=0)
    >>> with (hn.Runtime(devices="cpu:2", perfmodel=False) as rt,
    ...       hn.Trainer(model, runtime=rt, batch_size=32, granularity=2) as trainer):
    ...     history = trainer.fit(train, epochs=1, verbose=0)
    >>> [record["epoch"] for record in history], history[0]["granularity"]
    ([1], 2)
    """

    def __init__(self, model, loss=None, optimizer=None, runtime=None, batch_size=64,
                 granularity=1, dtype=None, seed=0, *, scheduler=None,
                 scheduler_interval=None, clip_grad_norm=None, augment=None, cluster=None,
                 replay=True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.dtype = _trainer_dtype(model, dtype)  # before a runtime exists to leak
        self.model = model
        self.loss = loss if loss is not None else SoftmaxCrossEntropy()
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.02, momentum=0.9)
        self._own_runtime = runtime is None
        self.runtime = runtime if runtime is not None else Runtime(devices="cpu", trace=False)
        try:  # a bad argument below must not leak the runtime made above
            self.batch_size = int(batch_size)
            self.auto_granularity = isinstance(granularity, str) and granularity == "auto"
            self.granularity = None if self.auto_granularity else self._check_granularity(granularity)
            #: What ``granularity="auto"`` chose (a GranularityDecision), None before.
            self.granularity_decision = None
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise ConfigError(f"seed must be an integer, got {seed!r}")
            self.seed = int(seed)
            self._init_training_options(scheduler, scheduler_interval, clip_grad_norm, augment)
            self._bound = None
            self.replay = bool(replay)
            self._graphs: dict = {}  # step key -> _CapturedStep
            self.graphs_captured = 0
            self._batch_arenas = ArenaPair("batches")
            self.last_correct = 0
            # the run's position (see the module docstring)
            self.epoch = 0
            self.step_in_epoch = 0
            self.global_step = 0
            self.history: list[dict] = []
            self._progress = _new_progress()
            self.last_checkpoint: dict | None = None
            self._checkpoint_dir = None
            self._warmed_up = False  # the first step of this process is timed apart (compilation)
            #: Extra JSON-serialisable facts stored in every checkpoint's config (the CLI's options).
            self.config: dict = {}
            self.cluster = None
            if cluster is not None:
                from .cluster import Cluster, connect
                if self.auto_granularity:
                    raise ConfigError("granularity='auto' calibrates and measures local steps; with "
                                      "a cluster give an integer (a multiple of the workers deals "
                                      "best)")
                if getattr(model, "granularities", None) is not None:
                    raise ConfigError("cluster: the model has per-layer granularities; a cluster "
                                      "worker runs its share at the trainer's granularity")
                if self.augment is not None:
                    raise ConfigError("augment= runs on the client's loader thread; with a cluster "
                                      "the workers read their batches themselves: give one or the other")
                from .layers import BatchNorm2D, Dropout
                stateful = sorted({type(m).__name__ for m in model.modules()
                                   if isinstance(m, (BatchNorm2D, Dropout))})
                if stateful:  # their statistics / masks span the whole batch, not one worker's block
                    raise ConfigError(f"cluster: the model has {', '.join(stateful)} layers, whose "
                                      f"batch statistics or dropout masks are not yet kept equal to "
                                      f"one process's across workers; train it with --devices")
                self._own_cluster = not isinstance(cluster, Cluster)
                self.cluster = connect(cluster)
        except BaseException:
            if self._own_runtime:
                self.runtime.close()
            raise

    def _init_training_options(self, scheduler, interval, clip, augment):
        if scheduler is not None and not isinstance(scheduler, LRScheduler):
            raise ConfigError(f"scheduler must be a hetero_nn.optim schedule, got "
                              f"{type(scheduler).__name__}")
        if scheduler is not None and scheduler.optimizer is not self.optimizer:
            raise ConfigError("scheduler: it was built on another optimizer than the trainer's")
        self.scheduler = scheduler
        interval = interval or (scheduler.interval if scheduler is not None else "epoch")
        if interval not in ("step", "epoch"):
            raise ConfigError(f"scheduler_interval must be 'step' or 'epoch', got {interval!r}")
        self.scheduler_interval = interval
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not clip > 0 or not math.isfinite(clip)):
            raise ConfigError(f"clip_grad_norm must be a positive number, got {clip!r}")
        self.clip_grad_norm = None if clip is None else float(clip)
        self.last_grad_norm = None
        if augment is not None and not callable(augment):
            raise ConfigError(f"augment must be callable, got {type(augment).__name__}")
        self.augment = augment

    def _check_granularity(self, g):
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise ConfigError(f"granularity must be a positive integer or 'auto', got {g!r}")
        if g > self.batch_size:
            raise ConfigError(f"granularity {g} is larger than the batch size {self.batch_size}")
        return int(g)

    # ------------------------------------------------------------ setup
    def _prepare(self, x):
        rt = self.runtime
        sample = tuple(x.shape[1:])
        if self.model.input_shape != sample or self.model.dtype != self.dtype:
            self.model.build(sample, self.dtype)
            self._bound = None
        if self._bound is not rt:
            self._graphs.clear()  # they hold the handles of the previous binding
            self.model.bind(rt)
            self.optimizer.bind(self.model.named_parameters(), rt)
            self._bound = rt

    def _split(self, h):
        g = min(self.granularity, h.shape[0])
        return list(h.split(0, g)) if g > 1 else [h]

    def _batch(self, x, y):
        rt = self.runtime
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if self.granularity is None:
            self.tune_granularity(x, y)
        self._prepare(x)
        xs = self._split(rt.register(x, name="x"))
        ys = None
        if y is not None:
            ys = self._split(rt.register(self._labels(x, y), name="y"))
        return xs, ys

    @staticmethod
    def _labels(x, y):
        y = np.ascontiguousarray(y, dtype=np.int64)
        if y.shape != (x.shape[0],):
            raise ConfigError(f"labels of shape {y.shape} do not match a batch of {x.shape[0]} samples")
        return y

    # ------------------------------------------------------------ steps
    def train_step(self, x, y) -> float:
        """One optimizer step on one batch; returns the batch's mean loss."""
        if self.cluster is not None:
            return self.cluster.train_step(self, x, y)
        key = self._step_key(x, y, self.optimizer.replay_key()) if self.replay else None
        if key is None:
            return self._read_step(*self._submit_step(*self._batch(x, y)))
        results = self._run_captured(key, x, y, self._submit_step)
        return self._read_step(*results)

    def _submit_step(self, xs, ys):
        """Submit one optimizer step; returns the handles of its loss, correct count and
        squared gradient norm (None without clipping)."""
        rt = self.runtime
        self.model.zero_grad(rt)
        logits = self.model.forward(rt, xs)
        loss, correct, dlogits = self.loss(rt, logits, ys)
        self.model.backward(rt, dlogits)
        norm_sq = (submit_clip_grad_norm(self.optimizer, self.clip_grad_norm)
                   if self.clip_grad_norm is not None else None)
        self.optimizer.step(rt)
        return loss, correct, norm_sq

    def _read_step(self, loss, correct, norm_sq) -> float:
        rt = self.runtime
        value = float(rt.fetch(loss))
        self.last_correct = int(rt.fetch(correct))
        if norm_sq is not None:
            self.last_grad_norm = float(np.sqrt(rt.fetch(norm_sq)))
        return value

    def _step_key(self, x, y, what):
        """The step key of ``(x, y)`` for a step of kind ``what`` (the optimizer's
        ``replay_key`` or ``"eval"``; module docstring), or None when the step must be
        submitted. Resolves the granularity and builds and binds the model first."""
        if what is None:
            return None
        modes = []
        for _, layer in self.model.named_modules():
            if not layer.replayable:
                return None
            modes.append(layer.training)
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if self.granularity is None:
            self.tune_granularity(x, y)
        self._prepare(x)
        return (x.shape, np.shape(y), self.dtype, self.granularity, what, tuple(modes),
                getattr(self.model, "fuse", None), getattr(self.model, "granularities", None))

    def _run_captured(self, key, x, y, submit):
        """Run the graph of ``key`` on ``(x, y)``: replay it with the batch copied in, or,
        the first time, capture ``submit(xs, ys)`` on the graph's own copies of the batch.
        Returns ``submit``'s result handles."""
        step = self._graphs.get(key)
        if step is not None:
            step.graph.write(step.x, x)
            step.graph.write(step.y, y)
            for owner, handle in step.inputs:
                step.graph.write(handle, owner.replayed())
            step.graph.replay()
            return step.results
        rt = self.runtime
        xh = rt.register(np.array(x, dtype=self.dtype), name="x")  # copies: the loader reuses x
        yh = rt.register(self._labels(xh, y).copy(), name="y")
        owners = [self.optimizer, *self.model.modules()]
        for owner in owners:
            owner.step_input = None
        with rt.capture() as graph:
            results = submit(self._split(xh), self._split(yh))
        inputs = [(owner, owner.step_input) for owner in owners if owner.step_input is not None]
        if len(self._graphs) >= _MAX_GRAPHS:
            del self._graphs[next(iter(self._graphs))]
        self._graphs[key] = _CapturedStep(graph, xh, yh, results, inputs)
        self.graphs_captured += 1
        return results

    @property
    def graphs(self) -> dict:
        """The captured graphs kept, by step key (a copy of the mapping); each one's
        ``bundles`` says what task-level fusion did to it."""
        return {key: step.graph for key, step in self._graphs.items()}

    def evaluate_batch(self, x, y):
        """``(mean loss, correct count)`` of one batch in eval mode, without updating anything."""
        rt = self.runtime
        with evaluating(self.model):
            key = self._step_key(x, y, "eval") if self.replay else None
        if key is None:
            loss, correct = self._submit_eval(*self._batch(x, y))
        else:
            loss, correct = self._run_captured(key, x, y, self._submit_eval)
        return float(rt.fetch(loss)), int(rt.fetch(correct))

    def _submit_eval(self, xs, ys):
        rt = self.runtime
        with evaluating(self.model):
            logits = self.model.forward(rt, xs)
        loss, correct, _ = self.loss(rt, logits, ys, grad=False)
        return loss, correct

    def predict(self, x) -> np.ndarray:
        """Predicted class of every sample of ``x`` (in batches of ``batch_size``), in eval mode."""
        out = []
        for start in range(0, len(x), self.batch_size):
            xs, _ = self._batch(x[start:start + self.batch_size], None)
            with evaluating(self.model):
                logits = self.model.forward(self.runtime, xs)
            preds = self.loss.predict(self.runtime, logits)
            self.runtime.wait()
            out.extend(self.runtime.fetch(p, copy=True) for p in preds)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    # ------------------------------------------------------------ granularity
    def tune_granularity(self, x, y=None, candidates=None, per_layer=True) -> int:
        """Choose and set the granularity (and fusion, and per-layer g) from the models.

        Calibrates, predicts each candidate's step by simulation, chooses, and measures
        the choice on ``(x, y)`` (:mod:`hetero_nn.granularity`); the weights, buffers,
        dropout steps and the optimizer state are not changed. The decision lands in
        ``granularity_decision``; the chosen granularity is returned.

        Parameters
        ----------
        x, y : numpy.ndarray
            One batch (labels default to zeros: only the time matters).
        candidates : sequence of int, optional
            Default: 1, 2, 4, ... up to ``min(len(x), 4 * workers)``.
        per_layer : bool
            Also try a granularity of its own for each block of the model.

        Returns
        -------
        int
        """
        from .granularity import choose_granularity

        self.granularity_decision = choose_granularity(self, x, y, candidates, per_layer)
        return self.granularity

    # ------------------------------------------------------------ epochs
    def evaluate(self, dataset, batch_size=None) -> tuple[float, float]:
        """``(mean loss, accuracy)`` over ``dataset`` (a Dataset or an ``(x, y)`` pair), in order."""
        data = _as_data(dataset, "evaluate")
        bs = self.batch_size if batch_size is None else int(batch_size)
        if bs < 1:
            raise ConfigError(f"evaluate: batch_size must be a positive integer, got {batch_size!r}")
        n = len(data)
        if n == 0:
            raise ConfigError("evaluate: the dataset is empty")
        loss_sum, correct = 0.0, 0
        for start in range(0, n, bs):
            x, y = data.batch(np.arange(start, min(start + bs, n)), dtype=self.dtype)
            loss, c = self.evaluate_batch(x, y)
            loss_sum += loss * len(y)
            correct += c
        return loss_sum / n, correct / n

    def fit(self, train, epochs=1, validation=None, *, shuffle=True, checkpoint_dir=None,
            checkpoint_every=None, verbose=1, on_step=None, on_epoch_end=None) -> list[dict]:
        """Train until ``epochs`` epochs are complete; returns the history.

        ``epochs`` counts from the start of the run, not of this call (Keras's
        ``epochs``): after :meth:`load_checkpoint` the run continues where the
        checkpoint left it, mid-epoch included, and a second ``fit`` needs a larger
        ``epochs`` to train more.

        Parameters
        ----------
        train : Dataset or (images, labels)
        epochs : int
        validation : Dataset or (images, labels), optional
            Evaluated after every epoch (``test_loss``, ``test_accuracy``).
        shuffle : bool
            Visit epoch ``e`` in ``epoch_order(seed, e)``; else in file order.
        checkpoint_dir : path-like, optional
            Where ``checkpoint.npz`` is written every ``checkpoint_every`` steps and at
            the end of every epoch, and ``checkpoint-final.npz`` when training ends.
        checkpoint_every : int, optional
            Steps between mid-epoch checkpoints (None: only at epoch ends).
        verbose : int
            0: silent; 1: a line per epoch on stderr, and a tqdm bar when stderr is a
            terminal; 2: the bar even when it is not.
        on_step : callable(trainer, loss), optional
        on_epoch_end : callable(trainer, record), optional

        Returns
        -------
        list of dict
            One per finished epoch: ``epoch`` (1-based), ``train_loss``,
            ``train_accuracy``, ``test_loss``, ``test_accuracy`` (None without
            validation), ``seconds`` (training time of the epoch),
            ``images_per_second``, ``eval_seconds``, ``samples``, ``steps``,
            ``granularity``.

        Raises
        ------
        TrainingDiverged
            The loss became NaN or infinite; the message names the epoch, the step
            and the last good checkpoint, which is left on disk.
        """
        data = _as_data(train, "fit")
        val = None if validation is None else _as_data(validation, "fit validation")
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
            raise ConfigError(f"epochs must be a non-negative integer, got {epochs!r}")
        if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
                checkpoint_every, (int, np.integer)) or checkpoint_every < 1):
            raise ConfigError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        n, bs = len(data), self.batch_size
        if n == 0:
            raise ConfigError("fit: the training set is empty")
        num_batches = -(-n // bs)
        if self.step_in_epoch > num_batches:
            raise CheckpointError(f"the run stopped at step {self.step_in_epoch} of epoch "
                                  f"{self.epoch + 1}, but {n} samples in batches of {bs} make "
                                  f"only {num_batches} steps: not the same training set")
        ckdir = None
        if checkpoint_dir is not None:
            ckdir = self._checkpoint_dir = Path(checkpoint_dir)
            ckdir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(ckdir, {CHECKPOINT_NAME, FINAL_NAME})
        bar_wanted = verbose >= 2 or (verbose >= 1 and sys.stderr.isatty())
        while self.epoch < epochs:
            e = self.epoch
            order = data.epoch_order(self.seed, e) if shuffle else np.arange(n)
            if self.granularity is None:
                self.tune_granularity(*data.batch(order[:bs], dtype=self.dtype))
            progress = self._progress
            bar = _progress_bar(num_batches, self.step_in_epoch, f"epoch {e + 1}/{epochs}",
                                not bar_wanted)
            try:
                t_last = time.perf_counter()
                if self.cluster is not None:  # the data is on the workers: batches are indices
                    batches = self.cluster.batches(data, order, bs, self.step_in_epoch, num_batches)
                else:
                    augment = None if self.augment is None else functools.partial(
                        self.augment, seed=self.seed, epoch=e)
                    batches = prefetched_batches(data, order, bs, self.step_in_epoch,
                                                 num_batches, self.dtype, self._batch_arenas,
                                                 augment)
                for b, (x, y) in enumerate(batches, self.step_in_epoch):
                    loss = self.train_step(x, y)
                    if not math.isfinite(loss):
                        raise self._diverged(loss, e, b, epochs, num_batches)
                    progress["loss_sum"] += loss * len(y)
                    progress["correct"] += self.last_correct
                    progress["samples"] += len(y)
                    now = time.perf_counter()
                    progress["seconds"] += now - t_last
                    if not self._warmed_up:  # kernel compilation: kept out of images/s
                        self._warmed_up = True
                        progress["warmup_seconds"] += now - t_last
                        progress["warmup_samples"] += len(y)
                    self.step_in_epoch = b + 1
                    self.global_step += 1
                    if self.scheduler is not None and self.scheduler_interval == "step":
                        self.scheduler.step()
                    if bar is not None:
                        bar.set_postfix_str(_running(progress), refresh=False)
                        bar.update(1)
                    if on_step is not None:
                        on_step(self, loss)
                    if (ckdir is not None and checkpoint_every
                            and self.global_step % checkpoint_every == 0 and b + 1 < num_batches):
                        self.save_checkpoint(ckdir / CHECKPOINT_NAME, require_finite=True)
                    t_last = time.perf_counter()
            finally:
                batches.close()  # joins the loader thread, also when a step raised
                if bar is not None:
                    bar.close()
            if self.scheduler is not None and self.scheduler_interval == "epoch":
                self.scheduler.step()
            record = self._end_epoch(val)
            if ckdir is not None:
                self.save_checkpoint(ckdir / CHECKPOINT_NAME, require_finite=True)
            if verbose >= 1:
                _print_epoch(record, epochs)
            if on_epoch_end is not None:
                on_epoch_end(self, record)
        if ckdir is not None:
            self.save_checkpoint(ckdir / FINAL_NAME, require_finite=True)
        return [dict(r) for r in self.history]

    def _end_epoch(self, validation) -> dict:
        p = self._progress
        seconds = p["seconds"]
        timed_seconds = seconds - p["warmup_seconds"]
        timed_samples = p["samples"] - p["warmup_samples"]
        if timed_samples <= 0 or timed_seconds <= 0:  # an epoch of the warm-up step alone
            timed_seconds, timed_samples = seconds, p["samples"]
        record = {"epoch": self.epoch + 1,
                  "train_loss": p["loss_sum"] / p["samples"],
                  "train_accuracy": p["correct"] / p["samples"],
                  "test_loss": None, "test_accuracy": None,
                  "seconds": seconds,
                  "images_per_second": timed_samples / timed_seconds if timed_seconds > 0 else None,
                  "warmup_seconds": p["warmup_seconds"],
                  "eval_seconds": 0.0, "samples": p["samples"], "steps": self.step_in_epoch,
                  "granularity": self.granularity}
        if validation is not None:
            t0 = time.perf_counter()
            record["test_loss"], record["test_accuracy"] = self.evaluate(validation)
            record["eval_seconds"] = time.perf_counter() - t0
        self.history.append(record)
        self.epoch += 1
        self.step_in_epoch = 0
        self._progress = _new_progress()
        return record

    def _diverged(self, loss, epoch, b, epochs, num_batches) -> TrainingDiverged:
        where = (f"epoch {epoch + 1}/{epochs}, step {b + 1}/{num_batches} (global step "
                 f"{self.global_step + 1})")
        return TrainingDiverged(f"training diverged: the loss is {loss} at {where}; "
                                f"{self._kept()}")

    def _kept(self) -> str:
        last = self.last_checkpoint
        if last is None and self._checkpoint_dir is not None:
            return f"no checkpoint was written in {self._checkpoint_dir} yet"
        if last is None:
            return "no checkpoint was written (give checkpoint_dir= or --out to keep one)"
        return (f"the last good checkpoint is {last['path']} (after "
                f"{_position(last['epoch'], last['step'], last['global_step'])})")


    # ------------------------------------------------------------ checkpoints
    def checkpoint_config(self) -> dict:
        """What a checkpoint records about the run: trainer settings, model spec, extras."""
        opt = self.optimizer
        cfg = {"batch_size": self.batch_size, "granularity": self.granularity,
               "auto_granularity": self.auto_granularity,
               "layer_granularity": _listed(getattr(self.model, "granularities", None)),
               "fuse": getattr(self.model, "fuse", None), "dtype": self.dtype.name,
               "seed": self.seed, "loss": type(self.loss).__name__,
               "optimizer": {"name": type(opt).__name__.lower(), **opt.hyper()},
               "input_shape": list(self.model.input_shape) if self.model.input_shape else None,
               "runtime": {"devices": str(self.runtime.devices),
                           "policy": self.runtime.policy_name,
                           "executor": self.runtime.executor_name,
                           "deterministic": self.runtime.deterministic,
                           "variants": list(self.runtime.preferred)}}
        spec = getattr(self.model, "spec", None)
        if spec is not None:
            cfg["model"] = dict(spec)
        cfg["dropout"] = dropout_state(self.model)  # seeds and steps: the masks after resume
        if self.scheduler is not None:
            cfg["scheduler"] = {"repr": repr(self.scheduler), "interval": self.scheduler_interval}
        if self.clip_grad_norm is not None:
            cfg["clip_grad_norm"] = self.clip_grad_norm
        if self.augment is not None:
            cfg["augment"] = repr(self.augment)
        cfg.update(self.config)
        return cfg

    def save_checkpoint(self, path, require_finite: bool = False) -> Path:
        """Write the run's whole state to ``path`` (atomically; see :mod:`hetero_nn.checkpoint`).

        With ``require_finite`` (as ``fit`` does), a NaN or infinite weight or
        optimizer buffer raises :class:`TrainingDiverged` instead, so the file on
        disk stays the last good one.
        """
        opt = {"type": type(self.optimizer).__name__, **self.optimizer.state_dict()}
        model_state = self.model.state_dict()
        if require_finite:
            arrays = [("model/" + k, v) for k, v in model_state.items()]
            arrays += [(f"optimizer/state/{k}/{b}", v) for k, st in opt["state"].items()
                       for b, v in st.items()]
            for key, value in arrays:
                if not np.isfinite(value).all():
                    where = _position(self.epoch, self.step_in_epoch, self.global_step)
                    raise TrainingDiverged(f"training diverged: {key} holds NaN or infinite "
                                           f"values after {where}; {self._kept()}")
        path = write_checkpoint(path, model_state=model_state, optimizer=opt,
                                epoch=self.epoch, step=self.step_in_epoch,
                                global_step=self.global_step, seed=self.seed,
                                progress=self._progress, history=self.history,
                                config=self.checkpoint_config(),
                                scheduler=None if self.scheduler is None
                                else self.scheduler.state_dict())
        self.last_checkpoint = {"path": str(path), "epoch": self.epoch,
                                "step": self.step_in_epoch, "global_step": self.global_step}
        return path

    def load_checkpoint(self, path):
        """Restore weights, optimizer state and the run's position from ``path``.

        The model is built first for the checkpoint's input shape and the
        trainer's dtype (the checkpoint's weights are cast to it). With ``granularity="auto"``
        the checkpoint's granularity is adopted; the fusion and per-layer granularities an
        ``"auto"`` run chose are adopted whenever the trainer runs at its granularity, so a
        resumed run splits batches as the original did.

        Returns
        -------
        Checkpoint

        Raises
        ------
        CheckpointError
            A corrupt file, or one that does not fit the model or the optimizer
            (the message names the file and the key or shape at fault).
        """
        ckpt = read_checkpoint(path)
        shape = ckpt.config.get("input_shape")
        shape = tuple(shape) if shape else self.model.input_shape
        if shape is not None and (self.model.input_shape != shape or self.model.dtype != self.dtype):
            self.model.build(shape, self.dtype)  # weights in the trainer's dtype before loading
            self._bound = None
        state = check_model_state(ckpt, self.model)
        opt_state = check_optimizer_state(ckpt, self.optimizer, self.model)
        self.model.load_state_dict(state)
        load_dropout_state(self.model, ckpt.config.get("dropout", {}))
        if opt_state is not None:
            self.optimizer.load_state_dict(opt_state)
        if (ckpt.scheduler is None) != (self.scheduler is None):
            raise CheckpointError(f"{ckpt.path}: " + (
                f"no schedule state, but the trainer has {self.scheduler!r}"
                if ckpt.scheduler is None else
                f"it holds a {ckpt.scheduler.get('type')} schedule's state; give the trainer "
                f"that scheduler"))
        if self.scheduler is not None:
            self.scheduler.load_state_dict(ckpt.scheduler)
        self._bound = None  # bind the restored arrays at the next batch
        self.epoch, self.step_in_epoch, self.global_step = ckpt.epoch, ckpt.step, ckpt.global_step
        self.seed = ckpt.seed
        self.history = [dict(r) for r in ckpt.history]
        self._progress = {**_new_progress(), **ckpt.progress}
        g = ckpt.config.get("granularity")
        if self.auto_granularity and isinstance(g, int) and 1 <= g <= self.batch_size:
            self.granularity = g
        if ckpt.config.get("auto_granularity") and g == self.granularity:
            self._adopt_layout(ckpt.config)  # the fusion and per-layer g 'auto' chose
        self.last_checkpoint = {"path": str(ckpt.path), "epoch": ckpt.epoch, "step": ckpt.step,
                                "global_step": ckpt.global_step}
        return ckpt

    def _adopt_layout(self, config):
        """The fusion and per-layer granularities an ``"auto"`` run chose, from a checkpoint."""
        model = self.model
        if isinstance(config.get("fuse"), bool) and hasattr(model, "fuse"):
            model.fuse = config["fuse"]
        layers = config.get("layer_granularity")
        if hasattr(model, "granularities") and (layers is None or len(layers) == len(model)):
            model.granularities = layers

    # ------------------------------------------------------------ lifetime
    def close(self):
        if self.cluster is not None and self._own_cluster:
            self.cluster.close()
        if self._own_runtime:
            self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _CapturedStep:
    """A captured train step: its graph, the batch handles it reads, its result handles,
    and its step inputs: ``(owner, handle)`` pairs whose data ``owner.replayed()`` gives."""

    __slots__ = ("graph", "x", "y", "results", "inputs")

    def __init__(self, graph, x, y, results, inputs):
        self.graph, self.x, self.y, self.results, self.inputs = graph, x, y, results, inputs


# ---------------------------------------------------------------------------------------
# Progress display
# ---------------------------------------------------------------------------------------

def _running(progress) -> str:
    n = progress["samples"]
    rate = n / progress["seconds"] if progress["seconds"] > 0 else 0.0
    return (f"loss {progress['loss_sum'] / n:.4f}  acc {progress['correct'] / n:.2%}  "
            f"{rate:.0f} img/s")


def _progress_bar(total, initial, desc, disable):
    if disable:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="batch", file=sys.stderr,
                leave=False, dynamic_ncols=True, mininterval=0.2)


def format_epoch(record, epochs=None) -> str:
    """One line for a finished epoch: train and test loss and accuracy, time, speed."""
    of = f"/{epochs}" if epochs else ""
    line = (f"epoch {record['epoch']}{of}: train loss {record['train_loss']:.4f} "
            f"acc {record['train_accuracy']:.2%}")
    if record.get("test_accuracy") is not None:
        line += f" | test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.2%}"
    ips = record.get("images_per_second")
    line += f" | {record['seconds']:.1f} s" + (f", {ips:.0f} img/s" if ips else "")
    return line


def _print_epoch(record, epochs):
    print(format_epoch(record, epochs), file=sys.stderr, flush=True)


def _listed(value):
    return None if value is None else list(value)


def _position(epoch, step, global_step) -> str:
    """Where a run stands, in words: ``step 5 of epoch 2`` or ``the end of epoch 1``."""
    where = f"the end of epoch {epoch}" if step == 0 and epoch > 0 else \
        f"step {step} of epoch {epoch + 1}"
    return f"{where}, global step {global_step}"
