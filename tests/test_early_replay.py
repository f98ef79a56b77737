"""Early replays (scheduler/engine/early.py): a repeated flush's graph starts to replay
while the flush is still submitted. The bits are the submitted program's, on random
programs and where the flush leaves the shape after its replay started (a differing
submission, a step value the graph does not hold, a flush that ends early, a polled kept
task): the tasks the replay ran are not run again, the others are submitted."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from numba import njit

import hetero_nn as hn
from hetero_nn import R, RW
from hetero_nn.scheduler import autocapture
from helpers import within
from test_autocapture import _check
from test_runtime_property import programs, run_reference

PARTS, TASKS, AT = 8, 96, 60  # the stencil's parts and tasks; where a run leaves the shape
STEADY = 5  # seen, captured, replayed, replanned, replayed early


@njit(nogil=True, cache=True)
def _axpy(x, y, a):
    for i in range(y.shape[0]):
        y[i] += a * x[i]


AXPY = hn.Codelet("early_axpy", modes=(R, RW), variants={"cpu": _axpy})


def _stencil(rt, parts, a, stop=None, leave=None):
    """Part ``i`` += a * part ``i + 1`` (cyclic), TASKS times; at ``stop`` tasks, sleep
    (the early replay runs the matched prefix), then ``leave(rt, parts, tasks)``."""
    tasks = []
    for j in range(TASKS):
        if j == stop:
            time.sleep(0.02)
            if leave(rt, parts, tasks) == "ended":
                break
        i = j % PARTS
        tasks.append(rt.submit(AXPY, parts[(i + 1) % PARTS], parts[i],
                               a=a(j) if callable(a) else a))
    rt.wait()


def _differs(rt, parts, tasks):
    rt.submit(AXPY, parts[3], parts[5], a=0.25)  # a task the shape does not have


def _ends(rt, parts, tasks):
    return "ended"


def _polls(rt, parts, tasks):
    deadline = time.monotonic() + 30
    while not tasks[0].done():  # a program's progress check: the flush runs as submitted
        assert time.monotonic() < deadline, "a polled kept task never ended"
        time.sleep(0.001)


LEAVES = {"differs": (_differs, 0.5), "step value": (None, None), "ends early": (_ends, 0.5),
          "polled": (_polls, 0.5)}


def _program(rt, h, leave):
    """STEADY repeats of the stencil, one that leaves the shape, two more."""
    parts = h.split(0, PARTS)
    step = leave == "step value"
    a = (lambda j: rt.param("a", 0.5)) if step else 0.5
    for _ in range(STEADY):
        _stencil(rt, parts, a)
    fn, _ = LEAVES[leave]
    if step:  # the graph's value, then another under that name: no one value to replay
        _stencil(rt, parts, lambda j: rt.param("a", 0.5 if j < AT else 0.75))
    else:
        _stencil(rt, parts, a, AT, fn)
    for _ in range(2):
        _stencil(rt, parts, a)
    return rt.fetch(h).copy()


@pytest.mark.parametrize("leave", sorted(LEAVES))
def test_a_flush_that_leaves_the_shape_after_its_early_replay_started(leave):
    data = np.linspace(0.5, 1.5, 2 * PARTS)
    with hn.Runtime(devices="cpu:2", perfmodel=False, auto_capture=False) as rt:
        want = _program(rt, rt.register(data.copy()), leave)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(data.copy())
        got = within(60, _program, rt, h, leave)
        trace = rt.trace()
    np.testing.assert_array_equal(got, want)
    notes = trace.metadata["auto_capture"]
    assert [(n["action"], n.get("early", False)) for n in notes[:4]] == [
        ("captured", False), ("replayed", False), ("replayed", False), ("replayed", True)]
    if leave in ("differs", "ends early"):  # the shape found again: replayed early again
        assert notes[-1].get("early"), notes
    ids = Counter(r.task_id for r in trace.records)
    assert max(ids.values()) == 1  # every task ran once: by the replay or as submitted
    assert len(ids) == (STEADY + 3) * TASKS + (leave == "differs") - (TASKS - AT) * (
        leave == "ends early")


def _checked(x, y, a):
    if np.isnan(x).any():
        raise ValueError("not a number")
    y += a * x


CHECKED = hn.Codelet("early_checked", modes=(R, RW), variants={"ref": _checked})


def test_an_early_replay_that_fails_raises_at_wait_and_the_runtime_goes_on():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        data = np.ones(2 * PARTS)
        h = rt.register(data)
        parts = h.split(0, PARTS)

        def run():
            for j in range(TASKS):
                rt.submit(CHECKED, parts[(j + 1) % PARTS], parts[j % PARTS], a=0.5)
            rt.wait()
        for _ in range(STEADY):
            within(60, run)
        data[:] = np.nan  # (the host array between flushes, as the program's own)
        with pytest.raises(hn.TaskError, match="early_checked"):
            within(60, run)
        data[:] = 1.0
        for _ in range(2):
            within(60, run)
        notes = rt.trace().metadata["auto_capture"]
        assert notes[-1].get("early") and notes[-1]["action"] == "replayed"
        np.testing.assert_array_equal(rt.fetch(h), _stencil_reference(np.ones(2 * PARTS), 2))


def _slow(x, y, a):
    time.sleep(2e-4)  # behind the submission: the replay is left half done at wait()
    y += a * x


SLOW = hn.Codelet("early_slow", modes=(R, RW), variants={"ref": _slow})


def test_an_early_replay_behind_at_wait_finishes_on_every_worker_with_the_bits():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(2 * PARTS))
        parts = h.split(0, PARTS)
        for _ in range(STEADY + 1):
            for j in range(TASKS):
                rt.submit(SLOW, parts[(j + 1) % PARTS], parts[j % PARTS], a=0.5)
            within(60, rt.wait)
        np.testing.assert_array_equal(rt.fetch(h), _stencil_reference(np.ones(2 * PARTS),
                                                                      STEADY + 1))
        trace = rt.trace()
        assert [n.get("early", False) for n in trace.metadata["auto_capture"]] == [
            False, False, False, True, True]
        assert Counter(r.task_id for r in trace.records).most_common(1)[0][1] == 1
        assert len(trace.records) == (STEADY + 1) * TASKS


def _stencil_reference(data, runs):
    parts = np.split(data, PARTS)
    for _ in range(runs):
        for j in range(TASKS):
            i = j % PARTS
            parts[i] += 0.5 * parts[(i + 1) % PARTS]
    return data


def _random_programs(program):
    roots, splits, ops = program
    expected, state = [], roots
    for _ in range(STEADY + 2):  # the last two replayed early where the graph allows it
        state = run_reference(state, splits, ops)[0]
        expected.append(state)
    saved = autocapture.EARLY_AT, autocapture.EARLY_MIN
    autocapture.EARLY_AT, autocapture.EARLY_MIN = 1, 1
    try:
        with hn.Runtime(devices="cpu:2", perfmodel=False, seed=2) as rt:
            _check(rt, "cpu:2 early", roots, splits, ops, expected, False)
    finally:
        autocapture.EARLY_AT, autocapture.EARLY_MIN = saved


@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_random_programs_replayed_early_have_the_submitted_bits(program):
    """test_autocapture's property, every shape replayed early from its first task."""
    _random_programs(program)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_more_random_programs_replayed_early_have_the_submitted_bits(program):
    _random_programs(program)
