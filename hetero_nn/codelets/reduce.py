"""Reduction helpers and the elementwise buffer codelets: zero, add, copy.

This module owns

- ``zero_init`` and ``add_redux``, the ``init``/``redux`` pair every REDUX
  codelet declares (a private partial starts at zero; two partials combine by
  ``dst += src``). Both are written against the array module of their operands,
  so one function serves NumPy buffers and CuPy buffers alike;
- the codelets ``fill_zero`` (W x), ``add`` (RW dst, R src) and ``copy``
  (R src, W dst), which the runtime uses for reduction trees, gradient resets
  and replica copies;
- ``flat_view``, the 1-d view the Numba kernels of this package work on;
- ``overwriting(codelet)``, the codelet's twin that writes its REDUX operands
  in place (mode ``W``, ``init`` run inside the task): what a gradient's first
  (or only) contribution of a step is submitted as, so that one partition needs
  no partial, no ``add`` and no ``fill_zero`` task.

``zero_init``, ``add_redux``, the ``cpu`` variants and the twins' variants are
prepared (:mod:`~hetero_nn.codelets.prepared`): in a replayed graph they are one
Numba call each over contiguous buffers (the same bits: one add or store per
element).

Every codelet has a ``"ref"`` variant (NumPy), a ``"cpu"`` variant (a Numba
kernel over the flattened buffers) and a ``"cuda"`` variant written against
``xp`` (CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .codelet import REDUX, RW, R, W, Codelet
from .prepared import calls_of, prepares
from .xp import array_module

__all__ = ["zero_init", "add_redux", "flat_view", "overwriting", "fill_zero", "add", "copy"]


# --------------------------------------------------------------------------- helpers

def _zero_calls(buffers, a):
    flat = flat_view(a) if isinstance(a, np.ndarray) else None
    return None if flat is None else [(_fill_zero_cpu, (flat,))]


def _add_calls(buffers, dst, src):
    dst_flat = flat_view(dst) if isinstance(dst, np.ndarray) else None
    src_flat = flat_view(src) if isinstance(src, np.ndarray) else None
    if dst_flat is None or src_flat is None or dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    return [(_add_cpu, (dst_flat, src_flat))]


def _copy_calls(buffers, src, dst):
    """One flat copy; between strided views of one shape, an element-wise one."""
    src_flat, dst_flat = flat_view(src), flat_view(dst)
    if src_flat is not None and dst_flat is not None and src.size == dst.size:
        return [(_copy_cpu, (src_flat, dst_flat))]
    if src.shape == dst.shape and src.dtype == dst.dtype:
        return [(_copy_strided_cpu, (src, dst))]
    return None


@prepares(_zero_calls)
def zero_init(a) -> None:
    """Fill a REDUX partial with the identity of a sum (mutates ``a``)."""
    a[...] = 0


@prepares(_add_calls)
def add_redux(dst, src) -> None:
    """Combine two REDUX partials: ``dst += src`` (mutates ``dst``)."""
    dst += src


def flat_view(a):
    """A 1-d view of ``a`` that shares its memory, or ``None`` if there is none.

    Kernels work on flat buffers; a non-contiguous operand (a handle split along
    an inner axis) has no flat view, and the wrappers then go through a
    contiguous copy.
    """
    if a.flags.c_contiguous:
        return a.reshape(-1)
    return None


_OVERWRITING: dict = {}


def overwriting(codelet: Codelet) -> Codelet:
    """``codelet`` with every REDUX operand written in place: mode ``W``, named
    ``"<name>.overwrite"``, each variant running ``codelet.init`` on those operands
    then the variant itself (which adds into them, as it always does).

    Submitted for a handle's first contribution of a step, it replaces the
    ``fill_zero`` task before and the ``add`` of the partial after; later
    contributions stay REDUX. Memoized: one twin per codelet, one performance model.
    """
    twin = _OVERWRITING.get(codelet)
    if twin is None:
        which = tuple(i for i, m in enumerate(codelet.modes) if m is REDUX)
        if not which:
            raise ValueError(f"codelet {codelet.name!r} has no REDUX operand to write in place")
        init = codelet.init

        def wrap(variant):
            def written_in_place(*arrays, **params):
                for i in which:
                    init(arrays[i])
                variant(*arrays, **params)

            def prepare(buffers, *arrays, **params):
                calls = []
                for i in which:
                    c = calls_of(init, buffers, [arrays[i]], {})
                    if c is None:
                        return None
                    calls += c
                c = calls_of(variant, buffers, arrays, params)
                return None if c is None else calls + c
            written_in_place.__name__ = getattr(variant, "__name__", "variant")
            written_in_place.prepare = prepare
            return written_in_place

        twin = Codelet(f"{codelet.name}.overwrite",
                       modes=tuple(W if m is REDUX else m for m in codelet.modes),
                       variants={name: wrap(v) for name, v in codelet.variants.items()},
                       flops=codelet.flops, footprint=codelet.footprint,
                       same_bits=codelet.same_bits)
        _OVERWRITING[codelet] = twin
    return twin


def _check_same_size(name, a, b):
    if a.size != b.size:
        raise ValueError(f"{name}: operands have {a.size} and {b.size} elements "
                         f"(shapes {a.shape} and {b.shape})")


# --------------------------------------------------------------------------- fill_zero

def _fill_zero_ref(x):
    x[...] = 0


@jit
def _fill_zero_cpu(x):
    for i in range(x.shape[0]):
        x[i] = 0


@prepares(_zero_calls)
def _fill_zero_cpu_wrapper(x):
    flat = flat_view(x)
    if flat is None:
        x[...] = 0
        return
    _fill_zero_cpu(flat)


def _fill_zero_cuda(x):
    x[...] = 0  # one fill (a memset on CuPy), no 0-d array made first


fill_zero = Codelet(
    "fill_zero", modes=(W,),
    variants={"ref": _fill_zero_ref, "cpu": _fill_zero_cpu_wrapper, "cuda": _fill_zero_cuda},
    flops=lambda x, **params: float(np.prod(x)),
)
"""``x[...] = 0``: resets a buffer (W x)."""


# --------------------------------------------------------------------------- add

def _add_ref(dst, src):
    np.add(dst, src, out=dst)


@jit
def _add_cpu(dst, src):
    for i in range(dst.shape[0]):
        dst[i] += src[i]


@prepares(_add_calls)
def _add_cpu_wrapper(dst, src):
    _check_same_size("add", dst, src)
    dst_flat = flat_view(dst)
    if dst_flat is None:
        dst += src.reshape(dst.shape)
        return
    _add_cpu(dst_flat, np.ascontiguousarray(src).reshape(-1))


def _add_cuda(dst, src):
    xp = array_module(dst, src)
    xp.add(dst, src, out=dst)


add = Codelet(
    "add", modes=(RW, R),
    variants={"ref": _add_ref, "cpu": _add_cpu_wrapper, "cuda": _add_cuda},
    flops=lambda dst, src, **params: float(np.prod(dst)),
)
"""``dst += src`` (RW dst, R src): one node of a REDUX tree."""


# --------------------------------------------------------------------------- copy

def _copy_ref(src, dst):
    np.copyto(dst, src, casting="same_kind")


@jit
def _copy_cpu(src, dst):
    for i in range(dst.shape[0]):
        dst[i] = src[i]


@jit
def _copy_strided_cpu(src, dst):
    for i in np.ndindex(dst.shape):
        dst[i] = src[i]


@prepares(_copy_calls)
def _copy_cpu_wrapper(src, dst):
    _check_same_size("copy", src, dst)
    dst_flat = flat_view(dst)
    if dst_flat is None:
        dst[...] = src.reshape(dst.shape)
        return
    _copy_cpu(np.ascontiguousarray(src).reshape(-1), dst_flat)


def _copy_cuda(src, dst):
    xp = array_module(src, dst)
    xp.copyto(dst, src, casting="same_kind")


copy = Codelet(
    "copy", modes=(R, W),
    variants={"ref": _copy_ref, "cpu": _copy_cpu_wrapper, "cuda": _copy_cuda},
    flops=lambda src, dst, **params: float(np.prod(dst)),
)
"""``dst[...] = src`` (R src, W dst)."""
