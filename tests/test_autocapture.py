"""Automatic capture: a repeated flush is captured, then replayed, with the bits of the
submitted program (random handle programs run several times on the same handles), and
says so in the trace; what has no shape runs as submitted; the runtime stops looking
after its miss budget."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import hetero_nn as hn
from hetero_nn import RW
from hetero_nn.scheduler import autocapture
from helpers import within
from test_runtime_property import CODELETS, handle_named, programs, run_reference

REPEATS = 4  # recorded, captured, replayed twice


def _scale(x, factor):
    x *= factor


SCALE = hn.Codelet("auto_scale", modes=(RW,), variants={"ref": _scale})
TUPLE = hn.Codelet("auto_tuple", modes=(RW,),
                   variants={"ref": lambda x, pair: _scale(x, pair[0] * pair[1])})


CONFIGS = (("cpu:2 eager", {}), ("cpu:3 ws", {"policy": "ws", "devices": "cpu:3"}),
           ("cpu:2 heft", {"policy": "heft"}),
           ("cpu:2 host_nodes=2 dmda", {"policy": "dmda", "host_nodes": 2}),
           ("cpu:2 executor replays", {"replay_engine": "executor"}))


def _run(rt, handles, splits, ops):
    for op in ops:
        if op[0] in ("wait", "fetch"):
            rt.wait()
        else:
            _, name, operands, params = op
            rt.submit(CODELETS[name], *[handle_named(handles, splits, h) for h in operands],
                      **params)
    rt.wait()


def _flushes(ops) -> int:
    """The program's flushes that submit a task: where they are no more than ALIKE, no
    shape is evicted and no miss budget spent before they repeat, so a run after the first
    captures or replays. (With more, the runtime may rightly stop looking: nine shapes
    cycled through its eight, each evicted before it comes again.)"""
    flushes, open_ = 0, False
    for op in ops + [("wait",)]:
        if op[0] in ("wait", "fetch"):
            flushes, open_ = flushes + open_, False
        else:
            open_ = True
    return flushes


def _repeated(program, configs):
    roots, splits, ops = program
    expected, state = [], roots
    for _ in range(REPEATS):  # each run starts from the last one's roots
        state = run_reference(state, splits, ops)[0]
        expected.append(state)
    submits = 0 < _flushes(ops) <= autocapture.ALIKE
    for label, kwargs in configs:  # a runtime per example: no miss budget spent before
        with hn.Runtime(**{"devices": "cpu:2", "perfmodel": False, "seed": 2, **kwargs}) as rt:
            _check(rt, label, roots, splits, ops, expected, submits)


@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_repeated_random_programs_replay_automatically_with_the_submitted_bits(program):
    _repeated(program, CONFIGS[:1] + CONFIGS[-1:])  # the engine, and the executor's replays


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_repeated_random_programs_replay_automatically_under_every_configuration(program):
    _repeated(program, CONFIGS)


def _check(rt, label, roots, splits, ops, expected, submits):
    handles = [rt.register(a.copy(), name=f"root{i}") for i, a in enumerate(roots)]
    for k, want in enumerate(expected):
        within(60, _run, rt, handles, splits, ops)
        for i, (h, e) in enumerate(zip(handles, want)):
            np.testing.assert_array_equal(rt.fetch(h), e, err_msg=f"{label} run {k} root {i}")
    actions = [n["action"] for n in rt.trace().metadata.get("auto_capture", [])]
    if submits:
        assert "captured" in actions and "replayed" in actions, (label, actions, ops)


def test_step_parameters_by_name_and_what_has_no_shape():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        data = np.ones(4)
        h = rt.register(data)
        factors = [2.0, 3.0, 0.5, 4.0, 4.0]
        for f in factors:  # the factor a step parameter: one shape
            for part in h.split(0, 2):
                rt.submit(SCALE, part, factor=rt.param("factor", f))
            rt.wait()
        assert rt.fetch(h).tolist() == [np.prod(factors)] * 4
        notes = rt.trace(clear=True).metadata.get("auto_capture", [])
        assert [n["action"] for n in notes] == ["captured", "replayed", "replayed", "replayed"]
        plain = (2.0, 0.5, 3.0)
        for f in plain:  # a plain parameter that changes: no replay
            rt.submit(SCALE, h, factor=f)
            rt.wait()
        for _ in range(3):  # an array parameter: no shape
            rt.submit(SCALE, h, factor=np.full(4, 2.0))
            rt.wait()
        assert "auto_capture" not in rt.trace().metadata
        signs = (-0.0, 0.0, -0.0)  # equal floats, the other sign of zero: not the same shape
        for f in signs:
            rt.submit(SCALE, h, factor=f)
            rt.wait()
        notes = rt.trace().metadata["auto_capture"]
        assert [n["action"] for n in notes] == ["captured"]  # the third: -0.0 again
        want = np.float64(np.prod(factors) * np.prod(plain) * 2.0 ** 3)
        for f in signs:
            want *= f
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, want))
        rt.trace(clear=True)
        for f in ((1, 2), (1.0, 2), (1, 2.0)):  # equal tuples of other element types
            rt.submit(TUPLE, h, pair=f)
            rt.wait()
        for name in ("a", "b", "c"):  # the same value under other step names
            rt.submit(SCALE, h, factor=rt.param(name, 1.0))
            rt.wait()
        assert "auto_capture" not in rt.trace().metadata
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, want))


def test_a_flush_that_differs_half_way_runs_as_submitted_and_tasks_stay_usable():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        a, b = h.split(0, 2)
        for _ in range(2):
            rt.submit(SCALE, a, factor=2.0)
            rt.submit(SCALE, b, factor=2.0)
            rt.wait()
        first = rt.submit(SCALE, a, factor=2.0)  # kept: the shape's start
        assert rt._auto.state == autocapture.DEFER and not first.ended
        rt.submit(SCALE, b, factor=5.0)  # differs: the kept task is submitted
        first.wait()
        assert first.done() and first.exception() is None
        rt.wait()
        assert rt.fetch(h).tolist() == [8.0, 8.0, 20.0, 20.0]
        assert rt.trace().metadata.get("auto_capture", [])[-1]["action"] == "captured"


def test_the_runtime_stops_looking_after_its_miss_budget_and_can_be_off():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        for k in range(autocapture.MISS_BUDGET):
            rt.submit(SCALE, rt.register(np.ones(2)), factor=2.0)  # a new handle each flush
            rt.wait()
        assert not rt._auto.on and not rt._auto.shapes
    with hn.Runtime(devices="cpu:1", perfmodel=False, auto_capture=False) as rt:
        h = rt.register(np.ones(2))
        for _ in range(3):
            rt.submit(SCALE, h, factor=2.0)
            rt.wait()
        assert "auto_capture" not in rt.trace().metadata
        assert rt.fetch(h).tolist() == [8.0, 8.0]


def _grow(x, limit):
    if x[0] >= limit:
        raise ValueError(f"{x[0]} reached {limit}")
    x += 1.0


GROW = hn.Codelet("auto_grow", modes=(RW,), variants={"ref": _grow})


def test_a_replay_that_fails_names_the_task_and_leaves_the_runtime_usable():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.zeros(2))
        for k in range(3):  # seen, captured, replayed
            rt.submit(GROW, h, limit=3.0)
            rt.wait()
        task = rt.submit(GROW, h, limit=3.0)  # replayed: 3.0 reached
        with pytest.raises(hn.TaskError, match="auto_grow"):
            within(60, rt.wait)
        assert task.done() and isinstance(task.exception(), hn.TaskError)
        rt.submit(GROW, h, limit=10.0)  # another shape, submitted
        rt.wait()
        assert rt.fetch(h).tolist() == [4.0, 4.0]


def test_a_kept_flush_meets_combining_with_as_submitted():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        x, acc = rt.register(np.ones(4)), rt.register(np.zeros(4))
        for _ in range(3):  # seen, captured, replayed
            rt.submit(CODELETS["prop_acc_sq"], x, acc)
            rt.wait()
        seen = []
        rt.submit(CODELETS["prop_acc_sq"], x, acc)  # kept, then submitted: the tree is across's
        with rt.combining_with(lambda h, parts: seen.append(len(parts))):
            rt.wait()
        assert seen == [1] and rt.fetch(acc).tolist() == [3.0] * 4  # the partial taken
        assert [n["action"] for n in rt.trace().metadata["auto_capture"]] == [
            "captured", "replayed"]


def test_polling_a_kept_task_runs_its_flush_as_submitted():
    """``done()`` is a program's progress check: a kept task must end without a wait()."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        for _ in range(2):
            rt.submit(SCALE, h, factor=2.0)
            rt.wait()
        task = rt.submit(SCALE, h, factor=2.0)  # kept: a known shape
        assert not task.ended
        deadline = time.monotonic() + 30
        while not task.done():
            assert time.monotonic() < deadline, "a polled kept task never ended"
            time.sleep(0.001)
        rt.wait()
        assert rt.fetch(h).tolist() == [8.0] * 4


