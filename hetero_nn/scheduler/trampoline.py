"""Trampolines: one calling convention for every compiled kernel.

A bound task's compiled work is a list of *calls*, ``(kernel, args)`` with
``kernel`` a Numba dispatcher and ``args`` a tuple of arrays, scalars and tuples
of them (see :mod:`hetero_nn.codelets.prepared`). One compiled loop cannot call
kernels of different signatures, so each call goes through a *trampoline*: a
``numba.cfunc`` of the C signature ``int64 trampoline(void *block)`` that reads
the call's operands from an argument block, rebuilds them (arrays with
:func:`~hetero_nn.scheduler.intrinsics.array_view`, no copy) and calls the
kernel's compiled overload at the address in the block's first slot
(:func:`~hetero_nn.scheduler.intrinsics.call_native`). The dispatch loop calls
the trampoline through its address with
:func:`~hetero_nn.scheduler.intrinsics.call_pointer`.

The argument block is an ``int64`` array, one slot per scalar:

- slot 0: the kernel's native entry point;
- an array: its address, then its shape, then its strides (bytes);
- an integer or boolean: its value; a float: its IEEE bits (``float64``, cast back
  to the kernel's type: exact for ``float32``);
- a tuple: its elements in order; ``None``: no slot.

A trampoline returns 0, or 1 when the kernel raised (the exception itself
cannot cross the C boundary: the runtime calls the kernel again from Python to
name it; see :mod:`~hetero_nn.scheduler.replay`).

Trampolines depend on the argument types only (the kernel is in the block), are
made once per process per type tuple and shared by every kernel of those types:
all the tasks of one layer, every ``fill_zero`` on one dtype. Making one compiles a
small ``cfunc`` that does not link the kernel (compiled, or loaded from Numba's
disk cache, as for a Python call).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import carray, cfunc, typeof, types

from .intrinsics import array_view, call_native

_SIGNATURE = types.int64(types.voidptr)
_lock = threading.Lock()
_made: dict = {}


class Trampoline:
    """The trampoline for one tuple of argument types (and the kernels' return type).

    Slot 0 of its argument block holds the kernel's native address, so every
    kernel of those argument types shares it.

    Attributes
    ----------
    argtypes : tuple of numba types
    slots : int
        Length of its argument block.
    address : int
        The ``cfunc``'s address, for :func:`~hetero_nn.scheduler.intrinsics.call_pointer`.
    """

    __slots__ = ("restype", "argtypes", "slots", "address", "cfunc", "source")

    def __init__(self, restype, argtypes):
        self.restype = restype
        self.argtypes = argtypes
        namespace = {"carray": carray, "np": np, "call": call_native(restype)}
        lines, exprs, self.slots = [], [], 1
        for i, t in enumerate(argtypes):
            expr, self.slots = _rebuild(t, self.slots, namespace, lines, f"a{i}")
            exprs.append(expr)
        body = "".join(f"    {line}\n" for line in lines)
        comma = "," if len(exprs) == 1 else ""
        self.source = (
            "def trampoline(block):\n"
            f"    b = carray(block, {self.slots}, np.int64)\n"
            "    f = b.view(np.float64)\n"
            f"{body}"
            f"    return call(b[0], ({', '.join(exprs)}{comma}))\n")
        exec(compile(self.source, "<trampoline>", "exec"), namespace)
        self.cfunc = cfunc(_SIGNATURE, nopython=True, nogil=True)(namespace["trampoline"])
        self.address = self.cfunc.address

    def __repr__(self):
        return f"Trampoline({len(self.argtypes)} args, {self.slots} slots)"


class CompiledCall:
    """One call ``kernel(*args)`` ready for the dispatch loop: its trampoline and its
    argument block. It keeps ``args`` (the arrays the block points into) alive.

    >>> import numpy as np
    >>> from hetero_nn.codelets.reduce import _add_cpu
    >>> a, b = np.ones(3), np.arange(3.0)
    >>> call = CompiledCall(_add_cpu, (a, b))
    >>> call(), a
    (0, array([1., 2., 3.]))
    """

    __slots__ = ("kernel", "args", "trampoline", "entry", "block")

    def __init__(self, kernel, args):
        self.kernel = kernel
        self.args = tuple(args)
        argtypes = argument_types(self.args)
        self.entry, restype = native_entry(kernel, argtypes)
        self.trampoline = trampoline_of(restype, argtypes)
        self.block = np.zeros(self.trampoline.slots, dtype=np.int64)
        self.pack(self.args)

    def pack(self, args):
        """Write ``args`` (of the same types) into the block, in place; keeps them."""
        out = [self.entry]
        for a in args:
            _flatten(a, out)
        if len(out) != self.trampoline.slots:
            raise ValueError(f"{_name(self.kernel)}: {len(out)} slots for "
                             f"{self.trampoline.slots}")
        self.block[:] = out
        self.args = tuple(args)

    def __call__(self) -> int:
        """Run the call from Python (tests, debugging): 0, or 1 if the kernel raised."""
        return self.trampoline.cfunc.ctypes(self.block.ctypes.data)

    def __repr__(self):
        return f"CompiledCall({_name(self.kernel)}, {len(self.args)} args)"


def native_entry(kernel, argtypes) -> tuple:
    """``(address, return type)`` of ``kernel``'s overload for ``argtypes`` (compiled, or
    loaded from Numba's cache, now if needed)."""
    if not hasattr(kernel, "overloads"):
        raise TypeError(f"{kernel!r} is not a Numba dispatcher")
    cres = kernel.overloads.get(argtypes)
    if cres is None:
        kernel.compile(argtypes)
        cres = kernel.overloads[argtypes]
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name), \
        cres.signature.return_type


