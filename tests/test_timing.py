"""What the runtime records as a task's time, and what keeps histories apart.

- A Numba ``nogil`` kernel given as the variant itself is called through a compiled
  trampoline that stamps its end before the thread takes the interpreter lock back:
  a thread that holds the lock meanwhile does not lengthen the recorded time.
- A codelet's ``footprint`` callback (StarPU's) joins its parameters to the
  performance model's key: a 64-iteration and a 4-million-iteration task keep apart
  histories.
"""

from __future__ import annotations

import sys
import threading
import time

import numba
import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.scheduler.executors import timing

HOLD = 1.0  # seconds the main thread keeps the interpreter lock (the kernel takes ~20 ms)


@numba.njit(nogil=True)
def _spin(x, n):
    s = 0.0
    for i in range(n):
        s += (i % 7) * 1e-9
    x[0] = s


def _spin_in_python(x, n):
    _spin(x, n)


def _end_beside_a_lock_holder(fn):
    """Run ``fn`` through the runtime's timed caller in a thread while this thread holds
    the interpreter lock (a switch interval far longer than the hold). Returns the end
    the caller recorded and when this thread let the lock go."""
    call = timing.caller(fn)
    x = np.zeros(1)
    call([x], {"n": 10})  # compiled outside the measurement
    entered = threading.Event()
    out = {}

    def worker():
        entered.set()
        out["end"] = call([x], {"n": 20_000_000})

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        t = threading.Thread(target=worker)
        t.start()
        assert entered.wait(10.0)
        deadline = time.perf_counter() + HOLD
        while time.perf_counter() < deadline:  # pure Python: the lock is never given up
            pass
        released = time.perf_counter()
        t.join(10.0)
    finally:
        sys.setswitchinterval(old)
    return out["end"], released


@pytest.mark.skipif(timing._kernel_clock() is None,
                    reason="no clock_gettime with perf_counter's clock here")
def test_a_nogil_kernels_end_is_stamped_before_the_lock_is_taken_back():
    """The kernel ends while the main thread holds the lock: the trampoline's end comes
    before the lock is let go, a Python wrapper's end after."""
    stamped, released = _end_beside_a_lock_holder(_spin)
    assert stamped < released
    in_python, released = _end_beside_a_lock_holder(_spin_in_python)
    assert in_python >= released


def test_the_timed_caller_passes_parameters_in_the_kernels_order():
    @numba.njit(nogil=True)
    def affine(x, scale, shift=1.0):
        x[:] = x * scale + shift

    call = timing.caller(affine)
    x = np.ones(3)
    end = call([x], {"scale": 2.0})
    assert x.tolist() == [3.0, 3.0, 3.0] and end <= time.perf_counter()
    call([x], {"shift": 0.0, "scale": 0.5})
    assert x.tolist() == [1.5, 1.5, 1.5]
    with pytest.raises(TypeError, match="unexpected keyword"):
        call([x], {"scale": 1.0, "offset": 2.0})


@numba.njit(nogil=True)
def _add_into(x, y):
    x += y


ADD_INTO = hn.Codelet("timing_add_into", modes=(hn.RW, hn.R), variants={"cpu": _add_into})


def test_a_codelet_without_parameters_runs_through_its_fixed_arity_trampoline():
    """``fixed(n)`` takes the ``n`` operands as arguments of their own (no ``*args``
    tuple); the local executor calls it for a pinned codelet's tasks without parameters."""
    call = timing.caller(_add_into)
    if timing._kernel_clock() is not None:
        x, y = np.ones(2), np.full(2, 2.0)
        assert call.fixed(2) is call.fixed(2)
        assert call.fixed(2)(x, y) <= time.perf_counter() and x.tolist() == [3.0, 3.0]
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        x, y = rt.register(np.zeros(4)), rt.register(np.arange(4.0))
        for _ in range(3):
            rt.submit(ADD_INTO, x, y)
        assert rt.fetch(x).tolist() == [0.0, 3.0, 6.0, 9.0]
        assert {r.variant for r in rt.trace().records} == {"cpu"}


def _iterate(x, iterations):
    x += iterations


PLAIN = hn.Codelet("timing_iterate", modes=(hn.RW,), variants={"ref": _iterate})
KEYED = hn.Codelet("timing_iterate_keyed", modes=(hn.RW,), variants={"ref": _iterate},
                   footprint=lambda shape, iterations: iterations)


def test_a_footprint_callback_keeps_the_histories_of_different_parameters_apart(tmp_path):
    pm = hn.PerfModel(tmp_path, load=False)
    with hn.Runtime(devices="cpu:1", perfmodel=pm) as rt:
        x = rt.register(np.zeros(4))
        for _ in range(4):
            for codelet in (PLAIN, KEYED):
                for iterations in (64, 4_000_000):
                    rt.submit(codelet, x, iterations=iterations)
        rt.wait()
    plain = {e["footprint"] for e in pm.entries("timing_iterate")}
    keyed = {e["footprint"] for e in pm.entries("timing_iterate_keyed")}
    assert plain == {"4:<f8"}
    assert keyed == {"4:<f8|timing_iterate_keyed=64", "4:<f8|timing_iterate_keyed=4000000"}
