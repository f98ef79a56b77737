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
dispatcher itself, one call with the parameters in its signature's order; for a
``functools.partial``, its function's with the partial's arguments; for other Python
code (NumPy references, ...), None. :func:`prepares` attaches a ``prepare`` to a
variant; :func:`from_calls` makes a variant and its ``prepare`` from one function that
returns the calls; wrappers that adapt a variant (``overwriting``, ``dense._rowwise``)
attach one that adapts the inner variant's.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

__all__ = ["WorkerBuffers", "calls_of", "contiguous", "from_calls", "prepares"]


def prepares(prepare):
    """Decorator: attach ``prepare`` (see the module docstring) to the decorated variant."""
    def attach(variant):
        variant.prepare = prepare
        return variant
    return attach


def from_calls(calls):
    """Decorator: the variant whose work is ``calls(view, *arrays, **params)``, a function
    that checks its operands and returns its calls ``[(kernel, args), ...]``, passing each
    array a kernel reads through ``view``. Called from Python, ``view`` is
    ``np.ascontiguousarray`` (a strided input is copied) and the calls run; as the
    variant's ``prepare``, ``view`` returns a C-contiguous operand itself and makes
    ``prepare`` return None for a strided one (the task then runs as Python). One function
    thus says both what the variant runs and what a replayed task runs."""
    def variant(*arrays, **params):
        for kernel, args in calls(np.ascontiguousarray, *arrays, **params):
            kernel(*args)

    def prepare(buffers, *arrays, **params):
        try:
            return calls(_view, *arrays, **params)
        except _Strided:
            return None
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(variant, name, getattr(calls, name))
    variant.prepare = prepare
    return variant


class _Strided(Exception):
    """An operand a prepared call would have to copy."""


def _view(a):
    if type(a) is np.ndarray and a.flags.c_contiguous:
        return a
    raise _Strided


def contiguous(*arrays) -> bool:
    """Whether every array (None: absent) is a C-contiguous NumPy array: what a prepared
    call may hold as a view. A wrapper makes a strided input contiguous by copying it,
    which a prepared call cannot do once (the copy would freeze one step's data), so
    ``prepare`` returns None for such operands and the task runs as Python."""
    return all(a is None or (type(a) is np.ndarray and a.flags.c_contiguous) for a in arrays)


def calls_of(variant, buffers, arrays, params):
    """The prepared calls of ``variant`` on ``arrays`` with ``params``, or None (it runs as
    Python). See the module docstring."""
    if isinstance(variant, functools.partial):  # e.g. AdamW: Adam's variants, decoupled
        return calls_of(variant.func, buffers, [*variant.args, *arrays],
                        {**variant.keywords, **params})
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
    names = _parameters(fn)[n_arrays:]
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


@functools.lru_cache(maxsize=1024)
def _parameters(fn) -> tuple:
    """``fn``'s parameters (its signature read once: binding a graph asks it per task)."""
    return tuple(inspect.signature(fn).parameters.values())


class WorkerBuffers:
    """The scratch arrays of one worker for one graph: ``buffers(tag, shape, dtype,
    zero=False)`` (see the module docstring). ``nbytes``: what they hold."""

    MAX_BYTES = 256 << 20  # held at most; the least recently asked for go first

    def __init__(self):
        self._arrays: dict = {}

    def __call__(self, tag, shape, dtype, zero=False):
        key = (tag, tuple(int(d) for d in shape), np.dtype(dtype).str)
        a = self._arrays.pop(key, None)
        if a is None:
            a = (np.zeros if zero else np.empty)(key[1], dtype=dtype)
            self._bytes = getattr(self, "_bytes", 0) + a.nbytes
            while self._arrays and self._bytes > self.MAX_BYTES:  # bound tasks keep their own
                self._bytes -= self._arrays.pop(next(iter(self._arrays))).nbytes
        self._arrays[key] = a  # the most recent last
        return a

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def __len__(self):
        return len(self._arrays)
