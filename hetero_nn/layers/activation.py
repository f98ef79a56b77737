"""Activations: ReLU (its backward passes the gradient where the output is positive),
LeakyReLU, Sigmoid, Tanh, GELU and the row-wise LogSoftmax, one codelet task per batch partition each way."""

from __future__ import annotations

import numbers

from ..codelets.activation import (gelu_bwd, gelu_fwd, leaky_relu_bwd, leaky_relu_fwd, relu_bwd,
                                   relu_fwd, sigmoid_bwd, sigmoid_fwd, tanh_bwd, tanh_fwd)
from ..codelets.loss import log_softmax, log_softmax_bwd
from ..errors import ConfigError, ShapeError
from .base import Layer


class _Pointwise(Layer):
    """An elementwise activation: ``fwd`` per partition, ``bwd`` from the saved input or output."""

    fwd = bwd = None
    saves = "output"  # which forward operand the backward codelet reads

    def _params_kw(self):
        return {}

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        kw = self._params_kw()
        for x, y in zip(xs, ys):
            rt.submit(self.fwd, x, y, **kw)
        self._saved = ys if self.saves == "output" else xs
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        kw = self._params_kw()
        for s, dy, dx in zip(self._saved, dys, dxs):
            rt.submit(self.bwd, s, dy, dx, **kw)
        return dxs


class ReLU(_Pointwise):
    """``torch.nn.ReLU()`` (gradient 0 at exactly 0, as PyTorch)."""

    fwd, bwd = relu_fwd, relu_bwd


class LogSoftmax(_Pointwise):
    """``torch.nn.LogSoftmax(dim=1)`` over ``(n, K)``: the layer before ``NLLLoss``.

    Row-wise rather than elementwise, but the same task pattern: its backward reads its output.
    """

    fwd, bwd = log_softmax, log_softmax_bwd

    def infer_shape(self, input_shape):
        if len(input_shape) != 1:
            raise ShapeError(f"LogSoftmax: expected inputs of shape (K,) per sample (after "
                             f"Flatten/Dense), got {tuple(input_shape)}")
        return input_shape

    def extra_repr(self):
        return "dim=1"


class LeakyReLU(_Pointwise):
    """``torch.nn.LeakyReLU(negative_slope=0.01)``."""

    fwd, bwd, saves = leaky_relu_fwd, leaky_relu_bwd, "input"

    def __init__(self, negative_slope=0.01):
        super().__init__()
        if isinstance(negative_slope, bool) or not isinstance(negative_slope, numbers.Real):
            raise ConfigError(f"LeakyReLU: negative_slope must be a number, got {negative_slope!r}")
        self.negative_slope = float(negative_slope)

    def _params_kw(self):
        return {"negative_slope": self.negative_slope}

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class Sigmoid(_Pointwise):
    """``torch.nn.Sigmoid()``."""

    fwd, bwd = sigmoid_fwd, sigmoid_bwd


class Tanh(_Pointwise):
    """``torch.nn.Tanh()``."""

    fwd, bwd = tanh_fwd, tanh_bwd


class GELU(_Pointwise):
    """``torch.nn.GELU()``: the exact form ``x * Phi(x)`` (``approximate='none'``)."""

    fwd, bwd, saves = gelu_fwd, gelu_bwd, "input"

    def extra_repr(self):
        return "approximate='none'"
