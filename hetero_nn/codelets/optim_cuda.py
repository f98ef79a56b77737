"""The optimizers' ``cuda`` variants: SGD and Adam(W) steps that read ``hyper`` on the device.

The learning rate, momentum, betas, step count and SGD's first-step flag live in the
``hyper`` operand (:mod:`hetero_nn.codelets.optim`). On a GPU, reading them as Python
floats (``tolist``) is a host synchronisation in every optimizer task; these variants
read them as 0-d device arrays instead and never branch on their values on the host
(``xp.where`` picks SGD's first step, the momentum-free update and the two forms of
PyTorch's ``lerp``). The scalar arithmetic is the one the ``ref`` variant does in
Python floats, done in float64 on the device and rounded to the parameter's dtype
(so the same bits, but for ``pow``, whose last bit the device's library may round
otherwise; ``xp.power`` keeps ``x ** 0.5`` a ``pow`` as Python's is, not a ``sqrt``).
On a device the ``ref`` variant's check (``step >= 1``, else ``ValueError``) would read
``hyper`` on the host: there a step 0 makes the parameters NaN instead.

Each step is one whole-operation kernel (:mod:`.kernels_cuda`: ``sgd_kernel``,
``adam_kernel``) where the operands are contiguous float32/float64; the array-module
code here (``*_xp``) is its twin and the path for other operands.
"""

from __future__ import annotations

import numpy as np

from . import kernels_cuda
from .xp import array_module


def _scalars(xp, hyper, count):
    """The first ``count`` entries of ``hyper`` as float64 0-d device arrays."""
    flat = hyper.reshape(-1)
    return [flat[i] for i in range(count)]


def sgd_step_cuda(param, grad, momentum_buffer, hyper, *, dampening=0.0, weight_decay=0.0,
                  nesterov=False):
    """One SGD step (momentum, dampening, Nesterov, weight decay) with ``hyper`` on the device:
    one kernel (``sgd_kernel``)."""
    xp = array_module(param, grad, hyper)
    if not (kernels_cuda.covers(param, grad, momentum_buffer) and hyper.dtype == np.float64
            and param.shape == grad.shape and hyper.flags.c_contiguous):
        sgd_step_xp(param, grad, momentum_buffer, hyper, dampening=dampening,
                    weight_decay=weight_decay, nesterov=nesterov)
        return
    buf = param if momentum_buffer is None else momentum_buffer
    kernels_cuda.launch(
        xp, kernels_cuda.sgd_kernel(param.dtype.name), param.size,
        (param, grad, buf, hyper, dampening, weight_decay, nesterov,
         momentum_buffer is not None, param.size),
        sgd_step_xp, param, grad, momentum_buffer, hyper, dampening=dampening,
        weight_decay=weight_decay, nesterov=nesterov)


def sgd_step_xp(param, grad, momentum_buffer, hyper, *, dampening=0.0, weight_decay=0.0,
                nesterov=False):
    """:func:`sgd_step_cuda` in the array module: the kernel's twin."""
    xp = array_module(param, grad, hyper)
    lr, momentum, first = _scalars(xp, hyper, 3)
    dtype = param.dtype
    g = grad
    if weight_decay != 0:
        g = g + dtype.type(weight_decay) * param
    if momentum_buffer is not None:
        m = momentum.astype(dtype)
        continued = momentum_buffer * m + dtype.type(1 - dampening) * g
        with_momentum = momentum != 0
        xp.copyto(momentum_buffer, xp.where(with_momentum & (first != 0), g,
                                            xp.where(with_momentum, continued, momentum_buffer)))
        step = g + m * momentum_buffer if nesterov else momentum_buffer
        g = xp.where(with_momentum, step, g)
    param += (-lr).astype(dtype) * g


def sgd_step_plain_cuda(param, grad, hyper, *, weight_decay=0.0):
    """SGD without momentum: ``param -= lr * (grad + weight_decay * param)``."""
    sgd_step_cuda(param, grad, None, hyper, weight_decay=weight_decay)


def adam_step_cuda(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8, weight_decay=0.0,
                   decoupled=False):
    """One Adam (``decoupled``: AdamW) step with ``hyper`` on the device: one kernel
    (``adam_kernel``)."""
    xp = array_module(param, grad, exp_avg, exp_avg_sq, hyper)
    if not (kernels_cuda.covers(param, grad, exp_avg, exp_avg_sq) and hyper.dtype == np.float64
            and param.shape == grad.shape == exp_avg.shape == exp_avg_sq.shape
            and hyper.flags.c_contiguous):
        adam_step_xp(param, grad, exp_avg, exp_avg_sq, hyper, eps=eps,
                     weight_decay=weight_decay, decoupled=decoupled)
        return
    kernels_cuda.launch(
        xp, kernels_cuda.adam_kernel(param.dtype.name), param.size,
        (param, grad, exp_avg, exp_avg_sq, hyper, eps, weight_decay, decoupled, param.size),
        adam_step_xp, param, grad, exp_avg, exp_avg_sq, hyper, eps=eps,
        weight_decay=weight_decay, decoupled=decoupled)


def adam_step_xp(param, grad, exp_avg, exp_avg_sq, hyper, *, eps=1e-8, weight_decay=0.0,
                 decoupled=False):
    """:func:`adam_step_cuda` in the array module: the kernel's twin."""
    xp = array_module(param, grad, exp_avg, exp_avg_sq, hyper)
    lr, beta1, beta2, step = _scalars(xp, hyper, 4)
    dtype = param.dtype
    if xp is np and not step >= 1:  # on the host the check costs nothing
        raise ValueError(f"adam_step: step counts from 1, got {step}")
    step_size = xp.where(step >= 1, lr / (1 - xp.power(beta1, step)), xp.nan)  # NaN: no step 0
    bias_correction2_sqrt = xp.power(1 - xp.power(beta2, step), 0.5)
    g = grad
    if weight_decay != 0 and decoupled:
        param *= (1 - lr * weight_decay).astype(dtype)
    elif weight_decay != 0:
        g = g + dtype.type(weight_decay) * param
    weight = (1 - beta1).astype(dtype)
    xp.copyto(exp_avg, xp.where(abs(weight) < 0.5, exp_avg + weight * (g - exp_avg),
                                g + (weight - dtype.type(1)) * (g - exp_avg)))
    exp_avg_sq *= beta2.astype(dtype)
    exp_avg_sq += ((1 - beta2).astype(dtype) * g) * g
    denom = xp.sqrt(exp_avg_sq)
    denom /= bias_correction2_sqrt.astype(dtype)
    denom += dtype.type(eps)
    param += ((-step_size).astype(dtype) * exp_avg) / denom
