"""Losses with PyTorch's reductions (the LogSoftmax layer that feeds NLLLoss is in activation.py).

Every loss is called as ``loss(rt, outputs, labels, grad=True)`` on the
partitions of one batch and returns ``(loss, correct, doutputs or None)``: the
loss and the count of correct argmaxes are REDUX scalars (each partition adds
its share, and the balanced tree makes the sum independent of the schedule;
``SoftmaxCrossEntropy``'s first partition writes them in place instead, with the
codelet's ``overwriting`` twin, so they need no ``fill_zero`` task),
``doutputs`` the partitions of the loss's gradient with respect to the model's
outputs. The mean is over the *whole* batch, whatever the partitioning:
``batch=`` gives its sample count where a call sees only some of its partitions (a
cluster rank's, a pipeline's micro-batch), and ``accumulate=True`` adds into the
scalars the previous call left instead of starting them (a pipeline's micro-batches
after the first, each submitted by its own call).

``reduction`` is ``"mean"`` (PyTorch's default) or ``"sum"``; ``"none"`` (a loss
per sample) has no scalar to differentiate and the trainer needs one, so it
is refused.
"""

from __future__ import annotations

import numpy as np

from ..codelets.loss import argmax_rows, softmax_xent, softmax_xent_eval
from ..codelets.loss_rows import count_correct, mse_loss, nll_loss, one_hot
from ..codelets.reduce import fill_zero, overwriting
from ..errors import ConfigError
from .base import _like_batch

_REDUCTIONS = ("mean", "sum")


