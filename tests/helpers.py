"""Helpers shared by the tests (importable because pytest puts tests/ on sys.path) and
by the benchmarks that compare with PyTorch (``benchmarks/bench_training.py``)."""

import numpy as np


def rel_err(actual, expected) -> float:
    """Largest absolute difference relative to the largest magnitude of ``expected``."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
    return float(np.max(np.abs(actual - expected), initial=0.0)) / scale


def pair(v):
    """An int or a pair as a pair (PyTorch's ``_pair``)."""
    return tuple(v) if isinstance(v, tuple) else (v, v)


def torch_twin(model, dtype):
    """A ``torch.nn.Sequential`` of the same layers holding a copy of ``model``'s weights."""
    import torch

    import hetero_nn as hn

    layers = []
    for layer in model:
        if isinstance(layer, hn.Conv2D):
            layers.append(torch.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                                          stride=layer.stride, padding=layer.padding,
                                          bias=layer.bias))
        elif isinstance(layer, hn.MaxPool2D):
            layers.append(torch.nn.MaxPool2d(layer.kernel_size, layer.stride))
        elif isinstance(layer, hn.Dense):
            layers.append(torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias))
        elif isinstance(layer, hn.ReLU):
            layers.append(torch.nn.ReLU())
        elif isinstance(layer, hn.Flatten):
            layers.append(torch.nn.Flatten())
        else:
            raise TypeError(f"no torch twin for {layer!r}")
    twin = torch.nn.Sequential(*layers).to(getattr(torch, np.dtype(dtype).name))
    twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    return twin
