"""Helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def rel_err(actual, expected) -> float:
    """Largest absolute difference relative to the largest magnitude of ``expected``."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
    return float(np.max(np.abs(actual - expected), initial=0.0)) / scale


def pair(v):
    """An int or a pair as a pair (PyTorch's ``_pair``)."""
    return tuple(v) if isinstance(v, tuple) else (v, v)


def load_script(path):
    """The script at ``path`` (relative to the repository) as a fresh module, its
    ``main`` callable in-process."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def central_differences(loss, x, eps):
    """``d loss() / d x`` by central differences, one element at a time: ``loss`` reads
    ``x``, which is changed in place and restored."""
    grad = np.empty_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = loss()
        x[i] = saved - eps
        down = loss()
        x[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad
