"""The garbage collector while flushes run (flush.py, *The garbage collector while flushes
run*): the young threshold is raised from a flush's first task to its end, for every kind
of flush (streamed, closed, replayed), and the program's thresholds come back after the
last open flush of the process, unless the program set its own meanwhile."""

import gc

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import RW
from hetero_nn.scheduler.autocapture import DEFER
from hetero_nn.scheduler.flush import FLUSH_THRESHOLD, Collector

TIMEOUT = 30.0  # a hang ends in a TaskError (Runtime(wait_timeout=))


def _add(x):
    x += 1.0


def _fail(x):
    raise ValueError("this task fails")


ADD = hn.Codelet("collector_add", modes=(RW,), variants={"ref": _add})
FAIL = hn.Codelet("collector_fail", modes=(RW,), variants={"ref": _fail})


@pytest.fixture(autouse=True)
def program_thresholds():
    """The program's thresholds, CPython's defaults, put back after each test."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    assert Collector.open == 0, "a flush still holds the collector's threshold"
    gc.set_threshold(*saved)


def _runtime(**options):
    return hn.Runtime(devices="cpu:2", wait_timeout=TIMEOUT, **options)


def test_a_streamed_flush_raises_the_young_threshold_until_its_end():
    with _runtime() as rt:
        h = rt.register(np.zeros(3))
        assert gc.get_threshold() == (700, 10, 10)  # no flush open
        for _ in range(5):
            rt.submit(ADD, h)
        assert gc.get_threshold() == (FLUSH_THRESHOLD, 10, 10)
        rt.wait()
        assert gc.get_threshold() == (700, 10, 10)
        np.testing.assert_array_equal(rt.fetch(h), np.full(3, 5.0))  # results unchanged


@pytest.mark.parametrize("overlap", [True, False])
def test_replayed_and_closed_flushes_give_the_thresholds_back(overlap):
    with _runtime(overlap=overlap) as rt:
        h = rt.register(np.zeros(2))
        for _ in range(4):  # automatic capture: seen, captured, replayed twice
            rt.submit(ADD, h)
            rt.submit(ADD, h)
            rt.wait()
            assert gc.get_threshold() == (700, 10, 10)
        notes = rt.trace().metadata.get("auto_capture", [])
        assert notes and notes[-1]["action"] == "replayed"
        np.testing.assert_array_equal(rt.fetch(h), np.full(2, 8.0))


def test_the_last_open_flush_of_the_process_restores_them():
    with _runtime() as first, _runtime() as second:
        a, b = first.register(np.zeros(1)), second.register(np.zeros(1))
        first.submit(ADD, a)
        second.submit(ADD, b)
        assert Collector.open == 2
        first.wait()
        assert gc.get_threshold()[0] == FLUSH_THRESHOLD  # the second flush still runs
        second.wait()
        assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_the_program_sets_during_a_flush_are_kept():
    with _runtime() as rt:
        h = rt.register(np.zeros(1))
        rt.submit(ADD, h)
        gc.set_threshold(2000, 5, 5)
        rt.wait()
        assert gc.get_threshold() == (2000, 5, 5)


def test_collection_turned_off_by_the_program_stays_off():
    gc.set_threshold(0, 10, 10)
    with _runtime() as rt:
        h = rt.register(np.zeros(1))
        rt.submit(ADD, h)
        assert gc.get_threshold() == (0, 10, 10)
        rt.wait()
    assert gc.get_threshold() == (0, 10, 10)


def test_a_failed_flush_and_a_runtime_closed_with_one_open_release_it():
    with _runtime() as rt:
        h = rt.register(np.zeros(1))
        rt.submit(FAIL, h)
        with pytest.raises(hn.TaskError, match="this task fails"):
            rt.wait()
        assert gc.get_threshold() == (700, 10, 10)
        rt.submit(ADD, h)  # left open: close() gives it back
    assert gc.get_threshold() == (700, 10, 10)


def test_a_kept_flush_holds_the_threshold_from_its_first_task_to_its_end():
    """Automatic capture keeps a repeated flush's tasks unrun until wait(): they live as
    long as an open flush's, so the threshold is raised while they are kept; a flush that
    differs midway (submitted then) and a runtime closed with a kept flush give it back."""
    with _runtime() as rt:
        h = rt.register(np.zeros(2))
        for _ in range(2):  # seen, then captured: the shape is known
            for _ in range(3):
                rt.submit(ADD, h)
            rt.wait()
        rt.submit(ADD, h)  # kept: compared with the shape, not run
        assert rt._auto.state == DEFER and Collector.open == 1
        assert gc.get_threshold() == (FLUSH_THRESHOLD, 10, 10)
        rt.submit(ADD, h)
        rt.submit(ADD, h)
        rt.wait()  # replayed
        assert gc.get_threshold() == (700, 10, 10) and Collector.open == 0
        for _ in range(4):  # the fourth task is not the shape's: submitted as the program did
            rt.submit(ADD, h)
        rt.wait()
        assert gc.get_threshold() == (700, 10, 10) and Collector.open == 0
        np.testing.assert_array_equal(rt.fetch(h), np.full(2, 13.0))
        rt.submit(ADD, h)  # kept, then the runtime closes without a wait
    assert gc.get_threshold() == (700, 10, 10) and Collector.open == 0


def test_a_long_streamed_flush_meets_no_young_collection_until_it_ends():
    """A 12,000-task chain keeps most of its tasks alive while it is submitted (the worker
    gets the interpreter lock only now and then): at a young threshold of 50,000 they met
    a collection that walked them all; under FLUSH_THRESHOLD the collection comes after
    the flush, when they are gone."""
    n = 12_000
    young = []

    def seen(phase, info):
        if phase == "start" and Collector.open:
            young.append(info["generation"])

    with _runtime() as rt:
        h = rt.register(np.zeros(1))
        gc.callbacks.append(seen)
        try:
            tasks = [rt.submit(ADD, h) for _ in range(n)]  # alive until wait(), as a
            rt.wait()  # program may keep them
        finally:
            gc.callbacks.remove(seen)
        assert rt.fetch(h)[0] == float(n)
        assert all(t.done() for t in tasks)
    assert young == [], f"collections while the flush was open: {young}"
