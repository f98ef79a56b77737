"""Trampolines: one calling convention for every compiled kernel.

A bound task's compiled work is a list of *calls*, ``(kernel, args)`` with
``kernel`` a Numba dispatcher and ``args`` a tuple of arrays, scalars and tuples
of them (see :mod:`hetero_nn.codelets.prepared`). One compiled loop cannot call
kernels of different signatures, so each call goes through a *trampoline*: a
``numba.cfunc`` of the C signature ``int64 trampoline(void *block)`` that reads
the call's operands from an argument block, rebuilds them (arrays with
:func:`~hetero_nn.scheduler.engine.intrinsics.array_view`, no copy) and calls the
kernel's compiled overload at the address in the block's first slot
(:func:`~hetero_nn.scheduler.engine.intrinsics.call_native`). The dispatch loop calls
the trampoline through its address with
:func:`~hetero_nn.scheduler.engine.intrinsics.call_pointer`.

The argument block is an ``int64`` array, one slot per scalar:

- slot 0: the kernel's native entry point;
- an array: its address, then its shape, then its strides (bytes);
- an integer or boolean: its value; a float: its IEEE bits (``float64``, cast back
  to the kernel's type: exact for ``float32``);
- a tuple: its elements in order (a named tuple is rebuilt by its class, imported
  from its module); ``None``: no slot.

A trampoline returns 0, or 1 when the kernel raised (the exception itself
cannot cross the C boundary: the runtime calls the kernel again from Python to
name it; see :mod:`~hetero_nn.scheduler.engine.replay`).

Trampolines depend on the argument types only (the kernel is in the block), are
made once per process per type tuple and shared by every kernel of those types:
all the tasks of one layer, every ``fill_zero`` on one dtype. Making one compiles a
small ``cfunc`` that does not link the kernel (compiled, or loaded from Numba's
disk cache, as for a Python call). Its source is written once as a module under
``<cache directory>/trampolines/`` (``HETERO_NN_CACHE``), named by a hash of its
source and of the intrinsics module, and imported with ``cache=True``: a later
process loads the machine code instead of compiling it again (where the directory
cannot be written, the trampoline is compiled in memory). The module's first line
states the SHA-256 of its source and the Numba and llvmlite versions that wrote it
(:func:`module_text`); a file that is not exactly what this process would write (edited,
torn, or from another Numba) is written again before it is imported, and Numba,
seeing a newer source file, compiles it again instead of loading its old machine code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import threading

import llvmlite
import numba
import numpy as np
from numba import typeof, types

from ...fileio import atomic_write_text
from . import intrinsics
from ..perfmodel.model import default_cache_dir

SIGNATURE = types.int64(types.voidptr)
"""Every trampoline's C signature: ``int64 trampoline(void *block)``."""
_lock = threading.Lock()
_made: dict = {}
_GENERATOR = inspect.getsource(intrinsics)
"""What the generated modules depend on besides their own source: a change to the
intrinsics makes new module names, so no stale machine code is loaded."""


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
        The ``cfunc``'s address, for :func:`~hetero_nn.scheduler.engine.intrinsics.call_pointer`.
    source : str
        The Python source it was compiled from.
    """

    __slots__ = ("restype", "argtypes", "slots", "address", "cfunc", "source")

    def __init__(self, restype, argtypes):
        self.restype = restype
        self.argtypes = argtypes
        names: dict = {}
        lines, exprs, self.slots = [], [], 1
        for i, t in enumerate(argtypes):
            expr, self.slots = _rebuild(t, self.slots, names, lines, f"a{i}")
            exprs.append(expr)
        comma = "," if len(exprs) == 1 else ""
        body = "".join(f"    {line}\n" for line in lines)
        self.source = (
            "import importlib\n\n"
            "import numpy as np\n"
            "from numba import carray, cfunc, types\n"
            "from hetero_nn.scheduler.engine.intrinsics import array_view, call_native\n"
            "from hetero_nn.scheduler.engine.trampoline import SIGNATURE\n\n"
            + "".join(f"{name} = {definition}\n" for definition, name in names.items())
            + f"call = call_native({_type_source(restype)})\n\n\n"
            "@cfunc(SIGNATURE, nopython=True, nogil=True, cache=CACHE)\n"
            "def trampoline(block):\n"
            f"    b = carray(block, {self.slots}, np.int64)\n"
            "    f = b.view(np.float64)\n"
            f"{body}"
            f"    return call(b[0], ({', '.join(exprs)}{comma}))\n")
        self.cfunc = _compile(self.source)
        self.address = self.cfunc.address

    def __repr__(self):
        return f"Trampoline({len(self.argtypes)} args, {self.slots} slots)"


def _compile(source):
    """The ``trampoline`` cfunc of ``source``: from a module written once under the cache
    directory and imported (Numba caches its machine code there), or, when that
    directory cannot be written, compiled in memory."""
    key = hashlib.sha1((_GENERATOR + source).encode()).hexdigest()[:20]
    name = f"hetero_nn_trampoline_{key}"
    module = sys.modules.get(name)
    if module is not None:
        return module.trampoline
    folder = default_cache_dir() / "trampolines"
    path = folder / f"{name}.py"
    text = module_text(source)
    try:
        if _read(path) != text:  # missing, changed, or written by another Numba/hetero_nn
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)  # a new mtime: Numba's cache of it is stale
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Numba's cache imports the module by name to load it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module.trampoline
    except OSError:
        namespace: dict = {"CACHE": False}
        exec(compile(source, f"<{name}>", "exec"), namespace)
        return namespace["trampoline"]


def module_text(source) -> str:
    """The module written for ``source``: a header (the hash of the source and of the
    intrinsics, the Numba and llvmlite versions), then the source with ``cache=True``. A
    file under the cache directory is imported only if it holds exactly this."""
    body = source.replace("cache=CACHE", "cache=True")
    digest = hashlib.sha256((_GENERATOR + body).encode()).hexdigest()
    return (f"# hetero_nn trampoline sha256={digest} numba={numba.__version__} "
            f"llvmlite={llvmlite.__version__}\n{body}")


def _read(path):
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


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
        self.entry, self.trampoline = call_target(kernel, self.args)
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


_TARGETS: dict = {}
MAX_TARGETS = 4096  # (kernel, argument types) pairs remembered; past it, forgotten at once


def call_target(kernel, args) -> tuple:
    """``(native entry, trampoline)`` of ``kernel`` called with ``args``: the kernel's
    overload for their types and the trampoline of those types, looked up by a key made of
    the arguments' Python types (and, for arrays, what their Numba type reads), so binding
    a graph types, checks and links each (kernel, argument types) once per process."""
    key = _type_key(args)
    target = _TARGETS.get((kernel, key)) if key is not None else None
    if target is None:
        argtypes = argument_types(args)
        entry, restype = native_entry(kernel, argtypes)
        target = entry, trampoline_of(restype, argtypes)
        if key is not None:
            if len(_TARGETS) >= MAX_TARGETS:
                _TARGETS.clear()
            _TARGETS[kernel, key] = target
    return target


def _type_key(value):
    """A hashable key that fixes ``numba.typeof(value)`` (None: no key, type it): the
    type, a Python int's width class (Numba types it by its bits), an array's dtype,
    dimensions, layout and writeability, a tuple's items'."""
    tp = type(value)
    if tp is np.ndarray:
        flags = value.flags
        return (value.dtype, value.ndim, flags.c_contiguous, flags.f_contiguous,
                flags.writeable)
    if isinstance(value, tuple):
        items = tuple(_type_key(v) for v in value)
        return None if None in items else (tp, items)
    if isinstance(value, int) and not isinstance(value, (bool, np.integer)):
        bits = (value if value >= 0 else -value - 1).bit_length()  # as Numba counts them
        return tp, 0 if bits < 32 else 1 if bits < 64 else 2 if value >= 0 else 3
    if value is None or isinstance(value, (bool, float, np.number, np.bool_)):
        return (tp,)
    return None


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
        t = _array_type(a) if type(a) is np.ndarray else typeof(a)
        _check_type(t, a)
        out.append(t)
    return tuple(out)


_ARRAY_TYPES: dict = {}


def _array_type(a):
    """``numba.typeof(a)`` for an ndarray, memoized on what it reads (dtype, ndim, layout,
    writeability): binding a graph types a few arrays per task."""
    flags = a.flags
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    key = (a.dtype, a.ndim, layout, flags.writeable)
    t = _ARRAY_TYPES.get(key)
    if t is None:
        t = _ARRAY_TYPES[key] = typeof(a)
    return t


def _check_type(t, value):
    if isinstance(t, types.Array):
        if t.dtype not in _DTYPES:
            raise TypeError(f"trampoline: arrays of {t.dtype} are not supported")
        return
    if isinstance(t, (types.Integer, types.Float, types.Boolean)) or t is types.none:
        return
    if isinstance(t, types.BaseTuple):
        if isinstance(t, types.BaseNamedTuple) and "." in t.instance_class.__qualname__:
            raise TypeError(f"trampoline: cannot rebuild {t.instance_class.__qualname__} "
                            "(not defined at a module's top level)")
        for item_type, item in zip(t.types, value):
            _check_type(item_type, item)
        return
    raise TypeError(f"trampoline: cannot pass {type(value).__name__} ({t})")


_DTYPES = {types.float32, types.float64, types.int8, types.int16, types.int32, types.int64,
           types.uint8, types.uint16, types.uint32, types.uint64, types.boolean}


def _rebuild(t, slot, names, lines, name):
    """``(expression, next slot)``: the source that rebuilds a value of type ``t`` from
    the block starting at ``slot`` (arrays get a line of their own); ``names`` maps the
    module-level definitions it needs (views, casts) to their names."""
    if isinstance(t, types.Array):
        view = _name_for(names, f"array_view({_type_source(t)})", "V")
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
    if isinstance(t, (types.Integer, types.Float)):
        cast = _name_for(names, _type_source(t), "T")
        return f"{cast}({'f' if isinstance(t, types.Float) else 'b'}[{slot}])", slot + 1
    if isinstance(t, types.BaseTuple):
        items = []
        for k, item in enumerate(t.types):
            expr, slot = _rebuild(item, slot, names, lines, f"{name}_{k}")
            items.append(expr)
        if isinstance(t, types.BaseNamedTuple):  # e.g. a convolution's geometry
            cls = t.instance_class
            maker = _name_for(names, f"importlib.import_module({cls.__module__!r})."
                                     f"{cls.__qualname__}", "N")
            return f"{maker}({', '.join(items)})", slot
        comma = "," if len(items) == 1 else ""
        return f"({', '.join(items)}{comma})", slot
    raise TypeError(f"trampoline: cannot rebuild {t}")


def _name_for(names, definition, prefix):
    name = names.get(definition)
    if name is None:
        name = names[definition] = f"{prefix}{len(names)}"
    return name


def _type_source(t) -> str:
    """Source that makes the Numba type ``t`` (scalars, arrays of them, none)."""
    if t is types.none:
        return "types.none"
    if isinstance(t, types.Boolean):
        return "types.boolean"
    if isinstance(t, (types.Integer, types.Float)):
        return f"types.{t.name}"
    if isinstance(t, types.Array):
        return (f"types.Array({_type_source(t.dtype)}, {t.ndim}, {t.layout!r}, "
                f"readonly={not t.mutable}, aligned={t.aligned})")
    raise TypeError(f"trampoline: kernels returning {t} are not supported")


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
