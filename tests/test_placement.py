"""Placement by the performance models: ``dmda`` and ``heft`` put each task where its
expected finish time (queue + transfers of missing inputs + predicted run time) is
lowest; ``eager`` ignores both.

The models are given by the test through :class:`~hetero_nn.PerfModel`'s public API
(many samples, so the few real measurements a run adds do not move them), on
``cpu:1,cuda-emu:1``: an emulated device is a CUDA worker with its own memory node.
"""

import time

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, RW, W

SAMPLES = 200
N = 4096  # float64 elements per handle: 32 KiB


def _touch(x, delay=0.0):
    time.sleep(delay)
    x += 1.0


def _fill(x):
    x[...] = 2.0


def _read(x, out):
    out[...] = x.sum()


TOUCH = hn.Codelet("place_touch", modes=(RW,), variants={"ref": _touch, "cuda": _touch})
FILL_ON_DEVICE = hn.Codelet("place_fill", modes=(W,), variants={"cuda": _fill})
READ = hn.Codelet("place_read", modes=(R, W), variants={"ref": _read, "cuda": _read})

FP = f"{N}:<f8"
OUT_FP = "1:<f8"


def _model(tmp_path, times, links=()):
    """A PerfModel holding ``times`` {(codelet, variant, kind, footprint): seconds} and
    ``links`` {(src, dst): seconds for N*8 and 2*N*8 bytes}."""
    pm = hn.PerfModel(tmp_path, load=False)
    for (codelet, variant, kind, fp), seconds in times.items():
        pm.record_many([(codelet, variant, kind, fp, 1.0, seconds)] * SAMPLES)
    for (src, dst), seconds in dict(links).items():
        for _ in range(SAMPLES):
            pm.record_transfer(src, dst, 8 * N, seconds)
            pm.record_transfer(src, dst, 16 * N, 2 * seconds)
    return pm


def _placement(rt):
    return [r.worker for r in sorted(rt.trace(clear=True), key=lambda r: r.task_id)]


@pytest.mark.parametrize("policy", ["dmda", "heft"])
def test_a_codelet_modelled_ten_times_faster_on_the_device_goes_there(tmp_path, policy):
    pm = _model(tmp_path, {("place_touch", "ref", "cpu", FP): 1e-2,
                           ("place_touch", "cuda", "cuda", FP): 1e-3})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy=policy, perfmodel=pm) as rt:
        hs = [rt.register(np.zeros(N)) for _ in range(6)]
        for h in hs:
            rt.submit(TOUCH, h)
        rt.wait()
        assert _placement(rt) == ["cuda-emu0"] * 6
        for h in hs:
            np.testing.assert_array_equal(rt.fetch(h), np.ones(N))


@pytest.mark.parametrize("policy", ["dmda", "heft"])
def test_a_queue_long_enough_sends_work_to_the_slower_worker(tmp_path, policy):
    """Twenty tasks at 10 ms on the device vs 30 ms on the CPU: the CPU's share is what
    equalises the finish times (dmda and heft agree on 5 of 20). The tasks are placed
    together (``overlap=False``): streamed, dmda would see them finish at once (they take
    no real time), so the CPU's share would depend on timing."""
    pm = _model(tmp_path, {("place_touch", "ref", "cpu", FP): 3e-2,
                           ("place_touch", "cuda", "cuda", FP): 1e-2})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy=policy, perfmodel=pm,
                    overlap=False) as rt:
        for _ in range(20):
            rt.submit(TOUCH, rt.register(np.zeros(N)))
        rt.wait()
        placed = _placement(rt)
    assert placed.count("cpu0") == 5, placed


@pytest.mark.parametrize("policy", ["dmda", "heft"])
@pytest.mark.parametrize("where", ["device", "host"])
def test_a_task_goes_where_its_input_lives_when_transfers_dominate(tmp_path, policy, where):
    times = {("place_read", "ref", "cpu", f"{FP}|{OUT_FP}"): 1e-4,
             ("place_read", "cuda", "cuda", f"{FP}|{OUT_FP}"): 1e-4}
    links = {("cuda-emu0", "host0"): 0.5, ("host0", "cuda-emu0"): 0.5}  # a slow link
    pm = _model(tmp_path, times, links)
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy=policy, perfmodel=pm) as rt:
        x = rt.empty((N,), "float64")
        if where == "device":
            rt.submit(FILL_ON_DEVICE, x)  # x valid on cuda-emu0 only
            rt.wait()
        else:
            x = rt.register(np.full(N, 2.0))  # x valid on host0 only
        outs = [rt.empty((1,), "float64") for _ in range(3)]
        rt.trace(clear=True)
        for out in outs:
            rt.submit(READ, x, out)
        rt.wait()
        expected = "cuda-emu0" if where == "device" else "cpu0"
        assert _placement(rt) == [expected] * 3
        for out in outs:
            assert rt.fetch(out)[0] == 2.0 * N


