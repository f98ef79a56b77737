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
The variants read it as Python floats (``tolist``: on a GPU, one copy of a few bytes
per task), so the arithmetic is the one PyTorch does with its Python floats. An optimizer
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

from ._jit import jit
from .codelet import REDUX, RW, R, Codelet
from .reduce import add_redux, flat_view, zero_init
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


def _sgd_step_cpu_wrapper(param, grad, momentum_buffer, hyper, *, dampening=0.0,
                          weight_decay=0.0, nesterov=False):
    lr, momentum, first = hyper.ravel().tolist()
    _check_same_shape("sgd_step", param, grad, momentum_buffer)
    param_flat, buf_flat = _flat_operands("sgd_step", param, momentum_buffer)
    dtype = param.dtype.type
    _sgd_step_cpu(param_flat, np.ascontiguousarray(grad).reshape(-1), buf_flat,
                  dtype(-lr), dtype(momentum), dtype(1 - dampening), dtype(weight_decay),
                  bool(nesterov), bool(first), momentum != 0, weight_decay != 0)


def _sgd_step_cuda(param, grad, momentum_buffer, hyper, *, dampening=0.0, weight_decay=0.0,
                   nesterov=False):
    lr, momentum, first = hyper.ravel().tolist()
    xp = array_module(param, grad, momentum_buffer)
    dtype = param.dtype.type
    g = grad
    if weight_decay != 0:
        g = g + dtype(weight_decay) * param
    if momentum != 0:
        if first:
            xp.copyto(momentum_buffer, g)
        else:
            momentum_buffer *= dtype(momentum)
            momentum_buffer += dtype(1 - dampening) * g
        g = g + dtype(momentum) * momentum_buffer if nesterov else momentum_buffer
    param += dtype(-lr) * g


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


def _sgd_step_plain_cuda(param, grad, hyper, *, weight_decay=0.0):
    _sgd_step_cuda(param, grad, None, _no_momentum(hyper), weight_decay=weight_decay)


def _elementwise_flops(per_element):
    def flops(param, *rest, **params):
        return per_element * float(np.prod(param))
    return flops


sgd_step = Codelet(
    "sgd_step", modes=(RW, R, RW, R),
    variants={"ref": _sgd_step_ref, "cpu": _sgd_step_cpu_wrapper, "cuda": _sgd_step_cuda},
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
              "cuda": _sgd_step_plain_cuda},
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


def _adam_step_cpu_wrapper(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8,
                           weight_decay=0.0, decoupled=False):
    lr, beta1, beta2, step = hyper.ravel().tolist()
    _check_same_shape("adam_step", param, grad, exp_avg, exp_avg_sq)
    param_flat, avg_flat, avg_sq_flat = _flat_operands("adam_step", param, exp_avg, exp_avg_sq)
    dtype = param.dtype.type
    step_size, bias_correction2_sqrt = _adam_scalars(lr, beta1, beta2, step)
    weight = dtype(1 - beta1)
    if weight_decay != 0 and decoupled:
        _scale_cpu(param_flat, dtype(1 - lr * weight_decay))
        weight_decay = 0.0
    _adam_step_cpu(param_flat, np.ascontiguousarray(grad).reshape(-1), avg_flat, avg_sq_flat,
                   dtype(weight_decay), weight_decay != 0, weight, weight - dtype(1),
                   dtype(beta2), dtype(1 - beta2), dtype(bias_correction2_sqrt), dtype(eps),
                   dtype(-step_size))


def _adam_step_cuda(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8, weight_decay=0.0,
                    decoupled=False):
    lr, beta1, beta2, step = hyper.ravel().tolist()
    xp = array_module(param, grad, exp_avg, exp_avg_sq)
    dtype = param.dtype.type
    step_size, bias_correction2_sqrt = _adam_scalars(lr, beta1, beta2, step)
    g = grad
    if weight_decay != 0 and decoupled:
        param *= dtype(1 - lr * weight_decay)
    elif weight_decay != 0:
        g = g + dtype(weight_decay) * param
    weight = dtype(1 - beta1)
    if abs(weight) < 0.5:
        exp_avg += weight * (g - exp_avg)
    else:
        xp.copyto(exp_avg, g + (weight - dtype(1)) * (g - exp_avg))
    exp_avg_sq *= dtype(beta2)
    exp_avg_sq += (dtype(1 - beta2) * g) * g
    denom = xp.sqrt(exp_avg_sq)
    denom /= dtype(bias_correction2_sqrt)
    denom += dtype(eps)
    param += (dtype(-step_size) * exp_avg) / denom


adam_step = Codelet(
    "adam_step", modes=(RW, R, RW, RW, R),
    variants={"ref": _adam_step_ref, "cpu": _adam_step_cpu_wrapper, "cuda": _adam_step_cuda},
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


def _sum_squares_cpu_wrapper(x, total):
    if x.size:
        total[...] += _sum_squares_cpu(np.ascontiguousarray(x).reshape(-1))


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


def _clip_scale_cpu_wrapper(grad, total, *, max_norm):
    (grad_flat,) = _flat_operands("clip_scale", grad)
    _scale_cpu(grad_flat, _clip_factor(np.asarray(total), max_norm))


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
