"""The replay engine: trampolines, fixed schedules, bound tasks and the compiled loop.

A compiled replay must give what sequential NumPy gives (random handle programs,
captured once and replayed with new inputs, under every policy and worker count),
run its Numba tasks without Python per task, keep traces and models right, name a
failing task and leave the runtime usable (every such test has a timeout), and
serve step parameters, writes into parts of a root and explicit bundles. The
training steps of ``tests/test_replay.py`` run on it too (bit for bit against
submitted steps).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, SCRATCH, W
from hetero_nn.codelets._jit import jit
from hetero_nn.codelets.reduce import add_redux, zero_init
from hetero_nn.scheduler.executors.bundle import Bundle
from hetero_nn.scheduler.perfmodel.model import PerfModel
from hetero_nn.scheduler.engine.replay import unavailable
from hetero_nn.scheduler.policies.list_scheduling import check_orders, from_assignment, plan
from hetero_nn.scheduler.engine.trampoline import CompiledCall
from helpers import within
from test_runtime_property import CODELETS as PROP, handle_named, programs, run_reference

POLICIES = ("eager", "random", "ws", "dmda", "heft")


# ----------------------------------------------------------------------------- kernels

@jit
def _scale_cpu(x, factor):
    for i in np.ndindex(x.shape):
        x[i] *= factor


@jit
def _axpy_cpu(x, y, a):
    for i in np.ndindex(x.shape):
        y[i] += a * x[i]


@jit
def _copy_cpu(x, y):
    for i in np.ndindex(x.shape):
        y[i] = x[i]


@jit
def _axpy_scratch_cpu(x, scratch, y, a):
    for i in np.ndindex(x.shape):
        scratch[i] = x[i] * a
    for i in np.ndindex(x.shape):
        y[i] += scratch[i]


@jit
def _acc_sq_cpu(x, acc):
    for i in np.ndindex(x.shape):
        acc[i] += x[i] * x[i]


@jit
def _boom_cpu(x, limit):
    for i in np.ndindex(x.shape):
        if x[i] > limit:
            raise ValueError("a value above the limit")


@jit
def _noop_cpu(x):
    pass


def _boom_ref(x, limit):
    if (x > limit).any():
        raise ValueError(f"{int((x > limit).sum())} values above {limit}")


def _twin(name, cpu, **extra):
    """The property test's codelet ``name`` with a Numba ``cpu`` variant beside its ``ref``."""
    base = PROP[name]
    if REDUX in base.modes:
        extra = {"init": zero_init, "redux": add_redux, **extra}
    return hn.Codelet(name.replace("prop_", "engine_"), modes=base.modes,
                      variants={"ref": base.variants["ref"], "cpu": cpu}, **extra)


COMPILED = {"prop_scale": _twin("prop_scale", _scale_cpu),
            "prop_axpy": _twin("prop_axpy", _axpy_cpu),
            "prop_copy": _twin("prop_copy", _copy_cpu),
            "prop_axpy_scratch": _twin("prop_axpy_scratch", _axpy_scratch_cpu),
            "prop_acc_sq": _twin("prop_acc_sq", _acc_sq_cpu)}
CODELETS = {name: COMPILED.get(name, codelet) for name, codelet in PROP.items()}
# The same with a ``cuda`` variant (the reference function) for CUDA workers
DEVICE_CODELETS = {name: hn.Codelet(c.name, modes=c.modes,
                                    variants={**c.variants, "cuda": c.variants["ref"]},
                                    init=c.init, redux=c.redux)
                   for name, c in CODELETS.items()}
SCALE, AXPY = COMPILED["prop_scale"], COMPILED["prop_axpy"]
BOOM = hn.Codelet("engine_boom", modes=(R,), variants={"ref": _boom_ref, "cpu": _boom_cpu})
NOOP = hn.Codelet("engine_noop", modes=(RW,), variants={"cpu": _noop_cpu})
CPU_FIRST = ("cpu", "ref")  # the Numba variants where a codelet has one


