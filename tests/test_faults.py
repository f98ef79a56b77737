"""Never hang, never race: faults outside a codelet's body fail the flush, not the runtime.

Each fault is injected through real code a user could write: a policy subclass
whose hook raises, a :class:`~hetero_nn.scheduler.perfmodel.PerfModel` subclass
whose update raises (on a CPU worker, and inside a CUDA stream's completion
callback on an emulated device). Each must give ``wait()`` a ``TaskError`` naming
the place, leave every worker thread alive, and let the next flush run and give
the right result. Every test runs under a time bound, so a hang fails it instead
of the suite.
"""

from __future__ import annotations

import re
import sys
import threading

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import RW, W
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.scheduler.variants import FEED_EVERY
from hetero_nn.scheduler.policies.policies import POLICIES, Dmda, Eager, Heft, WorkStealing
from helpers import within

BOUND = 60.0  # seconds: a test that takes longer hung


def _add_one(x):
    x += 1


def _fill(x, value):
    x[...] = value


ADD = hn.Codelet("fault_add", modes=(RW,), variants={"ref": _add_one, "cuda": _add_one})
FILL = hn.Codelet("fault_fill", modes=(W,), variants={"ref": _fill, "cuda": _fill})


class Boom(RuntimeError):
    """The injected fault."""


def _faulty(base, hook, after=3):
    """A subclass of policy ``base`` whose ``hook`` raises on its ``after``-th call
    (counted over the runtime's life, so the next flush runs a sound policy)."""
    calls = {"n": 0}

    def hooked(self, *args):
        calls["n"] += 1
        if calls["n"] == after:
            raise Boom(f"{hook} failed on purpose")
        return getattr(base, hook)(self, *args)

    return type(f"Faulty{base.__name__}", (base,), {"name": "faulty", hook: hooked})


def _check_next_flush(rt):
    """The runtime is usable: a chain and independent tasks give the right numbers."""
    x = rt.register(np.zeros(3))
    for _ in range(5):
        rt.submit(ADD, x)
    parts = rt.register(np.zeros(8)).split(0, 4)
    for i, p in enumerate(parts):
        rt.submit(FILL, p, value=float(i))
    rt.wait()
    assert rt.fetch(x).tolist() == [5.0, 5.0, 5.0]
    assert rt.fetch(parts[0].parent).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(w.thread.is_alive() for w in rt.workers)


def _program(rt, n=12):
    """A chain on one handle and independent tasks on the parts of another."""
    x = rt.register(np.zeros(1))
    for _ in range(n):
        rt.submit(ADD, x)
    for p in rt.register(np.zeros(n)).split(0, n):
        rt.submit(FILL, p, value=1.0)


@pytest.mark.parametrize("base, hook, where", [
    (Eager, "push", "policy 'faulty' push()"),
    (Eager, "pop", "policy 'faulty' pop()"),
    (WorkStealing, "push", "policy 'faulty' push()"),
    (WorkStealing, "pop", "policy 'faulty' pop()"),
    (Dmda, "finished", "policy 'faulty' finished()"),
    (Dmda, "push", "policy 'faulty' push()"),
    (Heft, "prepare", "policy 'faulty' prepare()"),
    (Heft, "push", "policy 'faulty' push()"),
])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_policy_hook_that_raises_fails_the_flush_and_the_next_one_runs(
        monkeypatch, base, hook, where, overlap):
    monkeypatch.setitem(POLICIES, "faulty", _faulty(base, hook, after=1 if hook == "prepare" else 3))

    def scenario():
        with hn.Runtime(devices="cpu:2", policy="faulty", perfmodel=False,
                        overlap=overlap) as rt:
            _program(rt)
            with pytest.raises(hn.TaskError,
                               match=rf"{re.escape(where)}.*Boom: {hook} failed on purpose"):
                rt.wait()
            _check_next_flush(rt)

    within(BOUND, scenario)


def test_a_push_that_raises_while_releasing_successors_names_the_releasing_task(monkeypatch):
    """The third push is the release of the second task of a chain by the first."""
    monkeypatch.setitem(POLICIES, "faulty", _faulty(Eager, "push", after=2))

    def scenario():
        with hn.Runtime(devices="cpu:1", policy="faulty", perfmodel=False,
                        overlap=False) as rt:
            x = rt.register(np.zeros(1))
            first = rt.submit(ADD, x)
            rt.submit(ADD, x)
            with pytest.raises(hn.TaskError, match=rf"released by task {first.id}"):
                rt.wait()
            _check_next_flush(rt)

    within(BOUND, scenario)


class FaultyModel(PerfModel):
    """A performance model whose updates raise once ``armed``."""

    armed = False

    def record_many(self, runs):
        if self.armed:
            raise Boom("the model's update failed on purpose")
        super().record_many(runs)


