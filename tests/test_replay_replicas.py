"""What a replay binds: never a stale replica (a segment whose bound replica was evicted
since binds again, a graph on a handle unregistered since is refused), and a re-plan
moves a bound task to another worker without binding it again where nothing it holds
is its old worker's."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import hetero_nn as hn
from helpers import within


def _scale(x, factor):
    x *= factor


@njit(nogil=True)
def _scale_cpu(x, factor):
    for i in range(x.shape[0]):
        x[i] *= factor


SCALE_EMU = hn.Codelet("replicas_scale_emu", modes=(hn.RW,), variants={"cuda": _scale})
SCALE = hn.Codelet("replicas_scale", modes=(hn.RW,),
                   variants={"ref": _scale, "cpu": _scale_cpu})


def _evicted_between_replays():
    with hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        a = rt.register(np.ones(8), name="a")
        with rt.capture() as graph:  # the capture runs it: 2
            rt.submit(SCALE_EMU, a, factor=2.0)
        graph.replay()  # 4, left valid on the device only
        rt.wait()
        device = rt.nodes[1]
        assert a.valid == {device.index}
        assert device.evict(a)  # written back to the host, the device buffer dropped
        graph.replay()  # 8: on a new device buffer, the one the handle holds
        np.testing.assert_array_equal(rt.fetch(a), np.full(8, 8.0))
        (seg,) = graph._compiled.segments
        assert seg.bound[0].arrays[0] is a._replicas[device.index]
        assert not seg.moved()


def test_a_replay_after_its_replica_was_evicted_binds_the_new_one():
    """Before: the replay wrote the dropped buffer, the handle's new one was marked
    valid, and ``fetch`` returned 4 instead of 8."""
    within(120, _evicted_between_replays)


@pytest.mark.parametrize("engine", ["compiled", "executor"])
def test_a_graph_on_a_handle_unregistered_since_is_refused(engine):
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False, replay_engine=engine) as rt:
            array = np.ones(8)
            a = rt.register(array, name="weights")
            with rt.capture() as graph:
                for part in a.split(0, 2):
                    rt.submit(SCALE, part, factor=2.0)
            graph.replay()
            host = rt.unregister(a)
            np.testing.assert_array_equal(host, np.full(8, 4.0))
            with pytest.raises(hn.SubmitError, match="'weights' was unregistered after the "
                                                     "capture"):
                graph.replay()
            np.testing.assert_array_equal(array, np.full(8, 4.0))  # not written
            b = rt.register(array, name="again")  # the runtime goes on
            with rt.capture() as again:
                rt.submit(SCALE, b, factor=2.0)
            again.replay()
            np.testing.assert_array_equal(rt.fetch(b), np.full(8, 16.0))
    within(120, scenario)


def _moves():
    from test_replay_engine import COMPILED
    from hetero_nn.scheduler.engine.bound import moved_to
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        x = rt.register(np.arange(8.0), name="x")
        y = rt.register(np.ones(8), name="y")
        with rt.capture() as graph:
            for px, py in zip(x.split(0, 2), y.split(0, 2)):
                rt.submit(SCALE, px, factor=2.0)
                rt.submit(COMPILED["prop_axpy_scratch"], px, py, py, a=0.5)
        graph.replay()
        (seg,) = graph._compiled.segments
        for b in seg.bound:
            other = rt.workers[1 - b.worker.index]
            moved = moved_to(b, other, seg.buffers[other.index])
            assert moved_to(b, b.worker, None) is b
            if b.task.codelet is SCALE:  # nothing of its worker's: the same calls, moved
                assert not b.private and moved.worker is other and moved.calls is b.calls
                assert moved.buffers is seg.buffers[other.index] and b.worker is not other
            else:  # its SCRATCH operand is its worker's buffer: bound again
                assert b.private and moved is None


def test_a_replan_moves_a_bound_task_to_another_worker_without_binding_it_again():
    """The second replay plans on measured times; a task that changes worker kept its
    calls unless they hold its old worker's buffers (binding again cost 0.3 ms a task)."""
    within(120, _moves)
