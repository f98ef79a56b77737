"""Codelets: one declaration per operation, with its access modes and device variants.

As in StarPU, a codelet says *what* a task does to its operands (the access
mode of each one) and *how* on each kind of device (its variants); the runtime
decides where and when. The number of operands follows from ``modes``.

Variant names are ``"ref"`` (the NumPy reference, runs on CPU workers),
``"cpu"`` (Numba), ``"cuda"`` (written against the array module it is given:
CuPy on a GPU, NumPy in CI) and, when a kind has several strategies,
``"cpu:<label>"`` / ``"cuda:<label>"``. Every variant takes the operands'
arrays in order, then the task's keyword parameters, and writes its results
in place into the ``W``/``RW``/``REDUX``/``SCRATCH`` arrays.

>>> import numpy as np
>>> def scale_ref(x, factor): x *= factor
>>> scale = Codelet("scale", modes=(RW,), variants={"ref": scale_ref})
>>> a = np.ones(3); scale.variants["ref"](a, factor=2.0); a
array([2., 2., 2.])
"""

from __future__ import annotations

import enum
from typing import Callable, Mapping

from ..errors import SubmitError


class AccessMode(str, enum.Enum):
    """How a task uses one operand (StarPU's ``STARPU_R``, ``STARPU_W``...)."""

    R = "R"
    W = "W"
    RW = "RW"
    REDUX = "REDUX"      # commutative accumulation into a private partial
    SCRATCH = "SCRATCH"  # private temporary from the worker's arena, contents undefined

    def __repr__(self):
        return self.value

    @property
    def reads(self) -> bool:
        return self in (AccessMode.R, AccessMode.RW)

    @property
    def writes(self) -> bool:
        return self in (AccessMode.W, AccessMode.RW)


R, W, RW, REDUX, SCRATCH = (AccessMode.R, AccessMode.W, AccessMode.RW,
                            AccessMode.REDUX, AccessMode.SCRATCH)

DEVICE_KINDS = ("cpu", "cuda")


def variant_kind(name: str) -> str:
    """The device kind a variant runs on: ``"ref"`` and ``"cpu[:x]"`` on ``cpu``."""
    base = name.split(":", 1)[0]
    if base == "ref":
        return "cpu"
    if base not in DEVICE_KINDS:
        raise ValueError(f"variant name {name!r}: expected 'ref', 'cpu[:label]' or 'cuda[:label]'")
    return base


class Codelet:
    """An operation the runtime can schedule: modes, variants per device kind, cost.

    Parameters
    ----------
    name : str
        Unique, used in traces and performance models.
    modes : sequence of AccessMode, or None
        One per operand, in the order the variants take the arrays. ``None``: a
        variable number of operands (StarPU's ``STARPU_VARIABLE_NBUFFERS``), their
        modes given at each submission (``rt.submit(cl, *handles, modes=(R, R, W))``).
    variants : mapping of variant name to callable
        See the module docstring for names and calling convention.
    init : callable(partial) -> None, optional
        Fills a private REDUX partial with the identity (zeros for a sum).
    redux : callable(dst, src) -> None, optional
        ``dst += src``; combines two partials. Both are required when a mode is
        REDUX; written against the array module so one function serves all devices.
    flops : callable(*shapes, **params) -> float, optional
        Work of one task, for the performance model's regression on size; the
        operands' total element count is used when absent.
    footprint : callable(*shapes, **params) -> str or int, optional
        What besides the operands' shapes and dtypes sets a task's cost (StarPU's
        ``footprint`` callback): tasks whose values differ keep apart histories in
        the performance model, e.g. ``footprint=lambda x, iterations: iterations``
        so a 64-iteration and a 4-million-iteration task do not share one mean, or a
        measured property of the data passed as a parameter (a spike rate).
        Without it the footprint is the operands' shapes and dtypes only.
    same_bits : sequence of str, optional
        Variants that give the same bits on every input: a pinned runtime lets the
        performance model choose among the pinned variant and these.
    """

    def __init__(self, name: str, modes, variants: Mapping[str, Callable], *,
                 init: Callable | None = None, redux: Callable | None = None,
                 flops: Callable | None = None, footprint: Callable | None = None,
                 same_bits=()):
        self.name = str(name)
        self.modes = None if modes is None else tuple(AccessMode(m) for m in modes)
        self.arity = None if self.modes is None else len(self.modes)  # what submit checks
        if self.modes is not None and not self.modes:
            raise ValueError(f"codelet {self.name!r}: needs at least one operand mode")
        if not variants:
            raise ValueError(f"codelet {self.name!r}: needs at least one variant")
        self.variants = dict(variants)
        self.kinds: dict[str, tuple[str, ...]] = {}
        for vname in self.variants:
            kind = variant_kind(vname)
            self.kinds[kind] = self.kinds.get(kind, ()) + (vname,)
        if self.modes is not None and REDUX in self.modes and (init is None or redux is None):
            raise ValueError(f"codelet {self.name!r}: a REDUX operand needs both init= and redux=")
        self.init = init
        self.redux = redux
        self.flops = flops
        self.footprint = footprint
        self.same_bits = tuple(same_bits)

    def check_operands(self, n: int) -> None:
        if n != len(self.modes):
            raise SubmitError(
                f"codelet {self.name!r} declares {len(self.modes)} operand(s) "
                f"(modes {list(m.value for m in self.modes)}) but was submitted with {n}")

    def submission_modes(self, n: int, modes) -> tuple:
        """The modes of a submission of ``n`` operands: the declared ones, or for a codelet
        declared with ``modes=None`` the ``modes`` given (checked)."""
        if self.modes is not None:
            if modes is not None:
                raise SubmitError(f"codelet {self.name!r} declares its modes; modes= is for a "
                                  "codelet declared with modes=None")
            self.check_operands(n)
            return self.modes
        if modes is None:
            raise SubmitError(f"codelet {self.name!r} takes a variable number of operands "
                              "(modes=None): give their modes at submission, e.g. "
                              "submit(cl, a, b, modes=(R, W))")
        try:
            modes = tuple(AccessMode(m) for m in modes)
        except (TypeError, ValueError):
            raise SubmitError(f"codelet {self.name!r}: modes={modes!r}: expected a sequence "
                              "of R, W, RW, REDUX, SCRATCH") from None
        if len(modes) != n or not n:
            raise SubmitError(f"codelet {self.name!r}: submitted with {n} operand(s) but "
                              f"{len(modes)} mode(s) {[m.value for m in modes]}")
        if REDUX in modes and (self.init is None or self.redux is None):
            raise SubmitError(f"codelet {self.name!r}: a REDUX operand needs the codelet's "
                              "init= and redux=")
        return modes

    def work(self, shapes, params) -> float:
        """Problem size for the performance model's regression."""
        if self.flops is not None:
            return float(self.flops(*shapes, **params))
        total = 0
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            total += n
        return float(total)

    def __repr__(self):
        modes = "None" if self.modes is None else "(" + ", ".join(m.value for m in self.modes) + ")"
        return f"Codelet({self.name!r}, modes={modes}, variants={list(self.variants)})"
