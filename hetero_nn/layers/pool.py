"""MaxPool2D: max pooling that keeps each window's argmax for the backward pass."""

from __future__ import annotations

import numpy as np

from ..codelets.pool import maxpool2d_bwd, maxpool2d_fwd
from ..errors import ShapeError
from .base import Layer
from ..codelets._checks import pair


class MaxPool2D(Layer):
    """``torch.nn.MaxPool2d(kernel_size, stride=None)``: stride defaults to the kernel size."""

    def __init__(self, kernel_size, stride=None):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size", "MaxPool2D", minimum=1)
        self.stride = (self.kernel_size if stride is None
                       else pair(stride, "stride", "MaxPool2D", minimum=1))

    def infer_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ShapeError(f"expects input of shape (C, H, W), got {input_shape}")
        c, h, w = input_shape
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        if h < kh or w < kw:
            raise ShapeError(f"kernel {self.kernel_size} is larger than input of shape {input_shape}")
        return (c, (h - kh) // sh + 1, (w - kw) // sw + 1)

    @property
    def _kw(self):
        k, s = self.kernel_size, self.stride
        return {"kernel_size": k[0] if k[0] == k[1] else k, "stride": s[0] if s[0] == s[1] else s}

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
            rt.submit(maxpool2d_bwd, dy, a, dx)
        return dxs

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}"
