"""Sequential: layers in order, shapes checked at build, PyTorch state_dict keys."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..errors import CheckpointError, ShapeError
from . import fused
from .base import Layer
from .summary import layer_repr, summary


class Sequential(Layer):
    """``torch.nn.Sequential(*layers)``; parameters named ``"<index>.<name>"``.

    ``build(input_shape, dtype)`` infers and checks every shape; a mismatch
    raises :class:`~hetero_nn.errors.ShapeError` naming the layer, its index and
    both shapes, before any task is submitted.

    ``fuse`` (default True; an attribute, may be changed between steps): submit
    the runs ``Conv2D, ReLU, MaxPool2D`` and ``Dense, ReLU`` as one fused task per
    partition (``layers/fused.py``); ``fuse=False`` submits every layer's own tasks.
    """

    def __init__(self, *layers, fuse=True):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Sequential: argument {i} is {type(layer).__name__}, not a Layer")
        self.layers = list(layers)
        self.fuse = bool(fuse)
        self._blocks = None

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)

    # ------------------------------------------------------------ parameters
    def named_parameters(self):
        return [(f"{i}.{name}", p) for i, layer in enumerate(self.layers)
                for name, p in layer.named_parameters()]

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        return [(f"{i}.{name}", b) for i, layer in enumerate(self.layers)
                for name, b in layer.named_buffers()]

    def named_state(self):
        return [(f"{i}.{name}", t) for i, layer in enumerate(self.layers)
                for name, t in layer.named_state()]

    def named_children(self):
        return [(str(i), layer) for i, layer in enumerate(self.layers)]

    def reset_parameters(self, rng=None):
        for layer in self.layers:
            layer.reset_parameters(rng)

    def bind(self, rt):
        for layer in self.layers:
            layer.bind(rt)

    def zero_grad(self, rt):
        for layer in self.layers:
            layer.zero_grad(rt)

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of the weights and buffers under PyTorch's names and shapes."""
        return OrderedDict((name, np.array(p.host(), copy=True)) for name, p in self.named_state())

    def load_state_dict(self, state, strict: bool = True):
        """Load arrays by name (shapes checked; values cast to each parameter's or buffer's
        dtype)."""
        params = dict(self.named_state())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise CheckpointError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            if name not in state:
                continue
            value = np.asarray(state[name])
            if value.shape != p.data.shape:
                raise ShapeError(f"load_state_dict: {name!r} has shape {value.shape}, the model "
                                 f"expects {p.data.shape}")
            p.host()  # make the host replica current before overwriting it
            p.data[...] = value
            rt = p.runtime
            p.unbind()  # other replicas are stale: a fresh handle whose host copy is valid
            if rt is not None and not rt._closed:
                p.bind(rt)  # a trainer bound to rt keeps training with the loaded values

    # ------------------------------------------------------------ shapes
    def build(self, input_shape, dtype="float32"):
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError(f"Sequential.build: dtype must be float32 or float64, got {dtype}")
        shape = tuple(int(d) for d in input_shape)
        self.input_shape, self.dtype = shape, dtype
        for i, layer in enumerate(self.layers):
            try:
                shape = layer.build(shape, dtype)
            except ShapeError as exc:
                raise ShapeError(f"layer {i} ({layer!r}): {exc}") from None
        self.output_shape = shape
        return shape

    @property
    def built(self) -> bool:
        return self.output_shape is not None

    # ------------------------------------------------------------ tasks
    def forward(self, rt, xs):
        self._blocks = fused.plan(self.layers) if self.fuse else list(enumerate(self.layers))
        for _, block in self._blocks:
            xs = block.forward(rt, xs)
        return xs

    def backward(self, rt, dys, need_input_grad=False):
        for i, block in reversed(self._blocks):  # the blocks the forward pass ran
            dys = block.backward(rt, dys, need_input_grad=(i > 0 or need_input_grad))
        return dys

    def summary(self, input_shape=None, dtype=None) -> str:
        """Each layer's output shape and parameter count, as torchsummary prints them.

        Builds the model for ``input_shape`` (one sample) first when given.
        """
        return summary(self, input_shape, dtype)

    def __repr__(self):
        return layer_repr(self)