@pytest.mark.parametrize("policy", ["dmda", "heft"])
def test_placement_does_not_wait_for_a_handle_lock(tmp_path, policy):
    """A policy places tasks under the executor's lock; it reads where a handle is valid
    without the handle's lock. (A transfer holds that lock while it waits for a stream,
    whose completion callback needs the executor's lock: waiting for it there was a
    deadlock seen with cuda-emu workers under dmda.)"""
    import threading

    times = {("place_read", "ref", "cpu", f"{FP}|{OUT_FP}"): 1e-4,
             ("place_read", "cuda", "cuda", f"{FP}|{OUT_FP}"): 1e-4}
    pm = _model(tmp_path, times, {("cuda-emu0", "host0"): 0.5, ("host0", "cuda-emu0"): 0.5})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy=policy, perfmodel=pm) as rt:
        x = rt.empty((N,), "float64")
        rt.submit(FILL_ON_DEVICE, x)
        rt.wait()
        part = x.split(0, 2)[0]  # a partitioned root keeps validity per cell, under its lock
        task = rt.submit(READ, part, rt.empty((1,), "float64"))
        policy_object = rt.executor.policy
        placed = threading.Event()

        def place():
            if policy == "heft":
                policy_object.prepare([task])
            policy_object.push(task, None)
            placed.set()

        with x.root._lock:  # as a transfer of x in progress holds it
            threading.Thread(target=place, daemon=True).start()
            assert placed.wait(5.0), "placement waited for the handle's lock"
        for w in rt.workers:  # undo the trial placement: the flush places the task again
            w.queue.clear()
            w.queued_work = 0.0
        assert part.valid_hint == part.valid == {1}
        rt.wait()


def test_eager_ignores_models_and_transfers(tmp_path):
    """The same models as above, but eager's shared queue feeds whichever worker is free."""
    pm = _model(tmp_path, {("place_touch", "ref", "cpu", FP): 1e-2,
                           ("place_touch", "cuda", "cuda", FP): 1e-3})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy="eager", perfmodel=pm) as rt:
        for _ in range(8):
            rt.submit(TOUCH, rt.register(np.zeros(N)), delay=0.01)
        rt.wait()
        placed = _placement(rt)
    assert set(placed) == {"cpu0", "cuda-emu0"}, placed


def test_prefetched_bytes_are_counted_per_link(tmp_path):
    """A prefetch (what dmda does for a task a worker releases to another node) copies on
    the target's stream; its bytes are in the trace's links though no task's
    ``bytes_in`` shows them, and the task then finds its input in place (``overlap=False``:
    the tasks run at the fetch, after the test's prefetches)."""
    pm = _model(tmp_path, {("place_touch", "ref", "cpu", FP): 1e-2,
                           ("place_touch", "cuda", "cuda", FP): 1e-3})
    with hn.Runtime(devices="cpu:1,cuda-emu:1", policy="dmda", perfmodel=pm,
                    overlap=False) as rt:
        hs = [rt.register(np.zeros(N)) for _ in range(3)]
        device = rt.workers[1].node
        for h in hs:
            rt.prefetch(rt.submit(TOUCH, h), device)
        for h in hs:
            np.testing.assert_array_equal(rt.fetch(h), np.ones(N))
        trace = rt.trace()
    assert [r.worker for r in trace] == ["cuda-emu0"] * 3
    assert sum(r.bytes_in for r in trace) == 0  # found in place: prefetched
    links = trace.links()
    assert links[("host0", "cuda-emu0")] == {"bytes": 3 * 8 * N, "copies": 3,
                                              "seconds": links[("host0", "cuda-emu0")]["seconds"]}
    assert links[("cuda-emu0", "host0")]["bytes"] == 3 * 8 * N
    assert trace.bytes_moved == 6 * 8 * N
