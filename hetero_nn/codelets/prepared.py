"""Prepared variants: a variant's per-shape work done once, its kernels then called directly.

A variant of the codelet calling convention (arrays, then keyword parameters)
spends Python time on every call before its Numba kernel runs: geometry,
checks, reshapes, buffer lookups, small allocations. A replayed graph calls
each task with the same arrays and parameters every step, so that work can be
done once. A variant says how by carrying a ``prepare`` attribute::

    variant.prepare(buffers, *arrays, **params) -> [(kernel, args), ...] or None

The result is the list of *calls* that do the variant's work: ``kernel`` a
Numba dispatcher, ``args`` arrays (views of the operands or of ``buffers``),
numbers and tuples of them, so that running ``kernel(*args)`` for each call in
order equals calling the variant on the same arrays, bit for bit. ``prepare``
may read the operands' shapes, dtypes and strides and the parameters, never
their values (they change between runs): a value the variant derives from an
operand's data (``sgd_step``'s learning rate from its ``hyper`` operand) must
be derived inside a kernel. It returns None when it cannot (an operand that
is not contiguous where a kernel needs it): the task then calls the variant.

``buffers(tag, shape, dtype, zero=False)`` gives scratch arrays of the worker
the task will run on (a :class:`WorkerBuffers`), the same contract as the
variants' thread buffers: contents undefined between calls (zeros when first
made with ``zero=True``), shared by the tasks of that worker, which run one at a
time. An array that must keep a prepared content between calls (a row of ones
beside an im2col block) takes a tag that says so.

:func:`calls_of` gives any variant's calls: its ``prepare``; for a Numba
dispatcher itself, one call with the parameters in its signature's order; for
other Python code (NumPy references, ...), None. :func:`prepares` attaches a
``prepare`` to a variant, and wrappers that adapt a variant (``overwriting``,
``dense._rowwise``) attach one that adapts the inner variant's.
"""

from __future__ import annotations

import inspect

import numpy as np

__all__ = ["WorkerBuffers", "calls_of", "prepares"]


def prepares(prepare):
    """Decorator: attach ``prepare`` (see the module docstring) to the decorated variant."""
    def attach(variant):
        variant.prepare = prepare
        return variant
    return attach


def calls_of(variant, buffers, arrays, params):
    """The prepared calls of ``variant`` on ``arrays`` with ``params``, or None (it runs as
    Python). See the module docstring."""
    prepare = getattr(variant, "prepare", None)
    if prepare is not None:
        return prepare(buffers, *arrays, **params)
    if hasattr(variant, "overloads") and hasattr(variant, "py_func"):  # a Numba dispatcher
        args = _positional(variant.py_func, len(arrays), params)
        return None if args is None else [(variant, (*arrays, *args))]
    return None


def _positional(fn, n_arrays, params):
    """``params`` in the order of ``fn``'s parameters after the first ``n_arrays`` (their
    defaults where missing), or None when they do not fit its signature."""
    names = list(inspect.signature(fn).parameters.values())[n_arrays:]
    out = []
    for p in names:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return None
        if p.name in params:
            out.append(params[p.name])
        elif p.default is not p.empty:
            out.append(p.default)
        else:
            return None
    if set(params) - {p.name for p in names}:
        return None
    return out


class WorkerBuffers:
    """The scratch arrays of one worker for one graph: ``buffers(tag, shape, dtype,
    zero=False)`` (see the module docstring). ``nbytes``: what they hold."""

    def __init__(self):
        self._arrays: dict = {}

    def __call__(self, tag, shape, dtype, zero=False):
        key = (tag, tuple(int(d) for d in shape), np.dtype(dtype).str)
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = (np.zeros if zero else np.empty)(key[1], dtype=dtype)
        return a

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def __len__(self):
        return len(self._arrays)
