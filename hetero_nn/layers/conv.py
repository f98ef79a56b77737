"""Conv2d: a 2-D convolution submitted as one codelet task per batch partition.

``Conv2d`` takes ``torch.nn.Conv2d``'s arguments, defaults and ``state_dict`` keys
(``weight`` ``[out, in/groups, kh, kw]``, ``bias``); ``Conv2D`` is the same class
(the Keras spelling). A depthwise convolution (``groups == in_channels > 1``)
submits the ``conv2d_depthwise_*`` codelets (``codelets/depthwise.py``), every
other one the ``conv2d_*`` codelets, with the options as task parameters (only
those that differ from the defaults, so the tasks of a plain convolution are
what they always were).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..codelets import depthwise
from ..codelets.conv import (conv2d_bwd_input, conv2d_bwd_params, conv2d_bwd_weight,
                             conv2d_fwd, conv2d_fwd_nobias, conv2d_geometry)
from ..codelets.padding import MODES
from ..errors import ConfigError, ShapeError
from .base import AffineLayer
from ..codelets._checks import pair, positive_int


class Conv2d(AffineLayer):
    """``torch.nn.Conv2d``: the same arguments, defaults and weights ``(out, in/groups, kh, kw)``.

    ``padding`` is an int, a pair, ``'same'`` (refused with a stride above 1, as
    PyTorch does) or ``'valid'``; ``padding_mode`` is ``'zeros'``, ``'reflect'``,
    ``'replicate'`` or ``'circular'``. ``device`` may only be None or ``'cpu'``
    (where tasks run is the runtime's choice); ``dtype`` sets the parameters'
    initial dtype (``build`` casts them to the model's).

    >>> Conv2d(1, 4, 3)
    Conv2d(1, 4, kernel_size=(3, 3), stride=(1, 1))
    >>> Conv2d(8, 8, 3, padding="same", groups=8, bias=False)
    Conv2d(8, 8, kernel_size=(3, 3), stride=(1, 1), padding=same, groups=8, bias=False)
    """

    fwd, fwd_nobias, bwd_input = conv2d_fwd, conv2d_fwd_nobias, conv2d_bwd_input
    bwd_params, bwd_weight = conv2d_bwd_params, conv2d_bwd_weight

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        name = "Conv2d"
        self.in_channels = positive_int(in_channels, "in_channels", name)
        self.out_channels = positive_int(out_channels, "out_channels", name)
        self.kernel_size = pair(kernel_size, "kernel_size", name, minimum=1)
        self.stride = pair(stride, "stride", name, minimum=1)
        self.dilation = pair(dilation, "dilation", name, minimum=1)
        self.groups = positive_int(groups, "groups", name)
        if self.in_channels % self.groups:
            raise ConfigError(f"{name}: in_channels {self.in_channels} must be divisible by "
                              f"groups {self.groups}")
        if self.out_channels % self.groups:
            raise ConfigError(f"{name}: out_channels {self.out_channels} must be divisible by "
                              f"groups {self.groups}")
        self.padding = _padding(padding, self.stride, name)
        if padding_mode not in MODES:
            raise ConfigError(f"{name}: padding_mode must be one of "
                              f"{', '.join(map(repr, MODES))}, got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.bias = bool(bias)
        if device not in (None, "cpu"):
            raise ConfigError(f"{name}: device={device!r}: layers hold host arrays and the "
                              "runtime places tasks; leave device as None")
        if dtype is not None:
            self.dtype = np.dtype(dtype)
            if self.dtype not in (np.float32, np.float64):
                raise ConfigError(f"{name}: dtype must be float32 or float64, got {dtype!r}")
        self.depthwise = self.groups == self.in_channels > 1
        if self.depthwise:
            self.fwd, self.fwd_nobias = (depthwise.conv2d_depthwise_fwd,
                                         depthwise.conv2d_depthwise_fwd_nobias)
            self.bwd_input = depthwise.conv2d_depthwise_bwd_input
            self.bwd_params = depthwise.conv2d_depthwise_bwd_params
            self.bwd_weight = depthwise.conv2d_depthwise_bwd_weight
        kh, kw = self.kernel_size
        self.add_parameter("weight", self._uniform(
            (self.out_channels, self.in_channels // self.groups, kh, kw)))
        if self.bias:
            self.add_parameter("bias", self._uniform((self.out_channels,)))

    @property
    def fan_in(self):
        return self.in_channels // self.groups * self.kernel_size[0] * self.kernel_size[1]

    def infer_shape(self, input_shape):
        if len(input_shape) != 3 or input_shape[0] != self.in_channels:
            raise ShapeError(f"expects input of shape ({self.in_channels}, H, W), got {input_shape}")
        weight = self._params["weight"].shape
        try:
            geo = conv2d_geometry((1, *input_shape), weight, **{**self._kw, "groups": self.groups})
        except ValueError as exc:
            raise ShapeError(f"kernel {self.kernel_size} (dilation {self.dilation}) with padding "
                             f"{self.padding!r} does not fit input of shape {input_shape}: "
                             f"{str(exc).removeprefix('conv2d: ')}") from None
        return (self.out_channels, geo.out_h, geo.out_w)

    @property
    def _kw(self):
        """Task parameters: the options that differ from the defaults (groups implied by the
        depthwise codelets)."""
        kw = {"stride": _compact(self.stride), "padding": _compact(self.padding)}
        if self.dilation != (1, 1):
            kw["dilation"] = _compact(self.dilation)
        if self.groups != 1 and not self.depthwise:
            kw["groups"] = self.groups
        if self.padding_mode != "zeros":
            kw["padding_mode"] = self.padding_mode
        return kw

    @property
    def fusable(self):
        """Whether ``layers/fused.py`` may run this layer in a fused chain: every convolution
        but a depthwise one (the chains call the ``conv2d_*`` kernels)."""
        return not self.depthwise

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if not self.bias:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


Conv2D = Conv2d
"""The Keras spelling of :class:`Conv2d` (the same class)."""


def _padding(padding, stride, name):
    """``padding`` as PyTorch keeps it: ``'same'``/``'valid'``, or a pair of ints >= 0."""
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ConfigError(f"{name}: padding must be an int, a pair, 'same' or 'valid', "
                              f"got {padding!r}")
        if padding == "same" and stride != (1, 1):
            raise ConfigError(f"{name}: padding='same' is not supported for strided "
                              f"convolutions (stride {stride})")
        return padding
    if isinstance(padding, numbers.Integral) or isinstance(padding, (tuple, list)):
        return pair(padding, "padding", name, minimum=0)
    raise ConfigError(f"{name}: padding must be an int, a pair, 'same' or 'valid', "
                      f"got {padding!r}")


def _compact(p):
    """An ``(a, a)`` pair as the int ``a``: performance-model footprints key on ints."""
    return p if isinstance(p, str) or p[0] != p[1] else p[0]
