"""The array module of a set of arrays: NumPy, or CuPy when the arrays live on a GPU.

Variants written once against ``xp`` run under NumPy in CI (or the strict CuPy
stand-in, :mod:`hetero_nn.codelets.strict_xp`) and under CuPy on a GPU. CuPy is
never imported here: an array is a CuPy array only if CuPy was
already imported by whoever made it.
"""

import sys

import numpy as np


def array_module(*arrays):
    """Return ``cupy`` if any of ``arrays`` is a CuPy array, the strict stand-in
    (:mod:`hetero_nn.codelets.strict_xp`) if any is one of its device arrays, else ``numpy``."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        for a in arrays:
            if isinstance(a, cupy.ndarray):
                return cupy
    stand_in = sys.modules.get("hetero_nn.codelets.strict_xp")
    if stand_in is not None:
        for a in arrays:
            if isinstance(a, stand_in.DeviceArray):
                return stand_in.strict
    return np


def cupy_or_none():
    """Import CuPy if it is installed and a GPU is visible; ``None`` otherwise."""
    try:
        import cupy  # cupy: optional, the GPU's array module
    except Exception:  # ImportError, or a CUDA library that fails to load
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    return cupy


def by_xp(fn):
    """The ``ref`` (NumPy) and ``cuda`` (the operands' array module) variants of one
    implementation ``fn(xp, *arrays, **params)`` written against the array module."""
    def ref(*arrays, **params):
        fn(np, *arrays, **params)

    def cuda(*arrays, **params):
        fn(array_module(*arrays), *arrays, **params)

    ref.__name__, cuda.__name__ = f"{fn.__name__}_ref", f"{fn.__name__}_cuda"
    return ref, cuda
