"""Loss codelets: softmax cross-entropy (with label smoothing) and the rows' argmax.

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

With ``label_smoothing = eps`` the target of row ``i`` is ``(1 - eps) onehot(label_i)
+ eps / K`` as in PyTorch: the loss adds ``eps / K * sum_k -log p_k`` per row
(``(1 - eps) * nll + eps / K * smooth``, PyTorch's formula) and ``dlogits = (p -
(1 - eps) onehot - eps / K) / B``. ``batch = 1`` gives ``reduction='sum'``.

The other row losses (log-softmax, NLL, MSE, one-hot, correct count) are in
:mod:`.loss_rows`.
"""

from __future__ import annotations

import numpy as np

from ._jit import as_dtype_of, jit, jit_inline
from .codelet import REDUX, R, W, Codelet
from .kernels_cuda import covers, launch, xent_kernel
from .prepared import contiguous, from_calls, prepares
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
    """Raise on the first label outside ``[0, K)`` (NumPy; on a device see :func:`_device_labels`)."""
    if labels.shape[0] == 0:
        return
    bad = (labels < 0) | (labels >= n_classes)
    if bool(bad.any()):
        row = int(xp.argmax(bad))
        raise _bad_label_error(name, row, int(labels[row]), n_classes)


def _device_labels(name, xp, labels, n_classes):
    """On a device, labels are checked there, not on the host (a sync per task): returns the
    labels with those outside ``[0, K)`` replaced by 0 (safe to gather with) and a 0-d
    flag, true if there was one; :func:`_poison` then makes the results NaN."""
    if xp is np:  # the host: the ValueError naming the row, as the ref variant raises
        _check_labels_xp(name, xp, labels, n_classes)
        return labels, None
    bad = (labels < 0) | (labels >= n_classes)
    return xp.where(bad, 0, labels), bad.any()


def _poison(xp, bad, *outputs):
    """``outputs`` set to NaN where the 0-d device flag ``bad`` is true (no host sync)."""
    if bad is None:
        return
    for out in outputs:
        out[...] = xp.where(bad, xp.nan, out)


# --------------------------------------------------------------------------- NumPy reference

def _log_softmax_ref(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _smoothed_loss(nll, smooth, n_classes, label_smoothing):
    """PyTorch's ``(1 - eps) * nll + smooth * (eps / K)`` (just ``nll`` without smoothing)."""
    if not label_smoothing:
        return nll
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)


def _xent_loss_ref(logits, labels, loss, correct, batch, label_smoothing):
    """Add the batch share of the loss and the correct count; return the log-probabilities."""
    rows = np.arange(logits.shape[0])
    log_probs = _log_softmax_ref(logits)
    nll = -log_probs[rows, labels].sum()
    smooth = -log_probs.sum() if label_smoothing else 0.0
    loss[...] += _smoothed_loss(nll, smooth, logits.shape[1], label_smoothing) / batch
    correct[...] += np.count_nonzero(logits.argmax(axis=1) == labels)
    return rows, log_probs


def _softmax_xent_ref(logits, labels, dlogits, loss, correct, *, batch, label_smoothing=0.0):
    _check_logits("softmax_xent", logits, labels)
    _check_labels_xp("softmax_xent", np, labels, logits.shape[1])
    rows, log_probs = _xent_loss_ref(logits, labels, loss, correct, batch, label_smoothing)
    dtype = dlogits.dtype.type
    inv_batch = dtype(1.0 / batch)
    dlogits[...] = np.exp(log_probs) * inv_batch
    if label_smoothing:
        dlogits -= dtype(label_smoothing / logits.shape[1] / batch)
        inv_batch = dtype((1 - label_smoothing) / batch)
    dlogits[rows, labels] -= inv_batch


def _softmax_xent_eval_ref(logits, labels, loss, correct, *, batch, label_smoothing=0.0):
    _check_logits("softmax_xent_eval", logits, labels)
    _check_labels_xp("softmax_xent_eval", np, labels, logits.shape[1])
    _xent_loss_ref(logits, labels, loss, correct, batch, label_smoothing)


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
def _softmax_xent_cpu(logits, labels, dlogits, inv_batch, with_grad, smoothing, label_grad,
                      smooth_grad):
    """Return ``(sum of -log p[label], sum of -sum_k log p_k, correct argmaxes)``.

    Fills dlogits if asked. The caller has checked the labels. Per row: max and
    first argmax, then ``s = sum exp(x - max)``, ``-log p_label = -((x_label -
    max) - log s)`` and ``p_k = exp(x_k - max) / s`` (each exponential computed
    once). With ``smoothing``, ``sum_k log p_k = sum_k (x_k - max) - K log s`` and
    ``smooth_grad`` (``eps / K / B``) is taken from every gradient entry;
    ``label_grad`` (``(1 - eps) / B``) is taken from the label's.
    """
    n_rows, n_classes = logits.shape
    total = 0.0
    total_smooth = 0.0
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
        log_sum = np.log(sum_exp)
        total -= (logits[i, label] - row_max) - log_sum
        if smoothing:
            shifted = inv_batch - inv_batch
            for k in range(n_classes):
                shifted += logits[i, k] - row_max
            total_smooth -= shifted - n_classes * log_sum
        if best == label:
            correct += 1
        if with_grad:
            scale = inv_batch / sum_exp
            for k in range(n_classes):
                dlogits[i, k] *= scale
                if smoothing:
                    dlogits[i, k] -= smooth_grad
            dlogits[i, label] -= label_grad
    return total, total_smooth, correct


