"""The emulated CUDA device ``cuda-emu``: the CUDA worker path (streams, copies between
distinct buffers, prefetch, coherence, REDUX partials on the device, eviction) in CI.

The random programs of ``test_runtime_property`` run here on ``cpu:1,cuda-emu:1`` and
``cpu:2,cuda-emu:2`` under every policy, with codelets that also have a ``cuda``
variant (the same NumPy function, so the result must be bit-identical to the
sequential reference wherever a task runs).
"""

import threading
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import hetero_nn as hn
from hetero_nn import R, RW, W
from hetero_nn.arena.stream import EmulatedStream
from hetero_nn.scheduler.devices import parse_devices

import test_runtime_property as prop

EMU_DEVICES = ("cpu:1,cuda-emu:1", "cpu:2,cuda-emu:2")

# The property test's codelets, each with a ``cuda`` variant: its reference function.
CUDA_CODELETS = {name: hn.Codelet(name, modes=c.modes,
                                  variants={**c.variants, "cuda": c.variants["ref"]},
                                  init=c.init, redux=c.redux)
                 for name, c in prop.CODELETS.items()}


@pytest.fixture(scope="module")
def emu_runtimes():
    made = prop._Configurations()
    try:
        for devices in EMU_DEVICES:
            for policy in prop.POLICIES:
                made.append((f"{devices} {policy}",
                             hn.Runtime(devices=devices, policy=policy, seed=5)))
        yield made
    finally:
        for _, rt in made:
            rt.close()


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(program=prop.programs(made_roots=True))
def test_random_programs_on_emulated_devices_match_sequential_numpy(emu_runtimes, program):
    roots, splits, ops = program
    with mock.patch.dict(prop.CODELETS, CUDA_CODELETS):
        expected, expected_fetched = prop.run_reference(roots, splits, ops)
        for label, rt in emu_runtimes:
            got, got_fetched = prop.run_runtime(rt, roots, splits, ops)
            for i, (g, e) in enumerate(zip(got, expected)):
                np.testing.assert_array_equal(g, e, err_msg=f"{label}: root {i}")
            for i, (g, e) in enumerate(zip(got_fetched, expected_fetched)):
                np.testing.assert_array_equal(g, e, err_msg=f"{label}: fetch #{i}")


# ---------------------------------------------------------------- devices, workers, names
def test_spec_parses_emulated_devices():
    assert parse_devices("cpu:1,cuda-emu:2") == (1, [], 2)
    assert parse_devices("cuda-emu") == (0, [], 1)
    with pytest.raises(hn.DeviceError, match="cuda-emu:x"):
        parse_devices("cuda-emu:x")


def test_emulated_workers_are_cuda_workers_that_say_what_they_are():
    with hn.Runtime(devices="cpu:1,cuda-emu:2", perfmodel=False) as rt:
        kinds = [(w.name, w.kind, w.device, w.node.name) for w in rt.workers]
        assert kinds == [("cpu0", "cpu", "cpu", "host0"),
                         ("cuda-emu0", "cuda", "cuda-emu", "cuda-emu0"),
                         ("cuda-emu1", "cuda", "cuda-emu", "cuda-emu1")]
        assert "cuda-emu1" in repr(rt)
        only_cuda = hn.Codelet("emu_only", modes=(RW,), variants={"cuda": _double})
        h = rt.register(np.arange(6.0))
        for part in h.split(0, 3):
            rt.submit(only_cuda, part)
        np.testing.assert_array_equal(rt.fetch(h), 2 * np.arange(6.0))
        records = rt.trace().records
        assert {r.device for r in records} == {"cuda-emu"}
        assert {r.node for r in records} <= {"cuda-emu0", "cuda-emu1"}
        # distinct buffers: the device replica is not the host array
        node = rt.workers[1].node
        assert all(h.replica(node) is not h.replica(rt.nodes[0]) for h in [h])


def _double(x):
    x *= 2


def _copy(x, y):
    y[...] = x


def _where(x, y, out):
    out[...] = threading.current_thread().name.endswith("-stream")


# ---------------------------------------------------------------- streams
def test_emulated_stream_runs_in_order_asynchronously_with_events_and_callbacks():
    a, b = EmulatedStream("s0", 0), EmulatedStream("s1", 1)
    try:
        gate = threading.Event()
        order = []
        a.launch(gate.wait)                 # holds stream a until the host opens the gate
        a.launch(order.append, "a1")
        ev = a.record()
        b.wait_event(ev)                    # b's next work waits for a's first two items
        b.launch(order.append, "b1")
        done = threading.Event()
        b.add_callback(done.set)
        assert not ev.done and order == []  # launch returned at once: asynchronous
        gate.set()
        b.synchronize()
        assert done.is_set() and ev.done and order == ["a1", "b1"]
    finally:
        a.close()
        b.close()


def test_kernels_run_on_the_stream_and_the_worker_does_not_wait_for_each():
    where = hn.Codelet("emu_where", modes=(R, R, W), variants={"cuda": _where})
    with hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        x = rt.register(np.zeros(3))
        out = rt.register(np.zeros(3))
        rt.submit(where, x, x, out)
        assert rt.fetch(out).tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------- transfers
