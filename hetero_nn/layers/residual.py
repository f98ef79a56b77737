"""Residual: ``body(x) + (shortcut(x) if shortcut else x)``, its backward the sum of both
input gradients.

``body`` and ``shortcut`` are :class:`~hetero_nn.layers.Sequential` (a list or a
single layer is wrapped in one), so the ``state_dict`` keys are those of a PyTorch
module holding two ``nn.Sequential`` named ``body`` and ``shortcut``:
``"<i>.body.<j>.weight"``, ``"<i>.shortcut.<j>.running_mean"``...
"""

from __future__ import annotations

from ..codelets.residual import add2
from ..errors import ShapeError
from .base import Layer
from .sequential import Sequential


def _as_sequential(value, what):
    if isinstance(value, Sequential):
        return value
    if isinstance(value, Layer):
        return Sequential(value)
    if isinstance(value, (list, tuple)):
        return Sequential(*value)
    raise TypeError(f"Residual: {what} must be a Sequential, a Layer or a list of layers, "
                    f"got {type(value).__name__}")


class Residual(Layer):
    """A residual block (``x -> body(x) + shortcut(x)``); ``shortcut=None`` is the identity.

    >>> from hetero_nn.layers import Conv2D, ReLU
    >>> block = Residual([Conv2D(4, 4, 3, padding=1), ReLU()])
    >>> [name for name, _ in block.named_parameters()]
    ['body.0.weight', 'body.0.bias']
    """

    join_fusable = True
    """``layers/fused_blocks.py`` may join with the ``ReLU`` after the block (``add2_relu``)."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = _as_sequential(body, "body")
        self.shortcut = None if shortcut is None else _as_sequential(shortcut, "shortcut")

    def constructor_args(self):
        return (self.body, self.shortcut), {}

    def named_children(self):
        children = [("body", self.body)]
        return children + ([("shortcut", self.shortcut)] if self.shortcut is not None else [])

    def named_parameters(self):
        return self._prefixed("named_parameters")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        return self._prefixed("named_buffers")

    def named_state(self):
        return self._prefixed("named_state")

    def reset_parameters(self, rng=None):
        for _, child in self.named_children():
            child.reset_parameters(rng)

    def bind(self, rt):
        for _, child in self.named_children():
            child.bind(rt)

    def zero_grad(self, rt):
        for _, child in self.named_children():
            child.zero_grad(rt)

    def build(self, input_shape, dtype):
        shape = tuple(input_shape)
        self.input_shape = shape
        outs = {}
        for name, child in self.named_children():
            try:
                outs[name] = child.build(shape, dtype)
            except ShapeError as exc:
                raise ShapeError(f"{name}: {exc}") from None
        self.dtype = self.body.dtype
        shortcut_shape = outs.get("shortcut", shape)
        if outs["body"] != shortcut_shape:
            what = "shortcut" if self.shortcut is not None else "input (identity shortcut)"
            raise ShapeError(f"body gives {outs['body']} but the {what} gives {shortcut_shape}")
        self.output_shape = outs["body"]
        return self.output_shape

    def forward(self, rt, xs, join=add2):
        """``join(body, shortcut, y)`` per partition (``add2``; a fused run passes
        ``add2_relu``)."""
        body = self.body.forward(rt, xs)
        short = xs if self.shortcut is None else self.shortcut.forward(rt, xs)
        ys = self.outputs(rt, xs)
        for a, b, y in zip(body, short, ys):
            rt.submit(join, a, b, y)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        dbody = self.body.backward(rt, dys, need_input_grad=need_input_grad)
        if self.shortcut is None:
            dshort = dys
        else:
            dshort = self.shortcut.backward(rt, dys, need_input_grad=need_input_grad)
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for a, b, dx in zip(dbody, dshort, dxs):
            rt.submit(add2, a, b, dx)
        return dxs
