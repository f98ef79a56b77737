"""Softmax cross-entropy codelets (training and evaluation) and row-wise argmax.

A mini-batch of ``B`` samples is split into partitions; each task sees one
partition ``logits[n, K]`` but the loss is PyTorch's ``reduction='mean'`` over
the *whole* batch, so every task divides by the parameter ``batch = B``:

- ``loss`` (REDUX, 0-d) ``+= sum_i -log softmax(logits_i)[label_i] / B``;
- ``dlogits`` (W) ``= (softmax(logits) - onehot(labels)) / B``, the gradient of
  the mean loss with respect to this partition's logits;
- ``correct`` (REDUX, 0-d int64) ``+= count(argmax(logits_i) == label_i)``,
  argmax ties going to the first index like ``torch.argmax``.

The softmax is numerically stable: the row maximum is subtracted before the
exponentials, and ``log softmax = (x - max) - log(sum(exp(x - max)))`` as in
PyTorch's ``log_softmax``. A label outside ``[0, K)`` raises ``ValueError``
naming the row and the label before anything is read with it.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, jit_inline
from .codelet import REDUX, R, W, Codelet
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["softmax_xent", "softmax_xent_eval", "argmax_rows"]


def _check_logits(name, logits, labels):
    if logits.ndim != 2 or labels.ndim != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"{name}: expected logits[n, K] and labels[n], got shapes "
                         f"{logits.shape} and {labels.shape}")


def _bad_label_error(name, row, label, n_classes):
    return ValueError(f"{name}: label {label} of row {row} is outside [0, {n_classes})")


def _check_labels_xp(name, xp, labels, n_classes):
    """Raise on the first label outside ``[0, K)`` (one reduction, one host sync on a GPU)."""
    if labels.shape[0] == 0:
        return
    bad = (labels < 0) | (labels >= n_classes)
    if bool(bad.any()):
        row = int(xp.argmax(bad))
        raise _bad_label_error(name, row, int(labels[row]), n_classes)


# --------------------------------------------------------------------------- NumPy reference

def _log_softmax_ref(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _softmax_xent_ref(logits, labels, dlogits, loss, correct, *, batch):
    _check_logits("softmax_xent", logits, labels)
    _check_labels_xp("softmax_xent", np, labels, logits.shape[1])
    rows = np.arange(logits.shape[0])
    log_probs = _log_softmax_ref(logits)
    loss[...] += -log_probs[rows, labels].sum() / batch
    correct[...] += np.count_nonzero(logits.argmax(axis=1) == labels)
    inv_batch = dlogits.dtype.type(1.0 / batch)
    dlogits[...] = np.exp(log_probs) * inv_batch
    dlogits[rows, labels] -= inv_batch


def _softmax_xent_eval_ref(logits, labels, loss, correct, *, batch):
    _check_logits("softmax_xent_eval", logits, labels)
    _check_labels_xp("softmax_xent_eval", np, labels, logits.shape[1])
    rows = np.arange(logits.shape[0])
    log_probs = _log_softmax_ref(logits)
    loss[...] += -log_probs[rows, labels].sum() / batch
    correct[...] += np.count_nonzero(logits.argmax(axis=1) == labels)


def _argmax_rows_ref(logits, pred):
    np.argmax(logits, axis=1, out=pred)


# --------------------------------------------------------------------------- Numba kernels

@jit
def _first_bad_label_cpu(labels, n_classes):
    """Row of the first label outside ``[0, n_classes)``, or -1."""
    for i in range(labels.shape[0]):
        if labels[i] < 0 or labels[i] >= n_classes:
            return i
    return -1


@jit_inline
def _row_max_cpu(logits, i):
    """``(max, first argmax)`` of row ``i`` (the first maximum wins, as torch.argmax)."""
    row_max = logits[i, 0]
    best = 0
    for k in range(1, logits.shape[1]):
        if logits[i, k] > row_max:
            row_max = logits[i, k]
            best = k
    return row_max, best


@jit
def _softmax_xent_cpu(logits, labels, dlogits, inv_batch, with_grad):
    """Return ``(sum of -log p[label], number of correct argmaxes)``; fill dlogits if asked.

    The caller has checked the labels. Per row: max and first argmax, then
    ``s = sum exp(x - max)``, ``-log p_label = -((x_label - max) - log s)`` and
    ``p_k = exp(x_k - max) / s`` (each exponential computed once).
    """
    n_rows, n_classes = logits.shape
    total = 0.0
    correct = 0
    for i in range(n_rows):
        row_max, best = _row_max_cpu(logits, i)
        sum_exp = inv_batch - inv_batch  # zero in the logits' dtype
        if with_grad:
            for k in range(n_classes):
                e = np.exp(logits[i, k] - row_max)
                dlogits[i, k] = e
                sum_exp += e
        else:
            for k in range(n_classes):
                sum_exp += np.exp(logits[i, k] - row_max)
        label = labels[i]
        total -= (logits[i, label] - row_max) - np.log(sum_exp)
        if best == label:
            correct += 1
        if with_grad:
            scale = inv_batch / sum_exp
            for k in range(n_classes):
                dlogits[i, k] *= scale
            dlogits[i, label] -= inv_batch
    return total, correct


@jit
def _argmax_rows_cpu(logits, pred):
    for i in range(logits.shape[0]):
        pred[i] = _row_max_cpu(logits, i)[1]


def _check_labels_cpu(name, logits, labels):
    row = _first_bad_label_cpu(labels, logits.shape[1])
    if row >= 0:
        raise _bad_label_error(name, row, int(labels[row]), logits.shape[1])


def _softmax_xent_cpu_wrapper(logits, labels, dlogits, loss, correct, *, batch):
    _check_logits("softmax_xent", logits, labels)
    if dlogits.shape != logits.shape:
        raise ValueError(f"softmax_xent: dlogits {dlogits.shape} != logits {logits.shape}")
    _check_labels_cpu("softmax_xent", logits, labels)
    if logits.shape[1] == 0 or logits.shape[0] == 0:
        dlogits[...] = 0
        return
    inv_batch = dlogits.dtype.type(1.0 / batch)
    total, n_correct = _softmax_xent_cpu(logits, labels, dlogits, inv_batch, True)
    loss[...] += total / batch
    correct[...] += n_correct


def _softmax_xent_eval_cpu_wrapper(logits, labels, loss, correct, *, batch):
    _check_logits("softmax_xent_eval", logits, labels)
    _check_labels_cpu("softmax_xent_eval", logits, labels)
    if logits.shape[1] == 0 or logits.shape[0] == 0:
        return
    no_grad = np.empty((0, 0), logits.dtype)
    total, n_correct = _softmax_xent_cpu(logits, labels, no_grad, logits.dtype.type(1.0 / batch),
                                         False)
    loss[...] += total / batch
    correct[...] += n_correct


def _argmax_rows_cpu_wrapper(logits, pred):
    if logits.ndim != 2 or pred.shape != (logits.shape[0],):
        raise ValueError(f"argmax_rows: expected logits[n, K] and pred[n], got "
                         f"{logits.shape} and {pred.shape}")
    if logits.shape[1] == 0:
        raise ValueError("argmax_rows: logits have no columns")
    _argmax_rows_cpu(logits, pred)


# --------------------------------------------------------------------------- array-module variants

def _xent_terms_xp(xp, logits, labels):
    """Log-probabilities and the per-row log-probability of the label."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    picked = xp.take_along_axis(log_probs, labels[:, None], axis=1)
    return log_probs, picked