def _segments(graph):
    return graph._compiled.segments


# ----------------------------------------------------------------------------- trampolines

@jit
def _mixed(a, b, n, x32, flag, nothing, pair):
    k, (s,) = pair
    if flag and nothing is None:
        for i in range(n):
            a[i] = b[i] * x32 + k * s


def test_a_compiled_call_rebuilds_every_kind_of_argument():
    a = np.zeros(6, dtype=np.float32)
    b = np.arange(12, dtype=np.float32)[::2]  # strided
    args = (a, b, 4, np.float32(0.1), True, None, (3, (0.5,)))
    call = CompiledCall(_mixed, args)
    assert call() == 0
    expected = np.zeros(6, dtype=np.float32)
    _mixed(expected, b, 4, np.float32(0.1), True, None, (3, (0.5,)))
    np.testing.assert_array_equal(a, expected)  # float32 0.1 crossed the block exactly
    call.pack((a, b, 6, np.float32(2.0), True, None, (0, (0.0,))))  # new values in place
    assert call() == 0 and a.tolist() == (b * 2).tolist()


def test_kernels_of_one_signature_share_a_trampoline_and_exceptions_return_one():
    x = np.ones(3)
    scale = CompiledCall(_scale_cpu, (x, 2.0))
    boom = CompiledCall(_boom_cpu, (x, 1.5))
    assert scale.trampoline is boom.trampoline and scale.entry != boom.entry
    assert scale() == 0 and boom() == 1  # 2.0 > 1.5: the kernel raised
    with pytest.raises(TypeError, match="cannot pass"):
        CompiledCall(_scale_cpu, (x, "two"))


# ----------------------------------------------------------------------------- schedules

def test_a_chain_stays_on_one_worker_and_independent_tasks_spread():
    chain = [[], [0], [1], [2]]
    worker_of, orders = plan([1e-3] * 4, chain, 2)
    assert len(set(worker_of)) == 1
    wide = [[] for _ in range(6)]
    worker_of, orders = plan([1e-3] * 6, wide, 3)
    assert sorted(len(o) for o in orders) == [2, 2, 2]


def test_a_successor_moves_only_when_the_move_pays_more_than_the_handoff():
    fork = [[], [0], [0]]  # two equal successors of one task
    worker_of, _ = plan([1e-3, 1e-3, 1e-3], fork, 2, handoff=1e-5)
    assert worker_of[1] != worker_of[2]  # running them side by side pays
    worker_of, _ = plan([1e-3, 1e-6, 1e-6], fork, 2, handoff=1e-5)
    assert worker_of[1] == worker_of[2] == worker_of[0]  # tiny ones: the handoff costs more


def test_orders_that_cannot_run_are_refused():
    preds = [[1], [], [3], []]  # 0 waits for 1, 2 for 3
    check_orders([[3, 0], [1, 2]], preds)
    with pytest.raises(ValueError, match="deadlock"):
        check_orders([[0, 3], [2, 1]], preds)  # each worker's head waits behind the other's
    worker_of, orders = from_assignment([0, 1, 0, 1], [4.0, 3.0, 2.0, 1.0], 2)
    assert orders == [[0, 2], [1, 3]]


# ----------------------------------------------------------------------------- the engine

def test_the_engine_serves_only_runtimes_it_can():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        assert unavailable(rt) is None
    for kwargs, reason in (({"replay_engine": "executor"}, "replay_engine"),
                           ({"executor": "dask"}, "Dask"),
                           ({"devices": "cpu:1,cuda-emu:1"}, "several kinds")):
        with hn.Runtime(**{"devices": "cpu:2", "perfmodel": False, **kwargs}) as rt:
            assert reason in unavailable(rt)
    for kwargs in ({"host_nodes": 2}, {"devices": "cpu:1,cuda-emu:1", "policy": "heft"}):
        with hn.Runtime(**{"devices": "cpu:2", "perfmodel": False, **kwargs}) as rt:
            assert unavailable(rt) is None
    with pytest.raises(hn.ConfigError, match="replay_engine"):
        hn.Runtime(devices="cpu:1", replay_engine="fast")


