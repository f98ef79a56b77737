"""The stream contract of CUDA workers: callbacks on a runtime thread, device times from
the stream's events in the trace and the performance model, a device fault as the
failing task's ``TaskError``.

On ``cuda-emu`` (CI) the events are stamped by the stream's thread; the ``cuda`` tests
run the same on a GPU, the fault in a child process (a CUDA fault poisons its context).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import RW
from hetero_nn.arena.stream import EmulatedStream
from helpers import REPO

SLEEP = 0.03


def _slow_double(x):
    time.sleep(SLEEP)
    x *= 2


def test_emulated_events_time_the_work_between_them():
    stream = EmulatedStream("timing", 0)
    try:
        began = stream.record()
        stream.launch(time.sleep, SLEEP)
        ended = stream.record()
        stream.synchronize()
        assert SLEEP <= stream.elapsed(began, ended) < SLEEP + 1.0
    finally:
        stream.close()


def test_device_times_feed_the_trace_and_callbacks_run_on_a_runtime_thread(perfmodel_cache):
    seen = []
    slow = hn.Codelet("emu_slow_double", modes=(RW,), variants={"cuda": _slow_double})
    with hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        x = rt.register(np.ones(4))
        for _ in range(3):
            rt.submit(slow, x, callback=lambda *a: seen.append(threading.current_thread().name))
        assert rt.fetch(x).tolist() == [8.0] * 4
        records = [r for r in rt.trace() if r.codelet == "emu_slow_double"]
    assert len(records) == 3
    for r in records:
        assert SLEEP <= r.end - r.start < SLEEP + 1.0
    assert seen and all(name != threading.main_thread().name for name in seen)


def _in_child(code, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.cuda
def test_on_a_gpu_callbacks_run_on_the_streams_callback_thread(cupy):
    threads = []
    scale = hn.Codelet("gpu_scale", modes=(RW,), variants={"cuda": lambda x: x.__imul__(2)})
    with hn.Runtime(devices="cuda:0", perfmodel=False) as rt:
        x = rt.register(np.ones(8))
        rt.submit(scale, x, callback=lambda *a: threads.append(threading.current_thread().name))
        assert rt.fetch(x).tolist() == [2.0] * 8
        record = next(r for r in rt.trace() if r.codelet == "gpu_scale")
    assert threads and threads[0].endswith("-callbacks"), threads
    assert 0 <= record.end - record.start < 1.0


@pytest.mark.cuda
def test_on_a_gpu_a_device_fault_is_the_failing_tasks_error(cupy):
    done = _in_child("""
        import numpy as np, cupy, hetero_nn as hn
        kernel = cupy.RawKernel(r'''extern "C" __global__ void bad(double* p) {
            double* q = (double*)0x10; *q = p[0]; }''', "bad")
        def fault(x):
            kernel((1,), (1,), (x,))
        cl = hn.Codelet("gpu_fault", modes=(hn.RW,), variants={"cuda": fault})
        try:
            with hn.Runtime(devices="cuda:0", perfmodel=False) as rt:
                x = rt.register(np.ones(4))
                rt.submit(cl, x)
                rt.wait()
        except hn.TaskError as exc:
            print("TASKERROR", exc.codelet, exc)
    """)
    assert "TASKERROR gpu_fault" in done.stdout, done.stdout + done.stderr