def _softmax_xent_cuda(logits, labels, dlogits, loss, correct, *, batch):
    xp = array_module(logits, labels, dlogits, loss, correct)
    _check_logits("softmax_xent", logits, labels)
    _check_labels_xp("softmax_xent", xp, labels, logits.shape[1])
    log_probs, picked = _xent_terms_xp(xp, logits, labels)
    loss[...] += -picked.sum() / batch
    correct[...] += (logits.argmax(axis=1) == labels).sum()
    inv_batch = dlogits.dtype.type(1.0 / batch)
    xp.exp(log_probs, out=dlogits)
    dlogits *= inv_batch
    onehot = xp.arange(logits.shape[1])[None, :] == labels[:, None]
    dlogits -= onehot * inv_batch


def _softmax_xent_eval_cuda(logits, labels, loss, correct, *, batch):
    xp = array_module(logits, labels, loss, correct)
    _check_logits("softmax_xent_eval", logits, labels)
    _check_labels_xp("softmax_xent_eval", xp, labels, logits.shape[1])
    _, picked = _xent_terms_xp(xp, logits, labels)
    loss[...] += -picked.sum() / batch
    correct[...] += (logits.argmax(axis=1) == labels).sum()


def _argmax_rows_cuda(logits, pred):
    xp = array_module(logits, pred)
    pred[...] = xp.argmax(logits, axis=1)


# --------------------------------------------------------------------------- declarations

def _xent_flops(logits, *rest, **params):
    n, k = logits
    return 6.0 * n * k


softmax_xent = Codelet(
    "softmax_xent", modes=(R, R, W, REDUX, REDUX),
    variants={"ref": _softmax_xent_ref, "cpu": _softmax_xent_cpu_wrapper,
              "cuda": _softmax_xent_cuda},
    init=zero_init, redux=add_redux, flops=_xent_flops,
)
"""Mean softmax cross-entropy, its gradient and the correct count.

Operands: (R logits[n,K], R labels[n] int64, W dlogits[n,K], REDUX loss[()],
REDUX correct[()] int64); parameter ``batch``: the whole batch size B.
"""

softmax_xent_eval = Codelet(
    "softmax_xent_eval", modes=(R, R, REDUX, REDUX),
    variants={"ref": _softmax_xent_eval_ref, "cpu": _softmax_xent_eval_cpu_wrapper,
              "cuda": _softmax_xent_eval_cuda},
    init=zero_init, redux=add_redux, flops=_xent_flops,
)
"""``softmax_xent`` without the gradient (R logits, R labels, REDUX loss, REDUX correct)."""

argmax_rows = Codelet(
    "argmax_rows", modes=(R, W),
    variants={"ref": _argmax_rows_ref, "cpu": _argmax_rows_cpu_wrapper,
              "cuda": _argmax_rows_cuda},
    flops=lambda logits, pred, **params: float(logits[0] * logits[1]),
)
"""``pred[i] = argmax_k logits[i, k]`` (R logits[n,K], W pred[n] int64), first index on ties."""
