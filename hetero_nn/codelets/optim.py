"""Optimizer codelets: SGD (momentum, dampening, Nesterov, weight decay), Adam, AdamW,
and the two halves of gradient clipping by global norm.

Each task updates one parameter tensor in place, elementwise, exactly as
``torch.optim.SGD`` / ``torch.optim.Adam`` (``_single_tensor_sgd`` and
``_single_tensor_adam``, ``maximize=False``, ``amsgrad=False``) do, in the same
order of floating-point operations:

SGD::

    g = grad + weight_decay * param               # if weight_decay != 0
    buf = g                                       # first step (torch clones g)
    buf = buf * momentum + (1 - dampening) * g    # later steps
    g = g + momentum * buf  if nesterov else buf  # if momentum != 0
    param = param + (-lr) * g

Adam (``step`` counts from 1; L2 weight decay, not AdamW)::

    g = grad + weight_decay * param
    exp_avg = lerp(exp_avg, g, 1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + ((1 - beta2) * g) * g
    denom = sqrt(exp_avg_sq) / sqrt(1 - beta2**step) + eps
    param = param + ((-lr / (1 - beta1**step)) * exp_avg) / denom

AdamW (``decoupled=True``, ``torch.optim.AdamW``) first decays the weight,
``param = param * (1 - lr * weight_decay)``, then runs Adam with no L2 term.

Clipping (``torch.nn.utils.clip_grad_norm_``, 2-norm): ``sum_squares`` adds
``sum(grad**2)`` of one parameter into a REDUX scalar ``total`` (one task per
parameter, the tree fixed by the submission order), and ``clip_scale`` then
multiplies each gradient by ``min(max_norm / (sqrt(total) + 1e-6), 1)``, computed
in the gradient's dtype as PyTorch does (the factor is applied even when it is 1).

*Hyper handle.* What may change from one step to the next (the learning rate, SGD's
momentum, Adam's betas and step count, SGD's first step) is not a task parameter but
the data of a small float64 operand, ``hyper`` (R), laid out by :func:`sgd_hyper` and
:func:`adam_hyper` and read by every variant when the task runs: a captured step
graph stays valid every step (the optimizer writes the next step's values into it).
The host variants read it as Python floats (``tolist``), so the arithmetic is the one
PyTorch does with its Python floats; the ``cuda`` variants (:mod:`.optim_cuda`) read it
on the device, the same arithmetic in float64 there, with no host synchronisation. An optimizer
with several parameter groups registers one row per group and gives each task its
group's row (a ``(1, k)`` child handle, read flat). The
parameters left are fixed for a run (``dampening``, ``nesterov``, ``eps``,
``weight_decay``).

Scalar coefficients are computed in Python floats and rounded to the
parameter's dtype, as PyTorch does with a Python scalar. PyTorch's vectorised
kernels fuse some multiply-adds (FMA); these kernels do not, so float64 results
agree to a few ulps rather than bit for bit.
"""

from __future__ import annotations

import numpy as np

import functools

from ._jit import as_dtype_of, jit
from .codelet import REDUX, RW, R, Codelet
from .prepared import prepares
from .reduce import add_redux, flat_view, zero_init
from .optim_cuda import adam_step_cuda, sgd_step_cuda, sgd_step_plain_cuda
from .xp import array_module

__all__ = ["sgd_step", "sgd_step_plain", "adam_step", "adamw_step", "sum_squares", "clip_scale",
           "sgd_hyper", "adam_hyper"]


def sgd_hyper(lr, momentum=0.0, first=False) -> np.ndarray:
    """The ``hyper`` operand of ``sgd_step`` and ``sgd_step_plain``: ``[lr, momentum, first]``."""
    return np.array([lr, momentum, float(first)], np.float64)


def adam_hyper(lr, beta1, beta2, step) -> np.ndarray:
    """The ``hyper`` operand of ``adam_step`` and ``adamw_step``: ``[lr, beta1, beta2, step]``
    (``step`` counts from 1)."""
    return np.array([lr, beta1, beta2, step], np.float64)


def _check_same_shape(name, *arrays):
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"{name}: operands must have one shape, got "
                         f"{[a.shape for a in arrays]}")


def _flat_operands(name, *arrays):
    """Flat views of in-place operands; raises if one is not contiguous (no view to update)."""
    views = []
    for a in arrays:
        v = flat_view(a)
        if v is None:
            raise ValueError(f"{name}: optimizer operands must be C-contiguous, got strides "
                             f"{a.strides} for shape {a.shape}")
        views.append(v)
    return views


