"""StarPU's task API: what ``submit`` returns and the task fields it takes.

``done()``, ``wait()`` and ``exception()`` on the task; ``priority=``, ``after=``,
``callback=``, ``worker=`` (one worker or a group), ``modes=`` for a codelet of
variable arity, ``rt.unregister``, and ``executor="sync"``. Each is checked under
every executor it applies to (local streaming, local with whole DAGs, sync, the
Dask executors) and refused in one line where it cannot be honoured. Codelets are
module-level functions so distributed workers can unpickle them.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, W
from hetero_nn.codelets.reduce import add_redux, zero_init
from hetero_nn.scheduler.policies.policies import POLICIES

TIMEOUT = 10.0


def _append(x, log, tag):
    log.append(tag)
    x += 1


def _add_one(x):
    x += 1


def _boom(x):
    raise ValueError("boom")


def _blocked(x, go):
    assert go.wait(TIMEOUT)
    x += 1


def _total(out, *parts):
    out[...] = sum(float(p.sum()) for p in parts)


def _fill(x, value):
    x[...] = value


def _which(x, log):
    log.append(threading.current_thread().name)


APPEND = hn.Codelet("api_append", modes=(RW,), variants={"ref": _append})
ADD = hn.Codelet("api_add", modes=(RW,), variants={"ref": _add_one, "cuda": _add_one})
BOOM = hn.Codelet("api_boom", modes=(RW,), variants={"ref": _boom})
BLOCKED = hn.Codelet("api_blocked", modes=(RW,), variants={"ref": _blocked})
FILL = hn.Codelet("api_fill", modes=(W,), variants={"ref": _fill})
WHICH = hn.Codelet("api_which", modes=(R,), variants={"ref": _which, "cuda": _which})
# a variable number of operands: the output first, then any number of inputs
TOTAL = hn.Codelet("api_total", modes=None, variants={"ref": _total},
                   init=zero_init, redux=add_redux)

LOCAL = [dict(executor="local"), dict(executor="local", overlap=False),
         dict(executor="local", policy="heft"), dict(executor="sync")]
ALL = LOCAL + [dict(executor="dask"), dict(executor="distributed")]


def _runtime(config, dist_client=None, devices="cpu:2", **kw):
    config = dict(config)
    if config.get("executor") == "distributed":
        config["executor"] = dist_client
    return hn.Runtime(devices=devices, perfmodel=False, **config, **kw)


def _id(config):
    return "-".join(f"{v}" for v in config.values())


@pytest.fixture(params=ALL, ids=_id)
def every_executor(request):
    if request.param.get("executor") == "distributed":
        return request.param, request.getfixturevalue("dist_client")
    return request.param, None


# ---------------------------------------------------------------- the task a submit returns
def test_done_wait_and_exception(every_executor):
    config, client = every_executor
    with _runtime(config, client) as rt:
        x = rt.register(np.zeros(2))
        task = rt.submit(ADD, x)
        task.wait()
        assert task.done() and task.exception() is None
        assert rt.fetch(x).tolist() == [1.0, 1.0]
        bad = rt.submit(BOOM, x)
        after_bad = rt.submit(ADD, x)
        with pytest.raises(hn.TaskError, match="boom|cancelled"):
            bad.wait()
        if rt.overlap:  # bad.wait() did not end the flush: wait() does, and raises its failure
            with pytest.raises(hn.TaskError, match="boom"):
                rt.wait()
        else:  # bad.wait() ran the flush kept for wait(), and raised its failure
            rt.wait()
        assert bad.done() and after_bad.done()
        if config.get("executor") not in ("dask", "distributed"):
            assert isinstance(bad.exception(), hn.TaskError)
            assert "boom" in str(bad.exception())
            assert "cancelled" in str(after_bad.exception())
        rt.submit(ADD, x).wait()  # the runtime goes on
        assert rt.fetch(x).tolist() == [2.0, 2.0]


def test_wait_on_one_task_returns_while_others_still_run():
    """Streaming: task.wait() returns once that task ended, while another still blocks;
    a wait with a timeout on the blocked one raises TimeoutError."""
    go = threading.Event()
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        blocked = rt.submit(BLOCKED, rt.register(np.zeros(1)), go=go)
        quick = rt.submit(ADD, rt.register(np.zeros(1)))
        quick.wait(timeout=TIMEOUT)
        assert quick.done() and not blocked.done()
        with pytest.raises(TimeoutError):
            blocked.wait(timeout=0.05)
        go.set()
        blocked.wait(timeout=TIMEOUT)
        rt.wait()


# ---------------------------------------------------------------- after= and callback=
def test_after_orders_tasks_that_share_no_data(every_executor):
    """B writes nothing A touches, yet runs after A because it is submitted after=[A]."""
    config, client = every_executor
    with _runtime(config, client) as rt:
        log = [] if config.get("executor") != "distributed" else None
        if log is None:  # distributed runs the codelets in other processes: order from times
            a = rt.submit(ADD, rt.register(np.zeros(1)))
            b = rt.submit(ADD, rt.register(np.zeros(1)), after=[a])
            rt.wait()
            records = {r.task_id: r for r in rt.trace().records}
            assert records[b.id].start >= records[a.id].end
            assert a.id in records[b.id].deps
            return
        pairs = []
        for i in range(5):
            a = rt.submit(APPEND, rt.register(np.zeros(1)), log=log, tag=f"a{i}")
            b = rt.submit(APPEND, rt.register(np.zeros(1)), log=log, tag=f"b{i}", after=[a])
            pairs.append((a, b))
        rt.wait()
        assert sorted(log) == sorted([f"{x}{i}" for i in range(5) for x in "ab"])
        assert all(log.index(f"a{i}") < log.index(f"b{i}") for i in range(5))
        deps = {r.task_id: r.deps for r in rt.trace().records}
        assert all(a.id in deps[b.id] for a, b in pairs)


def test_after_a_task_of_an_earlier_flush_is_already_met():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        a = rt.submit(ADD, rt.register(np.zeros(1)))
        rt.wait()
        b = rt.submit(ADD, rt.register(np.zeros(1)), after=[a])
        b.wait(timeout=TIMEOUT)
        assert b.done()


def test_callback_runs_after_its_task_and_before_its_successors(every_executor):
    config, client = every_executor
    with _runtime(config, client) as rt:
        x = rt.register(np.zeros(1))
        seen = []
        t1 = rt.submit(ADD, x, callback=lambda t: seen.append((t.id, float(rt.host_replica(x)[0]))))
        t2 = rt.submit(ADD, x, callback=lambda t: seen.append((t.id, None)))
        rt.wait()
        ids = [i for i, _ in seen]
        assert ids == [t1.id, t2.id]
        if config.get("executor") not in ("dask", "distributed"):
            assert seen[0][1] == 1.0  # the task had run, its successor not yet


def test_a_callback_that_raises_fails_the_flush_and_names_it(every_executor):
    config, client = every_executor

    def bad(task):
        raise KeyError("callback failed on purpose")

    with _runtime(config, client) as rt:
        x = rt.register(np.zeros(1))
        task = rt.submit(ADD, x, callback=bad)
        with pytest.raises(hn.TaskError, match=f"callback of task {task.id}.*on purpose"):
            rt.wait()
        rt.submit(ADD, x)
        rt.wait()
        assert rt.fetch(x)[0] == 2.0


# ---------------------------------------------------------------- priority=
@pytest.mark.parametrize("config", [dict(policy=p, overlap=False) for p in
                                    ("eager", "random", "ws", "dmda", "heft")]
                         + [dict(executor="sync", overlap=False)], ids=_id)
def test_priority_orders_ready_tasks(config):
    """One worker, a closed DAG of independent tasks: it takes them by priority (high
    first), then in the policy's order (submission order; ws: the newest first);
    negative priorities come last."""
    config = dict(config)
    executor = config.pop("executor", "local")
    with hn.Runtime(devices="cpu:1", perfmodel=False, executor=executor, **config) as rt:
        log = []
        if executor == "sync":  # tasks run at submission: order only within a captured DAG
            with rt.capture() as graph:
                _submit_by_priority(rt, log)
            log.clear()
            graph.replay()
        else:
            _submit_by_priority(rt, log)
            rt.wait()
        equal = ["p0b", "p0a"] if config.get("policy") == "ws" else ["p0a", "p0b"]  # ws: newest
        assert log == ["p5", "p1", *equal, "p-1"]


def _submit_by_priority(rt, log):
    for tag, prio in (("p0a", 0), ("p-1", -1), ("p1", 1), ("p0b", 0), ("p5", 5)):
        rt.submit(APPEND, rt.register(np.zeros(1)), log=log, tag=tag, priority=prio)


@pytest.mark.parametrize("executor", ["dask", "distributed"])
def test_priority_and_worker_are_refused_by_the_dask_executors(executor, request):
    spec = request.getfixturevalue("dist_client") if executor == "distributed" else executor
    with hn.Runtime(devices="cpu:2", executor=spec, perfmodel=False) as rt:
        x = rt.register(np.zeros(1))
        with pytest.raises(hn.SubmitError, match="priority= orders the ready tasks"):
            rt.submit(ADD, x, priority=2)
        with pytest.raises(hn.SubmitError, match="worker= places a task"):
            rt.submit(ADD, x, worker="cpu0")


# ---------------------------------------------------------------- worker=
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("overlap", [True, False])
def test_worker_pins_a_task_and_a_group_pins_it_to_one_of_them(policy, overlap):
    with hn.Runtime(devices="cpu:3", policy=policy, perfmodel=False, overlap=overlap) as rt:
        pinned, grouped = [], []
        for p in rt.register(np.zeros(24)).split(0, 24):
            pinned.append(rt.submit(ADD, p, worker="cpu2"))
        for p in rt.register(np.zeros(24)).split(0, 24):
            grouped.append(rt.submit(ADD, p, worker=[rt.workers[0], "cpu1"]))
        rt.wait()
        assert {t.worker.name for t in pinned} == {"cpu2"}
        assert {t.worker.name for t in grouped} <= {"cpu0", "cpu1"}
        trace = {r.task_id: r.worker for r in rt.trace().records}
        assert all(trace[t.id] == "cpu2" for t in pinned)


def test_worker_as_an_index_names_that_worker_or_is_refused_in_one_line():
    """StarPU's worker id: ``worker=0`` is ``rt.workers[0]`` (issue 30, item 4)."""
    with hn.Runtime(devices="cpu:3", policy="dmda", perfmodel=False) as rt:
        tasks = [rt.submit(ADD, p, worker=2) for p in rt.register(np.zeros(6)).split(0, 6)]
        tasks += [rt.submit(ADD, rt.register(np.zeros(2)), worker=np.int64(0))]
        tasks += [rt.submit(ADD, rt.register(np.zeros(2)), worker=[0, "cpu1"])]
        rt.wait()
        assert [t.worker.name for t in tasks[:6]] == ["cpu2"] * 6
        assert tasks[6].worker.name == "cpu0" and tasks[7].worker.name in ("cpu0", "cpu1")
        for bad in (3, -1, True):
            with pytest.raises(hn.SubmitError) as info:
                rt.submit(ADD, rt.register(np.zeros(1)), worker=bad)
            assert f"worker={bad!r} is not a worker of this Runtime (indices 0-2: " \
                   "['cpu0', 'cpu1', 'cpu2'])" in str(info.value)
        with pytest.raises(hn.SubmitError, match=r"worker=2\.5: expected a worker, its name"):
            rt.submit(ADD, rt.register(np.zeros(1)), worker=2.5)