@jit
def _argmax_rows_cpu(logits, pred):
    for i in range(logits.shape[0]):
        pred[i] = _row_max_cpu(logits, i)[1]


def _check_labels_cpu(name, logits, labels):
    row = _first_bad_label_cpu(labels, logits.shape[1])
    if row >= 0:
        raise _bad_label_error(name, row, int(labels[row]), logits.shape[1])


def _softmax_xent_cpu_run(logits, labels, dlogits, loss, correct, batch, label_smoothing):
    dtype = logits.dtype.type
    n_classes = logits.shape[1]
    total, smooth, n_correct = _softmax_xent_cpu(
        logits, labels, dlogits, dtype(1.0 / batch), dlogits.size > 0, bool(label_smoothing),
        dtype((1 - label_smoothing) / batch), dtype(label_smoothing / n_classes / batch))
    loss[...] += _smoothed_loss(total, smooth, n_classes, label_smoothing) / batch
    correct[...] += n_correct


@jit
def _softmax_xent_task_cpu(logits, labels, dlogits, loss, correct, batch, label_smoothing):
    """The whole ``cpu`` variant as one kernel (a prepared task): the label check (the
    wrapper, run again from Python, names the row), the rows, then ``loss`` and
    ``correct`` (flat, one element) added to as the wrapper adds to them."""
    n_classes = logits.shape[1]
    if _first_bad_label_cpu(labels, n_classes) >= 0:
        raise ValueError("softmax_xent: a label is out of range")
    smoothing = label_smoothing != 0
    total, smooth, n_correct = _softmax_xent_cpu(
        logits, labels, dlogits, as_dtype_of(logits, 1.0 / batch), dlogits.size > 0, smoothing,
        as_dtype_of(logits, (1 - label_smoothing) / batch),
        as_dtype_of(logits, label_smoothing / n_classes / batch))
    if smoothing:
        total = (1 - label_smoothing) * total + smooth * (label_smoothing / n_classes)
    loss[0] += as_dtype_of(loss, total / batch)
    correct[0] += n_correct


def _xent_calls(logits, labels, dlogits, loss, correct, batch, label_smoothing):
    if logits.shape[1] == 0 or logits.shape[0] == 0 or \
            not contiguous(logits, labels, dlogits, loss, correct):
        return None
    return [(_softmax_xent_task_cpu, (logits, labels, dlogits, loss.reshape(-1),
                                      correct.reshape(-1), int(batch), float(label_smoothing)))]


def _prepare_softmax_xent(buffers, logits, labels, dlogits, loss, correct, *, batch,
                          label_smoothing=0.0):
    _check_logits("softmax_xent", logits, labels)
    if dlogits.shape != logits.shape:
        raise ValueError(f"softmax_xent: dlogits {dlogits.shape} != logits {logits.shape}")
    return _xent_calls(logits, labels, dlogits, loss, correct, batch, label_smoothing)


def _prepare_softmax_xent_eval(buffers, logits, labels, loss, correct, *, batch,
                               label_smoothing=0.0):
    _check_logits("softmax_xent_eval", logits, labels)
    none = buffers("softmax_xent:no dlogits", (0, 0), logits.dtype)
    return _xent_calls(logits, labels, none, loss, correct, batch, label_smoothing)


@prepares(_prepare_softmax_xent)
def _softmax_xent_cpu_wrapper(logits, labels, dlogits, loss, correct, *, batch,
                              label_smoothing=0.0):
    _check_logits("softmax_xent", logits, labels)
    if dlogits.shape != logits.shape:
        raise ValueError(f"softmax_xent: dlogits {dlogits.shape} != logits {logits.shape}")
    _check_labels_cpu("softmax_xent", logits, labels)
    if logits.shape[1] == 0 or logits.shape[0] == 0:
        dlogits[...] = 0
        return
    _softmax_xent_cpu_run(logits, labels, dlogits, loss, correct, batch, label_smoothing)


@prepares(_prepare_softmax_xent_eval)
def _softmax_xent_eval_cpu_wrapper(logits, labels, loss, correct, *, batch, label_smoothing=0.0):
    _check_logits("softmax_xent_eval", logits, labels)
    _check_labels_cpu("softmax_xent_eval", logits, labels)
    if logits.shape[1] == 0 or logits.shape[0] == 0:
        return
    _softmax_xent_cpu_run(logits, labels, np.empty((0, 0), logits.dtype), loss, correct, batch,
                          label_smoothing)


