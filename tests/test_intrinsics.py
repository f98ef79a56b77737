"""The replay engine's intrinsics, each alone (``hetero_nn.scheduler.engine.intrinsics``).

Atomics under two threads that release the interpreter lock, the futex wait and
wake (with their timeout), the clock against ``time.perf_counter``, an indirect
call through a ``cfunc``'s address, a Numba-convention call that reports a
kernel's exception, and array views over memory the view does not own. Every
wait that could hang runs in a thread joined with a timeout.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from numba import carray, cfunc, njit, types

from hetero_nn.scheduler.engine.intrinsics import (HAVE_FUTEX, array_view, atomic_add, atomic_load,
                                            atomic_store, call_native, call_pointer,
                                            clock_offset, cpu_pause, futex_wait, futex_wake,
                                            monotonic_ns)
from hetero_nn.scheduler.engine.trampoline import native_entry


def _in_threads(targets, timeout=60):
    """Run the callables in threads at once; fail (not hang) if one is still running."""
    results = [None] * len(targets)

    def run(i, fn):
        results[i] = fn()
    threads = [threading.Thread(target=run, args=(i, fn), daemon=True)
               for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"a thread still runs after {timeout} s"
    return results


@njit(nogil=True)
def _add_many(counter, n):
    for _ in range(n):
        atomic_add(counter, 0, 1)


@njit(nogil=True)
def _plain_add_many(counter, n):
    for _ in range(n):
        counter[0] += 1


@pytest.mark.parametrize("dtype", (np.int32, np.int64))
def test_atomic_add_from_two_threads_loses_no_increment(dtype):
    counter = np.zeros(1, dtype=dtype)
    _add_many(counter, 10)  # compiled before the threads start
    counter[0] = 0
    n = 200_000
    _in_threads([lambda: _add_many(counter, n)] * 2)
    assert counter[0] == 2 * n


@njit(nogil=True)
def _load_store(a, i, v):
    old = atomic_load(a, i)
    atomic_store(a, i, v)
    return old, atomic_load(a, i)


def test_atomic_load_and_store_read_and_write_one_element():
    a = np.array([5, 7, 9], dtype=np.int64)
    assert _load_store(a, 1, np.int64(-3)) == (7, -3)
    assert a.tolist() == [5, -3, 9]


def test_atomics_refuse_arrays_they_cannot_update():
    with pytest.raises(Exception, match="int32 or int64"):
        _load_store(np.zeros(2, dtype=np.float64), 0, 1.0)


@njit(nogil=True)
def _wait_for(flags, i, timeout_ns):
    start = monotonic_ns()
    while atomic_load(flags, i) == 0:
        futex_wait(flags, i, np.int32(0), timeout_ns)
    return monotonic_ns() - start


@njit(nogil=True)
def _set_and_wake(flags, i):
    atomic_store(flags, i, np.int32(1))
    futex_wake(flags, i)


def test_a_futex_sleeper_wakes_when_the_flag_is_set():
    flags = np.zeros(2, dtype=np.int32)
    flags[1] = 1
    _wait_for(flags, 1, 1_000_000)  # compiled, and returns at once on a set flag
    _set_and_wake(flags, 1)

    def setter():
        time.sleep(0.05)
        _set_and_wake(flags, 0)
    waited, _ = _in_threads([lambda: _wait_for(flags, 0, 10_000_000_000), setter])
    assert flags[0] == 1 and 0.04 < waited * 1e-9 < 30


@njit(nogil=True)
def _one_wait(flags, timeout_ns):
    start = monotonic_ns()
    futex_wait(flags, 0, np.int32(0), timeout_ns)
    return monotonic_ns() - start


@pytest.mark.skipif(not HAVE_FUTEX, reason="no futex here: waits poll with short sleeps")
def test_a_futex_wait_ends_at_its_timeout_or_when_the_value_differs():
    flags = np.zeros(1, dtype=np.int32)
    assert 0.015 < _one_wait(flags, 20_000_000) * 1e-9 < 10  # nobody wakes it: the timeout
    flags[0] = 4
    assert _one_wait(flags, 10_000_000_000) * 1e-9 < 1  # not the expected value: no sleep


@njit(nogil=True)
def _now():
    cpu_pause()
    return monotonic_ns()


def test_the_clock_reads_perf_counter_time():
    before = time.perf_counter()
    stamp = _now() * 1e-9 + clock_offset()
    after = time.perf_counter()
    assert before - 1e-3 <= stamp <= after + 1e-3
    if sys.platform.startswith("linux"):  # one clock (CLOCK_MONOTONIC) under both
        assert abs(clock_offset()) < 1e-3


@cfunc(types.int64(types.voidptr), nopython=True)
def _sum_block(block):
    b = carray(block, 3, np.int64)
    return b[0] + b[1] * b[2]


@njit(nogil=True)
def _call(address, block):
    return call_pointer(address, block)


def test_call_pointer_calls_a_cfunc_through_its_address():
    block = np.array([2, 3, 4], dtype=np.int64)
    assert _call(_sum_block.address, block.ctypes.data) == 14


@njit(nogil=True)
def _kernel(a, value):
    if value < 0:
        raise ValueError("negative")
    a[0] = value


_CALL_NONE = call_native(types.none)


@njit(nogil=True)
def _call_kernel(address, a, value):
    return _CALL_NONE(address, (a, value))


def test_call_native_runs_a_compiled_overload_and_reports_its_exception():
    a = np.zeros(2)
    address, restype = native_entry(_kernel, (types.Array(types.float64, 1, "C"), types.float64))
    assert restype is types.none
    assert _call_kernel(address, a, 2.5) == 0 and a[0] == 2.5
    assert _call_kernel(address, a, -1.0) == 1 and a[0] == 2.5


_VIEW_2D = array_view(types.Array(types.float32, 2, "A"))


@njit(nogil=True)
def _view_sum(address, shape, strides):
    v = _VIEW_2D(address, shape, strides)
    v[0, 0] += 100
    return v.sum()


def test_array_view_sees_a_strided_region_without_copying_it():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    part = x[1:3, ::2]
    assert _view_sum(part.ctypes.data, part.shape, part.strides) == part.sum()
    assert x[1, 0] == 106  # written through the view
    assert array_view(types.Array(types.float32, 2, "A")) is _VIEW_2D  # memoized per type
