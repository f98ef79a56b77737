"""ReLU: ``max(x, 0)``; its backward passes the gradient where the output is positive."""

from __future__ import annotations

from ..codelets.activation import relu_bwd, relu_fwd
from .base import Layer


class ReLU(Layer):
    """``torch.nn.ReLU()`` (gradient 0 at exactly 0, as PyTorch)."""

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        for x, y in zip(xs, ys):
            rt.submit(relu_fwd, x, y)
        self._ys = ys
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for y, dy, dx in zip(self._ys, dys, dxs):
            rt.submit(relu_bwd, y, dy, dx)
        return dxs