# --------------------------------------------------------------------------- SGD

def _sgd_step_ref(param, grad, momentum_buffer, hyper, *, dampening=0.0, weight_decay=0.0,
                  nesterov=False):
    lr, momentum, first = hyper.ravel().tolist()
    dtype = param.dtype.type
    g = grad
    if weight_decay != 0:
        g = g + dtype(weight_decay) * param
    if momentum != 0:
        if first:
            momentum_buffer[...] = g
        else:
            momentum_buffer[...] = momentum_buffer * dtype(momentum) + dtype(1 - dampening) * g
        if nesterov:
            g = g + dtype(momentum) * momentum_buffer
        else:
            g = momentum_buffer
    param[...] = param + dtype(-lr) * g


@jit
def _sgd_step_cpu(param, grad, buf, lr_neg, momentum, one_minus_dampening, weight_decay,
                  nesterov, first, use_momentum, use_weight_decay):
    for i in range(param.shape[0]):
        g = grad[i]
        if use_weight_decay:
            g = g + weight_decay * param[i]
        if use_momentum:
            if first:
                b = g
            else:
                b = buf[i] * momentum + one_minus_dampening * g
            buf[i] = b
            if nesterov:
                g = g + momentum * b
            else:
                g = b
        param[i] = param[i] + lr_neg * g


@jit
def _sgd_step_hyper_cpu(param, grad, buf, hyper, dampening, weight_decay, nesterov):
    """``_sgd_step_cpu`` with ``lr``, ``momentum`` and ``first`` read from ``hyper`` here
    and rounded to the parameters' dtype as the wrapper does: what a prepared task runs."""
    lr, momentum, first = hyper[0], hyper[1], hyper[2]
    _sgd_step_cpu(param, grad, buf, as_dtype_of(param, -lr), as_dtype_of(param, momentum),
                  as_dtype_of(param, 1 - dampening), as_dtype_of(param, weight_decay),
                  nesterov, first != 0, momentum != 0, weight_decay != 0)


def _prepare_sgd_step(buffers, param, grad, momentum_buffer, hyper, *, dampening=0.0,
                      weight_decay=0.0, nesterov=False):
    _check_same_shape("sgd_step", param, grad, momentum_buffer)
    if not all(flat_view(a) is not None for a in (param, grad, momentum_buffer, hyper)):
        return None
    return [(_sgd_step_hyper_cpu, (param.reshape(-1), grad.reshape(-1),
                                   momentum_buffer.reshape(-1), hyper.reshape(-1),
                                   float(dampening), float(weight_decay), bool(nesterov)))]


@prepares(_prepare_sgd_step)
def _sgd_step_cpu_wrapper(param, grad, momentum_buffer, hyper, *, dampening=0.0,
                          weight_decay=0.0, nesterov=False):
    lr, momentum, first = hyper.ravel().tolist()
    _check_same_shape("sgd_step", param, grad, momentum_buffer)
    param_flat, buf_flat = _flat_operands("sgd_step", param, momentum_buffer)
    dtype = param.dtype.type
    _sgd_step_cpu(param_flat, np.ascontiguousarray(grad).reshape(-1), buf_flat,
                  dtype(-lr), dtype(momentum), dtype(1 - dampening), dtype(weight_decay),
                  bool(nesterov), bool(first), momentum != 0, weight_decay != 0)


def _sgd_step_plain_ref(param, grad, hyper, *, weight_decay=0.0):
    _sgd_step_ref(param, grad, None, _no_momentum(hyper), weight_decay=weight_decay)


def _no_momentum(hyper):
    """SGD's ``hyper`` with momentum 0 (what ``sgd_step_plain`` runs)."""
    return sgd_hyper(hyper.ravel().tolist()[0])


@jit
def _sgd_step_plain_cpu(param, grad, lr_neg):
    for i in range(param.shape[0]):
        param[i] = param[i] + lr_neg * grad[i]


@jit
def _sgd_step_plain_decay_cpu(param, grad, lr_neg, weight_decay):
    for i in range(param.shape[0]):
        param[i] = param[i] + lr_neg * (grad[i] + weight_decay * param[i])