@pytest.mark.parametrize("shape", ("chain", "wide"))
def test_numba_tasks_replay_compiled_with_records_and_measurements(shape, tmp_path):
    pm = PerfModel(tmp_path)
    with hn.Runtime(devices="cpu:2", perfmodel=pm, variants=CPU_FIRST) as rt:
        n = 40
        h = rt.register(np.zeros(n))
        parts = h.split(0, n) if shape == "wide" else [h] * n
        with rt.capture() as graph:
            for p in parts:
                rt.submit(AXPY, rt.register(np.ones(p.shape)), p, a=0.5)
        rt.trace(clear=True)
        busy = sum(w.busy for w in rt.workers)
        fp, _ = rt.footprint(graph._segments[0][0][0])
        measured = pm.count("engine_axpy", "cpu", "cpu", fp)  # the capture's run (warmed up)
        for _ in range(3):
            within(60, graph.replay)
        expected = np.full(n, 2.0) if shape == "wide" else np.full(1, 0.5 * n * 4)
        np.testing.assert_array_equal(rt.fetch(h)[:len(expected)], expected)
        (seg,) = _segments(graph)
        assert seg.python_tasks == 0 and all(len(b.calls) == 1 for b in seg.bound)
        if shape == "chain":  # a chain is not spread over workers
            assert len({b.worker.name for b in seg.bound}) == 1
        records = rt.trace().records
        assert len(records) == 3 * n and len({r.task_id for r in records}) == 3 * n
        by_id = {r.task_id: r for r in records}
        for r in records:
            assert r.variant == "cpu" and r.submit <= r.ready <= r.start <= r.end
            assert all(by_id[d].end <= r.start for d in r.deps)
        assert pm.count("engine_axpy", "cpu", "cpu", fp) == measured + 3 * n
        assert sum(w.busy for w in rt.workers) > busy


def test_python_and_compiled_tasks_mix_across_three_workers():
    rng = np.random.default_rng(1)
    with hn.Runtime(devices="cpu:3", perfmodel=False, variants=CPU_FIRST) as rt:
        x = rt.register(rng.standard_normal((9, 4)))
        y = rt.register(np.zeros((9, 4)))
        acc = rt.register(np.zeros((3, 4)))
        with rt.capture() as graph:
            for xp, yp in zip(x.split(0, 3), y.split(0, 3)):
                rt.submit(CODELETS["prop_copy"], xp, yp)            # compiled
                rt.submit(CODELETS["prop_fill_max"], yp, xp, a=2.0)  # Python
                rt.submit(CODELETS["prop_acc_sq"], xp, acc)          # compiled, REDUX
        graph.replay()
        python = {b.task.codelet.name: b.calls is None for b in _segments(graph)[0].bound}
        assert python == {"engine_copy": False, "prop_fill_max": True, "engine_acc_sq": False,
                          "engine_acc_sq.redux": False}
        for _ in range(2):
            before = rt.fetch(acc, copy=True)
            new = rng.standard_normal((9, 4))
            graph.write(x, new)
            within(60, graph.replay)
            filled = [np.full((3, 4), 2.0 * new[i:i + 3].max()) for i in (0, 3, 6)]
            partials = [f * f for f in filled]
            np.testing.assert_array_equal(rt.fetch(x), np.vstack(filled))
            np.testing.assert_array_equal(rt.fetch(y), new)
            np.testing.assert_array_equal(rt.fetch(acc),
                                          before + ((partials[0] + partials[1]) + partials[2]))


def _failing_program(rt, variants):
    h = rt.register(np.zeros(8))
    other = rt.register(np.zeros(8))
    with rt.capture() as graph:
        for p in h.split(0, 4):
            rt.submit(SCALE, p, factor=2.0)
            rt.submit(BOOM, p, limit=5.0)
        for p, q in zip(h.split(0, 4), other.split(0, 4)):  # work on the other workers,
            rt.submit(AXPY, p, q, a=1.0)                   # waiting on the failing one
    return graph, h


