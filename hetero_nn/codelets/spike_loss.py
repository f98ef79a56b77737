"""Loss codelets of spiking networks: cross-entropy over time, and spike-count accuracy.

This module owns

=====================  ============================================================
codelet                operands (access mode)
=====================  ============================================================
membrane_xent          out (R), labels (R), dout (W), loss (REDUX), correct (REDUX)
membrane_xent_eval     out (R), labels (R), loss (REDUX), correct (REDUX)
spike_count_xent       out (R), labels (R), dout (W), loss (REDUX), correct (REDUX)
spike_count_xent_eval  out (R), labels (R), loss (REDUX), correct (REDUX)
spike_count_argmax     out (R), pred (W)
=====================  ============================================================

``out`` is the output layer's ``(n, T, K)`` record; ``batch`` (a parameter) is the whole
batch's sample count ``B`` (1 for ``reduction='sum'``), as in :mod:`~hetero_nn.codelets.loss`.

- ``membrane_xent``: ``out`` is the membrane ``U``; the loss is the sum over the steps of
  the mean cross-entropy of ``U[:, t]`` (snnTorch's tutorials: ``loss += CE(mem[t], y)``),
  i.e. ``sum_{i, t} -log softmax(U[i, t])[y_i] / B``; ``dout[i, t] = (softmax(U[i, t]) -
  onehot(y_i)) / B``. The per-row maths is :func:`~hetero_nn.codelets.loss.softmax_xent`'s
  over the ``n * T`` rows with each label repeated ``T`` times.
- ``spike_count_xent``: ``out`` is spikes ``S``; the loss is the mean cross-entropy of the
  spike counts ``C[i] = sum_t S[i, t]`` (snnTorch's ``ce_count_loss``), and every step of a
  sample gets the counts' gradient: ``dout[i, t] = (softmax(C[i]) - onehot(y_i)) / B``.
- ``correct`` counts the samples whose spike count is largest at their label (first index
  on ties, as ``torch.max``), the spikes of a membrane record being ``U > threshold``
  (snnTorch's ``accuracy_rate``); ``spike_count_argmax`` writes that prediction.

Variants: ``ref`` and ``cpu`` call the NumPy and Numba cross-entropy of
:mod:`~hetero_nn.codelets.loss` on the rows; ``cuda`` its array-module variant (CuPy on a
GPU, NumPy in CI).
"""

from __future__ import annotations

import math

import numpy as np

from .codelet import REDUX, R, W, Codelet
from .loss import (_check_labels_cpu, _check_labels_xp, _softmax_xent_cpu_wrapper,
                   _softmax_xent_cuda, _softmax_xent_eval_cpu_wrapper, _softmax_xent_eval_cuda,
                   _softmax_xent_eval_ref, _softmax_xent_ref)
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["membrane_xent", "membrane_xent_eval", "spike_count_xent", "spike_count_xent_eval",
           "spike_count_argmax"]


def _check(name, out, labels):
    if out.ndim != 3 or labels.shape != (out.shape[0],):
        raise ValueError(f"{name}: expected out[n, T, K] and labels[n], got shapes "
                         f"{out.shape} and {labels.shape}")


def _counts(xp, out, threshold):
    """Spike counts ``(n, K)``: of ``out`` itself, or of ``out > threshold`` (a membrane)."""
    spikes = out if threshold is None else (out > threshold)
    return spikes.sum(axis=1, dtype=out.dtype)


def _count_correct(xp, out, labels, threshold):
    return (_counts(xp, out, threshold).argmax(axis=1) == labels).sum()  # stays on the device


_XENT = {  # variant -> (with gradient, without): the cross-entropy of loss.py over rows
    "ref": (_softmax_xent_ref, _softmax_xent_eval_ref),
    "cpu": (_softmax_xent_cpu_wrapper, _softmax_xent_eval_cpu_wrapper),
    "cuda": (_softmax_xent_cuda, _softmax_xent_eval_cuda),
}


