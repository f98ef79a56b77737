"""AvgPool2d and AdaptiveAvgPool2d: average pooling submitted per batch partition.

PyTorch's names, arguments and output-size rules; ``AvgPool2D`` is the same class
as ``AvgPool2d`` (the Keras spelling) and ``GlobalAvgPool2D()`` is
``AdaptiveAvgPool2d(1)``.
"""

from __future__ import annotations

import numbers

from ..codelets.avgpool import (adaptive_avgpool2d_bwd, adaptive_avgpool2d_fwd, avgpool2d_bwd,
                                avgpool2d_fwd, avgpool2d_output_shape)
from ..errors import ConfigError, ShapeError
from .base import Layer
from .conv import _compact
from .pool import _pooled_shape, _window_args


class _Pool(Layer):
    """A pooling layer: ``fwd`` and ``bwd`` submitted per partition with ``_kw``."""

    fwd = bwd = None

    @property
    def _kw(self):
        return {}

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        kw = self._kw
        for x, y in zip(xs, ys):
            rt.submit(self.fwd, x, y, **kw)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        kw = self._kw
        for dy, dx in zip(dys, dxs):
            rt.submit(self.bwd, dy, dx, **kw)
        return dxs


class AvgPool2d(_Pool):
    """``torch.nn.AvgPool2d(kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True, divisor_override=None)``, with PyTorch's divisors (see
    ``codelets/avgpool.py``).

    >>> AvgPool2d(3, 2, 1, ceil_mode=True)
    AvgPool2d(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)
    """

    fwd, bwd = avgpool2d_fwd, avgpool2d_bwd

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        name = "AvgPool2d"
        self.kernel_size, self.stride, self.padding = _window_args(kernel_size, stride, padding,
                                                                   name)
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if divisor_override is not None and (isinstance(divisor_override, bool) or not
                                             isinstance(divisor_override, numbers.Integral)
                                             or divisor_override == 0):
            raise ConfigError(f"{name}: divisor_override must be a non-zero integer or None, "
                              f"got {divisor_override!r}")
        self.divisor_override = divisor_override

    def infer_shape(self, input_shape):
        return _pooled_shape(input_shape, avgpool2d_output_shape, self._kw)

    @property
    def _kw(self):
        kw = {"kernel_size": _compact(self.kernel_size), "stride": _compact(self.stride),
              "padding": _compact(self.padding)}
        if self.ceil_mode:
            kw["ceil_mode"] = True
        if not self.count_include_pad:
            kw["count_include_pad"] = False
        if self.divisor_override is not None:
            kw["divisor_override"] = int(self.divisor_override)
        return kw

    def extra_repr(self):
        s = f"kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.ceil_mode:
            s += ", ceil_mode=True"
        if not self.count_include_pad:
            s += ", count_include_pad=False"
        if self.divisor_override is not None:
            s += f", divisor_override={self.divisor_override}"
        return s


AvgPool2D = AvgPool2d
"""The Keras spelling of :class:`AvgPool2d` (the same class)."""


class AdaptiveAvgPool2d(_Pool):
    """``torch.nn.AdaptiveAvgPool2d(output_size)``: an int, or a pair whose entries may be
    None (that axis keeps the input's size). Windows follow PyTorch's start/end rule
    (``codelets/avgpool.py``), so any output size works, larger than the input included.

    >>> AdaptiveAvgPool2d((None, 7))
    AdaptiveAvgPool2d(output_size=(None, 7))
    """

    fwd, bwd = adaptive_avgpool2d_fwd, adaptive_avgpool2d_bwd

    def __init__(self, output_size):
        super().__init__()
        sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
        if len(sizes) != 2 or not all(
                s is None or (isinstance(s, numbers.Integral) and not isinstance(s, bool)
                              and s >= 1) for s in sizes):
            raise ConfigError(f"{type(self).__name__}: output_size must be an integer >= 1 or "
                              f"a pair of them (None keeps the input's size), got "
                              f"{output_size!r}")
        self.output_size = (output_size if isinstance(output_size, numbers.Integral)
                            else tuple(None if s is None else int(s) for s in sizes))

    def infer_shape(self, input_shape):
        if len(input_shape) != 3:
            raise ShapeError(f"expects input of shape (C, H, W), got {input_shape}")
        out = (self.output_size,) * 2 if isinstance(self.output_size, int) else self.output_size
        return (input_shape[0], *(size if o is None else o
                                  for o, size in zip(out, input_shape[1:])))

    def extra_repr(self):
        return f"output_size={self.output_size}"


class GlobalAvgPool2D(AdaptiveAvgPool2d):
    """``AdaptiveAvgPool2d(1)`` under its Keras name: the mean of each channel, ``(C, 1, 1)``."""

    def __init__(self):
        super().__init__(1)

    def extra_repr(self):
        return ""
