"""Execution overlaps submission: tasks start while the program is still submitting.

With the local executor (``Runtime(overlap=True)``, the default) a task whose
predecessors have finished runs at once; ``wait()`` / ``fetch()`` stay the
synchronisation points. The tests that a task starts early are deterministic:
codelets set and wait on events (a timeout only bounds a failure), never a
sleep. Whole DAGs are still flushed at ``wait()`` for ``heft``, a capture, the
Dask executors and ``overlap=False``, whose results the streamed ones equal bit
for bit.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import hetero_nn as hn
from hetero_nn import RW, W
from hetero_nn.scheduler.policies.policies import POLICIES, Eager
from test_runtime_property import programs, run_runtime

TIMEOUT = 10.0  # seconds: bounds a failure, never reached when the runtime is right


def _signal(x, started, go, log, tag):
    """Say it started, wait for the test's go (if any), then add 1."""
    log.append(("start", tag))
    started.set()
    if go is not None and not go.wait(TIMEOUT):
        raise TimeoutError(f"{tag}: no go within {TIMEOUT} s")
    x += 1
    log.append(("end", tag))


def _fill(x, value):
    x[...] = value


def _boom(x, started):
    started.set()
    raise ValueError("boom: failed on purpose")


SIGNAL = hn.Codelet("overlap_signal", modes=(RW,), variants={"ref": _signal})
FILL = hn.Codelet("overlap_fill", modes=(W,), variants={"ref": _fill})
BOOM = hn.Codelet("overlap_boom", modes=(RW,), variants={"ref": _boom})