@pytest.mark.parametrize("variant", ("cpu", "ref"))
def test_a_failing_task_names_itself_and_leaves_runtime_and_graph_usable(variant):
    with hn.Runtime(devices="cpu:3", perfmodel=False, variants=(variant, "cpu")) as rt:
        graph, h = _failing_program(rt, variant)
        graph.replay()
        graph.write(h, np.full(8, 10.0))
        with pytest.raises(hn.TaskError, match="engine_boom.*above") as info:
            within(60, graph.replay)
        assert info.value.codelet == "engine_boom" and f"variant '{variant}'" in str(info.value)
        failed = [r for r in rt.trace().records if r.error]
        assert failed and all(r.codelet == "engine_boom" for r in failed)
        graph.write(h, np.ones(8))
        within(60, graph.replay)  # the graph replays again
        np.testing.assert_array_equal(rt.fetch(h), np.full(8, 2.0))
        rt.submit(SCALE, h, factor=0.5)
        np.testing.assert_array_equal(rt.fetch(h), np.ones(8))  # and the runtime submits


# ----------------------------------------------------------------------------- step parameters

def test_step_parameters_change_between_replays_without_a_handle():
    with hn.Runtime(devices="cpu:2", perfmodel=False, variants=CPU_FIRST) as rt:
        h = rt.register(np.ones(6))
        with pytest.raises(hn.SubmitError, match="inside the capture"):
            rt.capture().param("factor", 2.0)
        with rt.capture() as graph:
            factor = graph.param("factor", 2.0)
            times = graph.param("times", 1)
            assert factor == 2.0 and isinstance(times, int) and times == 1
            for p in h.split(0, 2):
                rt.submit(SCALE, p, factor=factor)              # compiled
                rt.submit(PROP["prop_scale"], p, factor=times)  # Python (its ref variant)
            with pytest.raises(hn.SubmitError, match="already declared"):
                graph.param("times", 2)
        np.testing.assert_array_equal(rt.fetch(h), np.full(6, 2.0))
        graph.replay(factor=3.0)
        np.testing.assert_array_equal(rt.fetch(h), np.full(6, 6.0))
        graph.replay(times=-2)
        np.testing.assert_array_equal(rt.fetch(h), np.full(6, -36.0))
        graph.replay()  # the last values stay
        np.testing.assert_array_equal(rt.fetch(h), np.full(6, 216.0))
        kinds = {b.task.codelet.name: b.calls is None for b in _segments(graph)[0].bound}
        assert kinds == {"engine_scale": False, "prop_scale": True}
        with pytest.raises(hn.SubmitError, match=r"\['lr'\] are not step parameters"):
            graph.replay(lr=0.1)


# ----------------------------------------------------------------------------- writes, bundles

def test_write_into_a_part_of_a_split_root():
    with hn.Runtime(devices="cpu:2", perfmodel=False, variants=CPU_FIRST) as rt:
        x = rt.register(np.zeros((4, 3)))
        rows = x.split(0, 2)
        with rt.capture() as graph:
            for part in rows:
                rt.submit(SCALE, part, factor=2.0)
        graph.write(rows[1], np.ones((2, 3)))
        graph.write(x.split(1, 3)[0], np.full((4, 1), 5.0))  # a part of another plan
        graph.replay()
        expected = np.zeros((4, 3))
        expected[2:] = 1.0
        expected[:, :1] = 5.0
        np.testing.assert_array_equal(rt.fetch(x), 2.0 * expected)
        with pytest.raises(hn.SubmitError, match="shape"):
            graph.write(rows[0], np.ones((4, 3)))


