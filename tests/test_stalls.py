"""Never hung: a hang injected at each wait of the runtime ends in a ``TaskError`` that
prints the state, within ``Runtime(wait_timeout=)`` (set short here).

The hang is real code a user could write: a codelet that blocks on a
``threading.Event`` (:data:`GATE`) the test opens again afterwards, so the stuck thread
ends and the runtime is checked usable. Every test runs under :func:`helpers.within`.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, RW
from hetero_nn.arena.stream import EmulatedStream
from hetero_nn.scheduler.executors.stalls import check_wait_timeout
from helpers import within

BOUND = 60.0   # seconds: a test that takes longer hung
TIMEOUT = 0.5  # the runtime's wait_timeout in these tests
GATE = threading.Event()
GATE.set()
STARTED = threading.Event()  # set by a task that reached GATE
ARMED = threading.Event()


def _hang(x):
    """Blocks while GATE is closed (at most BOUND: a broken test cannot leak a thread)."""
    STARTED.set()
    GATE.wait(BOUND)
    x += 1


def _add(x):
    x += 1


def _interrupt(x):
    """Ctrl-C, as it lands in a task's Python code, while ARMED is set."""
    if ARMED.is_set():
        raise KeyboardInterrupt
    x += 1


def _copy(src, dst):
    dst[...] = src


HANG = hn.Codelet("stall_hang", modes=(RW,), variants={"ref": _hang, "cuda": _hang})
ADD = hn.Codelet("stall_add", modes=(RW,), variants={"ref": _add, "cuda": _add})
COPY = hn.Codelet("stall_copy", modes=(R, RW), variants={"ref": _copy})
INTERRUPT = hn.Codelet("stall_interrupt", modes=(RW,), variants={"ref": _interrupt})


@pytest.fixture(autouse=True)
def _open_gate(_warm):
    yield
    GATE.set()


@pytest.fixture(scope="module")
def _warm():
    """The process's first tasks and replay compile their clocks and loop (seconds on a
    loaded machine: no progress, by the definition): done once, with no deadline."""
    def warm():
        with hn.Runtime(devices="cpu:2", perfmodel=False, wait_timeout=None) as rt:
            graph, _, _ = _captured_hang(rt, False)
            graph.replay()
            for codelet in (ADD, HANG):
                rt.submit(codelet, rt.register(np.zeros(2)))
            rt.wait()
    within(BOUND * 5, warm)


def _runtime(devices="cpu:2"):
    return hn.Runtime(devices=devices, perfmodel=False, wait_timeout=TIMEOUT)


def test_wait_timeout_is_checked():
    assert check_wait_timeout(None) is None and check_wait_timeout(2) == 2.0
    for bad in (0, -1, "10", True):
        with pytest.raises(hn.ConfigError, match="wait_timeout"):
            hn.Runtime(wait_timeout=bad)


@pytest.mark.parametrize("devices", ("cpu:2", "cuda-emu:1"))
def test_a_hung_task_stops_the_flush_with_the_executor_state(devices):
    """drain(): a task that never returns (on a CPU worker, or on an emulated stream)."""
    def scenario():
        with _runtime(devices) as rt:
            x, y = rt.register(np.zeros(2)), rt.register(np.zeros(2))
            GATE.clear()
            rt.submit(HANG, x)
            rt.submit(ADD, x)  # waits for the hung one
            with pytest.raises(hn.TaskError, match="a flush made no progress") as info:
                rt.wait()
            text = str(info.value)
            assert "executor state" in text and "running [" in text and "stall_hang" in text
            GATE.set()
            rt.submit(ADD, y)  # usable: the next flush also waits for the hung task
            np.testing.assert_array_equal(rt.fetch(y), np.ones(2))
    within(BOUND, scenario)


def test_closing_with_a_hung_task_ends_with_the_state():
    def scenario():
        rt = _runtime()
        x = rt.register(np.zeros(2))
        GATE.clear()
        STARTED.clear()
        rt.submit(HANG, x)
        assert STARTED.wait(BOUND)  # running (close cancels what has not started)
        with pytest.raises(hn.TaskError, match="closing the runtime.*still running"):
            rt.close()
    within(BOUND, scenario)


def test_closing_a_stream_whose_call_hangs_ends_at_the_deadline():
    """An emulated stream's close() serves what is queued: a call that never returns ends
    it with a TaskError naming the stream (its thread left behind), not a hang."""
    def scenario():
        stream = EmulatedStream("stall-emu", 0)
        stream.wait_timeout = TIMEOUT
        GATE.clear()
        STARTED.clear()
        stream.launch(_hang, np.zeros(1))
        stream.launch(_add, np.zeros(1))
        assert STARTED.wait(BOUND)
        t0 = time.perf_counter()
        with pytest.raises(hn.TaskError, match="stream stall-emu made no progress.*1 more "
                                               "queued"):
            stream.close()
        assert time.perf_counter() - t0 < BOUND / 2
    within(BOUND, scenario)


