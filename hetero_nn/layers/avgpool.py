"""AvgPool2D and GlobalAvgPool2D: average pooling submitted per batch partition."""

from __future__ import annotations

from ..codelets.avgpool import avgpool2d_bwd, avgpool2d_fwd
from ..errors import ConfigError, ShapeError
from .base import Layer
from ..codelets._checks import pair


def _compact(p):
    return p[0] if p[0] == p[1] else p


class AvgPool2D(Layer):
    """``torch.nn.AvgPool2d(kernel_size, stride=None, padding=0)`` (floor mode, padding
    counted in the average, as PyTorch's defaults)."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name = "AvgPool2D"
        self.kernel_size = pair(kernel_size, "kernel_size", name, minimum=1)
        self.stride = (self.kernel_size if stride is None
                       else pair(stride, "stride", name, minimum=1))
        self.padding = pair(padding, "padding", name, minimum=0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ConfigError(f"{name}: padding {self.padding} must be at most half the kernel "
                              f"size {self.kernel_size}")

    def infer_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ShapeError(f"expects input of shape (C, H, W), got {input_shape}")
        c, h, w = input_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        if h + 2 * ph < kh or w + 2 * pw < kw:
            raise ShapeError(f"kernel {self.kernel_size} is larger than input of shape "
                             f"{input_shape} with padding {self.padding}")
        return (c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)

    @property
    def _kw(self):
        return {"kernel_size": _compact(self.kernel_size), "stride": _compact(self.stride),
                "padding": _compact(self.padding)}

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        kw = self._kw
        for x, y in zip(xs, ys):
            rt.submit(avgpool2d_fwd, x, y, **kw)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        kw = self._kw
        for dy, dx in zip(dys, dxs):
            rt.submit(avgpool2d_bwd, dy, dx, **kw)
        return dxs

    def extra_repr(self):
        s = f"kernel_size={self.kernel_size}, stride={self.stride}"
        return s + (f", padding={self.padding}" if self.padding != (0, 0) else "")


class GlobalAvgPool2D(AvgPool2D):
    """``torch.nn.AdaptiveAvgPool2d(1)``: the mean of each channel, output ``(C, 1, 1)``."""

    def __init__(self):
        Layer.__init__(self)
        self.kernel_size = self.stride = None
        self.padding = (0, 0)

    def infer_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ShapeError(f"expects input of shape (C, H, W), got {input_shape}")
        self.kernel_size = self.stride = tuple(input_shape[1:])  # one window per plane
        return (input_shape[0], 1, 1)

    def extra_repr(self):
        return ""
