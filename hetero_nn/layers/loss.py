"""Softmax cross-entropy: mean over the whole batch, its gradient, the correct count.

The loss and the count are written by the first partition's task (the
codelet's ``overwriting`` twin) and the other partitions add their shares
(REDUX); the balanced tree makes the sum independent of the schedule.
"""

from __future__ import annotations

import numpy as np

from ..codelets.loss import argmax_rows, softmax_xent, softmax_xent_eval
from ..codelets.reduce import overwriting
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

    def __call__(self, rt, logits, labels, *, grad=True):
        """Submit the loss over partitions; returns ``(loss, correct, dlogits or None)``."""
        batch = sum(x.shape[0] for x in logits)
        dtype = logits[0].dtype
        loss, correct = self._handles(rt, dtype)
        # the first partition writes loss and count in place; the others add (REDUX)
        if not grad:
            for i, (lg, y) in enumerate(zip(logits, labels)):
                codelet = softmax_xent_eval if i else overwriting(softmax_xent_eval)
                rt.submit(codelet, lg, y, loss, correct, batch=batch)
            return loss, correct, None
        dlogits = _like_batch(rt, logits, logits[0].shape[1:], dtype, "dlogits")
        for i, (lg, y, dl) in enumerate(zip(logits, labels, dlogits)):
            codelet = softmax_xent if i else overwriting(softmax_xent)
            rt.submit(codelet, lg, y, dl, loss, correct, batch=batch)
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