def _captured_hang(rt, independent):
    """A graph whose task on cpu1 hangs at replay; cpu0 waits for it (a compiled wait)
    or not (then the replay's wait for its shares is the one that ends)."""
    x, y = rt.register(np.zeros(2)), rt.register(np.zeros(2))
    with rt.capture() as graph:
        rt.submit(HANG, x, worker="cpu1")
        if independent:
            rt.submit(ADD, y, worker="cpu0")
        else:
            rt.submit(COPY, x, y, worker="cpu0")
    return graph, x, y


def _force(graph, mode):
    for seg in graph._compiled.segments:  # (a test's choice of contention.py's mode)
        seg.contention.mode, seg.contention.countdown = mode, 10 ** 9


@pytest.mark.parametrize("independent", (False, True), ids=("wait_done", "shares"))
def test_a_hung_share_stops_the_replay_with_the_engine_state(independent):
    def scenario():
        with _runtime() as rt:
            graph, x, y = _captured_hang(rt, independent)
            graph.replay()
            _force(graph, "parallel")  # one thread per worker: the waits under test
            GATE.clear()
            with pytest.raises(hn.TaskError, match="a replay made no progress") as info:
                graph.replay()
            text = str(info.value)
            assert "replay engine state" in text and "cpu1: 0/1 done, running task" in text
            if not independent:
                assert "cpu0: 0/1 done, next task" in text and "waits on task" in text
                assert "(waits: 0 spun, 0 yielded, 1 slept" in text  # wait_stats: asleep
            assert rt._engine.broken
            GATE.set()
            deadline = time.monotonic() + BOUND
            while rt.fetch(x)[0] != 3 and time.monotonic() < deadline:  # the hung task ends
                time.sleep(0.01)
            graph.replay()  # usable: new engine threads
            np.testing.assert_array_equal(rt.fetch(x), np.full(2, 4.0))
    within(BOUND, scenario)


class _Reported(logging.Handler):
    """The runtime's log records of a stopped replay; opens GATE at the first."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.texts = []

    def emit(self, record):
        self.texts.append(record.getMessage())
        GATE.set()


@pytest.mark.parametrize("mode", ("serial", "parallel"))
def test_a_hung_task_on_the_calling_thread_is_reported_at_the_deadline(mode):
    """The calling thread runs a serial replay's one share and worker 0's of a parallel one;
    Python cannot take it back from a task that never returns (contention.py's
    docstring). At the deadline the watchdog stops the replay and logs the engine's state
    naming that task; once the task returns the replay raises its TaskError, and the
    runtime goes on."""
    def scenario():
        log = logging.getLogger("hetero_nn.scheduler")
        reported = _Reported()
        log.addHandler(reported)
        try:
            with _runtime() as rt:
                x, y = rt.register(np.zeros(2)), rt.register(np.zeros(2))
                with rt.capture() as graph:
                    rt.submit(HANG, x, worker="cpu0")
                    rt.submit(COPY, x, y, worker="cpu1")
                graph.replay()
                _force(graph, mode)
                GATE.clear()
                with pytest.raises(hn.TaskError, match="a replay made no progress"):
                    graph.replay()  # returns once the log record opened GATE
                (text,) = reported.texts
                assert "running task 0 ('stall_hang'" in text and "calling thread" in text
                assert ("in 1 share(s)" in text) == (mode == "serial")
                np.testing.assert_array_equal(rt.fetch(y), np.full(2, 2.0))  # cancelled
                graph.replay()  # usable
                np.testing.assert_array_equal(rt.fetch(y), np.full(2, 4.0))
                assert not rt._engine.broken  # no thread was lost
        finally:
            log.removeHandler(reported)
    within(BOUND, scenario)


@pytest.mark.parametrize("mode", ("parallel", "serial"))
def test_a_keyboard_interrupt_in_a_replay_leaves_the_runtime_usable(mode):
    """Ctrl-C lands in a Python task of the calling thread's share (parallel) or of the
    serial share: the other shares stop, the interrupt is raised, and the graph and the
    runtime go on."""
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
            x, y = rt.register(np.zeros(2)), rt.register(np.zeros(2))
            with rt.capture() as graph:
                rt.submit(INTERRUPT, x, worker="cpu0")
                for _ in range(20):
                    rt.submit(ADD, y, worker="cpu1")
            graph.replay()
            _force(graph, mode)
            ARMED.set()
            try:
                with pytest.raises(KeyboardInterrupt):
                    graph.replay()
            finally:
                ARMED.clear()
            threads = rt._engine._threads
            graph.replay()
            assert rt._engine._threads == threads  # no thread was lost
            rt.submit(ADD, x)
            assert rt.fetch(x)[0] >= 3
    within(BOUND, scenario)
