"""LayerNorm: each sample normalised over its trailing dimensions, one task per partition.

The statistics belong to a sample, so the forward and the input gradient are one
task per partition that needs nothing from the others; the forward also writes
each row's mean and ``1 / std`` (float64 temporaries partitioned like the batch)
for the backward. The parameter gradients are sums over the whole batch: the
first partition's contribution writes them, the others add by REDUX (see
:func:`~hetero_nn.layers.base.contribution`).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..codelets.layernorm import (layer_norm_bwd_input, layer_norm_bwd_params,
                                  layer_norm_bwd_weight, layer_norm_fwd)
from ..errors import ConfigError, ShapeError
from .base import Layer, contribution


class LayerNorm(Layer):
    """``torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)``.

    ``normalized_shape`` (an int or a tuple) is the trailing part of a sample's shape
    the statistics are taken over; ``weight`` (ones) and ``bias`` (zeros) have that
    shape, as PyTorch's.

    >>> LayerNorm(16)
    LayerNorm((16,), eps=1e-05, elementwise_affine=True)
    """

    overwrites_grads = True

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        name = "LayerNorm"
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
            else tuple(normalized_shape)
        if not shape or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1
                            for d in shape):
            raise ConfigError(f"{name}: normalized_shape must be a positive int or a tuple of "
                              f"them, got {normalized_shape!r}")
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps > 0:
            raise ConfigError(f"{name}: eps must be a positive number, got {eps!r}")
        self.normalized_shape = tuple(int(d) for d in shape)
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.has_bias = bool(bias) and self.elementwise_affine
        if self.elementwise_affine:
            self.add_parameter("weight", np.ones(self.normalized_shape, self.dtype))
            if self.has_bias:
                self.add_parameter("bias", np.zeros(self.normalized_shape, self.dtype))
        self._constants = None  # (runtime, ones, zeros) standing for absent parameters

    def reset_parameters(self, rng=None):
        """PyTorch's: weight 1, bias 0."""
        for p in self.parameters():
            p.data[...] = 1 if p.name == "weight" else 0

    def infer_shape(self, input_shape):
        d = len(self.normalized_shape)
        if tuple(input_shape[len(input_shape) - d:]) != self.normalized_shape:
            raise ShapeError(f"expects samples ending with {self.normalized_shape}, got "
                             f"{tuple(input_shape)}")
        return input_shape

    def _stats_shape(self):
        return self.input_shape[:len(self.input_shape) - len(self.normalized_shape)]

    def _affine_handles(self, rt):
        """``(weight, bias)``: the parameters, or constant ones and zeros where absent."""
        if (self._constants is None or self._constants[0] is not rt or rt.closed
                or self._constants[1].dtype != self.dtype):
            self._constants = (rt, rt.register(np.ones(self.normalized_shape, self.dtype),
                                               name="ln.ones"),
                               rt.register(np.zeros(self.normalized_shape, self.dtype),
                                           name="ln.zeros"))
        weight = self._params["weight"].handle if self.elementwise_affine else self._constants[1]
        bias = self._params["bias"].handle if self.has_bias else self._constants[2]
        return weight, bias

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        stats = self._stats_shape()
        means = self.outputs(rt, xs, shape=stats, dtype=np.float64)
        rstds = self.outputs(rt, xs, shape=stats, dtype=np.float64)
        weight, bias = self._affine_handles(rt)
        for x, y, m, r in zip(xs, ys, means, rstds):
            rt.submit(layer_norm_fwd, x, weight, bias, y, m, r, eps=self.eps)
        self._saved = (xs, means, rstds)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        xs, means, rstds = self._saved
        params = self.parameters()
        if params:
            codelet = layer_norm_bwd_params if self.has_bias else layer_norm_bwd_weight
            grads = [p.grad for p in params]
            for x, dy, m, r in zip(xs, dys, means, rstds):
                rt.submit(contribution(codelet, params), x, dy, m, r, *grads)
        if not need_input_grad:
            return None
        weight, _ = self._affine_handles(rt)
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for x, dy, m, r, dx in zip(xs, dys, means, rstds, dxs):
            rt.submit(layer_norm_bwd_input, x, dy, m, r, weight, dx)
        return dxs

    def extra_repr(self):
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        return s + ("" if self.has_bias or not self.elementwise_affine else ", bias=False")
