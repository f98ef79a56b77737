"""Losses of spiking networks over the output layer's ``(N, T, K)`` record.

Called as every loss of :mod:`hetero_nn.layers.loss` is: ``loss(rt, outputs, labels,
grad=True)`` on the partitions of one batch, returning ``(loss, correct, doutputs or
None)``; the first partition writes the loss and the correct count in place (the
codelet's ``overwriting`` twin), the others add (REDUX). ``correct`` and
:meth:`predict` use the spike counts (snnTorch's ``accuracy_rate``), whichever the loss.
The codelets and their maths are in :mod:`hetero_nn.codelets.spike_loss`.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..codelets.spike_loss import (membrane_xent, membrane_xent_eval, spike_count_argmax,
                                   spike_count_xent, spike_count_xent_eval)
from ..errors import ConfigError
from .base import _like_batch
from .loss import _Loss

__all__ = ["MembraneCrossEntropy", "SpikeCountCrossEntropy"]


class _SpikeLoss(_Loss):
    fwd = eval_fwd = None

    def _kw(self):
        return {}

    def __call__(self, rt, outputs, labels, *, grad=True, batch=None, accumulate=False):
        """Submit the loss over partitions; returns ``(loss, correct, doutputs or None)``."""
        if len(outputs[0].shape) != 3:
            raise ConfigError(f"{type(self).__name__}: expects the output layer's record "
                              f"(N, T, K), got partitions of shape {outputs[0].shape}")
        batch = self._divisor(outputs, batch=batch)
        loss, correct = self._handles(rt, outputs[0].dtype, zero=False)
        kw = {"batch": batch, **self._kw()}
        if not grad:
            for i, (out, y) in enumerate(zip(outputs, labels)):
                codelet = self._writer(self.eval_fwd, i, accumulate)
                rt.submit(codelet, out, y, loss, correct, **kw)
            return loss, correct, None
        douts = _like_batch(rt, outputs, outputs[0].shape[1:], outputs[0].dtype, "doutput")
        for i, (out, y, dout) in enumerate(zip(outputs, labels, douts)):
            codelet = self._writer(self.fwd, i, accumulate)
            rt.submit(codelet, out, y, dout, loss, correct, **kw)
        return loss, correct, douts

    def _threshold(self):
        return None

    def predict(self, rt, outputs):
        """Submit the class with the most spikes of every sample; returns the partitions."""
        preds = _like_batch(rt, outputs, (), np.int64, "pred")
        for out, p in zip(outputs, preds):
            rt.submit(spike_count_argmax, out, p, threshold=self._threshold())
        return preds


class MembraneCrossEntropy(_SpikeLoss):
    """The cross-entropy of the output membrane at every step, summed over the steps
    (``sum_t CrossEntropyLoss()(mem[t], y)``, snnTorch's tutorials), for an output
    :class:`~hetero_nn.layers.LIF` with ``output="membrane"``.

    Parameters
    ----------
    threshold : float
        The output layer's firing threshold: accuracy counts the spikes ``U > threshold``.
    reduction : {"mean", "sum"}
        Over the batch, at each step.
    """

    fwd, eval_fwd = membrane_xent, membrane_xent_eval

    def __init__(self, threshold=1.0, reduction="mean"):
        super().__init__(reduction)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) \
                or not np.isfinite(threshold):
            raise ConfigError(f"MembraneCrossEntropy: threshold must be a finite number, got "
                              f"{threshold!r}")
        self.threshold = float(threshold)

    def _kw(self):
        return {"threshold": self.threshold}

    def _threshold(self):
        return self.threshold

    def extra_repr(self):
        parts = [super().extra_repr()] + ([f"threshold={self.threshold}"]
                                          if self.threshold != 1.0 else [])
        return ", ".join(p for p in parts if p)


class SpikeCountCrossEntropy(_SpikeLoss):
    """The cross-entropy of the output spike counts ``sum_t S[t]`` (snnTorch's
    ``functional.ce_count_loss``), for an output :class:`~hetero_nn.layers.LIF` with
    ``output="spikes"``; ``reduction`` over the batch."""

    fwd, eval_fwd = spike_count_xent, spike_count_xent_eval