def test_worker_on_the_sync_executor_binds_on_that_workers_node():
    with hn.Runtime(devices="cpu:1,cuda-emu:1", executor="sync", perfmodel=False) as rt:
        x = rt.register(np.zeros(3))
        t = rt.submit(ADD, x, worker="cuda-emu0")
        assert t.done() and t.worker.name == "cuda-emu0"
        assert rt.fetch(x).tolist() == [1.0, 1.0, 1.0]
        assert [r.worker for r in rt.trace().records] == ["cuda-emu0"]


def test_worker_is_honoured_on_emulated_devices_and_refused_when_no_variant_fits():
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy="dmda", perfmodel=False) as rt:
        tasks = [rt.submit(ADD, rt.register(np.zeros(4)), worker="cuda-emu0") for _ in range(6)]
        rt.wait()
        assert {t.worker.name for t in tasks} == {"cuda-emu0"}
        with pytest.raises(hn.SubmitError, match="none of them has a variant"):
            rt.submit(APPEND, rt.register(np.zeros(1)), log=[], tag="x", worker="cuda-emu0")
        with pytest.raises(hn.SubmitError, match="not a worker of this Runtime"):
            rt.submit(ADD, rt.register(np.zeros(1)), worker="cpu7")


def test_worker_constraints_reach_the_simulator(tmp_path):
    """A captured graph keeps worker=: the simulator places those tasks there too."""
    from hetero_nn.simulation.simulate import Platform, capture, simulate

    pm = hn.PerfModel(tmp_path, load=False)
    with hn.Runtime(devices="cpu:2", perfmodel=pm) as rt:
        for _ in range(3):  # a model for the codelet
            for p in rt.register(np.zeros(8)).split(0, 8):
                rt.submit(ADD, p)
            rt.wait()

        def step():
            for p in rt.register(np.zeros(8)).split(0, 8):
                rt.submit(ADD, p, worker="cpu1")
            rt.wait()

        steps = capture(rt, step, steps=1)
        simulate(steps, Platform.from_devices("cpu:2"), "eager", rt)
        assert {t.worker.name for g in steps[0].graphs for t in g} == {"cpu1"}
        with pytest.raises(hn.ConfigError, match="worker="):
            simulate(steps, Platform.from_devices("cpu:1"), "eager", rt)


