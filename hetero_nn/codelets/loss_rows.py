"""Row losses beside softmax cross-entropy (:mod:`.loss`): log-softmax, NLL, MSE, one-hot
targets and the correct count, in PyTorch's decomposition:

- ``log_softmax`` / ``log_softmax_bwd``: ``y = (x - max) - log sum exp(x - max)``
  and ``dx = dy - exp(y) * sum(dy)`` per row (``torch.log_softmax`` and its backward);
- ``nll_loss``: ``loss += -sum_i logp[i, label_i] / batch``, ``dlogp = -onehot / batch``;
- ``mse_loss``: ``loss += sum (x - t)^2 / numel``, ``dx = (2 / numel) * (x - t)``
  (``numel`` = all elements of the batch for ``'mean'``, 1 for ``'sum'``);
- ``one_hot``: float targets from int labels (MSE on class labels);
- ``count_correct``: ``correct += count(argmax(scores_i) == label_i)``.

Labels are checked as :mod:`.loss` checks them (its helpers): ``ValueError`` naming the
row on the host, NaN results on a device.
"""

from __future__ import annotations

import numpy as np

from ._jit import as_dtype_of, jit
from ._checks import require_contiguous
from .codelet import REDUX, R, W, Codelet
from .loss import (_check_labels_cpu, _check_labels_xp, _check_logits, _device_labels,
                   _first_bad_label_cpu, _log_softmax_ref, _poison, _row_max_cpu)
from .prepared import contiguous, from_calls, prepares
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["log_softmax", "log_softmax_bwd", "nll_loss", "mse_loss", "one_hot", "count_correct"]


# --------------------------------------------------------------------------- log-softmax

def _check_rows(name, *arrays):
    if arrays[0].ndim != 2 or any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"{name}: expected operands of one shape (n, K), got "
                         f"{[a.shape for a in arrays]}")


def _log_softmax_fwd_ref(x, y):
    _check_rows("log_softmax", x, y)
    if x.size:
        y[...] = _log_softmax_ref(x)


@jit
def _log_softmax_fwd_cpu(x, y):
    for i in range(x.shape[0]):
        row_max = _row_max_cpu(x, i)[0]
        sum_exp = row_max - row_max
        for k in range(x.shape[1]):
            sum_exp += np.exp(x[i, k] - row_max)
        log_sum = np.log(sum_exp)
        for k in range(x.shape[1]):
            y[i, k] = (x[i, k] - row_max) - log_sum


@from_calls
def _log_softmax_fwd_cpu_wrapper(view, x, y):
    _check_rows("log_softmax", x, y)
    require_contiguous("log_softmax", y=y)
    return [(_log_softmax_fwd_cpu, (view(x), y))] if x.size else []


def _log_softmax_fwd_cuda(x, y):
    xp = array_module(x, y)
    _check_rows("log_softmax", x, y)
    if x.size:
        shifted = x - x.max(axis=1, keepdims=True)
        y[...] = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


def _log_softmax_bwd_ref(y, dy, dx):
    _check_rows("log_softmax_bwd", y, dy, dx)
    dx[...] = dy - np.exp(y) * dy.sum(axis=1, keepdims=True)


@jit
def _log_softmax_bwd_cpu(y, dy, dx):
    for i in range(y.shape[0]):
        total = dy[i, 0] - dy[i, 0]
        for k in range(y.shape[1]):
            total += dy[i, k]
        for k in range(y.shape[1]):
            dx[i, k] = dy[i, k] - np.exp(y[i, k]) * total


@from_calls
def _log_softmax_bwd_cpu_wrapper(view, y, dy, dx):
    _check_rows("log_softmax_bwd", y, dy, dx)
    require_contiguous("log_softmax_bwd", dx=dx)
    return [(_log_softmax_bwd_cpu, (view(y), view(dy), dx))] if y.size else []


def _log_softmax_bwd_cuda(y, dy, dx):
    xp = array_module(y, dy, dx)
    _check_rows("log_softmax_bwd", y, dy, dx)
    dx[...] = dy - xp.exp(y) * dy.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- NLL

def _nll_loss_ref(logp, labels, dlogp, loss, *, batch):
    _check_logits("nll_loss", logp, labels)
    _check_rows("nll_loss", logp, dlogp)
    _check_labels_xp("nll_loss", np, labels, logp.shape[1])
    rows = np.arange(logp.shape[0])
    loss[...] += -logp[rows, labels].sum() / batch
    dlogp[...] = 0
    dlogp[rows, labels] = dlogp.dtype.type(-1.0 / batch)


@jit
def _nll_loss_cpu(logp, labels, dlogp, grad):
    total = 0.0
    for i in range(logp.shape[0]):
        for k in range(logp.shape[1]):
            dlogp[i, k] = 0
        total -= logp[i, labels[i]]
        dlogp[i, labels[i]] = grad
    return total


