"""Cheap first replays (issue 34, Build item 3): a graph the engine will replay is compiled
at the capture's end, so its first replay binds and plans nothing; the re-plan on measured
times keeps the compiled segment where the plan is unchanged; binding's per-type caches
type a call as Numba does; a new segment starts in the runtime's last contention mode."""

from __future__ import annotations

import collections

import numpy as np
from numba import typeof

import hetero_nn as hn
from hetero_nn.scheduler.engine.contention import Contention
from hetero_nn.scheduler.engine.replay import FloatParam, IntParam
from hetero_nn.scheduler.engine.trampoline import _type_key
from hetero_nn.scheduler.perfmodel.model import PerfModel
from helpers import within
from test_replay_engine import SCALE

Pair = collections.namedtuple("Pair", "a b")


def _chain(rt, data, steps):
    h = rt.register(data)
    with rt.capture() as graph:
        for _ in range(steps):
            rt.submit(SCALE, h, factor=2.0)
    return graph, h


def test_the_capture_compiles_the_graph_and_its_first_replays_bind_and_plan_nothing():
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False, variants=("cpu", "ref")) as rt:
            graph, h = _chain(rt, np.ones(3), 6)
            segs = list(graph._compiled.segments)  # compiled before any replay
            bound = [list(s.bound) for s in segs]
            assert all(b.calls is not None for s in segs for b in s.bound)
            for k in range(1, 4):
                graph.replay()
                np.testing.assert_array_equal(rt.fetch(h), np.full(3, 2.0 ** (6 * (k + 1))))
            # a chain plans the same on any costs: the re-plan kept what was compiled
            assert graph._compiled.replanned and graph._compiled.segments == segs
            assert [list(s.bound) for s in graph._compiled.segments] == bound
        with hn.Runtime(devices="cpu:2", perfmodel=False, replay_engine="executor") as rt:
            graph, h = _chain(rt, np.ones(3), 2)
            assert graph._compiled is None  # the executor replays it: nothing compiled
            graph.replay()
            np.testing.assert_array_equal(rt.fetch(h), np.full(3, 16.0))
    within(60, scenario)


def test_a_new_segment_starts_in_the_mode_the_runtime_last_chose():
    assert Contention("serial").next_mode() == "serial"

    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False, variants=("cpu", "ref")) as rt:
            first, _ = _chain(rt, np.ones(2), 4)
            (seg,) = first._compiled.segments
            assert seg.contention.mode == "parallel"
            seg.contention.mode, seg.contention.countdown = "serial", 10 ** 9
            first.replay()
            second, h = _chain(rt, np.ones(2), 4)
            assert second._compiled.segments[0].contention.mode == "serial"
            second.replay()
            np.testing.assert_array_equal(rt.fetch(h), np.full(2, 2.0 ** 8))
    within(60, scenario)


def test_the_binding_cache_key_separates_what_numba_types_apart():
    a = np.zeros((3, 4))
    values = [0, 1, -1, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 63 - 1, 2 ** 63,
              2 ** 64 - 1, -2 ** 63, True, np.bool_(False), np.int32(3), np.int64(3),
              np.uint8(3), np.float32(1.5), 1.5, np.float64(1.5), None, IntParam(7),
              FloatParam(0.5), (1, 2.0), (1, (2, None)), Pair(1, 2.0), Pair(1.0, 2),
              a, a.T, a[:, ::2], a[0], a.astype(np.float32), np.zeros(0)]
    readonly = a.copy()
    readonly.flags.writeable = False
    values.append(readonly)
    typed = {}
    for v in values:
        key = _type_key(v)
        assert key is not None, v
        t = typeof(v)
        assert typed.setdefault(key, t) == t, (v, key, typed[key], t)
    assert _type_key(object()) is None and _type_key((1, object())) is None


def test_a_step_parameter_is_rewritten_in_place_and_restarts_the_mode_comparison():
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False, variants=("cpu", "ref")) as rt:
            h = rt.register(np.ones(3))
            with rt.capture() as graph:
                for _ in range(3):
                    rt.submit(SCALE, h, factor=graph.param("f", 2.0) if _ == 0 else 2.0)
            graph.replay()
            (seg,) = graph._compiled.segments
            shares, blocks = seg.shares, seg.shares[0].blocks.copy()
            seg.contention.walls["parallel"].append(1.0)
            graph.replay(f=3.0)  # the same kernel and types: the same blocks, new values
            assert seg.shares is shares and (seg.shares[0].blocks == blocks).all()
            assert seg.contention.walls["parallel"] != [1.0]  # measured again from here
            np.testing.assert_array_equal(rt.fetch(h), np.full(3, 8.0 * 8.0 * 12.0))  # capture, replay, f=3
    within(60, scenario)


def test_a_graph_captured_without_a_model_feeds_the_model_it_replays_under(tmp_path):
    """Compiled at a capture inside ``Runtime.measuring(None)`` (as the pipeline's
    calibration captures), its bound tasks get their model keys back at the first
    replay under the runtime's model, which then learns from every replay."""
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=PerfModel(tmp_path),
                        variants=("cpu", "ref")) as rt:
            with rt.measuring(None):
                graph, h = _chain(rt, np.ones(3), 4)
            (seg,) = graph._compiled.segments
            assert not seg.groups  # nothing to learn into at the capture
            for _ in range(3):  # the first run of a key in the process is a warm-up
                graph.replay()
            assert seg.groups
            fp = rt.footprint(seg.bound[0].task)[0]
            assert rt.perfmodel.count(SCALE.name, seg.bound[0].variant, "cpu", fp) >= 4
    within(60, scenario)