def test_device_to_device_and_back_with_every_byte_traced():
    copy = hn.Codelet("emu_copy", modes=(R, W), variants={"cuda": _copy})
    scale = hn.Codelet("emu_scale", modes=(RW,), variants={"cuda": _double})
    with hn.Runtime(devices="cuda-emu:2", policy="random", seed=1, perfmodel=False) as rt:
        x = rt.register(np.arange(8.0))
        y = rt.register(np.zeros(8))
        for _ in range(6):
            rt.submit(scale, x)
            rt.submit(copy, x, y)
        np.testing.assert_array_equal(rt.fetch(y), np.arange(8.0) * 64)
        trace = rt.trace()
        links = trace.links()
    assert trace.bytes_moved == sum(row["bytes"] for row in links.values())
    assert sum(r.bytes_in for r in trace) <= trace.bytes_moved
    assert ("cuda-emu1", "host0") in links or ("cuda-emu0", "host0") in links


# ---------------------------------------------------------------- memory limit
def test_graph_larger_than_the_device_limit_runs_with_eviction():
    scale = hn.Codelet("emu_scale_big", modes=(RW,), variants={"cuda": _double})
    add = hn.Codelet("emu_axpy_big", modes=(R, RW), variants={"cuda": lambda x, y: np.add(y, x, out=y)})
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(16_384) for _ in range(12)]  # 128 KiB each, 1.5 MiB in all
    with hn.Runtime(devices="cuda-emu:1", device_memory="512KiB", perfmodel=False) as rt:
        hs = [rt.register(a.copy()) for a in arrays]
        for _ in range(2):
            for i, h in enumerate(hs):
                rt.submit(scale, h)
                rt.submit(add, hs[i - 1], h)
        got = [rt.fetch(h, copy=True) for h in hs]
        node = rt.nodes[1]
        assert node.used <= node.limit
    expected = [a.copy() for a in arrays]
    for _ in range(2):
        for i, e in enumerate(expected):
            e *= 2
            e += expected[i - 1]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_task_that_cannot_fit_names_itself_and_the_bytes():
    scale = hn.Codelet("emu_scale_huge", modes=(RW,), variants={"cuda": _double})
    with hn.Runtime(devices="cuda-emu:1", device_memory={"cuda-emu0": "64KiB"},
                    perfmodel=False) as rt:
        h = rt.register(np.zeros(16_384))  # 128 KiB
        rt.submit(scale, h)
        with pytest.raises(hn.TaskError, match=r"emu_scale_huge.*131072 bytes.*limit 65536"):
            rt.wait()


def test_bad_device_memory_is_one_clear_line():
    with pytest.raises(hn.DeviceError, match="device_memory.*cuda7"):
        hn.Runtime(devices="cuda-emu:1", device_memory={"cuda7": "1GiB"}, perfmodel=False)
    with pytest.raises(hn.DeviceError, match="device_memory: memory size .3 parsecs."):
        hn.Runtime(devices="cuda-emu:1", device_memory="3 parsecs", perfmodel=False)


def _fail(x):
    raise FloatingPointError("kernel exploded")


def test_a_failing_kernel_on_the_stream_is_a_task_error_and_the_runtime_goes_on():
    fail = hn.Codelet("emu_fail", modes=(RW,), variants={"cuda": _fail})
    scale = hn.Codelet("emu_scale_after", modes=(RW,), variants={"cuda": _double})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        rt.submit(fail, h)
        rt.submit(scale, h)  # cancelled with the rest of that graph
        with pytest.raises(hn.TaskError, match=r"emu_fail.*cuda-emu0.*kernel exploded"):
            rt.wait()
        rt.submit(scale, h)
        np.testing.assert_array_equal(rt.fetch(h), np.full(4, 2.0))


def _trained_state(devices):
    """A nested model (a residual inside a residual's body, batch norms in both) trained two
    float64 steps on ``devices``: its and the optimizer's state read after the runtime closed
    (the reference, on ``cpu:1``, does not replay: the same bits, no trampolines to compile)."""
    inner = hn.Residual([hn.Conv2D(2, 2, 3, padding=1), hn.BatchNorm2D(2)])
    model = hn.Sequential(hn.Residual([hn.Conv2D(2, 2, 3, padding=1), hn.BatchNorm2D(2),
                                       hn.ReLU(), inner]), hn.Flatten(), hn.Dense(32, 3))
    model.reset_parameters(np.random.default_rng(0))
    initial = model.state_dict()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 2, 4, 4)), rng.integers(0, 3, 4)
    with hn.Runtime(devices=devices, deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.1, momentum=0.9), rt, batch_size=4,
                             dtype="float64", replay=devices != "cpu:1")  # cpu: no compile
        for _ in range(2):
            trainer.train_step(x, y)
    momenta = {k: v["momentum_buffer"] for k, v in trainer.optimizer.state_dict()["state"].items()}
    return initial, model.state_dict(), momenta


@pytest.mark.parametrize("devices", ["cuda-emu:1", "cpu:1,cuda-emu:1"])
def test_state_read_after_close_is_the_trained_one_at_any_nesting(devices):
    """``close`` writes every registered array back to the host: the weights, running
    statistics and momenta last written on the device (here those of nested layers)."""
    initial, ref, ref_momenta = _trained_state("cpu:1")
    _, got, momenta = _trained_state(devices)
    assert got.keys() == ref.keys() and "0.body.3.body.1.running_var" in got
    changed = {k for k in ref if not np.array_equal(ref[k], initial[k])}  # a stale copy fails
    assert {"0.body.1.weight", "0.body.3.body.1.weight", "0.body.3.body.1.running_mean",
            "0.body.3.body.0.weight", "2.weight"} <= changed
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=1e-12, err_msg=k)
    for k in ref_momenta:
        np.testing.assert_allclose(momenta[k], ref_momenta[k], rtol=0, atol=1e-12, err_msg=k)