def test_a_flush_that_ends_early_replays_the_shape_it_is_the_whole_of():
    """A flush whose shape is a prefix of the one it was compared with (predicted as the
    last flush's next) is that shorter shape's occurrence, not a new shape."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(6))
        parts = h.split(0, 3)
        want = np.ones(6)
        for flush in "BABBB":  # B is A's first two tasks; after A, A is the one predicted
            for i, part in enumerate(parts[:3 if flush == "A" else 2]):
                rt.submit(SCALE, part, factor=2.0)
                want[2 * i:2 * i + 2] *= 2.0
            rt.wait()
        np.testing.assert_array_equal(rt.fetch(h), want)
        notes = rt.trace().metadata["auto_capture"]
        assert [(n["action"], n["tasks"]) for n in notes] == [
            ("captured", 2), ("replayed", 2), ("replayed", 2)]


def test_step_parameter_objects_passed_again_replay_with_their_own_values():
    """A submission whose parameters are the shape's very objects is matched by identity
    and brings no step value: the graph must hold that object's value, including after a
    capture whose values differ from the first occurrence's, and a flush mixing such an
    object with another value of the same name is not replayed with one of them."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        a, b = h.split(0, 2)
        two, three = rt.param("factor", 2.0), rt.param("factor", 3.0)
        assert rt.param("factor", 3.0) is three and rt.param("factor", 3) is not three
        want = np.ones(4)
        for f in (two, three, two, two, three, two):  # seen, captured at 3.0, replays
            for part in (a, b):
                rt.submit(SCALE, part, factor=f)
            rt.wait()
            want *= float(f)
        np.testing.assert_array_equal(rt.fetch(h), want)
        assert [n["action"] for n in rt.trace(clear=True).metadata["auto_capture"]] == [
            "captured"] + ["replayed"] * 4
        rt.submit(SCALE, a, factor=two)  # the shape's object, then another value by that name
        rt.submit(SCALE, b, factor=rt.param("factor", 5.0))
        rt.wait()
        want *= [2.0, 2.0, 5.0, 5.0]
        np.testing.assert_array_equal(rt.fetch(h), want)
        assert "auto_capture" not in rt.trace().metadata


ADD = hn.Codelet("auto_add", modes=(RW,), variants={"ref": lambda x, v: x.__iadd__(v)})


@pytest.mark.parametrize("option", ("priority", "callback"))
def test_a_task_given_options_leaves_its_flush_without_shape_in_program_order(option):
    """A task with ``priority``/``callback``... is never kept: the tasks kept before it in
    its flush are submitted first (it ran before them, and the flush was replayed without
    it, until this was fixed)."""
    kwargs = {"priority": 1} if option == "priority" else {"callback": lambda task: None}
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(2))
        for _ in range(4):
            rt.submit(SCALE, h, factor=2.0)
            rt.submit(ADD, h, v=1.0, **kwargs)
            rt.submit(SCALE, h, factor=3.0)
            rt.wait()
        want = 1.0
        for _ in range(4):
            want = (want * 2.0 + 1.0) * 3.0
        assert rt.fetch(h).tolist() == [want] * 2
        assert "auto_capture" not in rt.trace().metadata