@from_calls
def _argmax_rows_cpu_wrapper(view, logits, pred):
    if logits.ndim != 2 or pred.shape != (logits.shape[0],):
        raise ValueError(f"argmax_rows: expected logits[n, K] and pred[n], got "
                         f"{logits.shape} and {pred.shape}")
    if logits.shape[1] == 0:
        raise ValueError("argmax_rows: logits have no columns")
    return [(_argmax_rows_cpu, (logits, pred))]


# --------------------------------------------------------------------------- array-module variants

def _xent_terms_xp(xp, logits, labels):
    """Log-probabilities and the per-row log-probability of the label."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    picked = xp.take_along_axis(log_probs, labels[:, None], axis=1)
    return log_probs, picked


def _xent_loss_xp(xp, logits, labels, loss, correct, batch, label_smoothing):
    log_probs, picked = _xent_terms_xp(xp, logits, labels)
    smooth = -log_probs.sum() if label_smoothing else 0.0
    loss[...] += _smoothed_loss(-picked.sum(), smooth, logits.shape[1], label_smoothing) / batch
    correct[...] += (logits.argmax(axis=1) == labels).sum()
    return log_probs


def _xent_kernel(xp, logits, labels, dlogits, loss, correct, batch, label_smoothing, twin,
                 *twin_args) -> bool:
    """Loss, correct count and (``dlogits`` given) gradient by one kernel
    (:func:`.kernels_cuda.xent_kernel`); ``False`` if the operands are not its."""
    if not (covers(logits, dlogits, loss) and labels.dtype == np.int64
            and correct.dtype == np.int64 and labels.flags.c_contiguous and logits.shape[1] > 0
            and loss.shape == correct.shape == ()):
        return False
    n, k = logits.shape
    launch(xp, xent_kernel(logits.dtype.name), n,
           (logits, labels, logits if dlogits is None else dlogits, loss, correct, n, k, batch,
            label_smoothing, dlogits is not None),
           twin, *twin_args, batch=batch, label_smoothing=label_smoothing)
    return True


def _softmax_xent_cuda(logits, labels, dlogits, loss, correct, *, batch, label_smoothing=0.0):
    xp = array_module(logits, labels, dlogits, loss, correct)
    _check_logits("softmax_xent", logits, labels)
    if not _xent_kernel(xp, logits, labels, dlogits, loss, correct, batch, label_smoothing,
                        _softmax_xent_xp, logits, labels, dlogits, loss, correct):
        _softmax_xent_xp(logits, labels, dlogits, loss, correct, batch=batch,
                         label_smoothing=label_smoothing)


def _softmax_xent_xp(logits, labels, dlogits, loss, correct, *, batch, label_smoothing=0.0):
    """The array-module path of ``softmax_xent``'s ``cuda`` variant (its kernel's twin)."""
    xp = array_module(logits, labels, dlogits, loss, correct)
    labels, bad = _device_labels("softmax_xent", xp, labels, logits.shape[1])
    log_probs = _xent_loss_xp(xp, logits, labels, loss, correct, batch, label_smoothing)
    dtype = dlogits.dtype.type
    inv_batch = dtype(1.0 / batch)
    xp.exp(log_probs, out=dlogits)
    dlogits *= inv_batch
    if label_smoothing:
        dlogits -= dtype(label_smoothing / logits.shape[1] / batch)
        inv_batch = dtype((1 - label_smoothing) / batch)
    onehot = xp.arange(logits.shape[1])[None, :] == labels[:, None]
    dlogits -= onehot * inv_batch
    _poison(xp, bad, loss, dlogits)


def _softmax_xent_eval_cuda(logits, labels, loss, correct, *, batch, label_smoothing=0.0):
    xp = array_module(logits, labels, loss, correct)
    _check_logits("softmax_xent_eval", logits, labels)
    if not _xent_kernel(xp, logits, labels, None, loss, correct, batch, label_smoothing,
                        _softmax_xent_eval_xp, logits, labels, loss, correct):
        _softmax_xent_eval_xp(logits, labels, loss, correct, batch=batch,
                              label_smoothing=label_smoothing)


def _softmax_xent_eval_xp(logits, labels, loss, correct, *, batch, label_smoothing=0.0):
    """The array-module path of ``softmax_xent_eval``'s ``cuda`` variant (its kernel's twin)."""
    xp = array_module(logits, labels, loss, correct)
    labels, bad = _device_labels("softmax_xent_eval", xp, labels, logits.shape[1])
    _xent_loss_xp(xp, logits, labels, loss, correct, batch, label_smoothing)
    _poison(xp, bad, loss)


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
REDUX correct[()] int64); parameters ``batch`` (the whole batch size B, or 1 for
``reduction='sum'``) and ``label_smoothing`` (default 0).
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
