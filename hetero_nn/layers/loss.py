"""Softmax cross-entropy: mean over the whole batch, its gradient, the correct count.

The loss and the count are REDUX scalars: each partition adds its share, and
the balanced tree makes the sum independent of the schedule.
"""

from __future__ import annotations

import numpy as np

from ..codelets.loss import argmax_rows, softmax_xent, softmax_xent_eval
from ..codelets.reduce import fill_zero
from .base import _like_batch


class SoftmaxCrossEntropy:
    """``torch.nn.CrossEntropyLoss()`` (mean reduction) over logits ``(n, K)`` and int labels."""

    def __init__(self):
        self._scalars = {}

    def _handles(self, rt, dtype):
        key = (id(rt), np.dtype(dtype))
        h = self._scalars.get(key)
        if h is None or h[0].owner is not rt:
            h = (rt.empty((), dtype, name="loss"), rt.empty((), np.int64, name="correct"))
            self._scalars[key] = h
        return h

    def __call__(self, rt, logits, labels, *, grad=True, batch=None):
        """Submit the loss over partitions; returns ``(loss, correct, dlogits or None)``.

        ``batch``: the sample count the mean is over, when ``logits`` are only some of
        the batch's partitions (a cluster worker's block); default their total.
        """
        if batch is None:
            batch = sum(x.shape[0] for x in logits)
        dtype = logits[0].dtype
        loss, correct = self._handles(rt, dtype)
        rt.submit(fill_zero, loss)
        rt.submit(fill_zero, correct)
        if not grad:
            for lg, y in zip(logits, labels):
                rt.submit(softmax_xent_eval, lg, y, loss, correct, batch=batch)
            return loss, correct, None
        dlogits = _like_batch(rt, logits, logits[0].shape[1:], dtype, "dlogits")
        for lg, y, dl in zip(logits, labels, dlogits):
            rt.submit(softmax_xent, lg, y, dl, loss, correct, batch=batch)
        return loss, correct, dlogits

    @staticmethod
    def predict(rt, logits):
        """Submit the argmax of every row; returns the partitions of the predictions."""
        preds = _like_batch(rt, logits, (), np.int64, "pred")
        for lg, p in zip(logits, preds):
            rt.submit(argmax_rows, lg, p)
        return preds

    def __repr__(self):
        return "SoftmaxCrossEntropy()"
