"""The low-level operations of the compiled dispatch loop, as small typed Numba intrinsics.

This module owns every piece of LLVM IR the runtime emits itself; the loop in
:mod:`~hetero_nn.scheduler.engine.dispatch` and the trampolines of
:mod:`~hetero_nn.scheduler.engine.trampoline` are plain ``@njit`` / ``@cfunc`` code
built from these (Numba's ``extending.intrinsic``, as its parallel backend does):

``atomic_load(a, i)`` / ``atomic_store(a, i, v)`` / ``atomic_add(a, i, v)``
    Sequentially consistent atomic operations on one element of a 1-d
    C-contiguous ``int32`` or ``int64`` array (``atomic_add`` returns the old
    value). The counters between workers are such arrays.
``futex_wait(a, i, expected, timeout_ns)`` / ``futex_wake(a, i)``
    Linux's futex on one ``int32`` element: sleep while it holds ``expected``
    (at most ``timeout_ns``), wake every sleeper on it. Where there is no futex
    (:data:`HAVE_FUTEX` False) the wait is a short ``nanosleep`` and the wake
    does nothing, which is still correct (waiters poll).
``monotonic_ns()``
    ``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds: the runtime's one compiled clock,
    which the executors' timed calls share, so it lives in
    :mod:`~hetero_nn.scheduler.trace.clock` (with :func:`clock_offset`, what to add to
    read ``time.perf_counter()``) and is re-exported here.
``cpu_pause()``
    The spin-wait hint (``pause`` on x86-64, ``yield`` on AArch64).
``cpu_yield()``
    ``sched_yield()``: give the core to another runnable thread, if one waits for it.
``call_pointer(address, block)``
    Calls the C function ``int64 f(void *block)`` at ``address`` (a trampoline's
    ``cfunc`` address), passing ``block`` (an address too): one indirect call.
``call_native(restype)``
    A factory (memoized per return type) of an intrinsic ``call(address, args)``
    that calls a Numba-compiled function at ``address`` (an overload's native
    entry point, Numba's own calling convention) with the tuple ``args``, and
    returns 0, or 1 if it raised. The callee is not linked into the caller: a
    trampoline compiles in a fraction of the time the kernel took.
``array_view(arrtype)``
    A factory (memoized per Numba array type) of an intrinsic
    ``view(address, shape, strides)`` that makes an array of exactly that type
    over memory it does not own (no reference count: the caller keeps the
    buffer alive).

Each is tested alone in ``tests/test_intrinsics.py``.
"""

from __future__ import annotations

import functools
import platform
import sys

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array

from ..trace.clock import HAVE_CLOCK, clock_offset, monotonic_ns  # noqa: F401 - re-exported

_MACHINE = platform.machine().lower()
_FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(_MACHINE)
HAVE_FUTEX = sys.platform.startswith("linux") and _FUTEX_SYSCALL is not None
"""Whether ``futex_wait``/``futex_wake`` are the kernel's (else: polling with sleeps)."""

_FUTEX_WAIT_PRIVATE = 128
_FUTEX_WAKE_PRIVATE = 129
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_I8P = ir.IntType(8).as_pointer()


def _element_pointer(context, builder, arrtype, array, index):
    ary = context.make_array(arrtype)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, arrtype, ary, [index])


def _check_counter_array(a, name):
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
            and a.dtype in (types.int32, types.int64)):
        raise TypeError(f"{name}: expected a 1-d C-contiguous int32 or int64 array, got {a}")


@intrinsic
def atomic_load(typingctx, a, i):
    """``a[i]``, read atomically (sequentially consistent)."""
    _check_counter_array(a, "atomic_load")
    sig = a.dtype(a, types.intp)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "seq_cst", a.dtype.bitwidth // 8)
    return sig, codegen


@intrinsic
def atomic_store(typingctx, a, i, v):
    """``a[i] = v``, written atomically (sequentially consistent)."""
    _check_counter_array(a, "atomic_store")
    sig = types.void(a, types.intp, a.dtype)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "seq_cst", a.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def atomic_add(typingctx, a, i, v):
    """``a[i] += v`` atomically; returns the value before."""
    _check_counter_array(a, "atomic_add")
    sig = a.dtype(a, types.intp, a.dtype)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")
    return sig, codegen


def _syscall(builder, number, *args):
    fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
    fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
    return builder.call(fn, [_I64(number), *args])


def _timespec(builder, nanoseconds):
    ts_t = ir.LiteralStructType([_I64, _I64])
    ts = cgutils.alloca_once(builder, ts_t)
    billion = _I64(1_000_000_000)
    builder.store(builder.sdiv(nanoseconds, billion), cgutils.gep_inbounds(builder, ts, 0, 0))
    builder.store(builder.srem(nanoseconds, billion), cgutils.gep_inbounds(builder, ts, 0, 1))
    return ts