@jit
def _sgd_step_plain_hyper_cpu(param, grad, hyper, weight_decay):
    """``sgd_step_plain``'s kernels with ``lr`` read from ``hyper`` (a prepared task)."""
    if weight_decay != 0:
        _sgd_step_plain_decay_cpu(param, grad, as_dtype_of(param, -hyper[0]),
                                  as_dtype_of(param, weight_decay))
    else:
        _sgd_step_plain_cpu(param, grad, as_dtype_of(param, -hyper[0]))


def _prepare_sgd_step_plain(buffers, param, grad, hyper, *, weight_decay=0.0):
    _check_same_shape("sgd_step_plain", param, grad)
    if not all(flat_view(a) is not None for a in (param, grad, hyper)):
        return None
    return [(_sgd_step_plain_hyper_cpu, (param.reshape(-1), grad.reshape(-1), hyper.reshape(-1),
                                         float(weight_decay)))]


@prepares(_prepare_sgd_step_plain)
def _sgd_step_plain_cpu_wrapper(param, grad, hyper, *, weight_decay=0.0):
    lr = hyper.ravel().tolist()[0]
    _check_same_shape("sgd_step_plain", param, grad)
    (param_flat,) = _flat_operands("sgd_step_plain", param)
    grad_flat = np.ascontiguousarray(grad).reshape(-1)
    dtype = param.dtype.type
    if weight_decay != 0:
        _sgd_step_plain_decay_cpu(param_flat, grad_flat, dtype(-lr), dtype(weight_decay))
    else:
        _sgd_step_plain_cpu(param_flat, grad_flat, dtype(-lr))


def _elementwise_flops(per_element):
    def flops(param, *rest, **params):
        return per_element * float(np.prod(param))
    return flops


sgd_step = Codelet(
    "sgd_step", modes=(RW, R, RW, R),
    variants={"ref": _sgd_step_ref, "cpu": _sgd_step_cpu_wrapper, "cuda": sgd_step_cuda},
    flops=_elementwise_flops(6),
)
"""SGD with momentum (RW param, R grad, RW momentum_buffer, R hyper = :func:`sgd_hyper`).

Parameters ``dampening, weight_decay, nesterov``; ``hyper``'s ``first`` is 1 on the
step where torch creates the buffer (it is overwritten with the gradient, no
dampening); a momentum of 0 leaves the buffer alone.
"""

sgd_step_plain = Codelet(
    "sgd_step_plain", modes=(RW, R, R),
    variants={"ref": _sgd_step_plain_ref, "cpu": _sgd_step_plain_cpu_wrapper,
              "cuda": sgd_step_plain_cuda},
    flops=_elementwise_flops(2),
)
"""SGD without momentum (RW param, R grad, R hyper = :func:`sgd_hyper`, which gives ``lr``);
parameter ``weight_decay``."""


# --------------------------------------------------------------------------- Adam

def _adam_scalars(lr, beta1, beta2, step):
    """Step size and sqrt of the second bias correction, in Python floats like torch."""
    if step < 1:
        raise ValueError(f"adam_step: step counts from 1, got {step}")
    bias_correction1 = 1 - beta1 ** float(step)
    bias_correction2 = 1 - beta2 ** float(step)
    return lr / bias_correction1, bias_correction2 ** 0.5