def test_explicit_bundles_run_member_by_member_on_one_worker(tmp_path):
    def run(fuse):
        with hn.Runtime(devices="cpu:2", perfmodel=PerfModel(tmp_path / str(fuse)),
                        variants=CPU_FIRST, fuse_chains=False) as rt:
            x = rt.register(np.arange(12.0))
            y = rt.register(np.zeros(12))
            with rt.capture() as graph:
                for xp, yp in zip(x.split(0, 3), y.split(0, 3)):
                    rt.submit(SCALE, xp, factor=1.5)
                    rt.submit(AXPY, xp, yp, a=2.0)
                    rt.submit(SCALE, yp, factor=-1.0)
            for _ in range(3):
                graph.replay()
            if fuse:
                report = graph.fuse_chains(overhead=1.0)
                assert report.chains and any(isinstance(t, Bundle)
                                             for s in graph._segments for t, _, _ in s)
            rt.trace(clear=True)
            graph.replay()
            seg = _segments(graph)[0]
            for unit in seg.units:
                assert len({seg.bound[t].worker.name for t in unit}) == 1
            assert len(rt.trace().records) == 9
            return rt.fetch(y).copy()
    np.testing.assert_array_equal(run(True), run(False))


def test_automatic_fusion_defers_to_the_engine(tmp_path):
    with hn.Runtime(devices="cpu:2", perfmodel=PerfModel(tmp_path), variants=CPU_FIRST) as rt:
        h = rt.register(np.zeros(4))
        with rt.capture() as graph:
            for _ in range(5):
                rt.submit(NOOP, h)
        graph.replay()
        graph.replay()
        assert graph.bundles is not None and "engine" in graph.bundles.reason


# ----------------------------------------------------------------------------- random programs

class _Runtimes(list):
    def __repr__(self):
        return f"<{len(self)} runtimes>"


@pytest.fixture(scope="module")
def engine_runtimes():
    """(label, runtime, codelets): CPU workers under every policy; several memory nodes
    (two host nodes; a CPU and emulated CUDA devices under heft, their streams driven by
    the engine), whose tasks bind their operands at every run."""
    made = _Runtimes()
    try:
        for workers in (1, 2, 3):
            for policy in POLICIES:
                made.append((f"cpu:{workers} {policy}",
                             hn.Runtime(devices=f"cpu:{workers}", policy=policy, seed=workers,
                                        perfmodel=False, variants=CPU_FIRST), CODELETS))
        for policy in ("eager", "dmda"):
            made.append((f"cpu:2 host_nodes=2 {policy}",
                         hn.Runtime(devices="cpu:2", host_nodes=2, policy=policy,
                                    perfmodel=False, variants=CPU_FIRST), CODELETS))
        for devices in ("cpu:1,cuda-emu:1", "cpu:2,cuda-emu:2"):
            made.append((f"{devices} heft",
                         hn.Runtime(devices=devices, policy="heft", perfmodel=False,
                                    variants=CPU_FIRST), DEVICE_CODELETS))
        yield made
    finally:
        for _, rt, _ in made:
            rt.close()


def _captured(rt, roots, splits, ops, codelets):
    """Register the roots, capture the program (fetches become waits); returns the graph,
    the root handles."""
    handles = [rt.register(a.copy(), name=f"root{i}") for i, a in enumerate(roots)]
    with rt.capture() as graph:
        for op in ops:
            if op[0] in ("wait", "fetch"):
                rt.wait()
            else:
                _, name, operands, params = op
                rt.submit(codelets[name], *[handle_named(handles, splits, h) for h in operands],
                          **params)
    return graph, handles


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(program=programs())
def test_random_programs_replayed_with_new_inputs_match_sequential_numpy(engine_runtimes,
                                                                          program):
    roots, splits, ops = program
    rng = np.random.default_rng(len(ops))
    inputs = [[rng.standard_normal(a.shape) for a in roots] for _ in range(2)]
    expected = [run_reference(new, splits, ops)[0] for new in inputs]
    for label, rt, codelets in engine_runtimes:
        graph, handles = _captured(rt, roots, splits, ops, codelets)
        for new, want in zip(inputs, expected):
            for h, a in zip(handles, new):
                graph.write(h, a)
            within(60, graph.replay)
            for i, (h, e) in enumerate(zip(handles, want)):
                np.testing.assert_array_equal(rt.fetch(h), e, err_msg=f"{label}: root {i}")
        assert graph._compiled is not None


