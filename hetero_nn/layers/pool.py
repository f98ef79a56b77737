"""MaxPool2d: max pooling that keeps each window's argmax for the backward pass.

``MaxPool2d`` takes ``torch.nn.MaxPool2d``'s arguments and output-size rules
(padding, dilation, ceil mode); ``MaxPool2D`` is the same class (the Keras
spelling).
"""

from __future__ import annotations

import numpy as np

from ..codelets.pool import maxpool2d_bwd, maxpool2d_fwd, maxpool2d_output_shape
from ..errors import ConfigError, ShapeError
from .base import Layer
from ..codelets._checks import pair
from .conv import _compact


class MaxPool2d(Layer):
    """``torch.nn.MaxPool2d(kernel_size, stride=None, padding=0, dilation=1,
    return_indices=False, ceil_mode=False)``: stride defaults to the kernel size, padding
    is at most half the kernel, windows never take padding, and in ceil mode the last
    window must start inside the input or its left padding (PyTorch's rules).
    ``return_indices=True`` is refused: a layer has one output.

    >>> MaxPool2d(3, 2, padding=1, ceil_mode=True)
    MaxPool2d(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        name = "MaxPool2d"
        self.kernel_size, self.stride, self.padding = _window_args(kernel_size, stride, padding,
                                                                   name)
        self.dilation = pair(dilation, "dilation", name, minimum=1)
        if return_indices:
            raise ConfigError(f"{name}: return_indices=True is not supported (a layer returns "
                              "one output; the indices stay inside the layer for its backward)")
        self.return_indices = False
        self.ceil_mode = bool(ceil_mode)

    def infer_shape(self, input_shape):
        return _pooled_shape(input_shape, maxpool2d_output_shape, self._kw)

    @property
    def _kw(self):
        kw = {"kernel_size": _compact(self.kernel_size), "stride": _compact(self.stride)}
        if self.padding != (0, 0):
            kw["padding"] = _compact(self.padding)
        if self.dilation != (1, 1):
            kw["dilation"] = _compact(self.dilation)
        if self.ceil_mode:
            kw["ceil_mode"] = True
        return kw

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        self._argmax = self.outputs(rt, xs, dtype=np.int64)
        for x, y, a in zip(xs, ys, self._argmax):
            rt.submit(maxpool2d_fwd, x, y, a, **self._kw)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for dy, a, dx in zip(dys, self._argmax, dxs):
            rt.submit(maxpool2d_bwd, dy, a, dx, **self._kw)  # the geometry: no scatter on a GPU
        return dxs

    def extra_repr(self):
        s = f"kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        return s + (", ceil_mode=True" if self.ceil_mode else "")


MaxPool2D = MaxPool2d
"""The Keras spelling of :class:`MaxPool2d` (the same class)."""


def _window_args(kernel_size, stride, padding, name):
    """``(kernel_size, stride, padding)`` as pairs, checked: stride defaults to the kernel
    size and padding is at most half the kernel (PyTorch's pooling rules)."""
    kernel_size = pair(kernel_size, "kernel_size", name, minimum=1)
    stride = kernel_size if stride is None else pair(stride, "stride", name, minimum=1)
    padding = pair(padding, "padding", name, minimum=0)
    if any(2 * p > k for p, k in zip(padding, kernel_size)):
        raise ConfigError(f"{name}: padding {padding} must be at most half the kernel size "
                          f"{kernel_size}")
    return kernel_size, stride, padding


def _pooled_shape(input_shape, output_shape, kw):
    """``(C, OH, OW)`` of pooling a ``(C, H, W)`` sample: ``output_shape(x_shape, **kw)`` of
    the layer's codelet, its ``ValueError`` a ``ShapeError``."""
    if len(input_shape) != 3:
        raise ShapeError(f"expects input of shape (C, H, W), got {input_shape}")
    try:
        return output_shape((1, *input_shape), **kw)[1:]
    except ValueError as exc:
        raise ShapeError(f"input of shape {input_shape}: {str(exc).split(': ', 1)[1]}") from None
