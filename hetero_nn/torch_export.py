"""``to_torch``: the ``torch.nn`` module of a hetero_nn model (``from_torch``'s inverse,
in :mod:`hetero_nn.torch_interop`).

Policy: one ``torch.nn`` module per layer, ``Sequential`` as ``nn.Sequential`` with the
same names and ``Residual`` as one small module class holding ``body`` and ``shortcut``;
weights, buffers, dtype and train/eval modes copied. torch is imported only when these
functions run.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np

from .errors import ConversionError
from . import layers as L


def _torch():
    try:
        import torch.fx  # torch: optional, and seconds at start-up (binds torch too)
    except ImportError:
        raise ConversionError("from_torch/to_torch need PyTorch (pip install torch)") from None
    return torch


# --------------------------------------------------------------------------- to_torch

@functools.lru_cache(maxsize=None)
def residual_module_class():
    """The ``torch.nn.Module`` class ``to_torch`` makes of a Residual (one class, made once)."""
    torch = _torch()

    class Residual(torch.nn.Module):
        """hetero_nn's Residual: ``body(x) + (shortcut(x) if shortcut else x)``."""

        def __init__(self, body, shortcut=None):
            super().__init__()
            self.body = body
            self.shortcut = shortcut

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))

    return Residual


def _torch_module(layer, nn):
    kind = type(layer)
    if kind is L.Sequential:
        return nn.Sequential(OrderedDict((name, _torch_module(child, nn))
                                         for name, child in layer.named_children()))
    if kind is L.Residual:
        return residual_module_class()(_torch_module(layer.body, nn),
                                 None if layer.shortcut is None
                                 else _torch_module(layer.shortcut, nn))
    simple = {L.ReLU: nn.ReLU, L.ReLU6: nn.ReLU6, L.SiLU: nn.SiLU, L.Hardswish: nn.Hardswish,
              L.Sigmoid: nn.Sigmoid, L.Tanh: nn.Tanh, L.GELU: nn.GELU, L.Identity: nn.Identity,
              L.Flatten: nn.Flatten, L.LogSoftmax: lambda: nn.LogSoftmax(dim=1)}
    if kind in simple:
        return simple[kind]()
    if kind is L.Linear:
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if kind is L.Conv2d:
        return nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                         stride=layer.stride, padding=layer.padding, dilation=layer.dilation,
                         groups=layer.groups, bias=layer.bias, padding_mode=layer.padding_mode)
    if kind in (L.BatchNorm2d, L.BatchNorm1d):
        cls = nn.BatchNorm2d if kind is L.BatchNorm2d else nn.BatchNorm1d
        return cls(layer.num_features, layer.eps, layer.momentum, layer.affine,
                   layer.track_running_stats)
    if kind is L.LayerNorm:
        return nn.LayerNorm(layer.normalized_shape, layer.eps, layer.elementwise_affine,
                            bias=layer.has_bias)
    if kind is L.MaxPool2d:
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding, layer.dilation,
                            ceil_mode=layer.ceil_mode)
    if kind is L.AvgPool2d:
        return nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding, layer.ceil_mode,
                            layer.count_include_pad, layer.divisor_override)
    if kind in (L.AdaptiveAvgPool2d, L.GlobalAvgPool2D):
        return nn.AdaptiveAvgPool2d(layer.output_size)
    if kind is L.LeakyReLU:
        return nn.LeakyReLU(layer.negative_slope)
    if kind is L.Softmax:
        return nn.Softmax(layer.dim)
    if kind in (L.Dropout, L.Dropout2d):
        return (nn.Dropout if kind is L.Dropout else nn.Dropout2d)(layer.p)
    raise ConversionError(f"to_torch: {kind.__name__} has no torch.nn equivalent here")


def to_torch(model):
    """The ``torch.nn`` module equivalent to ``model``: the same layers (``Residual`` as a
    small module holding ``body`` and ``shortcut``), weights, buffers, dtype and modes.

    Its ``state_dict`` keys are the model's paths (``layer1_0.body.layer1_0_bn1.weight``),
    which a model from ``from_torch`` renames to the source module's (``state_names``).
    """
    torch = _torch()
    module = _torch_module(model, torch.nn)
    if model.output_shape is not None:
        module = module.to(getattr(torch, np.dtype(model.dtype).name))
    paths = {v: k for k, v in (getattr(model, "state_names", None) or {}).items()}
    module.load_state_dict({paths.get(k, k): torch.from_numpy(np.array(v)) for k, v in
                            model.state_dict().items()})
    for (_, layer), (_, sub) in zip(model.named_modules(), module.named_modules()):
        sub.train(layer.training)
    return module
