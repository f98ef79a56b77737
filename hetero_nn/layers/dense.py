"""Dense (``torch.nn.Linear``) and Flatten (a view: no copy, no task).

Flatten only changes the per-sample shape the next layer is checked against:
the handles flow through unchanged, and the dense codelets read an input of
shape ``(n, *features)`` as ``(n, prod(features))`` through a reshaped view.
"""

from __future__ import annotations

import math

from ..codelets.dense import (dense_bwd_input, dense_bwd_params, dense_bwd_weight, dense_fwd,
                              dense_fwd_nobias)
from ..errors import ShapeError
from .base import Layer, default_rng
from .checks import positive_int


class Flatten(Layer):
    """``torch.nn.Flatten()``: ``(C, H, W)`` samples seen as ``(C*H*W,)``."""

    def infer_shape(self, input_shape):
        return (math.prod(input_shape),)

    def forward(self, rt, xs):
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys if need_input_grad else None


class Dense(Layer):
    """``torch.nn.Linear(in_features, out_features, bias=True)``, weight ``(out, in)``."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = positive_int(in_features, "in_features", "Dense")
        self.out_features = positive_int(out_features, "out_features", "Dense")
        self.bias = bool(bias)
        self.add_parameter("weight", self._uniform((self.out_features, self.in_features)))
        if self.bias:
            self.add_parameter("bias", self._uniform((self.out_features,)))

    def _uniform(self, shape, rng=None):
        bound = 1.0 / math.sqrt(self.in_features)
        return (rng or default_rng()).uniform(-bound, bound, size=shape).astype(self.dtype)

    def reset_parameters(self, rng=None):
        """PyTorch's default: kaiming_uniform(a=sqrt(5)) weights and bias U(+-1/sqrt(fan_in))."""
        for p in self.parameters():
            p.data[...] = self._uniform(p.data.shape, rng)

    def infer_shape(self, input_shape):
        if tuple(input_shape) != (self.in_features,):
            raise ShapeError(f"expects input of shape ({self.in_features},), got {tuple(input_shape)}")
        return (self.out_features,)

    def forward(self, rt, xs):
        self._xs = xs
        ys = self.outputs(rt, xs)
        w = self._params["weight"].handle
        if self.bias:
            b = self._params["bias"].handle
            for x, y in zip(xs, ys):
                rt.submit(dense_fwd, x, w, b, y)
        else:
            for x, y in zip(xs, ys):
                rt.submit(dense_fwd_nobias, x, w, y)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        w = self._params["weight"]
        for x, dy in zip(self._xs, dys):
            if self.bias:
                rt.submit(dense_bwd_params, x, dy, w.grad, self._params["bias"].grad)
            else:
                rt.submit(dense_bwd_weight, x, dy, w.grad)
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self._xs[0].shape[1:])  # the input's own layout
        for dy, dx in zip(dys, dxs):
            rt.submit(dense_bwd_input, dy, w.handle, dx)
        return dxs

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}" + ("" if self.bias else ", bias=False")
