"""Linear (alias ``Dense``), and Flatten and Identity (views: no copy, no task).

Flatten only changes the per-sample shape the next layer is checked against:
the handles flow through unchanged, and the dense codelets read an input of
shape ``(n, *features)`` as ``(n, prod(features))`` through a reshaped view.
Identity hands its input handles on, and their gradients back.
"""

from __future__ import annotations

import math

from ..codelets.dense import (dense_bwd_input, dense_bwd_params, dense_bwd_weight, dense_fwd,
                              dense_fwd_nobias)
from ..errors import ConfigError, ShapeError
from .base import AffineLayer, Layer
from ..codelets._checks import positive_int


class _View(Layer):
    """A layer whose output is its input's handles: no task either way."""

    def forward(self, rt, xs):
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys if need_input_grad else None


class Flatten(_View):
    """``torch.nn.Flatten(start_dim=1, end_dim=-1)``: ``(C, H, W)`` samples seen as
    ``(C*H*W,)``.

    Only the whole sample flattens (``start_dim=1`` and ``end_dim`` its last axis): a
    partial flatten would need the handles themselves reshaped, which they are not.
    """

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)
        if self.start_dim != 1:
            raise ConfigError(f"Flatten: start_dim must be 1 (the batch axis stays), got "
                              f"{start_dim!r}")

    def infer_shape(self, input_shape):
        if self.end_dim not in (-1, len(input_shape)):
            raise ConfigError(f"Flatten: end_dim={self.end_dim} keeps axes of a sample of "
                              f"shape {tuple(input_shape)}; only the whole sample flattens "
                              "(end_dim=-1)")
        return (math.prod(input_shape),)


class Identity(_View):
    """``torch.nn.Identity()``: its input, unchanged (arguments accepted and ignored, as
    PyTorch's)."""

    def __init__(self, *args, **kwargs):
        super().__init__()


class Linear(AffineLayer):
    """``torch.nn.Linear(in_features, out_features, bias=True)``, weight ``(out, in)``;
    ``Dense`` is the same class."""

    fwd, fwd_nobias, bwd_input = dense_fwd, dense_fwd_nobias, dense_bwd_input
    bwd_params, bwd_weight = dense_bwd_params, dense_bwd_weight

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = positive_int(in_features, "in_features", "Linear")
        self.out_features = positive_int(out_features, "out_features", "Linear")
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


Dense = Linear
