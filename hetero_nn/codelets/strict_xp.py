"""A strict CuPy stand-in: NumPy underneath, CuPy's rules on top, every launch and sync counted.

The ``cuda`` variants are written against the array module their operands give
(:func:`hetero_nn.codelets.xp.array_module`). Under plain NumPy (``cuda-emu``, CI)
code that is wrong on a GPU runs fine: ``float(a)`` or ``a.tolist()`` of a device
array is a host synchronisation on CuPy; adding a host array to a device array raises
there; ``np.add.at`` is sequential while CuPy's ``scatter_add`` is atomic, so the sums
land in another order on every run. This module makes those visible without a GPU:

* :class:`DeviceArray` holds a NumPy array and behaves as a CuPy array where CuPy is
  stricter: ``float``, ``int``, ``bool``, ``tolist``, ``item``, ``__array__`` (so
  ``np.asarray``) and iteration into host values raise :class:`StrictError` (an
  *implicit* host conversion); ``get()`` is the explicit one, counted as a sync. A
  host ``ndarray`` mixed into a device operation raises. Reductions return 0-d device
  arrays, as CuPy's do.
* :data:`strict` is the module: ``asarray`` (host -> device, counted as a transfer),
  ``asnumpy`` (a sync), NumPy's functions and ufuncs on device arrays, each call that
  makes or writes an array counted as one kernel launch (CuPy may use a few for
  some, e.g. ``pad``: the count is a lower bound that compares code, not a profile).
  ``ufunc.at`` (``np.add.at``: CuPy's ``scatter_add``) and weighted ``bincount`` are
  unordered accumulations on a GPU: they raise. A whole-operation kernel
  (:mod:`.kernels_cuda`) runs its NumPy twin under these rules, counted as one launch.
* :func:`guard` wraps a ``cuda`` variant so that its NumPy operands reach it as
  :class:`DeviceArray` views (writes land in the caller's arrays);
  :func:`checking` guards every codelet's ``cuda`` variant for a block of code, and
  :data:`counters` holds the counts (per codelet too).

``HETERO_NN_STRICT_XP=1`` in the environment makes the test suite run every
``cuda`` variant it calls through :func:`checking` (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
import os
import pkgutil
import threading
import types
from collections import Counter

import numpy as np

from ..errors import HeteroNNError
from .activation import host_erf
from .codelet import Codelet

__all__ = ["DeviceArray", "StrictError", "strict", "guard", "checking", "counters",
           "Counters"]


class StrictError(HeteroNNError, TypeError):
    """Code that CuPy refuses, or that would synchronise with or reorder on a GPU."""


class Counters:
    """Kernel launches, host syncs and transfers since the last :meth:`reset`, in total
    and per codelet (the codelet whose guarded variant was running)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._local = threading.local()
        self.reset()

    def reset(self):
        with self._lock:
            self.launches = 0
            self.syncs = 0          # explicit device -> host copies (asnumpy, get)
            self.implicit = 0       # implicit conversions refused (float(), tolist(), ...)
            self.unordered = 0      # unordered accumulations refused (ufunc.at, ...)
            self.transfers = 0      # host -> device copies (asarray of host data)
            self.by_codelet: dict[str, Counter] = {}
            self.variants: Counter = Counter()  # guarded variant calls per codelet
            self.kernels: Counter = Counter()   # whole-operation kernel launches (kernels_cuda)

    def add(self, what: str, n: int = 1):
        if what == "launches" and getattr(self._local, "kernel", None):
            return  # inside one whole-operation kernel's twin: its launch is counted once
        with self._lock:
            setattr(self, what, getattr(self, what) + n)
            name = getattr(self._local, "codelet", None)
            if name is not None:
                self.by_codelet.setdefault(name, Counter())[what] += n

    @contextlib.contextmanager
    def codelet(self, name):
        previous = getattr(self._local, "codelet", None)
        self._local.codelet = name
        with self._lock:
            self.variants[name] += 1
        try:
            yield
        finally:
            self._local.codelet = previous

    @contextlib.contextmanager
    def kernel(self, name):
        """The block runs one whole-operation kernel's twin: one launch, counted here."""
        outer = getattr(self._local, "kernel", None)
        if outer is None:
            self.add("launches")
            with self._lock:
                self.kernels[name] += 1
        self._local.kernel = outer or name
        try:
            yield
        finally:
            self._local.kernel = outer

    def snapshot(self) -> dict:
        with self._lock:
            return {k: getattr(self, k) for k in
                    ("launches", "syncs", "implicit", "unordered", "transfers")}


counters = Counters()


def _refuse(what: str, kind: str = "implicit"):
    counters.add(kind)
    raise StrictError(what)


# --------------------------------------------------------------------------- arrays

