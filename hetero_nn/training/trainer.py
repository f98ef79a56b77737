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

Replay: with ``replay=True`` (the default) every train and eval step goes through
the trainer's :class:`~hetero_nn.training.step_cache.StepCache`, which captures the
first step of each *step key* and replays it for the later ones (the rule and the
key are in :mod:`hetero_nn.training.step_cache`). The runtime (devices, policy,
variants) is fixed per trainer and rebinding the model drops the graphs.
``evaluate_batch`` (and so ``evaluate``) and ``predict`` capture and replay the same way
(keys ``"eval"``, ``"predict"``; layers in eval mode); the calibration steps of
``granularity="auto"`` are ordinary steps whose graphs are dropped once the choice is made. Before its second replay a graph fuses the chains of tasks too small for their
dispatch (the runtime's ``fuse_chains``, on by default); :attr:`Trainer.graphs`
shows each graph and its ``bundles``.

``granularity="auto"`` decides when the first batch arrives, from the performance
models after calibration (:mod:`hetero_nn.training.granularity`): the granularity, the
model's fusion and, where the models say a block pays at its own g, the model's
per-block granularities; the decision, with the predicted and the measured step
time, lands in ``granularity_decision``. A checkpoint records the choice and a
resumed ``"auto"`` run adopts it.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

from ..arena.arena import ArenaPair
from ..errors import CheckpointError, ConfigError
from ..layers.base import evaluating
from ..layers.events import measure_rates
from ..layers.loss import SoftmaxCrossEntropy
from ..optim import SGD, LRScheduler, submit_clip_grad_norm
from ..energy import EnergyMeter
from ..scheduler.runtime import Runtime
from . import checkpoint
from .checkpoint import CHECKPOINT_NAME, FINAL_NAME
from .loader import as_data, epoch_batches, trainer_dtype
from .progress import (add_step, diverged, epoch_record, last_checkpoint, new_progress,
                       print_epoch, progress_bar, running)
from .runners import connect_trainer, make_pipeline
from .step_cache import StepCache
from .granularity import choose_granularity

#: Keys of every per-epoch record :meth:`Trainer.fit` returns.
HISTORY_KEYS = ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                "seconds", "images_per_second", "warmup_seconds", "energy_joules",
                "joules_per_image")