# ---------------------------------------------------------------- modes= (variable operands)
@pytest.fixture(params=LOCAL + [dict(executor="dask")], ids=_id)
def local_or_dask(request):
    return request.param


def test_a_codelet_of_variable_arity_takes_its_modes_at_submission(local_or_dask):
    with _runtime(local_or_dask) as rt:
        out = rt.register(np.zeros(()))
        for n in (1, 2, 5):
            inputs = [rt.register(np.full(3, float(i))) for i in range(n)]
            rt.submit(TOTAL, out, *inputs, modes=(W,) + (R,) * n)
            assert float(rt.fetch(out)) == 3.0 * sum(range(n))
        acc = rt.register(np.zeros(()))
        for i in range(4):
            rt.submit(TOTAL, acc, rt.register(np.ones(2)), modes=(REDUX, R))
        assert float(rt.fetch(acc)) == 8.0


def test_variable_arity_is_checked_in_one_line():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        a = rt.register(np.zeros(()))
        with pytest.raises(hn.SubmitError, match="give their modes at submission"):
            rt.submit(TOTAL, a)
        with pytest.raises(hn.SubmitError, match="1 operand.*2 mode"):
            rt.submit(TOTAL, a, modes=(W, R))
        with pytest.raises(hn.SubmitError, match="modes= is for a codelet declared with"):
            rt.submit(ADD, a, modes=(RW,))
        no_redux = hn.Codelet("api_plain", modes=None, variants={"ref": _total})
        with pytest.raises(hn.SubmitError, match="REDUX operand needs"):
            rt.submit(no_redux, a, modes=(REDUX,))