@pytest.mark.parametrize("devices", ["cpu:2", "cpu:1,cuda-emu:1"])
def test_a_performance_model_update_that_raises_is_not_the_codelets_failure(tmp_path, devices):
    """On a CPU worker the update runs after the task; on an emulated CUDA worker inside
    the stream's completion callback: either way the flush fails naming the update,
    no task is reported as failed, and the next flush runs."""

    def scenario():
        pm = FaultyModel(tmp_path, load=False)
        with hn.Runtime(devices=devices, perfmodel=pm) as rt:
            pm.armed = True
            x = rt.register(np.zeros(1))
            for _ in range(FEED_EVERY + 8):  # more than a worker buffers before it feeds
                rt.submit(ADD, x)
            with pytest.raises(hn.TaskError, match="performance model") as caught:
                rt.wait()
            assert "failed on purpose" in str(caught.value)
            assert caught.value.codelet is None  # not the codelet's failure
            assert not [r for r in rt.trace().records if r.error not in (None, "cancelled")]
            pm.armed = False
            _check_next_flush(rt)

    within(BOUND, scenario)


def test_the_completion_callback_of_a_stream_cannot_strand_its_worker(tmp_path):
    """A fault inside the completion callback (here the model's update, run on the
    emulated stream's thread) still hands the task back: wait() returns."""

    def scenario():
        pm = FaultyModel(tmp_path, load=False)
        with hn.Runtime(devices="cuda-emu:1", perfmodel=pm) as rt:
            pm.armed = True
            x = rt.register(np.zeros(1))
            for _ in range(FEED_EVERY + 8):  # the model's update runs in the callback
                rt.submit(ADD, x)
            with pytest.raises(hn.TaskError, match="completion callback of task"):
                rt.wait()
            pm.armed = False
            _check_next_flush(rt)

    within(BOUND, scenario)


def test_measurements_from_several_workers_are_all_kept(tmp_path):
    """Two workers record 400 runs of one footprint: the model counts 399 (the first
    is the warm-up), whatever the interleaving of their feeds."""

    def scenario():
        pm = PerfModel(tmp_path, load=False)
        with hn.Runtime(devices="cpu:2", perfmodel=pm) as rt:
            for p in rt.register(np.zeros(400)).split(0, 400):
                rt.submit(FILL, p, value=2.0)
            rt.wait()
        fp = "1:<f8"
        return pm.count("fault_fill", "ref", "cpu", fp)

    assert within(BOUND, scenario) == 399


def test_two_workers_binding_children_of_one_unallocated_root_share_one_buffer():
    """``Handle.replica`` allocates under the root's lock: children reached from two
    threads at once are views of one root buffer (switches forced every microsecond)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
            node = rt.nodes[0]
            for _ in range(200):
                root = rt.empty((64,), "float64")
                a, b = root.split(0, 2)
                barrier = threading.Barrier(2)
                got = {}

                def bind(h):
                    barrier.wait(5)
                    got[h.name] = h.replica(node)

                threads = [threading.Thread(target=bind, args=(h,)) for h in (a, b)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(5)
                whole = root.replica(node)
                assert np.shares_memory(got[a.name], whole) and np.shares_memory(got[b.name], whole)
            # and through tasks: every part written lands in the one root buffer
            for _ in range(20):
                root = rt.empty((40,), "float64")
                for i, p in enumerate(root.split(0, 4)):
                    rt.submit(FILL, p, value=float(i + 1))
                assert rt.fetch(root).tolist() == [float(1 + i // 10) for i in range(40)]
    finally:
        sys.setswitchinterval(old)


def _held(x, go):
    assert go.wait(BOUND)
    x += 1


HELD = hn.Codelet("fault_held", modes=(RW,), variants={"ref": _held})


def test_waiting_on_a_task_an_aborted_flush_dropped_raises_instead_of_hanging(monkeypatch):
    """One worker runs a held task while three more wait in the ready queue; the pop
    after it raises: the flush is aborted, and task.wait() on a queued task raises its
    cancellation."""
    class PopFailsWithThreeQueued(Eager):
        name = "faulty"
        failed = False

        def pop(self, worker):
            if len(self.queue) >= 3 and not self.failed:  # once
                self.failed = True
                raise Boom("pop failed on purpose")
            return super().pop(worker)

    monkeypatch.setitem(POLICIES, "faulty", PopFailsWithThreeQueued)

    def scenario():
        go = threading.Event()
        with hn.Runtime(devices="cpu:1", policy="faulty", perfmodel=False) as rt:
            rt.submit(HELD, rt.register(np.zeros(1)), go=go)
            queued = [rt.submit(ADD, rt.register(np.zeros(1))) for _ in range(3)]
            go.set()
            with pytest.raises(hn.TaskError, match="cancelled"):
                queued[-1].wait(timeout=BOUND)
            assert all(t.done() for t in queued)
            with pytest.raises(hn.TaskError, match="pop"):
                rt.wait()
            _check_next_flush(rt)

    within(BOUND, scenario)