def _until(condition):
    """Poll ``condition`` until it holds (at most ``TIMEOUT``)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _signal_on(rt, h, tag, log, go=None):
    started = threading.Event()
    rt.submit(SIGNAL, h, started=started, go=go, log=log, tag=tag)
    return started


# ---------------------------------------------------------------- tasks start before wait()
@pytest.mark.parametrize("policy", ["eager", "random", "ws", "dmda"])
def test_a_task_runs_while_the_program_submits(policy):
    """A blocks until the test says go; meanwhile the test submits B (independent: it
    runs on the other worker, but under ``random``, which may queue it behind A) and C
    (after A: it waits), all before calling wait()."""
    log = []
    go = threading.Event()
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        assert rt.overlap
        a, b = rt.register(np.zeros(1)), rt.register(np.zeros(1))
        a_started = _signal_on(rt, a, "A", log, go)
        assert a_started.wait(TIMEOUT), "A did not start before wait()"
        b_started = _signal_on(rt, b, "B", log)
        if policy != "random":
            assert b_started.wait(TIMEOUT), "B did not start while A ran"
        _signal_on(rt, a, "C", log)
        assert ("start", "C") not in log  # C reads what A writes: A has not finished
        go.set()
        rt.wait()
        assert log.index(("end", "A")) < log.index(("start", "C"))
        assert rt.fetch(a)[0] == 2.0 and rt.fetch(b)[0] == 1.0
        records = {r.task_id: r for r in rt.trace().records}
        assert len(records) == 3


def test_no_task_starts_before_wait_without_overlap():
    log = []
    with hn.Runtime(devices="cpu:2", perfmodel=False, overlap=False) as rt:
        assert not rt.overlap
        started = _signal_on(rt, rt.register(np.zeros(1)), "A", log)
        assert not started.wait(0.2)  # nothing runs until the flush
        rt.wait()
        assert started.is_set()


def test_heft_capture_and_dask_flush_whole_graphs():
    """heft plans the whole step; a capture records whole flushes; Dask runs one graph
    per flush: none of them streams."""
    with hn.Runtime(devices="cpu:2", policy="heft", perfmodel=False) as rt:
        assert not rt.overlap and rt.executor.policy.whole_graph
        log = []
        started = _signal_on(rt, rt.register(np.zeros(1)), "A", log)
        assert not started.wait(0.2)
        tasks = [rt.submit(FILL, p, value=float(i))
                 for i, p in enumerate(rt.register(np.zeros(6)).split(0, 6))]
        rt.wait()
        assert started.is_set()
        assert all(t.worker is t.assigned for t in tasks)  # run where heft planned them
    with hn.Runtime(devices="cpu:2", policy="eager", perfmodel=False) as rt:
        assert rt.overlap and not rt.executor.policy.whole_graph
        x = rt.register(np.zeros(1))
        log = []
        with rt.capture() as graph:
            started = _signal_on(rt, x, "A", log)
            assert not started.wait(0.2)  # recorded, to run at the block's end
        assert started.is_set()
        graph.replay()
        assert rt.fetch(x)[0] == 2.0
    with hn.Runtime(devices="cpu:2", executor="dask", perfmodel=False) as rt:
        assert not rt.overlap


def test_runtimes_with_cuda_workers_flush_whole_graphs():
    """Emulated (or real) CUDA workers: the flush is handed over at ``wait()``."""
    with hn.Runtime(devices="cpu:1,cuda-emu:1", perfmodel=False) as rt:
        assert not rt.overlap
        log = []
        started = _signal_on(rt, rt.register(np.zeros(1)), "A", log)
        assert not started.wait(0.2)
        rt.wait()
        assert started.is_set()


class _Planning(Eager):
    """An eager policy that looks at the whole DAG first (a user's static policy)."""

    def prepare(self, tasks):
        self.sizes = getattr(self, "sizes", []) + [len(tasks)]


def test_a_policy_with_prepare_sees_whole_dags(monkeypatch):
    monkeypatch.setitem(POLICIES, "planning", _Planning)
    with hn.Runtime(devices="cpu:2", policy="planning", perfmodel=False) as rt:
        assert not rt.overlap
        for p in rt.register(np.zeros(4)).split(0, 4):
            rt.submit(FILL, p, value=1.0)
        rt.wait()
        assert rt.executor.policy.sizes == [4]


# ---------------------------------------------------------------- same bits as flushes
_CONFIGS = [(policy, nodes) for policy in ("eager", "random", "ws", "dmda") for nodes in (1, 2)]


@pytest.fixture(scope="module")
def pairs():
    made = []
    try:
        for policy, nodes in _CONFIGS:
            made.append(tuple(
                hn.Runtime(devices="cpu:2", policy=policy, host_nodes=nodes, seed=2,
                           deterministic=nodes == 1, overlap=overlap)
                for overlap in (True, False)))
        yield made
    finally:
        for pair in made:
            for rt in pair:
                rt.close()


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(program=programs(made_roots=True))
def test_streamed_programs_equal_flushed_ones_bit_for_bit(pairs, program):
    roots, splits, ops = program
    for (streamed, flushed), (policy, nodes) in zip(pairs, _CONFIGS):
        got, got_fetched = run_runtime(streamed, roots, splits, ops)
        want, want_fetched = run_runtime(flushed, roots, splits, ops)
        label = f"{policy} host_nodes={nodes}"
        for i, (g, e) in enumerate(zip(got + got_fetched, want + want_fetched)):
            np.testing.assert_array_equal(g, e, err_msg=f"{label}: array {i}")


def _train_digest(overlap, policy):
    model = hn.build_model("lenet5", (1, 28, 28), 10, dtype="float32", seed=5)
    rng = np.random.default_rng(8)
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False, overlap=overlap) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.Adam(lr=1e-3), runtime=rt,
                             batch_size=16, granularity=2, replay=False)
        losses = [trainer.train_step(rng.standard_normal((16, 1, 28, 28)).astype(np.float32),
                                     rng.integers(0, 10, 16)) for _ in range(3)]
        arrays = [np.array(losses), *model.state_dict().values()]
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


@pytest.mark.parametrize("policy", ["eager", "dmda"])
def test_streamed_training_steps_equal_flushed_ones(policy):
    assert _train_digest(True, policy) == _train_digest(False, policy)


# ---------------------------------------------------------------- failures and lifetime
def test_a_failure_while_submitting_surfaces_at_wait_and_cancels_the_rest():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        x = rt.register(np.zeros(1))
        started = threading.Event()
        bad = rt.submit(BOOM, x, started=started)
        assert started.wait(TIMEOUT)
        after = [rt.submit(FILL, x, value=5.0)]  # follows the failed task
        others = [rt.register(np.zeros(1)) for _ in range(20)]
        _until(lambda: rt.executor.state.error is not None)  # the worker has recorded the failure
        after += [rt.submit(FILL, h, value=1.0) for h in others]  # submitted after the failure
        with pytest.raises(hn.TaskError, match="overlap_boom") as info:
            rt.fetch(x)
        assert info.value.task_id == bad.id
        assert all(t.error == "cancelled" for t in after)
        assert rt.fetch(x)[0] == 0.0 and all(rt.fetch(h)[0] == 0.0 for h in others)
        rt.submit(FILL, x, value=3.0)  # usable again
        assert rt.fetch(x)[0] == 3.0
        rt.wait()  # the error was raised once


