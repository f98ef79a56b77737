"""Task timing: a variant called with its run's end stamped where the kernel ends.

Policy
------
A worker thread that runs a Numba ``nogil`` kernel gives up the interpreter lock for
the kernel and must take it back when the kernel returns; if another thread holds it
then, the wait is counted as the task's time when the end is stamped in Python
afterwards (a 4.8 µs kernel recorded as 18.5 µs beside a second worker). Where the
variant *is* a Numba dispatcher compiled ``nogil=True`` (not a Python wrapper around
one), it is called through a compiled trampoline made once per variant,
``timed(*args)``: it calls the kernel and reads the clock before returning to Python,
so the recorded end excludes the wait for the lock (the caller carries it as ``timed``; the
local executor calls ``fixed(n)``, the same for ``n`` operands as separate arguments,
directly for a task of a codelet of fixed modes without parameters). The clock is the runtime's one
compiled clock, the replay engine's (:mod:`~hetero_nn.scheduler.trace.clock`), where it
is the clock of ``time.perf_counter`` (Linux); where it is not, or the variant is Python
code, the end is ``time.perf_counter()`` after the call, as before. Keyword parameters reach the
trampoline positionally, in the order of the kernel's signature (defaults filled in).

State
-----
``_callers``: variant function -> the caller ``call(arrays, params) -> end``;
``_orders``: (kernel, parameter names given) -> positional names and defaults. Both
grow once per variant (and per set of parameter names) and are read without a lock
(a race makes the same caller twice).
"""

from __future__ import annotations

import inspect
import time

import numba
from numba.core.registry import CPUDispatcher  # to recognise a compiled dispatcher

from ..trace.clock import HAVE_CLOCK, clock_offset, monotonic_ns

_perf = time.perf_counter
_callers: dict = {}
_orders: dict = {}


def caller(fn):
    """``call(arrays, params) -> end time`` for variant ``fn`` (memoized)."""
    call = _callers.get(fn)
    if call is None:
        call = _callers[fn] = _make_caller(fn)
    return call


def _make_caller(fn):
    clock = _kernel_clock()
    if clock is None or not _is_nogil_dispatcher(fn):
        def call(arrays, params):
            fn(*arrays, **params)
            return _perf()
        return call

    @numba.njit(nogil=True)
    def timed(*args):
        fn(*args)
        return clock()

    def call(arrays, params):
        if params:
            return timed(*arrays, *_positional(fn, len(arrays), params))
        return timed(*arrays)
    call.timed = timed  # a task without parameters may call it directly: timed(*arrays)
    call.fixed = _fixed_arity(fn, clock)
    return call


def _fixed_arity(fn, clock):
    """``fixed(n)``: the trampoline of ``n`` operands and no parameters, memoized. It takes
    each operand as an argument of its own: Numba's dispatcher types and unboxes ``n``
    arrays, not a ``*args`` tuple of them (0.2-0.4 us a call less on the 2-core machine,
    where the local executor calls it once per task of a codelet without parameters)."""
    made = {}

    def fixed(n):
        timed = made.get(n)
        if timed is None:
            names = ", ".join(f"a{i}" for i in range(n))
            scope = {"fn": fn, "clock": clock}
            exec(f"def timed({names}):\n    fn({names})\n    return clock()\n", scope)
            timed = made[n] = numba.njit(nogil=True)(scope["timed"])
        return timed
    return fixed


def _positional(fn, nops, params) -> list:
    """``params`` in the order of ``fn``'s arguments after its ``nops`` operands."""
    key = (fn, tuple(params))
    order = _orders.get(key)
    if order is None:
        names = list(inspect.signature(fn.py_func).parameters.values())[nops:]
        unknown = set(params) - {p.name for p in names}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword argument(s) {sorted(unknown)}")
        order = _orders[key] = [(p.name, p.default) for p in names]
    out = []
    for name, default in order:
        value = params.get(name, default)
        if value is inspect.Parameter.empty:
            raise TypeError(f"{fn.__name__}() missing argument {name!r}")
        out.append(value)
    return out


def _is_nogil_dispatcher(fn) -> bool:
    return isinstance(fn, CPUDispatcher) and bool(fn.targetoptions.get("nogil"))


_CLOCK = None


def _kernel_clock():
    """A compiled function reading the clock of ``time.perf_counter``, or None."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = _build_clock() or False
    return _CLOCK or None


def _build_clock():
    if not HAVE_CLOCK or clock_offset() != 0.0:  # not perf_counter's clock (macOS)
        return None

    @numba.njit(nogil=True)
    def clock():
        return monotonic_ns() / 1e9  # as perf_counter divides

    return clock