def _lerp_ref(start, end, weight):
    """PyTorch's lerp: two formulas, switched at ``|weight| = 0.5`` for accuracy."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end + (weight - weight.dtype.type(1)) * (end - start)


def _adam_step_ref(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8, weight_decay=0.0,
                   decoupled=False):
    lr, beta1, beta2, step = hyper.ravel().tolist()
    dtype = param.dtype.type
    step_size, bias_correction2_sqrt = _adam_scalars(lr, beta1, beta2, step)
    g = grad
    if weight_decay != 0 and decoupled:
        param *= dtype(1 - lr * weight_decay)
    elif weight_decay != 0:
        g = g + dtype(weight_decay) * param
    exp_avg[...] = _lerp_ref(exp_avg, g, dtype(1 - beta1))
    exp_avg_sq[...] = exp_avg_sq * dtype(beta2) + (dtype(1 - beta2) * g) * g
    denom = np.sqrt(exp_avg_sq) / dtype(bias_correction2_sqrt) + dtype(eps)
    param[...] = param + (dtype(-step_size) * exp_avg) / denom


@jit
def _adam_step_cpu(param, grad, exp_avg, exp_avg_sq, weight_decay, use_weight_decay,
                   one_minus_beta1, weight_minus_one, beta2, one_minus_beta2,
                   bias_correction2_sqrt, eps, step_size_neg):
    small_weight = abs(one_minus_beta1) < 0.5
    for i in range(param.shape[0]):
        g = grad[i]
        p = param[i]
        if use_weight_decay:
            g = g + weight_decay * p
        m = exp_avg[i]
        if small_weight:
            m = m + one_minus_beta1 * (g - m)
        else:
            m = g + weight_minus_one * (g - m)
        exp_avg[i] = m
        v = exp_avg_sq[i] * beta2 + (one_minus_beta2 * g) * g
        exp_avg_sq[i] = v
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        param[i] = p + (step_size_neg * m) / denom


@jit
def _adam_step_hyper_cpu(param, grad, exp_avg, exp_avg_sq, hyper, eps, weight_decay, decoupled,
                         half):
    """One Adam (or, ``decoupled``, AdamW) step on flat operands, ``lr``, the betas and the
    step count read from ``hyper`` here and the scalars computed in float64 as
    :func:`_adam_scalars` computes them in Python floats, then rounded to the parameters'
    dtype: what the ``cpu`` variant runs, from Python or prepared.

    ``half`` is 0.5, passed in so that LLVM cannot turn ``x ** 0.5`` into a square root,
    which differs from Python's ``pow`` in the last bit for about one value in 2,000.
    """
    lr, beta1, beta2, step = hyper[0], hyper[1], hyper[2], hyper[3]
    if step < 1:
        raise ValueError("adam_step: step counts from 1")
    step_size = lr / (1 - beta1 ** step)
    bias_correction2_sqrt = (1 - beta2 ** step) ** half
    if weight_decay != 0 and decoupled:
        _scale_cpu(param, as_dtype_of(param, 1 - lr * weight_decay))
        weight_decay = 0.0
    weight = as_dtype_of(param, 1 - beta1)
    _adam_step_cpu(param, grad, exp_avg, exp_avg_sq, as_dtype_of(param, weight_decay),
                   weight_decay != 0, weight, weight - as_dtype_of(param, 1.0),
                   as_dtype_of(param, beta2), as_dtype_of(param, 1 - beta2),
                   as_dtype_of(param, bias_correction2_sqrt), as_dtype_of(param, eps),
                   as_dtype_of(param, -step_size))


def _adam_step_calls(name, param, grad, exp_avg, exp_avg_sq, hyper, eps, weight_decay,
                     decoupled, prepared):
    """The one call of the ``cpu`` variant; ``prepared``: None where an operand is strided
    (the variant then copies ``grad``, and refuses a strided state)."""
    _check_same_shape(name, param, grad, exp_avg, exp_avg_sq)
    if prepared and not all(flat_view(a) is not None
                            for a in (param, grad, exp_avg, exp_avg_sq, hyper)):
        return None
    param_flat, avg_flat, avg_sq_flat = _flat_operands(name, param, exp_avg, exp_avg_sq)
    return [(_adam_step_hyper_cpu, (param_flat, np.ascontiguousarray(grad).reshape(-1),
                                    avg_flat, avg_sq_flat,
                                    np.ascontiguousarray(hyper, np.float64).reshape(-1),
                                    float(eps), float(weight_decay), bool(decoupled), 0.5))]


def _prepare_adam_step(buffers, param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8,
                       weight_decay=0.0, decoupled=False):
    if hyper.dtype != np.float64:
        return None
    return _adam_step_calls("adam_step", param, grad, exp_avg, exp_avg_sq, hyper, eps,
                            weight_decay, decoupled, True)


@prepares(_prepare_adam_step)
def _adam_step_cpu_wrapper(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8,
                           weight_decay=0.0, decoupled=False):
    lr, beta1, beta2, step = hyper.ravel().tolist()
    _adam_scalars(lr, beta1, beta2, step)  # its checks, with the numbers in the message
    for kernel, args in _adam_step_calls("adam_step", param, grad, exp_avg, exp_avg_sq, hyper,
                                         eps, weight_decay, decoupled, False):
        kernel(*args)


adam_step = Codelet(
    "adam_step", modes=(RW, R, RW, RW, R),
    variants={"ref": _adam_step_ref, "cpu": _adam_step_cpu_wrapper, "cuda": adam_step_cuda},
    flops=_elementwise_flops(14),
)
"""Adam (RW param, R grad, RW exp_avg, RW exp_avg_sq, R hyper = :func:`adam_hyper`).

