"""PyTorch twins of hetero_nn layers and models, for the tests that compare with torch.

``torch_module(layer)`` is the ``torch.nn`` module with the same arguments (a Residual
becomes a module holding ``body`` and ``shortcut`` Sequentials, so the state_dict keys
agree); ``torch_twin(model, dtype)`` also copies the weights and buffers. Torch is
imported by the caller (``pytest.importorskip``) before these run.
"""

from __future__ import annotations

import numpy as np

import hetero_nn as hn


def _torch():
    import torch
    return torch


def torch_residual_class():
    """The torch module of a Residual: ``body(x) + shortcut(x)`` (``hn.to_torch``'s)."""
    from hetero_nn.torch_interop import residual_module_class
    return residual_module_class()


def torch_module(layer):
    """The ``torch.nn`` module with the same arguments as ``layer`` (no weights copied)."""
    nn = _torch().nn
    if isinstance(layer, hn.Sequential):
        return nn.Sequential(*(torch_module(child) for child in layer))
    if isinstance(layer, hn.Residual):
        shortcut = None if layer.shortcut is None else torch_module(layer.shortcut)
        return torch_residual_class()(torch_module(layer.body), shortcut)
    if isinstance(layer, hn.Conv2d):
        return nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                         stride=layer.stride, padding=layer.padding, dilation=layer.dilation,
                         groups=layer.groups, bias=layer.bias, padding_mode=layer.padding_mode)
    if isinstance(layer, hn.BatchNorm2D):
        return nn.BatchNorm2d(layer.num_features, eps=layer.eps, momentum=layer.momentum,
                              affine=layer.affine, track_running_stats=layer.track_running_stats)
    if isinstance(layer, hn.Dropout):
        return nn.Dropout(layer.p)
    if isinstance(layer, hn.AdaptiveAvgPool2d):
        return nn.AdaptiveAvgPool2d(layer.output_size)
    if isinstance(layer, hn.AvgPool2d):
        return nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding, layer.ceil_mode,
                            layer.count_include_pad, layer.divisor_override)
    if isinstance(layer, hn.MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding, layer.dilation,
                            ceil_mode=layer.ceil_mode)
    if isinstance(layer, hn.Dense):
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if isinstance(layer, hn.LeakyReLU):
        return nn.LeakyReLU(layer.negative_slope)
    simple = {hn.ReLU: nn.ReLU, hn.Sigmoid: nn.Sigmoid, hn.Tanh: nn.Tanh, hn.GELU: nn.GELU,
              hn.Flatten: nn.Flatten, hn.ReLU6: nn.ReLU6}
    return simple[type(layer)]()


def torch_twin(model, dtype="float64"):
    """``torch_module(model)`` in ``dtype`` holding a copy of ``model``'s weights and buffers."""
    torch = _torch()
    twin = torch_module(model).to(getattr(torch, np.dtype(dtype).name))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    return twin
