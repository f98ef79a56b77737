"""Activations: ReLU (its backward passes the gradient where the output is positive),
LeakyReLU, Sigmoid, Tanh, GELU, SiLU, ReLU6, Hardswish, Softmax along a sample axis and
the row-wise LogSoftmax, one codelet task per batch partition each way.

``inplace`` is accepted where PyTorch has it, for model definitions that pass it; the
output is always a handle of its own (a task never overwrites the input another layer's
backward reads).
"""

from __future__ import annotations

import numbers

from ..codelets.activation import (gelu_bwd, gelu_fwd, hardswish_bwd, hardswish_fwd,
                                   leaky_relu_bwd, leaky_relu_fwd, relu6_bwd, relu6_fwd, relu_bwd,
                                   relu_fwd, sigmoid_bwd, sigmoid_fwd, silu_bwd, silu_fwd,
                                   tanh_bwd, tanh_fwd)
from ..codelets.loss_rows import log_softmax, log_softmax_bwd
from ..codelets.softmax import softmax_bwd, softmax_fwd
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


class _InPlaceArg(_Pointwise):
    """An activation whose PyTorch twin takes ``inplace=False`` (see the module docstring)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = bool(inplace)


class ReLU(_InPlaceArg):
    """``torch.nn.ReLU(inplace=False)`` (gradient 0 at exactly 0, as PyTorch)."""

    fwd, bwd = relu_fwd, relu_bwd


class ReLU6(_InPlaceArg):
    """``torch.nn.ReLU6(inplace=False)``: ``min(max(x, 0), 6)``, gradient 0 at 0 and 6."""

    fwd, bwd, saves = relu6_fwd, relu6_bwd, "input"


class SiLU(_InPlaceArg):
    """``torch.nn.SiLU(inplace=False)``: ``x * sigmoid(x)``."""

    fwd, bwd, saves = silu_fwd, silu_bwd, "input"


class Hardswish(_InPlaceArg):
    """``torch.nn.Hardswish(inplace=False)``: ``x * relu6(x + 3) / 6``."""

    fwd, bwd, saves = hardswish_fwd, hardswish_bwd, "input"


class Softmax(_Pointwise):
    """``torch.nn.Softmax(dim=None)`` along ``dim``, an axis of the whole batch ``(N, ...)``
    other than the batch axis (each sample on its own: partitions stay independent).

    ``dim=None`` is PyTorch's legacy choice (axis 0 for 0-, 1- and 3-dimensional inputs,
    axis 1 otherwise) and must not land on the batch axis.

    >>> Softmax(dim=1)
    Softmax(dim=1)
    """

    fwd, bwd = softmax_fwd, softmax_bwd

    def __init__(self, dim=None):
        super().__init__()
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)):
            raise ConfigError(f"Softmax: dim must be an integer or None, got {dim!r}")
        self.dim = None if dim is None else int(dim)

    def infer_shape(self, input_shape):
        ndim = len(input_shape) + 1  # with the batch axis
        dim = (0 if ndim in (0, 1, 3) else 1) if self.dim is None else self.dim
        axis = dim + ndim if dim < 0 else dim
        if not 1 <= axis < ndim:
            what = "the batch axis" if axis == 0 else "out of range"
            raise ShapeError(f"Softmax: dim={self.dim} is {what} of inputs "
                             f"{('N', *input_shape)}; give an axis of a sample (1..{ndim - 1} "
                             f"or -1..-{ndim - 1})")
        self._axis = axis
        return input_shape

    def _params_kw(self):
        return {"dim": self._axis}

    def extra_repr(self):
        return f"dim={self.dim}"


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
    """``torch.nn.LeakyReLU(negative_slope=0.01, inplace=False)``."""

    fwd, bwd, saves = leaky_relu_fwd, leaky_relu_bwd, "input"

    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.inplace = bool(inplace)
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
