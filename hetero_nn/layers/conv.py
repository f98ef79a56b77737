"""Conv2D: a 2-D convolution submitted as one codelet task per batch partition."""

from __future__ import annotations

from ..codelets.conv import (conv2d_bwd_input, conv2d_bwd_params, conv2d_bwd_weight,
                             conv2d_fwd, conv2d_fwd_nobias)
from ..errors import ShapeError
from .base import AffineLayer
from ..codelets._checks import pair, positive_int


class Conv2D(AffineLayer):
    """``torch.nn.Conv2d`` with the same arguments, weights ``(out, in, kh, kw)``.

    >>> Conv2D(1, 4, 3)
    Conv2D(1, 4, kernel_size=(3, 3), stride=(1, 1))
    """

    fwd, fwd_nobias, bwd_input = conv2d_fwd, conv2d_fwd_nobias, conv2d_bwd_input
    bwd_params, bwd_weight = conv2d_bwd_params, conv2d_bwd_weight

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

    @property
    def fan_in(self):
        return self.in_channels * self.kernel_size[0] * self.kernel_size[1]

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
