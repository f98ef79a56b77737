"""Replays that suit the machine: a segment replays on one thread while that is measured
faster than its workers' threads, with the same bits, and tries the other mode again."""

from __future__ import annotations

import sys
import threading

import numpy as np
from hypothesis import HealthCheck, given, settings

import hetero_nn as hn
from hetero_nn.scheduler.engine.contention import (FIRST_PROBE, REPLAY_SWITCH_INTERVAL, WIN,
                                                   Contention, QuickHandoffs, serial_order)
from hetero_nn.scheduler.engine.dispatch import SLEPT, SPUN, WAITS, YIELDED
from helpers import within
from test_replay_engine import CODELETS, _captured
from test_runtime_property import programs, run_reference


def test_the_faster_mode_is_kept_and_the_other_tried_again_with_a_doubling_period():
    c = Contention()
    assert c.next_mode() == "parallel"
    for _ in range(FIRST_PROBE):  # parallel beats one thread's time: no early try
        c.observe("parallel", 0.015, 0.018)
    assert c.next_mode() == "serial"  # due
    c.observe("serial", 0.018, 0.018)  # loses
    assert c.mode == "parallel" and c.probe == 2 * FIRST_PROBE
    for _ in range(2 * FIRST_PROBE):
        assert c.next_mode() == "parallel"
        c.observe("parallel", 0.200, 0.018)  # a neighbour came
    c.observe("serial", 0.020, 0.018)  # wins
    assert c.mode == "serial" and c.probe == FIRST_PROBE
    fresh = Contention()
    fresh.observe("parallel", 0.050, 0.018)  # slower than one thread would be: once is chance
    assert fresh.next_mode() == "parallel"
    fresh.observe("parallel", 0.050, 0.018)  # twice
    assert fresh.next_mode() == "serial"  # tried at once


def test_a_win_the_next_replay_does_not_confirm_is_undone_with_a_doubled_period():
    c = Contention("serial")
    for _ in range(FIRST_PROBE):
        c.observe("serial", 0.0048, 0.005)
    assert c.next_mode() == "parallel"
    c.observe("parallel", 0.0034, 0.005)  # a lucky try: the neighbour left it both cores
    assert c.mode == "parallel"
    c.observe("parallel", 0.0082, 0.005)  # the next one is not under serial's 4.8 ms
    assert c.mode == "serial" and c.probe == c.countdown == 2 * FIRST_PROBE
    for _ in range(2 * FIRST_PROBE):
        assert c.next_mode() == "serial"
        c.observe("serial", 0.0048, 0.005)
    c.observe("parallel", 0.0030, 0.005)  # the neighbour went: a win ...
    c.observe("parallel", 0.0031, 0.005)  # ... confirmed
    assert c.mode == "parallel" and c.probe == FIRST_PROBE and c.beaten is None


def test_a_try_is_judged_against_the_recent_median_not_a_lucky_replay():
    c = Contention()  # beside a busy loop: parallel mostly 10 ms, once 3 ms (both cores)
    for wall in (0.010, 0.003, 0.010, 0.011):
        c.observe("parallel", wall, 0.018)  # inflated task times: "one thread cannot win"
    assert c.next_mode() == "parallel"  # no serial wall measured: the sum is believed
    c.mode, c.countdown = "parallel", 0
    assert c.next_mode() == "serial"
    c.observe("serial", 0.0047, 0.0047)  # against the median 10 ms (the best, 3 ms, would lose)
    assert c.mode == "serial" and c.beaten == 0.010
    c = Contention()
    c.walls["serial"] = [0.0047]
    for _ in range(FIRST_PROBE):  # serial measured under these walls: tries stay due
        c.observe("parallel", 0.010, 0.018)
    assert c.next_mode() == "serial"


def test_a_plain_parallel_win_makes_no_serial_try_and_new_costs_try_the_other_mode_soon():
    c = Contention()
    for _ in range(10 * FIRST_PROBE):  # half the tasks' summed time: one thread cannot win
        c.observe("parallel", 0.009, 0.018)
        assert c.next_mode() == "parallel"
    c = Contention("serial")  # (the runtime's last verdict)
    c.observe("serial", 0.020, 0.018)
    c.restart()  # the tasks changed size: two replays in the mode kept, then the other
    for _ in range(2):
        assert c.next_mode() == "serial"
        c.observe("serial", 0.100, 0.100)
    assert c.next_mode() == "parallel"
    c.observe("parallel", 0.051, 0.100)
    assert c.mode == "parallel"


def _force_serial(graph):
    for seg in graph._compiled.segments:
        if seg.contention is not None:
            seg.contention.mode, seg.contention.countdown = "serial", 10 ** 9


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_serial_replays_give_the_bits_of_parallel_ones(program):
    roots, splits, ops = program
    rng = np.random.default_rng(len(ops))
    inputs = [[rng.standard_normal(a.shape) for a in roots] for _ in range(4)]

    def scenario():
        with hn.Runtime(devices="cpu:3", perfmodel=False, variants=("cpu", "ref")) as rt:
            graph, handles = _captured(rt, roots, splits, ops, CODELETS)
            for k, new in enumerate(inputs):
                if k == 2:  # compiled twice by now (placed, then re-planned): kept
                    _force_serial(graph)
                for h, a in zip(handles, new):
                    graph.write(h, a)
                rt.trace(clear=True)
                graph.replay()
                want = run_reference(new, splits, ops)[0]
                for i, (h, e) in enumerate(zip(handles, want)):
                    np.testing.assert_array_equal(rt.fetch(h), e, err_msg=f"root {i}")
                if k >= 2:
                    for seg in graph._compiled.segments:
                        if seg.contention is not None:
                            order = serial_order(seg)
                            assert sorted(order) == list(range(len(seg.runs)))
                    assert {r.worker for r in rt.trace().records} <= {"cpu0"}
    within(120, scenario)


