"""ReLU: ``max(x, 0)``; its backward passes the gradient where the output is positive."""

from __future__ import annotations

from ..codelets.activation import relu_bwd, relu_fwd
from .base import Layer


class OutputGradLayer(Layer):
    """A layer whose backward needs only its output: ``fwd`` (R x, W y) and
    ``bwd`` (R y, R dy, W dx), one task per partition."""

    fwd = bwd = None

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        for x, y in zip(xs, ys):
            rt.submit(self.fwd, x, y)
        self._ys = ys
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for y, dy, dx in zip(self._ys, dys, dxs):
            rt.submit(self.bwd, y, dy, dx)
        return dxs


class ReLU(OutputGradLayer):
    """``torch.nn.ReLU()`` (gradient 0 at exactly 0, as PyTorch)."""

    fwd, bwd = relu_fwd, relu_bwd
