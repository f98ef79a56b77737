"""The trainer: one optimizer step per batch, as one task graph per step.

``train_step(x, y)`` registers the batch, splits it into ``granularity``
partitions, and submits in program order: zero the gradients, the forward
pass, the loss and its gradient, the backward pass (REDUX parameter gradients)
and the optimizer update; then waits and reads the loss. ``fit`` and
``evaluate`` loop over batches with the same path.
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError
from .layers.loss import SoftmaxCrossEntropy
from .optim import SGD
from .scheduler.runtime import Runtime


class Trainer:
    """Trains ``model`` with ``loss`` and ``optimizer`` on ``runtime``.

    Parameters
    ----------
    model : Sequential
    loss : SoftmaxCrossEntropy, optional
    optimizer : Optimizer, optional
        Built without parameters (``hn.optim.SGD(lr=0.05, momentum=0.9)``);
        the trainer binds the model's. Default: SGD(lr=0.01, momentum=0.9).
    runtime : Runtime, optional
        Default: ``Runtime(devices="cpu")``, closed by :meth:`close`.
    batch_size : int
    granularity : int
        Partitions per batch: every per-sample codelet is submitted that many times.
    dtype : str
        ``"float32"`` or ``"float64"``; the model is built for it on the first batch.
    """

    def __init__(self, model, loss=None, optimizer=None, runtime=None, batch_size=64,
                 granularity=1, dtype="float32"):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.model = model
        self.loss = loss if loss is not None else SoftmaxCrossEntropy()
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.01, momentum=0.9)
        self._own_runtime = runtime is None
        self.runtime = runtime if runtime is not None else Runtime(devices="cpu")
        self.batch_size = int(batch_size)
        self.granularity = self._check_granularity(granularity)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ConfigError(f"dtype must be float32 or float64, got {dtype!r}")
        self._bound = None
        self.last_correct = 0

    def _check_granularity(self, g):
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise ConfigError(f"granularity must be a positive integer, got {g!r}")
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
            self.model.bind(rt)
            self.optimizer.bind(self.model.named_parameters(), rt)
            self._bound = rt

    def _split(self, h):
        g = min(self.granularity, h.shape[0])
        return list(h.split(0, g)) if g > 1 else [h]

    def _batch(self, x, y):
        rt = self.runtime
        x = np.ascontiguousarray(x, dtype=self.dtype)
        self._prepare(x)
        xs = self._split(rt.register(x, name="x"))
        ys = None
        if y is not None:
            y = np.ascontiguousarray(y, dtype=np.int64)
            if y.shape != (x.shape[0],):
                raise ConfigError(f"labels of shape {y.shape} do not match a batch of {x.shape[0]} samples")
            ys = self._split(rt.register(y, name="y"))
        return xs, ys

    # ------------------------------------------------------------ steps
    def train_step(self, x, y) -> float:
        """One optimizer step on one batch; returns the batch's mean loss."""
        rt = self.runtime
        xs, ys = self._batch(x, y)
        self.model.zero_grad(rt)
        logits = self.model.forward(rt, xs)
        loss, correct, dlogits = self.loss(rt, logits, ys)
        self.model.backward(rt, dlogits)
        self.optimizer.step(rt)
        value = float(rt.fetch(loss))
        self.last_correct = int(rt.fetch(correct))
        return value

    def evaluate_batch(self, x, y):
        """``(mean loss, correct count)`` of one batch, without updating anything."""
        rt = self.runtime
        xs, ys = self._batch(x, y)
        logits = self.model.forward(rt, xs)
        loss, correct, _ = self.loss(rt, logits, ys, grad=False)
        return float(rt.fetch(loss)), int(rt.fetch(correct))

    def predict(self, x) -> np.ndarray:
        """Predicted class of every sample of ``x`` (in batches of ``batch_size``)."""
        out = []
        for start in range(0, len(x), self.batch_size):
            xs, _ = self._batch(x[start:start + self.batch_size], None)
            logits = self.model.forward(self.runtime, xs)
            preds = self.loss.predict(self.runtime, logits)
            self.runtime.wait()
            out.extend(self.runtime.fetch(p, copy=True) for p in preds)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def close(self):
        if self._own_runtime:
            self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
