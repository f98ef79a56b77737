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
from .base import AffineLayer, Layer
from ..codelets._checks import positive_int


class Flatten(Layer):
    """``torch.nn.Flatten()``: ``(C, H, W)`` samples seen as ``(C*H*W,)``."""

    def infer_shape(self, input_shape):
        return (math.prod(input_shape),)

    def forward(self, rt, xs):
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys if need_input_grad else None


class Dense(AffineLayer):
    """``torch.nn.Linear(in_features, out_features, bias=True)``, weight ``(out, in)``."""

    fwd, fwd_nobias, bwd_input = dense_fwd, dense_fwd_nobias, dense_bwd_input
    bwd_params, bwd_weight = dense_bwd_params, dense_bwd_weight

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = positive_int(in_features, "in_features", "Dense")
        self.out_features = positive_int(out_features, "out_features", "Dense")
        self.bias = bool(bias)
        self.add_parameter("weight", self._uniform((self.out_features, self.in_features)))
        if self.bias:
            self.add_parameter("bias", self._uniform((self.out_features,)))

    @property
    def fan_in(self):
        return self.in_features

    def infer_shape(self, input_shape):
        if tuple(input_shape) != (self.in_features,):
            raise ShapeError(f"expects input of shape ({self.in_features},), got {tuple(input_shape)}")
        return (self.out_features,)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}" + ("" if self.bias else ", bias=False")
