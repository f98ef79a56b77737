"""Conv2D: a 2-D convolution submitted as one codelet task per batch partition."""

from __future__ import annotations

import math

from ..codelets.conv import (conv2d_bwd_input, conv2d_bwd_params, conv2d_bwd_weight,
                             conv2d_fwd, conv2d_fwd_nobias)
from ..errors import ShapeError
from .base import Layer, default_rng
from .checks import positive_int, pair


class Conv2D(Layer):
    """``torch.nn.Conv2d`` with the same arguments, weights ``(out, in, kh, kw)``.

    >>> Conv2D(1, 4, 3)
    Conv2D(1, 4, kernel_size=(3, 3), stride=(1, 1))
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        name = "Conv2D"
        self.in_channels = positive_int(in_channels, "in_channels", name)
        self.out_channels = positive_int(out_channels, "out_channels", name)
        self.kernel_size = pair(kernel_size, "kernel_size", name, minimum=1)
        self.stride = pair(stride, "stride", name, minimum=1)
        self.padding = pair(padding, "padding", name, minimum=0)
        self.bias = bool(bias)
        kh, kw = self.kernel_size
        self.add_parameter("weight", self._uniform((self.out_channels, self.in_channels, kh, kw)))
        if self.bias:
            self.add_parameter("bias", self._uniform((self.out_channels,)))

    def _uniform(self, shape, rng=None):
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        return (rng or default_rng()).uniform(-bound, bound, size=shape).astype(self.dtype)

    def reset_parameters(self, rng=None):
        """PyTorch's default: kaiming_uniform(a=sqrt(5)) weights and bias U(+-1/sqrt(fan_in))."""
        for p in self.parameters():
            p.data[...] = self._uniform(p.data.shape, rng)

    def infer_shape(self, input_shape):
        if len(input_shape) != 3 or input_shape[0] != self.in_channels:
            raise ShapeError(f"expects input of shape ({self.in_channels}, H, W), got {input_shape}")
        _, h, w = input_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        if oh < 1 or ow < 1:
            raise ShapeError(f"kernel {self.kernel_size} with padding {self.padding} does not fit "
                             f"input of shape {input_shape}")
        return (self.out_channels, oh, ow)

    @property
    def _kw(self):
        return {"stride": _compact(self.stride), "padding": _compact(self.padding)}

    def forward(self, rt, xs):
        self._xs = xs
        ys = self.outputs(rt, xs)
        w = self._params["weight"].handle
        if self.bias:
            b = self._params["bias"].handle
            for x, y in zip(xs, ys):
                rt.submit(conv2d_fwd, x, w, b, y, **self._kw)
        else:
            for x, y in zip(xs, ys):
                rt.submit(conv2d_fwd_nobias, x, w, y, **self._kw)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        w = self._params["weight"]
        for x, dy in zip(self._xs, dys):
            if self.bias:
                rt.submit(conv2d_bwd_params, x, dy, w.grad, self._params["bias"].grad, **self._kw)
            else:
                rt.submit(conv2d_bwd_weight, x, dy, w.grad, **self._kw)
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for dy, dx in zip(dys, dxs):
            rt.submit(conv2d_bwd_input, dy, w.handle, dx, **self._kw)
        return dxs

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if not self.bias:
            s += ", bias=False"
        return s


def _compact(p):
    """An ``(a, a)`` pair as the int ``a``: performance-model footprints key on ints."""
    return p[0] if p[0] == p[1] else p