# ----------------------------------------------------------------------------- no Python per task

def _python_calls(fn):
    """Python function calls made by ``fn()`` on every thread (the engine's included)."""
    import sys
    calls = [0]

    def profile(frame, event, arg):
        if event == "call":
            calls[0] += 1
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls[0]


@pytest.mark.parametrize("host_nodes", (1, 2))
@pytest.mark.parametrize("shape", ("chain", "wide"))
def test_a_compiled_replay_makes_no_python_call_per_task(shape, host_nodes, tmp_path):
    """Python calls of one replay (traces and models on) do not grow with its tasks, on
    one memory node or two (the data plan's prologue checks one mask per root)."""
    calls = {}
    with hn.Runtime(devices="cpu:2", host_nodes=host_nodes, perfmodel=PerfModel(tmp_path),
                    variants=CPU_FIRST) as rt:
        for n in (100, 1000):
            h = rt.register(np.zeros(n))
            parts = h.split(0, n) if shape == "wide" else [h] * n
            with rt.capture() as graph:
                for p in parts:
                    rt.submit(NOOP, p)
            for _ in range(3):  # bind, plan again on measured times, settle
                graph.replay()
            calls[n] = _python_calls(graph.replay)
    assert calls[1000] - calls[100] < 20, calls  # a constant per replay, none per task


def test_array_types_are_numbas():
    from numba import typeof
    from hetero_nn.scheduler.engine.trampoline import argument_types
    base = np.zeros((4, 6), dtype=np.float32)
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    arrays = [base, base[:, ::2], base.T, base[1:3], np.zeros(0), readonly,
              np.zeros((2, 2), dtype=np.int64)]
    for a in arrays * 2:  # the second time from the memo
        assert argument_types((a,)) == (typeof(a),)


# ----------------------------------------------------------------------------- CUDA workers

def _device_boom(x, limit):
    if (x > limit).any():
        raise ValueError(f"{int((x > limit).sum())} values above {limit} on the device")


DEVICE_BOOM = hn.Codelet("engine_device_boom", modes=(R,),
                         variants={"cuda": _device_boom})


def test_a_cuda_worker_s_share_is_enqueued_on_its_stream():
    """cuda-emu under heft: the device's tasks go through its stream, bound to the data
    plan's replicas, its copies in and out enqueued there too (traced per copy); the
    CPU's tasks run compiled and wait for the device's through the counters; a kernel
    that raises on the stream fails the replay, naming it, and nothing hangs."""
    scale, axpy = DEVICE_CODELETS["prop_scale"], DEVICE_CODELETS["prop_axpy"]
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy="heft", perfmodel=False,
                    variants=CPU_FIRST) as rt:
        x = rt.register(np.arange(12.0))
        y = rt.register(np.zeros(12))
        with rt.capture() as graph:
            for xp, yp in zip(x.split(0, 4), y.split(0, 4)):
                rt.submit(scale, xp, factor=2.0)
                rt.submit(DEVICE_BOOM, xp, limit=1e9)   # on the device only
                rt.submit(axpy, xp, yp, a=1.0)
        graph.replay()
        (seg,) = _segments(graph)
        on_device = [b for b in seg.bound if b.worker.name == "cuda-emu0"]
        assert on_device and all(b.arrays is not None for b in seg.bound)  # bound once
        assert all(b.calls is not None for b in seg.bound if b.worker.kind == "cpu")
        copies = {(b.transfer.src.kind, b.transfer.dst.kind, b.worker.name) for b in seg.moves}
        assert copies == {("host", "cuda", "cuda-emu0"), ("cuda", "host", "cuda-emu0")}
        rt.trace(clear=True)
        graph.write(x, np.ones(12))
        within(60, graph.replay)
        np.testing.assert_array_equal(rt.fetch(x), np.full(12, 2.0))
        trace = rt.trace()
        records = trace.records
        assert {r.worker for r in records if r.codelet == "engine_device_boom"} == {"cuda-emu0"}
        assert sum(r.bytes_in for r in records) > 0  # copies between the nodes, per task
        assert {(t.src, t.dst) for t in trace.transfers} == {("host0", "cuda-emu0"),
                                                             ("cuda-emu0", "host0")}
        graph.write(x, np.full(12, 1e10))
        with pytest.raises(hn.TaskError, match="engine_device_boom.*on the device"):
            within(60, graph.replay)
        graph.write(x, np.ones(12))
        within(60, graph.replay)  # usable again
        np.testing.assert_array_equal(rt.fetch(x), np.full(12, 2.0))