def _labels_ok(variant, xp, name, out, labels):
    if variant == "cpu":
        _check_labels_cpu(name, out[:, 0], labels)
    elif xp is np:  # on a device the cross-entropy variant flags bad labels there
        _check_labels_xp(name, xp, labels, out.shape[2])


# --------------------------------------------------------------------------- membrane

def _membrane(variant, grad):
    xent = _XENT[variant][0 if grad else 1]
    name = "membrane_xent" if grad else "membrane_xent_eval"

    def run(out, labels, *rest, batch, threshold=1.0):
        xp = array_module(out, labels)
        _check(name, out, labels)
        _labels_ok(variant, xp, name, out, labels)
        n, T, K = out.shape
        rows = xp.repeat(labels, T)
        unused = xp.zeros((), np.int64)  # the per-row argmax count: not this loss's accuracy
        if grad:
            dout, loss, correct = rest
            if dout.shape != out.shape:
                raise ValueError(f"{name}: dout {dout.shape} != out {out.shape}")
            xent(out.reshape(n * T, K), rows, dout.reshape(n * T, K), loss, unused, batch=batch)
        else:
            loss, correct = rest
            xent(out.reshape(n * T, K), rows, loss, unused, batch=batch)
        correct[...] += _count_correct(xp, out, labels, threshold)
    run.__name__ = f"{name}_{variant}"
    return run


# --------------------------------------------------------------------------- spike count

def _spike_count(variant, grad):
    xent = _XENT[variant][0 if grad else 1]
    name = "spike_count_xent" if grad else "spike_count_xent_eval"

    def run(out, labels, *rest, batch):
        xp = array_module(out, labels)
        _check(name, out, labels)
        counts = xp.ascontiguousarray(_counts(xp, out, None))
        if grad:
            dout, loss, correct = rest
            if dout.shape != out.shape:
                raise ValueError(f"{name}: dout {dout.shape} != out {out.shape}")
            dcounts = xp.empty_like(counts)
            xent(counts, labels, dcounts, loss, correct, batch=batch)
            dout[...] = dcounts[:, None]
        else:
            loss, correct = rest
            xent(counts, labels, loss, correct, batch=batch)
    run.__name__ = f"{name}_{variant}"
    return run


def _argmax(out, pred, *, threshold=None):
    xp = array_module(out, pred)
    if out.ndim != 3 or pred.shape != (out.shape[0],):
        raise ValueError(f"spike_count_argmax: expected out[n, T, K] and pred[n], got "
                         f"{out.shape} and {pred.shape}")
    pred[...] = _counts(xp, out, threshold).argmax(axis=1)


# --------------------------------------------------------------------------- declarations

def _flops(out, *rest, **params):
    return 6.0 * math.prod(out)


def _declare(name, make, grad):
    return Codelet(name, modes=(R, R) + ((W,) if grad else ()) + (REDUX, REDUX),
                   variants={v: make(v, grad) for v in ("ref", "cpu", "cuda")},
                   init=zero_init, redux=add_redux, flops=_flops)


membrane_xent = _declare("membrane_xent", _membrane, True)
"""Cross-entropy of the membrane summed over time, its gradient, spike-count accuracy."""
membrane_xent_eval = _declare("membrane_xent_eval", _membrane, False)
"""``membrane_xent`` without the gradient."""
spike_count_xent = _declare("spike_count_xent", _spike_count, True)
"""Cross-entropy of the spike counts, its gradient (every step), spike-count accuracy."""
spike_count_xent_eval = _declare("spike_count_xent_eval", _spike_count, False)
"""``spike_count_xent`` without the gradient."""

spike_count_argmax = Codelet(
    "spike_count_argmax", modes=(R, W),
    variants={"ref": _argmax, "cpu": _argmax, "cuda": _argmax},
    flops=lambda out, pred, **params: float(math.prod(out)))
"""``pred[i] = argmax_k sum_t spikes[i, t, k]`` (spikes ``out > threshold`` for a membrane
record, ``out`` itself with ``threshold=None``); first index on ties."""