def _unwrap(value, where: str):
    """The NumPy array of a device operand; a host ndarray is refused (CuPy's rule)."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, np.ndarray):
        raise StrictError(f"{where}: a host numpy.ndarray {value.shape} mixed with device "
                          "arrays (CuPy raises; copy it with xp.asarray first)")
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, where) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, where) for k, v in value.items()}
    return value


def _wrap(value, device: bool = True):
    """Device arrays for NumPy results; a NumPy scalar from a device call is a 0-d array."""
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if device and isinstance(value, np.generic):
        return DeviceArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v, device) for v in value)
    if isinstance(value, list):
        return [_wrap(v, device) for v in value]
    return value


_VIEWS = frozenset({"reshape", "ravel", "view", "transpose", "squeeze", "swapaxes"})
_NO_LAUNCH_ATTRS = frozenset({"shape", "dtype", "ndim", "size", "strides", "nbytes",
                              "itemsize", "flags"})


def _binary(op, name, reflected=False):
    def method(self, other):
        other = _unwrap(other, f"DeviceArray.{name}")
        counters.add("launches")
        return _wrap(op(other, self._a) if reflected else op(self._a, other))
    method.__name__ = name
    return method


def _inplace(op, name):
    def method(self, other):
        op(self._a, _unwrap(other, f"DeviceArray.{name}"))
        counters.add("launches")
        return self
    method.__name__ = name
    return method


def _implicit(name):
    def method(self, *args, **kwargs):
        _refuse(f"DeviceArray.{name}: an implicit device -> host conversion of a "
                f"{self._a.shape} {self._a.dtype} array (a host sync on a GPU); keep the value "
                "on the device, or copy it explicitly with xp.asnumpy / .get()")
    method.__name__ = name
    return method


class DeviceArray:
    """A NumPy array behaving as a CuPy array (see the module docstring)."""

    __slots__ = ("_a",)
    __array_priority__ = 1000
    __hash__ = None

    def __init__(self, array: np.ndarray):
        self._a = array

    # metadata is on the host in CuPy too
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    real = property(lambda self: DeviceArray(self._a.real))

    def __len__(self):
        return len(self._a)

    def __repr__(self):  # CuPy's repr copies to the host; this one does not
        return f"DeviceArray(shape={self._a.shape}, dtype={self._a.dtype})"

    __float__ = _implicit("__float__")
    __int__ = _implicit("__int__")
    __index__ = _implicit("__index__")
    __bool__ = _implicit("__bool__")
    __complex__ = _implicit("__complex__")
    tolist = _implicit("tolist")
    item = _implicit("item")
    __iter__ = _implicit("__iter__")

    def __array__(self, dtype=None, copy=None):
        _refuse(f"DeviceArray.__array__ (np.asarray or a NumPy call on a device array) of a "
                f"{self._a.shape} {self._a.dtype} array: CuPy refuses the implicit conversion; "
                "use xp.asnumpy / .get()")

    def get(self):
        """The explicit device -> host copy (a sync)."""
        counters.add("syncs")
        return self._a.copy()

    def __getitem__(self, key):
        key = _unwrap(key, "DeviceArray.__getitem__")
        if any(isinstance(k, (np.ndarray, list)) for k in (key if isinstance(key, tuple) else (key,))):
            counters.add("launches")  # advanced indexing gathers; basic slicing is a view
        return _wrap(self._a[key])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, "DeviceArray.__setitem__")] = _unwrap(value, "DeviceArray.__setitem__")
        counters.add("launches")

    def __getattr__(self, name):
        if name.startswith("__"):  # __array_interface__ & co: NumPy would read the host data
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr, device=False)

        def method(*args, **kwargs):
            out = attr(*_unwrap(args, f"DeviceArray.{name}"),
                       **_unwrap(kwargs, f"DeviceArray.{name}"))
            if name not in _VIEWS:
                counters.add("launches")
            return _wrap(out)
        return method

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _Ufunc(ufunc)._call(method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _Function(func)(*args, **kwargs)

    __neg__ = lambda self: _unary(operator.neg, self)  # noqa: E731
    __pos__ = lambda self: _unary(operator.pos, self)  # noqa: E731
    __abs__ = lambda self: _unary(operator.abs, self)  # noqa: E731
    __invert__ = lambda self: _unary(operator.invert, self)  # noqa: E731


def _unary(op, a):
    counters.add("launches")
    return _wrap(op(a._a))


for _name, _op in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                   ("mod", operator.mod), ("pow", operator.pow), ("matmul", operator.matmul),
                   ("and", operator.and_), ("or", operator.or_), ("xor", operator.xor),
                   ("lshift", operator.lshift), ("rshift", operator.rshift)]:
    setattr(DeviceArray, f"__{_name}__", _binary(_op, f"__{_name}__"))
    setattr(DeviceArray, f"__r{_name}__", _binary(_op, f"__r{_name}__", reflected=True))
    setattr(DeviceArray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}"),
                                                   f"__i{_name}__"))
for _name in ("lt", "le", "eq", "ne", "gt", "ge"):
    setattr(DeviceArray, f"__{_name}__", _binary(getattr(operator, _name), f"__{_name}__"))


# --------------------------------------------------------------------------- the module

class _Function:
    """A NumPy function on device arrays: one launch, device results."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        name = getattr(self.fn, "__name__", "function")
        if name == "bincount" and (len(args) > 1 or kwargs.get("weights") is not None):
            _refuse("bincount with weights: an atomic, unordered accumulation on a GPU "
                    "(the sums land in another order on every run)", "unordered")
        out = self.fn(*_unwrap(args, name), **_unwrap(kwargs, name))
        counters.add("launches")
        return _wrap(out)