@pytest.mark.parametrize("policy", ("eager", "heft"))
def test_grouped_dilated_convolutions_replay_compiled_bit_for_bit(policy):
    """A grouped convolution through the prepared im2col kernels (its geometry crosses
    the trampolines as a named tuple) beside a dilated, reflect-padded depthwise one (a
    variant without a prepare: Python in the replay)."""
    def train(replay):
        hn.manual_seed(4)
        model = hn.Sequential(hn.Conv2D(2, 4, 3, padding=2, dilation=2, groups=2,
                                        padding_mode="reflect"), hn.ReLU(), hn.MaxPool2D(2),
                              hn.Conv2D(4, 4, 3, groups=2, bias=False), hn.ReLU(),
                              hn.Flatten(), hn.Dense(4 * 3 * 3, 5))
        rng = np.random.default_rng(8)
        with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
            trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9),
                                 runtime=rt, batch_size=6, granularity=2, dtype="float64",
                                 replay=replay)
            losses = [trainer.train_step(rng.standard_normal((6, 2, 10, 10)),
                                         rng.integers(0, 5, 6)) for _ in range(4)]
            compiled = sum(b.calls is not None for g in trainer.graphs.values()
                           if g._compiled is not None for s in g._compiled.segments
                           for b in s.bound)
            return losses, model.state_dict(), compiled
    replayed, submitted = train(True), train(False)
    assert replayed[0] == submitted[0] and replayed[2] > 0
    for k, v in submitted[1].items():
        np.testing.assert_array_equal(replayed[1][k], v, err_msg=k)


def test_a_fault_of_the_engine_itself_is_a_task_error_and_nothing_hangs(monkeypatch):
    """Fault injection: a share whose runner raises (not a task: the engine) fails the
    replay with a TaskError, the other shares stop at their next task, no engine thread
    is lost (the next replays run on the same threads)."""
    from hetero_nn.scheduler.engine.segment import CompiledSegment

    with hn.Runtime(devices="cpu:3", perfmodel=False, variants=CPU_FIRST) as rt:
        h = rt.register(np.zeros(12))
        with rt.capture() as graph:
            for _ in range(3):
                for p in h.split(0, 6):
                    rt.submit(SCALE, p, factor=2.0)
                rt.submit(SCALE, h, factor=1.0)
        graph.replay()
        threads = rt._engine._threads
        run_share = CompiledSegment.run_share

        def broken(seg, share, *args):  # (epoch, and an early replay's gate)
            if share.worker.index == 1:
                raise RuntimeError("engine fault")
            return run_share(seg, share, *args)
        monkeypatch.setattr(CompiledSegment, "run_share", broken)
        with pytest.raises(hn.TaskError, match="replay engine failed: RuntimeError: engine "
                                               "fault"):
            within(60, graph.replay)
        monkeypatch.setattr(CompiledSegment, "run_share", run_share)
        graph.write(h, np.ones(12))
        within(60, graph.replay)
        np.testing.assert_array_equal(rt.fetch(h), np.full(12, 8.0))
        assert rt._engine._threads == threads and all(t.is_alive() for t in threads)