class _Loss:
    """Scalar handles per runtime, the reduction, and the argmax prediction."""

    def __init__(self, reduction="mean"):
        if reduction not in _REDUCTIONS:
            raise ConfigError(f"{type(self).__name__}: reduction must be 'mean' or 'sum', got "
                              f"{reduction!r} ('none' gives no scalar loss to train on)")
        self.reduction = reduction
        self._scalars = {}

    def _handles(self, rt, dtype, zero=True):
        """The ``(loss, correct)`` scalars of ``rt``, zeroed by tasks unless ``zero`` is
        False (a loss whose first partition writes them with an ``overwriting`` codelet)."""
        key = (id(rt), np.dtype(dtype))
        h = self._scalars.get(key)
        if h is None or h[0].owner is not rt:
            h = (rt.empty((), dtype, name="loss"), rt.empty((), np.int64, name="correct"))
            self._scalars[key] = h
        if zero:
            rt.submit(fill_zero, h[0])
            rt.submit(fill_zero, h[1])
        return h

    @staticmethod
    def _writer(codelet, index, accumulate):
        """The codelet partition ``index`` submits: the first one of a call that starts the
        loss writes it in place (``overwriting``), the others add (REDUX)."""
        return codelet if index or accumulate else overwriting(codelet)

    def _divisor(self, outputs, per_sample=False, batch=None):
        """What the sum is divided by; ``batch``: the batch's sample count when
        ``outputs`` are only some of its partitions (a cluster worker's)."""
        if self.reduction == "sum":
            return 1
        n = sum(x.shape[0] for x in outputs) if batch is None else batch
        return n * int(np.prod(outputs[0].shape[1:])) if per_sample else n

    @staticmethod
    def predict(rt, logits):
        """Submit the argmax of every row; returns the partitions of the predictions."""
        preds = _like_batch(rt, logits, (), np.int64, "pred")
        for lg, p in zip(logits, preds):
            rt.submit(argmax_rows, lg, p)
        return preds

    def extra_repr(self):
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class SoftmaxCrossEntropy(_Loss):
    """``torch.nn.CrossEntropyLoss(reduction="mean", label_smoothing=0.0)`` over logits
    ``(n, K)`` and int labels (fused softmax and NLL, one task per partition)."""

    def __init__(self, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        try:
            eps = float(label_smoothing)
        except (TypeError, ValueError):
            eps = float("nan")
        if not 0.0 <= eps <= 1.0:
            raise ConfigError(f"SoftmaxCrossEntropy: label_smoothing must be in [0, 1], got "
                              f"{label_smoothing!r}")
        self.label_smoothing = eps

    def __call__(self, rt, logits, labels, *, grad=True, batch=None, accumulate=False):
        """Submit the loss over partitions; returns ``(loss, correct, dlogits or None)``.
        ``batch``: the divisor's sample count when ``logits`` are part of a batch;
        ``accumulate``: add into the loss and count the previous call left (a pipeline's
        later micro-batches) instead of starting them."""
        batch = self._divisor(logits, batch=batch)
        dtype = logits[0].dtype
        loss, correct = self._handles(rt, dtype, zero=False)
        eps = self.label_smoothing
        # the first partition writes loss and count in place; the others add (REDUX)
        if not grad:
            for i, (lg, y) in enumerate(zip(logits, labels)):
                codelet = self._writer(softmax_xent_eval, i, accumulate)
                rt.submit(codelet, lg, y, loss, correct, batch=batch, label_smoothing=eps)
            return loss, correct, None
        dlogits = _like_batch(rt, logits, logits[0].shape[1:], dtype, "dlogits")
        for i, (lg, y, dl) in enumerate(zip(logits, labels, dlogits)):
            codelet = self._writer(softmax_xent, i, accumulate)
            rt.submit(codelet, lg, y, dl, loss, correct, batch=batch, label_smoothing=eps)
        return loss, correct, dlogits

    def extra_repr(self):
        parts = [super().extra_repr()] + ([f"label_smoothing={self.label_smoothing}"]
                                          if self.label_smoothing else [])
        return ", ".join(p for p in parts if p)


CrossEntropyLoss = SoftmaxCrossEntropy


class NLLLoss(_Loss):
    """``torch.nn.NLLLoss(reduction="mean")`` over log-probabilities ``(n, K)`` (a model
    ending with :class:`LogSoftmax`) and int labels."""

    def __call__(self, rt, logp, labels, *, grad=True, batch=None, accumulate=False):
        batch = self._divisor(logp, batch=batch)
        loss, correct = self._handles(rt, logp[0].dtype, zero=not accumulate)
        dlogp = _like_batch(rt, logp, logp[0].shape[1:], logp[0].dtype, "dlogp")
        for lp, y, dl in zip(logp, labels, dlogp):
            rt.submit(nll_loss, lp, y, dl, loss, batch=batch)
            rt.submit(count_correct, lp, y, correct)
        return loss, correct, dlogp if grad else None


class MSELoss(_Loss):
    """``torch.nn.MSELoss(reduction="mean")``: the mean of ``(output - target)**2`` over
    every element.

    Targets of the outputs' shape and dtype are used as given; int labels (what the
    trainer passes) become one-hot targets, ``F.mse_loss(out, F.one_hot(y, K).to(out))``,
    and also count the correct argmaxes (0 with float targets).
    """

    def __call__(self, rt, outputs, targets, *, grad=True, batch=None, accumulate=False):
        numel = self._divisor(outputs, per_sample=True, batch=batch)
        dtype = outputs[0].dtype
        loss, correct = self._handles(rt, dtype, zero=not accumulate)
        labels = targets[0].dtype.kind in "iu"
        if labels:
            onehot = _like_batch(rt, outputs, outputs[0].shape[1:], dtype, "target")
            for y, t in zip(targets, onehot):
                rt.submit(one_hot, y, t)
            for x, y in zip(outputs, targets):
                rt.submit(count_correct, x, y, correct)
            targets = onehot
        dout = _like_batch(rt, outputs, outputs[0].shape[1:], dtype, "doutput")
        for x, t, dx in zip(outputs, targets, dout):
            rt.submit(mse_loss, x, t, dx, loss, numel=numel)
        return loss, correct, dout if grad else None