def _replay_probing_interval(study, seen):
    def probe(x):
        seen.append(sys.getswitchinterval())
    cl = hn.Codelet("probe_switch_interval", modes=(hn.RW,), variants={"ref": probe})
    with hn.Runtime(devices="cpu:2", perfmodel=False, study=study) as rt:
        h = rt.register(np.zeros(4))
        with rt.capture() as graph:
            for part in h.split(0, 2):
                rt.submit(cl, part)
        seen.clear()  # the capture run's: not a replay
        graph.replay()
        graph.replay()
        between = sys.getswitchinterval()
    return between


def test_replays_lower_the_switch_interval_until_close_then_restore_the_programs():
    """Beside a thread holding the interpreter lock, every lock handoff of a replay waited
    a full switch interval (5 ms): the engine lowers it while its threads exist."""
    saved = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        seen = []
        between = within(60, _replay_probing_interval, hn.StudyOptions(), seen)
        assert seen and max(seen) <= REPLAY_SWITCH_INTERVAL * 1.01
        assert between <= REPLAY_SWITCH_INTERVAL * 1.01  # kept between replays
        assert abs(sys.getswitchinterval() - 0.004) < 1e-6  # restored at close
        seen.clear()
        within(60, _replay_probing_interval, hn.StudyOptions(gil_handoff=False), seen)
        assert seen and all(abs(s - 0.004) < 1e-6 for s in seen)
        handoffs = QuickHandoffs()
        sys.setswitchinterval(0.002)  # the program's own choice meanwhile: kept
        handoffs.close()
        handoffs.close()
        assert abs(sys.getswitchinterval() - 0.002) < 1e-6
    finally:
        sys.setswitchinterval(saved)


def test_a_try_of_parallel_has_a_cutoff_only_against_a_measured_serial_wall():
    c = Contention("serial")
    assert c.cutoff() is None  # nothing measured to beat
    for _ in range(FIRST_PROBE):
        assert c.cutoff() is None  # serial replays: no try
        c.observe("serial", 0.010, 0.010)
    assert c.next_mode() == "parallel" and abs(c.cutoff() - WIN * 0.010) < 1e-12
    c.lost()  # cut there: lost, its wall not kept
    assert c.mode == "serial" and c.probe == c.countdown == 2 * FIRST_PROBE
    assert c.walls["parallel"] == [] and Contention().cutoff() is None


def _stencil(rt, steps):
    """A 2-wide stencil of Python tasks on ``cpu:2``: each cell reads both of the step
    before, so the calling thread's share waits on the other worker at every step."""
    cl = hn.Codelet("cut_stencil", modes=(hn.W, hn.R, hn.R), variants={
        "ref": lambda out, a, b: np.copyto(out, 0.5 * a + 0.25 * b + 1.0)})
    data = np.zeros((2 * (steps + 1), 3))  # cell (t, i) is row 2 t + i
    data[:2] = np.arange(6.0).reshape(2, 3)
    root = rt.register(data, name="cells")
    cells = [row.split(0, 2) for row in root.split(0, steps + 1)]
    with rt.capture() as graph:
        for t in range(1, steps + 1):
            for i in range(2):
                rt.submit(cl, cells[t][i], cells[t - 1][i], cells[t - 1][1 - i])
    want = data.copy().reshape(steps + 1, 2, 3)
    for t in range(1, steps + 1):
        for i in range(2):
            want[t, i] = 0.5 * want[t - 1, i] + 0.25 * want[t - 1, 1 - i] + 1.0
    return graph, root, want.reshape(data.shape)


def test_a_losing_try_of_parallel_is_cut_and_finished_on_one_thread_with_the_same_bits():
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
            graph, root, want = _stencil(rt, 24)
            graph.replay()
            graph.replay()  # placed, then re-planned: kept from here
            seg = graph._compiled.segments[0]
            c = seg.contention
            assert c is not None and len(seg.shares[0].waits) > 0
            stats = seg.wait_stats[0]
            assert stats[WAITS] == stats[SPUN] + stats[YIELDED] + stats[SLEPT]
            for _ in range(5):  # (cut by a wait of the calling thread's share: it waits
                #                  on the other worker at once, all but surely)
                c.mode, c.walls["serial"], c.countdown = "serial", [1e-6], 0  # 0.9 us to win
                c.probe, parallel = FIRST_PROBE, list(c.walls["parallel"])
                rt.trace(clear=True)
                graph.replay()
                np.testing.assert_array_equal(rt.fetch(root), want)
                assert len(rt.trace().records) == len(seg.tasks)  # every task ran once
                if c.cuts:
                    break
            assert c.cuts == 1 and c.walls["parallel"] == parallel  # lost, no wall kept
            assert c.mode == "serial" and c.probe == 2 * FIRST_PROBE
    within(60, scenario)


def test_a_cut_try_drops_the_shares_no_thread_has_started_and_does_not_wait_for_them():
    from hetero_nn.scheduler.engine.replay import EngineThreads

    def scenario():
        threads = EngineThreads(1, quick_handoffs=False, bind_threads=False)
        busy, ran = threading.Event(), []
        try:
            threads._queues[0].put(busy.wait)  # the thread is held: the next job waits
            results, finished = threads.start([None, lambda: ran.append(1)], 1)
            threads._cancel()
            assert threads.join(results, finished, 1) == [None, None]  # not waited for
            busy.set()
            started, _ = threads.start([None, lambda: ran.append(2) or "done"], 1)
            assert threads.join(started, _, 1)[1] == "done" and ran == [2]  # dropped, not run
        finally:
            busy.set()
            threads.close()
    within(30, scenario)
