"""The runtime's one compiled clock: what every task's start and end are stamped with where
compiled code stamps them (the replay engine's dispatch loop, the executors' timed kernel
calls), on the scale of ``time.perf_counter()`` that the trace's other times use.

``monotonic_ns()`` (a Numba intrinsic, callable from ``@njit`` code) reads
``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds; :func:`clock_offset` is what to add
to ``monotonic_ns() * 1e-9`` to read ``time.perf_counter()``: exactly 0 where Python
says ``perf_counter`` is that clock (Linux), else measured once per process.
:data:`HAVE_CLOCK` says whether the platform has ``clock_gettime`` at all.
"""

from __future__ import annotations

import sys
import time

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

HAVE_CLOCK = sys.platform.startswith(("linux", "darwin", "freebsd"))
"""Whether ``clock_gettime`` exists (the compiled loop needs it to time tasks)."""

_CLOCK_MONOTONIC = 1 if sys.platform.startswith("linux") else 6  # Darwin: CLOCK_MONOTONIC = 6
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


@intrinsic
def monotonic_ns(typingctx):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds."""
    sig = types.int64()

    def codegen(context, builder, sig, args):
        ts_t = ir.LiteralStructType([_I64, _I64])
        fnty = ir.FunctionType(_I32, [_I32, ts_t.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        ts = cgutils.alloca_once(builder, ts_t)
        builder.call(fn, [_I32(_CLOCK_MONOTONIC), ts])
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, _I64(1_000_000_000)), nsec)
    return sig, codegen


@njit(nogil=True, cache=True)
def _now_ns():
    return monotonic_ns()


def _same_clock() -> bool:
    """Whether ``time.perf_counter`` reads ``CLOCK_MONOTONIC`` itself (Python says so)."""
    return (sys.platform.startswith("linux") and
            time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)")


def _clock_offset() -> float:
    """``time.perf_counter() - monotonic_ns() / 1e9``: 0 where both read one clock, else
    the median of a few readings."""
    if not HAVE_CLOCK or _same_clock():
        return 0.0
    _now_ns()  # compiled first
    readings = []
    for _ in range(5):
        a = time.perf_counter()
        b = _now_ns()
        c = time.perf_counter()
        readings.append((a + c) / 2 - b * 1e-9)
    readings.sort()
    return readings[2]


CLOCK_OFFSET = None
"""Seconds to add to ``monotonic_ns() * 1e-9`` to read ``time.perf_counter()``; set by
:func:`clock_offset` on first use."""


def clock_offset() -> float:
    """:data:`CLOCK_OFFSET`, found once per process."""
    global CLOCK_OFFSET
    if CLOCK_OFFSET is None:
        CLOCK_OFFSET = _clock_offset()
    return CLOCK_OFFSET