@jit
def _nll_loss_task_cpu(logp, labels, dlogp, loss, batch):
    """The ``cpu`` variant as one kernel (a prepared task): the label check (the wrapper,
    run again from Python, names the row), the rows, then ``loss`` (flat) added to as the
    wrapper adds to it."""
    if _first_bad_label_cpu(labels, logp.shape[1]) >= 0:
        raise ValueError("nll_loss: a label is out of range")
    total = _nll_loss_cpu(logp, labels, dlogp, as_dtype_of(dlogp, -1.0 / batch))
    loss[0] += as_dtype_of(loss, total / batch)


def _prepare_nll_loss(buffers, logp, labels, dlogp, loss, *, batch):
    _check_logits("nll_loss", logp, labels)
    _check_rows("nll_loss", logp, dlogp)
    if not logp.size or not contiguous(logp, labels, dlogp, loss):
        return None if logp.size else []
    return [(_nll_loss_task_cpu, (logp, labels, dlogp, loss.reshape(-1), float(batch)))]


@prepares(_prepare_nll_loss)
def _nll_loss_cpu_wrapper(logp, labels, dlogp, loss, *, batch):
    _check_logits("nll_loss", logp, labels)
    _check_rows("nll_loss", logp, dlogp)
    require_contiguous("nll_loss", dlogp=dlogp)
    _check_labels_cpu("nll_loss", logp, labels)
    if logp.size:
        total = _nll_loss_cpu(np.ascontiguousarray(logp), labels, dlogp,
                              dlogp.dtype.type(-1.0 / batch))
        loss[...] += total / batch


def _nll_loss_cuda(logp, labels, dlogp, loss, *, batch):
    xp = array_module(logp, labels, dlogp, loss)
    _check_logits("nll_loss", logp, labels)
    _check_rows("nll_loss", logp, dlogp)
    labels, bad = _device_labels("nll_loss", xp, labels, logp.shape[1])
    picked = xp.take_along_axis(logp, labels[:, None], axis=1)
    loss[...] += -picked.sum() / batch
    onehot = xp.arange(logp.shape[1])[None, :] == labels[:, None]
    dlogp[...] = onehot * dlogp.dtype.type(-1.0 / batch)
    _poison(xp, bad, loss, dlogp)


# --------------------------------------------------------------------------- MSE

def _check_mse(x, target, dx):
    if x.shape != target.shape or x.shape != dx.shape:
        raise ValueError(f"mse_loss: input, target and gradient must have one shape, got "
                         f"{x.shape}, {target.shape} and {dx.shape}")


def _mse_loss_ref(x, target, dx, loss, *, numel):
    _check_mse(x, target, dx)
    diff = x - target
    loss[...] += (diff * diff).sum() / numel
    dx[...] = x.dtype.type(2.0 / numel) * diff


@jit
def _mse_loss_cpu(x, target, dx, norm):
    total = 0.0
    for i in range(x.shape[0]):
        d = x[i] - target[i]
        total += d * d
        dx[i] = norm * d
    return total


@jit
def _mse_loss_task_cpu(x, target, dx, loss, numel):
    """``_mse_loss_cpu``, then ``loss`` (flat) added to as a Python float is added to it."""
    total = _mse_loss_cpu(x, target, dx, as_dtype_of(x, 2.0 / numel))
    loss[0] += as_dtype_of(loss, total / numel)


@from_calls
def _mse_loss_cpu_wrapper(view, x, target, dx, loss, *, numel):
    _check_mse(x, target, dx)
    require_contiguous("mse_loss", dx=dx, loss=loss)
    return [(_mse_loss_task_cpu, (view(x).reshape(-1), view(target).reshape(-1),
                                  dx.reshape(-1), loss.reshape(-1), float(numel)))]


def _mse_loss_cuda(x, target, dx, loss, *, numel):
    array_module(x, target, dx, loss)
    _check_mse(x, target, dx)
    diff = x - target
    loss[...] += (diff * diff).sum() / numel
    dx[...] = x.dtype.type(2.0 / numel) * diff


# --------------------------------------------------------------------------- one-hot, count

def _one_hot_ref(labels, out):
    _check_logits("one_hot", out, labels)
    _check_labels_xp("one_hot", np, labels, out.shape[1])
    out[...] = np.arange(out.shape[1])[None, :] == labels[:, None]


@jit
def _one_hot_cpu(labels, out):
    for i in range(out.shape[0]):
        for k in range(out.shape[1]):
            out[i, k] = 0
        out[i, labels[i]] = 1


@jit
def _one_hot_task_cpu(labels, out):
    """The label check (the wrapper, run again from Python, names the row), then
    ``_one_hot_cpu``: a prepared task."""
    if _first_bad_label_cpu(labels, out.shape[1]) >= 0:
        raise ValueError("one_hot: a label is out of range")
    _one_hot_cpu(labels, out)