def test_stale_temporaries_with_streaming():
    """A temporary may be fetched after its flush until work is submitted again; the
    arenas are reset then, and the temporary is refused at submit and at fetch."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        tmp = rt.temporary((4,), "float64", name="tmp")
        rt.submit(FILL, tmp, value=2.0)
        rt.wait()
        np.testing.assert_array_equal(rt.fetch(tmp), [2.0] * 4)
        np.testing.assert_array_equal(rt.fetch(tmp), [2.0] * 4)  # no work since: still valid
        fresh = rt.temporary((4,), "float64", name="fresh")
        rt.submit(FILL, fresh, value=7.0)  # a new flush: the arena starts over
        with pytest.raises(hn.SubmitError, match="'tmp' belongs to an earlier flush"):
            rt.submit(FILL, tmp, value=1.0)
        np.testing.assert_array_equal(rt.fetch(fresh), [7.0] * 4)  # same memory as tmp's
        with pytest.raises(hn.SubmitError, match="earlier flush"):
            rt.fetch(tmp)


def test_close_with_tasks_in_flight_cancels_them_and_returns():
    """The running task finishes, the ones not started are cancelled, no thread is left."""
    log = []
    go = threading.Event()
    rt = hn.Runtime(devices="cpu:2", perfmodel=False)
    x = rt.register(np.zeros(1))
    started = _signal_on(rt, x, "A", log, go)
    assert started.wait(TIMEOUT)
    rest = [rt.submit(FILL, x, value=float(i)) for i in range(50)]
    closer = threading.Thread(target=rt.close)
    closer.start()
    _until(lambda: rt.executor.state.error is not None)  # close() has cancelled the rest
    go.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive(), "close() hung with tasks in flight"
    assert rt.closed and ("end", "A") in log
    assert all(t.error == "cancelled" for t in rest)
    assert not [w for w in rt.workers if w.thread.is_alive()]


# ---------------------------------------------------------------- the executor's state
@pytest.mark.parametrize("policy", ["eager", "dmda"])
def test_the_executor_state_says_where_each_unfinished_task_is(policy):
    """While A blocks on one worker, B waits for A and C queues behind it: the one
    state object lists A running, B waiting after A, and nothing idle but the other
    worker; once drained everything is empty again."""
    log = []
    go = threading.Event()
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        a = rt.register(np.zeros(1))
        started = _signal_on(rt, a, "A", log, go)
        assert started.wait(TIMEOUT)
        rt.submit(FILL, a, value=2.0)  # waits for A
        state = rt.executor.state
        with rt._lock:
            text = str(state)
            running = [t for r in state.running for t in r]
            waiting = list(state.waiting)
            remaining = state.remaining
        go.set()
        rt.wait()
        assert remaining == 2
        assert [t.codelet.name for t in running] == ["overlap_signal"]
        assert [t.codelet.name for t in waiting] == ["overlap_fill"]
        assert "2 task(s) not finished, 1 waiting" in text
        assert "running [Task(overlap_signal#" in text and "waiting: Task(overlap_fill#" in text
        assert state.remaining == 0 and not state.waiting and not any(state.running)
        assert rt.fetch(a)[0] == 2.0


def test_a_stalled_flush_is_logged_with_the_state(monkeypatch, caplog):
    """drain() logs the state when nothing finishes for STALL_REPORT_SECONDS, and goes
    on waiting: the flush still completes once the task is let go."""
    import hetero_nn.scheduler.executors.local as local

    monkeypatch.setattr(local, "STALL_REPORT_SECONDS", 0.05)
    log = []
    go = threading.Event()
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        a = rt.register(np.zeros(1))
        _signal_on(rt, a, "A", log, go)
        threading.Timer(0.5, go.set).start()
        with caplog.at_level("WARNING", logger="hetero_nn.scheduler"):
            rt.wait()
        assert rt.fetch(a)[0] == 1.0
    assert any("made no progress" in r.getMessage() and "running [Task(overlap_signal#"
               in r.getMessage() for r in caplog.records)