class _Ufunc(_Function):
    """A NumPy ufunc on device arrays; ``ufunc.at`` (a scatter) is refused."""

    __slots__ = ()

    def _call(self, method, inputs, kwargs):
        if method == "at":
            _refuse(f"{self.fn.__name__}.at: CuPy's scatter_add is an atomic, unordered "
                    "accumulation (the sums land in another order on every run)", "unordered")
        fn = self.fn if method == "__call__" else getattr(self.fn, method)
        out = fn(*_unwrap(inputs, self.fn.__name__), **_unwrap(kwargs, self.fn.__name__))
        counters.add("launches")
        if kwargs.get("out") is not None:
            return kwargs["out"][0] if isinstance(kwargs["out"], tuple) else kwargs["out"]
        return _wrap(out)

    def __call__(self, *args, **kwargs):
        return self._call("__call__", args, kwargs)

    def __getattr__(self, method):
        return lambda *args, **kwargs: self._call(method, args, kwargs)


def _asarray(a, dtype=None, order=None):
    if isinstance(a, DeviceArray):
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        counters.add("launches")
        return DeviceArray(a._a.astype(dtype))
    counters.add("transfers")
    return DeviceArray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def _asnumpy(a):
    if isinstance(a, DeviceArray):
        return a.get()
    return np.asarray(a)


def _launch_twin(name, twin, args, kwargs):
    """A whole-operation kernel (:mod:`.kernels_cuda`) here: its twin under this module's
    rules, counted as one launch."""
    with counters.kernel(name):
        return twin(*args, **kwargs)


def _allocation(fn):
    def allocate(*args, **kwargs):
        return _wrap(fn(*_unwrap(args, fn.__name__), **_unwrap(kwargs, fn.__name__)))
    allocate.__name__ = fn.__name__
    return allocate


def _erf(x):
    return _Function(host_erf)(x)


class _StrictModule(types.ModuleType):
    """``strict``: NumPy's namespace with CuPy's rules (see the module docstring)."""

    def __init__(self):
        super().__init__("hetero_nn.codelets.strict_xp.strict", "A strict CuPy stand-in.")
        self.ndarray = DeviceArray
        self.asarray = self.array = _asarray
        self.asnumpy = _asnumpy
        self.erf = _erf  # cupyx.scipy.special.erf's place
        self.launch_twin = _launch_twin  # cupy.RawKernel's place (kernels_cuda.launch)
        for name in ("empty", "empty_like"):  # CuPy allocates these without a kernel
            setattr(self, name, _allocation(getattr(np, name)))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        obj = getattr(np, name)
        if isinstance(obj, np.ufunc):
            wrapped = _Ufunc(obj)
        elif isinstance(obj, (type, types.ModuleType)) or not callable(obj):
            wrapped = obj  # dtypes, constants: the same objects in CuPy
        else:
            wrapped = _Function(obj)
        setattr(self, name, wrapped)
        return wrapped

    def __repr__(self):
        return "<strict CuPy stand-in over NumPy>"


strict = _StrictModule()


# --------------------------------------------------------------------------- guarding variants

def guard(fn, name=None):
    """``fn`` (a ``cuda`` variant) called with its NumPy operands as :class:`DeviceArray`
    views, its launches and syncs counted under ``name``."""
    if getattr(fn, "__strict_guarded__", False):
        return fn
    label = name or getattr(fn, "__name__", "variant")

    @functools.wraps(fn)
    def strict_variant(*arrays, **params):
        arrays = [DeviceArray(a) if isinstance(a, np.ndarray) else a for a in arrays]
        with counters.codelet(label):
            return fn(*arrays, **params)
    strict_variant.__strict_guarded__ = True
    strict_variant.__wrapped__ = fn
    return strict_variant


def all_cuda_codelets() -> dict:
    """Every module-level codelet of :mod:`hetero_nn.codelets` with a ``cuda`` variant."""
    found = {}
    for info in pkgutil.iter_modules([os.path.dirname(__file__)]):
        module = importlib.import_module(f"{__package__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, Codelet) and any(v.startswith("cuda") for v in value.variants):
                found[value.name] = value
    return found


@contextlib.contextmanager
def checking():
    """Guard every codelet's ``cuda`` variants (:func:`guard`) inside the block."""
    saved = []
    for codelet in all_cuda_codelets().values():
        for vname, fn in list(codelet.variants.items()):
            if vname.startswith("cuda"):
                saved.append((codelet, vname, fn))
                codelet.variants[vname] = guard(fn, codelet.name)
    try:
        yield counters
    finally:
        for codelet, vname, fn in saved:
            codelet.variants[vname] = fn