def _prepare_one_hot(buffers, labels, out):
    _check_logits("one_hot", out, labels)
    require_contiguous("one_hot", out=out)
    return [(_one_hot_task_cpu, (labels, out))]


@prepares(_prepare_one_hot)
def _one_hot_cpu_wrapper(labels, out):
    _check_logits("one_hot", out, labels)
    require_contiguous("one_hot", out=out)
    _check_labels_cpu("one_hot", out, labels)
    _one_hot_cpu(labels, out)


def _one_hot_cuda(labels, out):
    xp = array_module(labels, out)
    _check_logits("one_hot", out, labels)
    labels, bad = _device_labels("one_hot", xp, labels, out.shape[1])
    out[...] = xp.arange(out.shape[1])[None, :] == labels[:, None]
    _poison(xp, bad, out)


def _count_correct_ref(scores, labels, correct):
    _check_logits("count_correct", scores, labels)
    if scores.size:
        correct[...] += np.count_nonzero(scores.argmax(axis=1) == labels)


@jit
def _count_correct_cpu(scores, labels):
    n = 0
    for i in range(scores.shape[0]):
        if _row_max_cpu(scores, i)[1] == labels[i]:
            n += 1
    return n


@jit
def _count_correct_acc_cpu(scores, labels, correct):
    """``correct[0] += _count_correct_cpu(...)`` (``correct``: the REDUX scalar seen flat)."""
    correct[0] += _count_correct_cpu(scores, labels)


@from_calls
def _count_correct_cpu_wrapper(view, scores, labels, correct):
    _check_logits("count_correct", scores, labels)
    if not scores.size:
        return []
    require_contiguous("count_correct", correct=correct)
    return [(_count_correct_acc_cpu, (view(scores), labels, correct.reshape(-1)))]


def _count_correct_cuda(scores, labels, correct):
    array_module(scores, labels, correct)
    _check_logits("count_correct", scores, labels)
    if scores.size:
        correct[...] += (scores.argmax(axis=1) == labels).sum()


# --------------------------------------------------------------------------- declarations

def _rows_flops(per_element):
    def flops(x, *rest, **params):
        return per_element * float(np.prod(x))
    return flops


log_softmax = Codelet(
    "log_softmax", modes=(R, W),
    variants={"ref": _log_softmax_fwd_ref, "cpu": _log_softmax_fwd_cpu_wrapper,
              "cuda": _log_softmax_fwd_cuda},
    flops=_rows_flops(4),
)
"""``y = log_softmax(x, dim=1)`` (R x[n,K], W y[n,K])."""

log_softmax_bwd = Codelet(
    "log_softmax_bwd", modes=(R, R, W),
    variants={"ref": _log_softmax_bwd_ref, "cpu": _log_softmax_bwd_cpu_wrapper,
              "cuda": _log_softmax_bwd_cuda},
    flops=_rows_flops(4),
)
"""``dx = dy - exp(y) * sum_k dy`` (R y = log_softmax(x), R dy, W dx)."""

nll_loss = Codelet(
    "nll_loss", modes=(R, R, W, REDUX),
    variants={"ref": _nll_loss_ref, "cpu": _nll_loss_cpu_wrapper, "cuda": _nll_loss_cuda},
    init=zero_init, redux=add_redux, flops=_rows_flops(1),
)
"""Negative log-likelihood (R logp[n,K], R labels[n], W dlogp[n,K], REDUX loss[()]);
parameter ``batch`` (B for ``reduction='mean'``, 1 for ``'sum'``)."""

mse_loss = Codelet(
    "mse_loss", modes=(R, R, W, REDUX),
    variants={"ref": _mse_loss_ref, "cpu": _mse_loss_cpu_wrapper, "cuda": _mse_loss_cuda},
    init=zero_init, redux=add_redux, flops=_rows_flops(4),
)
"""Squared error (R input, R target, W dinput, REDUX loss[()]); parameter ``numel``
(every element of the whole batch for ``reduction='mean'``, 1 for ``'sum'``)."""

one_hot = Codelet(
    "one_hot", modes=(R, W),
    variants={"ref": _one_hot_ref, "cpu": _one_hot_cpu_wrapper, "cuda": _one_hot_cuda},
    flops=lambda labels, out, **params: float(np.prod(out)),
)
"""``out[i, k] = (k == labels[i])`` in ``out``'s dtype (R labels[n] int64, W out[n,K])."""

count_correct = Codelet(
    "count_correct", modes=(R, R, REDUX),
    variants={"ref": _count_correct_ref, "cpu": _count_correct_cpu_wrapper,
              "cuda": _count_correct_cuda},
    init=zero_init, redux=add_redux, flops=_rows_flops(1),
)
"""``correct += count(argmax_k scores[i, k] == labels[i])`` (R scores, R labels, REDUX
correct[()] int64), the first maximum winning as ``torch.argmax``."""