Parameters ``eps, weight_decay``; ``lr, beta1, beta2, step`` come from ``hyper``.
"""

adamw_step = Codelet(
    "adamw_step", modes=(RW, R, RW, RW, R),
    variants={name: functools.partial(variant, decoupled=True)
              for name, variant in adam_step.variants.items()},
    flops=_elementwise_flops(15),
)
"""AdamW (RW param, R grad, RW exp_avg, RW exp_avg_sq, R hyper): Adam's kernels with
decoupled weight decay; parameters and ``hyper`` as ``adam_step``."""


# --------------------------------------------------------------------------- clipping

@jit
def _scale_cpu(x, factor):
    for i in range(x.shape[0]):
        x[i] = x[i] * factor


def _sum_squares_ref(x, total):
    total[...] += np.sum(x * x)


@jit
def _sum_squares_cpu(x):
    s = x[0] - x[0]
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


@jit
def _sum_squares_acc_cpu(x, total):
    """``total[0] += sum(x * x)`` (``total``: the REDUX scalar seen flat)."""
    if x.shape[0]:
        total[0] += _sum_squares_cpu(x)


def _prepare_sum_squares(buffers, x, total):
    if flat_view(x) is None or flat_view(total) is None:
        return None
    return [(_sum_squares_acc_cpu, (x.reshape(-1), total.reshape(-1)))]


@prepares(_prepare_sum_squares)
def _sum_squares_cpu_wrapper(x, total):
    (total_flat,) = _flat_operands("sum_squares", total)
    _sum_squares_acc_cpu(np.ascontiguousarray(x).reshape(-1), total_flat)


def _sum_squares_cuda(x, total):
    array_module(x, total)
    total[...] += (x * x).sum()


def _clip_factor(total, max_norm):
    """``min(max_norm / (sqrt(total) + 1e-6), 1)`` in ``total``'s dtype, as torch."""
    dtype = total.dtype.type
    factor = dtype(max_norm) / (dtype(np.sqrt(total[()])) + dtype(1e-6))
    return min(factor, dtype(1.0))


def _clip_scale_ref(grad, total, *, max_norm):
    grad *= _clip_factor(np.asarray(total), max_norm)


@jit
def _clip_scale_total_cpu(grad, total, max_norm):
    """``_scale_cpu`` by :func:`_clip_factor`, computed here from ``total`` (seen flat) in its
    dtype as the wrapper computes it (``min`` as Python's: ``factor`` unless 1 is smaller,
    so a NaN factor passes)."""
    one = as_dtype_of(total, 1.0)
    factor = as_dtype_of(total, max_norm) / (np.sqrt(total[0]) + as_dtype_of(total, 1e-6))
    if one < factor:
        factor = one
    _scale_cpu(grad, factor)


def _prepare_clip_scale(buffers, grad, total, *, max_norm):
    (grad_flat,) = _flat_operands("clip_scale", grad)
    if flat_view(total) is None or total.size != 1:
        return None
    return [(_clip_scale_total_cpu, (grad_flat, total.reshape(-1), float(max_norm)))]


@prepares(_prepare_clip_scale)
def _clip_scale_cpu_wrapper(grad, total, *, max_norm):
    (grad_flat,) = _flat_operands("clip_scale", grad)
    _clip_scale_total_cpu(grad_flat, np.ascontiguousarray(total).reshape(-1), float(max_norm))


def _clip_scale_cuda(grad, total, *, max_norm):
    xp = array_module(grad, total)
    dtype = total.dtype.type
    factor = dtype(max_norm) / (xp.sqrt(total) + dtype(1e-6))
    grad *= xp.minimum(factor, dtype(1.0)).astype(grad.dtype)


sum_squares = Codelet(
    "sum_squares", modes=(R, REDUX),
    variants={"ref": _sum_squares_ref, "cpu": _sum_squares_cpu_wrapper,
              "cuda": _sum_squares_cuda},
    init=zero_init, redux=add_redux, flops=_elementwise_flops(2),
)
"""``total += sum(x * x)`` (R x, REDUX total[()]): one parameter's share of the squared norm."""

clip_scale = Codelet(
    "clip_scale", modes=(RW, R),
    variants={"ref": _clip_scale_ref, "cpu": _clip_scale_cpu_wrapper, "cuda": _clip_scale_cuda},
    flops=_elementwise_flops(1),
)
"""``grad *= min(max_norm / (sqrt(total) + 1e-6), 1)`` (RW grad, R total[()]); parameter
``max_norm``."""
