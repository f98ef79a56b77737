"""The modes the runtime offers instead of having its attributes swapped from above
(hetero_nn/scheduler/flush.py, hetero_nn/scheduler/variants.py): recording without
running, measuring with another model, tracing apart; and the one end of a flush, which
a compiled replay's segment goes through too."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import RW
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.scheduler.engine.replay import unavailable
from hetero_nn.scheduler.flush import Flushes
from helpers import within


def _double(x):
    x *= 2.0


DOUBLE = hn.Codelet("modes_double", modes=(RW,), variants={"ref": _double})


class Sink:
    """Keeps each closed DAG it is handed (a recorder, as the simulator's)."""

    def __init__(self):
        self.flushes = []

    def run(self, tasks, planned=False):
        self.flushes.append([t.codelet.name for t in tasks])


def test_recording_keeps_the_dags_and_runs_nothing():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        executor = rt.executor
        h = rt.register(np.ones(4))
        rt.submit(DOUBLE, h)  # submitted before: run first, not recorded
        sink = Sink()
        with rt.recording(sink):
            assert unavailable(rt) is not None  # a replay goes to the sink too
            for _ in range(3):
                rt.submit(DOUBLE, h)
            rt.wait()
            rt.submit(DOUBLE, h)
        assert sink.flushes == [["modes_double"] * 3, ["modes_double"]]
        assert rt.executor is executor and rt.overlap and unavailable(rt) is None
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 2.0))  # only the first ran
        rt.submit(DOUBLE, h)
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 4.0))


def test_measuring_gives_the_block_another_model_and_puts_it_back(tmp_path):
    own = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:1", perfmodel=own) as rt:
        h = rt.register(np.ones(4))
        with pytest.raises(RuntimeError):
            with rt.measuring(None):
                assert rt.perfmodel is None
                for _ in range(3):
                    rt.submit(DOUBLE, h)
                rt.wait()
                raise RuntimeError("the block failed")
        assert rt.perfmodel is own
        fp, _ = rt.footprint(rt.submit(DOUBLE, h))
        rt.wait()
        assert own.count("modes_double", "ref", "cpu", fp) == 0  # the block's warmed up only
        other = PerfModel(load=False)
        with rt.measuring(other) as model:
            assert model is other
            for _ in range(3):
                rt.submit(DOUBLE, h)
            rt.wait()
        assert other.count("modes_double", "ref", "cpu", fp) == 3
        assert own.count("modes_double", "ref", "cpu", fp) == 0


@pytest.mark.parametrize("tracing", (True, False))
def test_tracing_apart_keeps_the_block_s_records_by_themselves(tracing):
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace=tracing) as rt:
        h = rt.register(np.ones(4))
        rt.submit(DOUBLE, h)
        rt.wait()
        before = len(rt.trace().records)
        with rt.tracing_apart() as buffer:
            assert rt.tracing
            for _ in range(2):
                rt.submit(DOUBLE, h)
                rt.wait()
            assert len(buffer.records()) == 2
        assert rt.tracing is tracing
        assert len(rt.trace().records) == before + (2 if tracing else 0)


def test_a_compiled_replay_ends_each_segment_at_the_flush_s_one_end(tmp_path, monkeypatch):
    ended = []
    end = Flushes.end

    def counted(self, tasks, *args, **kwargs):
        ended.append((len(tasks), kwargs.get("replayed") is not None,
                      kwargs.get("samples") is not None))
        return end(self, tasks, *args, **kwargs)

    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:2", perfmodel=pm, trace=True) as rt:
        h = rt.register(np.ones(4))
        with rt.capture() as graph:
            rt.submit(DOUBLE, h)
            rt.wait()
            rt.submit(DOUBLE, h)
        assert unavailable(rt) is None
        monkeypatch.setattr(Flushes, "end", counted)
        generation = rt.generation
        within(60, graph.replay)
        assert ended == [(0, True, True), (0, True, True)]  # no task: the engine ran them
        assert rt.generation == generation + 2
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 16.0))
        assert len(rt.trace().records) >= 2


def test_a_replay_while_recording_is_recorded_not_run():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        with rt.capture() as graph:
            rt.submit(DOUBLE, h)
        sink = Sink()
        with rt.recording(sink):
            graph.replay()
        assert sink.flushes == [["modes_double"]]
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 2.0))  # the capture's run only
        within(60, graph.replay)
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 4.0))