def _name(kernel) -> str:
    return getattr(kernel, "__name__", None) or getattr(kernel.py_func, "__name__", "kernel")


def argument_types(args) -> tuple:
    """The Numba types of a call's arguments, refusing what no slot can carry."""
    out = []
    for a in args:
        t = typeof(a)
        _check_type(t, a)
        out.append(t)
    return tuple(out)


def _check_type(t, value):
    if isinstance(t, types.Array):
        if t.dtype not in _DTYPES:
            raise TypeError(f"trampoline: arrays of {t.dtype} are not supported")
        return
    if isinstance(t, (types.Integer, types.Float, types.Boolean)) or t is types.none:
        return
    if isinstance(t, types.BaseTuple):
        for item_type, item in zip(t.types, value):
            _check_type(item_type, item)
        return
    raise TypeError(f"trampoline: cannot pass {type(value).__name__} ({t})")


_DTYPES = {types.float32, types.float64, types.int8, types.int16, types.int32, types.int64,
           types.uint8, types.uint16, types.uint32, types.uint64, types.boolean}


def _rebuild(t, slot, namespace, lines, name):
    """``(expression, next slot)``: the source that rebuilds a value of type ``t`` from
    the block starting at ``slot`` (arrays get a line of their own)."""
    if isinstance(t, types.Array):
        view = f"V_{len(namespace)}"
        namespace[view] = array_view(t)
        n = t.ndim
        shape = ", ".join(f"b[{slot + 1 + d}]" for d in range(n))
        strides = ", ".join(f"b[{slot + 1 + n + d}]" for d in range(n))
        comma = "," if n == 1 else ""
        lines.append(f"{name} = {view}(b[{slot}], ({shape}{comma}), ({strides}{comma}))")
        return name, slot + 1 + 2 * n
    if t is types.none:
        return "None", slot
    if isinstance(t, types.Boolean):
        return f"b[{slot}] != 0", slot + 1
    if isinstance(t, types.Integer):
        cast = f"T_{len(namespace)}"
        namespace[cast] = t
        return f"{cast}(b[{slot}])", slot + 1
    if isinstance(t, types.Float):
        cast = f"T_{len(namespace)}"
        namespace[cast] = t
        return f"{cast}(f[{slot}])", slot + 1
    if isinstance(t, types.BaseTuple):
        items = []
        for k, item in enumerate(t.types):
            expr, slot = _rebuild(item, slot, namespace, lines, f"{name}_{k}")
            items.append(expr)
        comma = "," if len(items) == 1 else ""
        return f"({', '.join(items)}{comma})", slot
    raise TypeError(f"trampoline: cannot rebuild {t}")


def _flatten(value, out):
    if isinstance(value, np.ndarray):
        out.append(value.ctypes.data)
        out.extend(value.shape)
        out.extend(value.strides)
    elif value is None:
        pass
    elif isinstance(value, tuple):
        for v in value:
            _flatten(v, out)
    elif isinstance(value, (bool, np.bool_)):
        out.append(int(bool(value)))
    elif isinstance(value, (int, np.integer)):
        v = int(value)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)  # uint64: the same bits
    elif isinstance(value, (float, np.floating)):
        out.append(int(np.float64(value).view(np.int64)))
    else:
        raise TypeError(f"trampoline: cannot pass {type(value).__name__}")


def trampoline_of(restype, argtypes) -> Trampoline:
    """The (memoized) trampoline for kernels of ``argtypes`` returning ``restype``."""
    key = (restype, argtypes)
    t = _made.get(key)
    if t is None:
        with _lock:
            t = _made.get(key)
            if t is None:
                t = _made[key] = Trampoline(restype, argtypes)
    return t