# ---------------------------------------------------------------- unregister
@pytest.mark.parametrize("devices", ["cpu:2", "cpu:1,cuda-emu:1"])
def test_unregister_waits_brings_the_data_home_and_disowns_the_handle(devices):
    with hn.Runtime(devices=devices, perfmodel=False) as rt:
        data = np.zeros(4)
        h = rt.register(data)
        parts = h.split(0, 2)
        for p in parts:
            rt.submit(ADD, p, worker=rt.workers[-1])  # on the device where there is one
        out = rt.unregister(h)
        assert out is data and data.tolist() == [1.0] * 4
        with pytest.raises(hn.SubmitError, match="was unregistered"):
            rt.submit(ADD, h)
        with pytest.raises(hn.SubmitError, match="was unregistered"):
            rt.submit(ADD, parts[0])
        e = rt.empty((3,), "float64")
        rt.submit(FILL, e, value=7.0)
        assert rt.unregister(e).tolist() == [7.0] * 3
        with pytest.raises(hn.SubmitError, match="unregister the root"):
            rt.unregister(rt.register(np.zeros(2)).split(0, 2)[0])


# ---------------------------------------------------------------- executor="sync"
def test_sync_runs_each_task_in_the_calling_thread_at_submission():
    with hn.Runtime(devices="cpu:2", executor="sync", perfmodel=False) as rt:
        log = []
        x = rt.register(np.zeros(1))
        t = rt.submit(WHICH, x, log=log)
        assert t.done() and log == [threading.current_thread().name]
        rt.submit(ADD, x)
        assert rt.host_replica(x)[0] == 1.0  # ran inside submit
        rt.submit(BOOM, x)
        skipped = rt.submit(ADD, x)
        assert skipped.done() and "cancelled" in str(skipped.exception())
        with pytest.raises(hn.TaskError, match="boom") as caught:
            rt.wait()
        assert isinstance(caught.value.__cause__, ValueError)  # the codelet's own traceback
        rt.submit(ADD, x)
        assert rt.fetch(x)[0] == 2.0


def test_sync_gives_the_same_bits_as_the_local_executor():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 8))

    def program(rt):
        acc = rt.register(np.zeros(8))
        h = rt.register(a.copy())
        for part in h.split(0, 8):
            rt.submit(TOTAL, acc, part, modes=(REDUX, R))
        return rt.fetch(acc).copy()

    with hn.Runtime(devices="cpu:2", executor="sync", perfmodel=False) as rt:
        sync = program(rt)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        local = program(rt)
    assert sync.tobytes() == local.tobytes()