#: Partitions per batch without ``granularity=`` (at most the batch size), as the CLI's.
DEFAULT_GRANULARITY = 2

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
        Partitions per batch (default 2 as the CLI's, at most the batch size): every
        per-sample codelet is submitted that many times. ``"auto"``: chosen from the
        models at the first batch (:mod:`hetero_nn.training.granularity`), per block.
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
        Train on a Dask cluster (``"local:N"``, ``"tcp://HOST:PORT"``, a client or a
        :class:`hetero_nn.training.cluster.Cluster`), whose workers hold the run between steps
        (:meth:`sync`). See :mod:`hetero_nn.training.cluster`; a cluster made from a string
        or client is closed by :meth:`close`.
    pipeline : int or list of lists of layers, optional
        Cut the model into stages, each on its own workers (``stage_devices``, e.g.
        ``["cpu:1", "cuda-emu:1"]``; default: the runtime's workers in equal groups), the
        partitions as micro-batches, ordered by ``pipeline_schedule`` (``"1f1b"``, ``"gpipe"``:
        bit-identical weights; ``"pipedream"``: asynchronous). See :mod:`.pipeline.stages`.

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
                 granularity=None, dtype=None, seed=0, *, scheduler=None,
                 scheduler_interval=None, clip_grad_norm=None, augment=None, cluster=None,
                 replay=True, pipeline=None, stage_devices=None, pipeline_schedule="1f1b"):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.dtype = trainer_dtype(model, dtype)  # before a runtime exists to leak
        self.model = model
        self.loss = loss if loss is not None else SoftmaxCrossEntropy()
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.02, momentum=0.9)
        self._own_runtime = runtime is None
        self.runtime = runtime if runtime is not None else Runtime(devices="cpu", trace=False)
        try:  # a bad argument below must not leak the runtime made above
            self.batch_size = int(batch_size)
            self.auto_granularity = isinstance(granularity, str) and granularity == "auto"
            granularity = min(DEFAULT_GRANULARITY, batch_size) if granularity is None else granularity
            self.granularity = None if self.auto_granularity else self.check_granularity(granularity)
            #: What ``granularity="auto"`` chose (a GranularityDecision), None before.
            self.granularity_decision = None
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise ConfigError(f"seed must be an integer, got {seed!r}")
            self.seed = int(seed)
            self._init_training_options(scheduler, scheduler_interval, clip_grad_norm, augment)
            self._bound = None
            self.replay = bool(replay)
            #: The captured steps, by step key (:mod:`hetero_nn.training.step_cache`).
            self.step_cache = StepCache(self)
            self._batch_arenas = ArenaPair("batches")
            self.last_correct = 0
            # the run's position (see the module docstring)
            self.epoch = 0
            self.step_in_epoch = 0
            self.global_step = 0
            self.history: list[dict] = []
            self.progress = new_progress()
            self.last_checkpoint: dict | None = None
            self._checkpoint_dir = None
            self._warmed_up = False  # the first step of this process is timed apart (compilation)
            #: Extra JSON-serialisable facts stored in every checkpoint's config (the CLI's options).
            self.config: dict = {}
            #: The EnergyMeter ``fit`` reads per epoch (made at the first ``fit``).
            self.energy = None
            #: The stages of ``pipeline=`` (a :class:`~hetero_nn.training.pipeline.stages.Pipeline`).
            self.pipeline = make_pipeline(model, pipeline, stage_devices, pipeline_schedule,
                                          cluster)
            self.cluster = None
            if cluster is not None:
                self.cluster, self._own_cluster = connect_trainer(self, cluster)
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

    def check_granularity(self, g) -> int:
        """``g`` as an int if it is a granularity this trainer can run, else ConfigError."""
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise ConfigError(f"granularity must be a positive integer or 'auto', got {g!r}")
        if g > self.batch_size:
            raise ConfigError(f"granularity {g} is larger than the batch size {self.batch_size}")
        return int(g)

    # ------------------------------------------------------------ setup
    def prepare(self, x) -> None:
        """Build the model for the samples of ``x`` in the trainer's dtype (if it is not
        already) and bind it and the optimizer to the runtime (dropping the captured
        graphs, which hold the handles of the previous binding)."""
        rt = self.runtime
        sample = tuple(x.shape[1:])
        if self.model.input_shape != sample or self.model.dtype != self.dtype:
            self.model.build(sample, self.dtype)
            self._bound = None
        if self._bound is not rt:
            self.step_cache.clear()
            self.model.bind(rt)
            self.optimizer.bind(self.model.named_parameters(), rt)
            self._bound = rt

    def ready(self, x, y):
        """``x`` contiguous in the trainer's dtype, once the granularity is resolved (tuned
        on ``(x, y)`` if "auto") and the model built and bound for it (:meth:`prepare`)."""
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if self.granularity is None:
            self.tune_granularity(x, y)
        self.prepare(x)
        return x

    def unbind(self) -> None:
        """Forget the binding and the captured graphs: the next batch binds the model's
        arrays afresh (after its state was replaced behind the runtime's back)."""
        self._bound = None
        self.step_cache.clear()
        if self.cluster is not None:  # the workers train from the state here next
            self.cluster.invalidate()

    def split(self, h) -> list:
        """The partitions of the batch handle ``h`` at the trainer's granularity."""
        g = min(self.granularity, h.shape[0])
        return list(h.split(0, g)) if g > 1 else [h]

    def register_batch(self, x, y):
        """``(xs, ys)``: the batch registered with the runtime and split into partitions
        (``ys`` None without labels); resolves the granularity and prepares the model."""
        rt = self.runtime
        x = self.ready(x, y)
        xs = self.split(rt.register(x, name="x"))
        ys = None
        if y is not None:
            ys = self.split(rt.register(self.labels(x, y), name="y"))
        return xs, ys

    @staticmethod
    def labels(x, y) -> np.ndarray:
        """``y`` as the int64 labels of the batch ``x`` (ConfigError if they do not fit)."""
        y = np.ascontiguousarray(y, dtype=np.int64)
        if y.shape != (x.shape[0],):
            raise ConfigError(f"labels of shape {y.shape} do not match a batch of {x.shape[0]} samples")
        return y

    # ------------------------------------------------------------ steps
    def train_step(self, x, y) -> float:
        """One optimizer step on one batch; returns the batch's mean loss."""
        if self.cluster is not None:
            return self.cluster.train_step(self, x, y)
        if self.pipeline is not None and self.pipeline.runtime is not self.runtime:
            self.pipeline.bind(self, x, y)  # its stages and workers, at the first step
        key = self.step_cache.key(self.ready(x, y), y, self.optimizer.replay_key())
        if key is None:
            return self._read_step(*self.submit_step(x, y))
        return self._read_step(*self.step_cache.run(key, x, y, self._submit_step))

    def submit_step(self, x, y):
        """Submit one optimizer step on ``(x, y)`` without waiting and without the step
        cache; returns the handles of its loss, correct count and squared gradient norm
        (None without clipping)."""
        return self._submit_step(*self.register_batch(x, y))

    def _submit_step(self, xs, ys):
        if self.pipeline is not None:
            return self.pipeline.submit_stages(self, xs, ys)
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
        measure_rates(self.model, rt)  # the spike rates the next steps' variants are chosen at
        return value

    @property
    def graphs(self) -> dict:
        """The captured graphs kept, by step key (a copy of the mapping); each one's
        ``bundles`` says what task-level fusion did to it."""
        return self.step_cache.graphs

    @property
    def graphs_captured(self) -> int:
        """Graphs captured so far (:attr:`StepCache.captured`)."""
        return self.step_cache.captured

    @graphs_captured.setter
    def graphs_captured(self, value):
        self.step_cache.captured = value

    def pull_state(self) -> None:
        """Bring the run's state here from the cluster's workers (done before evaluations,
        predictions, checkpoints, at the end of ``fit`` and when the cluster closes)."""
        if self.cluster is not None:
            self.cluster.pull(self)

    sync = pull_state  # the former name (not an executor="sync" matter), kept for callers

    def evaluate_batch(self, x, y):
        """``(mean loss, correct count)`` of one batch in eval mode, without updating anything."""
        self.pull_state()
        loss, correct = self._eval_step(x, y, "eval", self._submit_eval)
        return float(self.runtime.fetch(loss)), int(self.runtime.fetch(correct))

    def _eval_step(self, x, y, what, submit):
        """``submit``'s results on ``(x, y)`` in eval mode: replayed by the step cache
        as a step of kind ``what``, or submitted where it does not replay."""
        with evaluating(self.model):
            key = self.step_cache.key(self.ready(x, y), y, what)
        if key is None:
            return submit(*self.register_batch(x, y))
        return self.step_cache.run(key, x, y, submit)

    def _submit_eval(self, xs, ys):
        loss, correct, _ = self.loss(self.runtime, self._submit_logits(xs), ys, grad=False)
        return loss, correct

    def _submit_logits(self, xs):
        with evaluating(self.model):
            return self.model.forward(self.runtime, xs)

    def predict(self, x) -> np.ndarray:
        """Predicted class of every sample of ``x`` (in batches of ``batch_size``), in eval
        mode; each batch shape captured once and replayed, as ``evaluate``'s."""
        self.pull_state()
        out = []
        for start in range(0, len(x), self.batch_size):
            preds = self._eval_step(x[start:start + self.batch_size], None, "predict",
                                    self._submit_predict)
            out.extend(self.runtime.fetch(p, copy=True) for p in preds)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _submit_predict(self, xs, _):
        return self.loss.predict(self.runtime, self._submit_logits(xs))

    # ------------------------------------------------------------ granularity
    def tune_granularity(self, x, y=None, candidates=None, per_layer=True) -> int:
        """Choose and set the granularity (and fusion, and per-layer g) from the models.

        Calibrates, predicts each candidate's step by simulation, chooses, and measures
        the choice on ``(x, y)`` (:mod:`hetero_nn.training.granularity`); the weights, buffers,
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

        self.granularity_decision = choose_granularity(self, x, y, candidates, per_layer)
        return self.granularity

    # ------------------------------------------------------------ epochs
    def evaluate(self, dataset, batch_size=None) -> tuple[float, float]:
        """``(mean loss, accuracy)`` over ``dataset`` (a Dataset or an ``(x, y)`` pair), in order."""
        data = as_data(dataset, "evaluate")
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
            Where ``checkpoint.npz`` is written every ``checkpoint_every`` steps and at each
            epoch end, ``checkpoint-final.npz`` at the end; refused if it holds another
            run's (not the one this trainer saved or loaded), as the CLI's ``--out``.
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
        data = as_data(train, "fit")
        val = None if validation is None else as_data(validation, "fit validation")
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
        ckdir = None if checkpoint_dir is None else checkpoint.run_folder(self, checkpoint_dir)
        bar_wanted = verbose >= 2 or (verbose >= 1 and sys.stderr.isatty())
        if self.energy is None:
            self.energy = EnergyMeter()
        while self.epoch < epochs:
            e = self.epoch
            order = data.epoch_order(self.seed, e) if shuffle else np.arange(n)
            if self.granularity is None and self.cluster is None:  # a cluster tunes at its step
                self.tune_granularity(*data.batch(order[:bs], dtype=self.dtype))
            progress = self.progress
            bar = progress_bar(num_batches, self.step_in_epoch, f"epoch {e + 1}/{epochs}",
                               not bar_wanted)
            self.energy.start()
            try:
                t_last = time.perf_counter()
                batches = epoch_batches(self, data, order, e, num_batches)
                for b, (x, y) in enumerate(batches, self.step_in_epoch):
                    loss = self.train_step(x, y)
                    if not math.isfinite(loss):
                        raise diverged(self, loss, e, b, epochs, num_batches)
                    add_step(progress, loss, self.last_correct, len(y),
                             time.perf_counter() - t_last, warmup=not self._warmed_up)
                    self._warmed_up = True  # the first step (compilation): out of images/s
                    self.step_in_epoch = b + 1
                    self.global_step += 1
                    if self.scheduler is not None and self.scheduler_interval == "step":
                        self.scheduler.step()
                    if bar is not None:
                        bar.set_postfix_str(running(progress), refresh=False)
                        bar.update(1)
                    if on_step is not None:
                        on_step(self, loss)
                    if (ckdir is not None and checkpoint_every
                            and self.global_step % checkpoint_every == 0 and b + 1 < num_batches):
                        self.save_checkpoint(ckdir / CHECKPOINT_NAME, require_finite=True)
                    t_last = time.perf_counter()
            finally:
                batches.close()  # joins the loader thread, also when a step raised
                energy = self.energy.stop()
                if bar is not None:
                    bar.close()
            if self.scheduler is not None and self.scheduler_interval == "epoch":
                self.scheduler.step()
            record = self._end_epoch(val, energy)
            if ckdir is not None:
                self.save_checkpoint(ckdir / CHECKPOINT_NAME, require_finite=True)
            if self.runtime.perfmodel is not None:  # a killed run keeps its calibration
                self.runtime.perfmodel.save()
            if verbose >= 1:
                print_epoch(record, epochs)
            if on_epoch_end is not None:
                on_epoch_end(self, record)
        if ckdir is not None:
            self.save_checkpoint(ckdir / FINAL_NAME, require_finite=True)
        self.pull_state()
        return [dict(r) for r in self.history]

    def _end_epoch(self, validation, energy=None) -> dict:
        record = epoch_record(self.progress, self.epoch + 1, self.step_in_epoch,
                              self.granularity, energy)
        if validation is not None:
            t0 = time.perf_counter()
            record["test_loss"], record["test_accuracy"] = self.evaluate(validation)
            record["eval_seconds"] = time.perf_counter() - t0
        self.history.append(record)
        self.epoch += 1
        self.step_in_epoch = 0
        self.progress = new_progress()
        return record

    def describe_last_checkpoint(self) -> str:
        """Where the run's last good checkpoint is, for error messages."""
        return last_checkpoint(self)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_config(self) -> dict:
        """What a checkpoint records about the run: trainer settings, model spec, extras."""
        return checkpoint.trainer_config(self)

    def save_checkpoint(self, path, require_finite: bool = False) -> Path:
        """Write the run's whole state to ``path`` (atomically; see
        :mod:`hetero_nn.training.checkpoint`).

        With ``require_finite`` (as ``fit`` does), a NaN or infinite weight or
        optimizer buffer raises :class:`TrainingDiverged` instead, so the file on
        disk stays the last good one.
        """
        self.pull_state()
        return checkpoint.save_trainer(self, path, require_finite)

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
        return checkpoint.load_trainer(self, path)

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