@intrinsic
def futex_wait(typingctx, a, i, expected, timeout_ns):
    """Sleep while ``a[i] == expected`` (``a`` int32), at most ``timeout_ns``; may return
    early (spuriously): callers re-check."""
    if not (isinstance(a, types.Array) and a.dtype == types.int32 and a.layout == "C"):
        raise TypeError(f"futex_wait: expected a C-contiguous int32 array, got {a}")
    sig = types.void(a, types.intp, types.int32, types.int64)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
        ts = _timespec(builder, args[3])
        if HAVE_FUTEX:
            _syscall(builder, _FUTEX_SYSCALL, builder.bitcast(ptr, _I8P),
                     _I32(_FUTEX_WAIT_PRIVATE), args[2], ts, ir.Constant(_I8P, None), _I32(0))
        else:
            fnty = ir.FunctionType(_I32, [ts.type, ts.type])
            sleep = cgutils.get_or_insert_function(builder.module, fnty, "nanosleep")
            builder.store(_I64(0), cgutils.gep_inbounds(builder, ts, 0, 0))
            builder.store(_I64(20_000), cgutils.gep_inbounds(builder, ts, 0, 1))
            builder.call(sleep, [ts, ir.Constant(ts.type, None)])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def futex_wake(typingctx, a, i):
    """Wake every thread sleeping in ``futex_wait`` on ``a[i]`` (``a`` int32)."""
    if not (isinstance(a, types.Array) and a.dtype == types.int32 and a.layout == "C"):
        raise TypeError(f"futex_wake: expected a C-contiguous int32 array, got {a}")
    sig = types.void(a, types.intp)

    def codegen(context, builder, sig, args):
        if HAVE_FUTEX:
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
            _syscall(builder, _FUTEX_SYSCALL, builder.bitcast(ptr, _I8P),
                     _I32(_FUTEX_WAKE_PRIVATE), _I32(2 ** 31 - 1))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def cpu_pause(typingctx):
    """The processor's spin-wait hint (nothing where there is none)."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        if _MACHINE in ("x86_64", "amd64"):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
        elif _MACHINE in ("aarch64", "arm64"):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [_I32]), "llvm.aarch64.hint")
            builder.call(fn, [_I32(1)])  # YIELD
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def cpu_yield(typingctx):
    """``sched_yield()``: the thread goes to the back of its core's run queue."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, []),
                                            "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def call_pointer(typingctx, address, block):
    """Call ``int64 f(void *)`` at ``address`` with ``block``; returns its result."""
    if not (isinstance(address, types.Integer) and isinstance(block, types.Integer)):
        raise TypeError("call_pointer: expected two integer addresses")
    sig = types.int64(types.intp, types.intp)

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I64, [_I8P])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(fn, [builder.inttoptr(args[1], _I8P)])
    return sig, codegen


@functools.lru_cache(maxsize=None)
def call_native(restype):
    """An intrinsic ``call(address, args) -> int64`` (see the module docstring); a
    returned value is released (kernels of the runtime return nothing)."""

    @intrinsic
    def call(typingctx, address, args):
        if not (isinstance(address, types.Integer) and isinstance(args, types.BaseTuple)):
            raise TypeError("call_native: expected an integer address and a tuple of arguments")
        argtypes = tuple(args.types)
        sig = types.int64(address, args)

        def codegen(context, builder, sig, llargs):
            fnty = context.call_conv.get_function_type(restype, argtypes)
            fn = builder.inttoptr(llargs[0], fnty.as_pointer())
            values = cgutils.unpack_tuple(builder, llargs[1], len(argtypes))
            status, out = context.call_conv.call_function(builder, fn, restype, argtypes, values)
            if restype is not types.none and context.enable_nrt:
                context.nrt.decref(builder, restype, out)
            return builder.select(status.is_error, _I64(1), _I64(0))
        return sig, codegen
    return call


@functools.lru_cache(maxsize=None)
def array_view(arrtype: types.Array):
    """An intrinsic ``view(address, shape, strides) -> arrtype`` (see the module docstring).

    ``shape`` and ``strides`` are tuples of ``arrtype.ndim`` integers (bytes for strides).
    """
    if not isinstance(arrtype, types.Array):
        raise TypeError(f"array_view: expected a Numba array type, got {arrtype!r}")

    @intrinsic
    def view(typingctx, address, shape, strides):
        sig = arrtype(types.intp, types.UniTuple(types.intp, arrtype.ndim),
                      types.UniTuple(types.intp, arrtype.ndim))

        def codegen(context, builder, sig, args):
            ary = make_array(arrtype)(context, builder)
            data = builder.inttoptr(args[0], ary.data.type)
            itemsize = context.get_abi_sizeof(context.get_data_type(arrtype.dtype))
            populate_array(ary, data=data, shape=args[1], strides=args[2], itemsize=itemsize,
                           meminfo=None)
            return ary._getvalue()
        return sig, codegen
    return view
