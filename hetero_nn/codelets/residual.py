"""The residual join: ``y = a + b`` elementwise into a new buffer.

A residual block adds its body's output to its shortcut's (or its input), and its
backward pass adds the two input gradients. Neither operand may be overwritten
(the layers that made them may still read them), hence a third, written operand,
where the runtime's ``add`` codelet accumulates in place.

Variants: ``ref`` (NumPy), ``cpu`` (a Numba loop over flat buffers, prepared), ``cuda``
(written against the array module: CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit
from .codelet import R, W, Codelet
from .prepared import from_calls
from .xp import array_module

__all__ = ["add2"]


def _check(a, b, y):
    if not a.shape == b.shape == y.shape:
        raise ValueError(f"add2: operands must have one shape, got {a.shape}, {b.shape}, {y.shape}")


def _add2_ref(a, b, y):
    _check(a, b, y)
    np.add(a, b, out=y)


@jit
def _add2_cpu(a, b, y):
    for i in range(y.shape[0]):
        y[i] = a[i] + b[i]


@from_calls
def _add2_cpu_wrapper(view, a, b, y):
    _check(a, b, y)
    require_contiguous("add2", y=y)
    return [(_add2_cpu, (view(a).reshape(-1), view(b).reshape(-1), y.reshape(-1)))]


def _add2_cuda(a, b, y):
    _check(a, b, y)
    array_module(a, b, y).add(a, b, out=y)


add2 = Codelet(
    "add2", modes=(R, R, W),
    variants={"ref": _add2_ref, "cpu": _add2_cpu_wrapper, "cuda": _add2_cuda},
    flops=lambda a, b, y, **params: float(math.prod(y)))
"""``y = a + b`` (R a, R b, W y)."""
