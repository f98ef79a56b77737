"""The runtime core: public surface, dependencies, REDUX bit-identity, arenas, failures,
misuse, traces and performance-model-driven variant choice.

Random programs against a sequential NumPy run live in ``test_runtime_property.py``.
Codelets are module-level functions so ``distributed`` workers can unpickle them.
"""

import json
import threading
import time

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, SCRATCH, W
from hetero_nn.codelets._jit import jit

POLICIES = ("eager", "random", "ws", "dmda", "heft")
SLOW = 0.02  # seconds a "slow" task sleeps: long enough for a missing dependency to show


# ---------------------------------------------------------------- codelets
def _fill(x, value, delay=0.0):
    time.sleep(delay)
    x[...] = value


def _copy(x, y, delay=0.0):
    time.sleep(delay)
    y[...] = x


def _add(x, amount, delay=0.0):
    time.sleep(delay)
    x += amount


def _scale_ref(x, factor):
    x *= factor


@jit
def _scale_kernel(x, factor):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] *= factor


def _scale_numba(x, factor):
    # the factor in the array's dtype, as NumPy does with a Python float (NEP 50)
    _scale_kernel(x if x.ndim == 2 else x.reshape(1, -1), x.dtype.type(factor))


def _boom(x):
    raise ValueError("boom: the codelet failed on purpose")


def _zero(partial):
    partial[...] = 0


def _sum_into(dst, src):
    dst += src


def _acc_row(part, acc):
    acc += part[0]


def _acc_scratch(part, scratch, acc, delay=0.0):
    time.sleep(delay)
    np.multiply(part, 2, out=scratch)
    acc += scratch


def _work_fast(x):
    x += 1.0


def _work_slow(x):
    time.sleep(0.003)
    x += 1.0


FILL = hn.Codelet("fill", modes=(W,), variants={"ref": _fill})
COPY = hn.Codelet("copy", modes=(R, W), variants={"ref": _copy})
ADD = hn.Codelet("add", modes=(RW,), variants={"ref": _add})
SCALE = hn.Codelet("scale", modes=(RW,), variants={"ref": _scale_ref, "cpu": _scale_numba})
BOOM = hn.Codelet("boom", modes=(RW,), variants={"ref": _boom})
ACC_ROW = hn.Codelet("acc_row", modes=(R, REDUX), variants={"ref": _acc_row},
                     init=_zero, redux=_sum_into)
ACC_SCRATCH = hn.Codelet("acc_scratch", modes=(R, SCRATCH, REDUX), variants={"ref": _acc_scratch},
                         init=_zero, redux=_sum_into)
TWO_VARIANTS = hn.Codelet("two_variants", modes=(RW,),
                          variants={"cpu:slow": _work_slow, "cpu:fast": _work_fast})


def _local_configs(workers=(1, 2, 3), host_nodes=(1, 2)):
    return [dict(devices=f"cpu:{n}", policy=p, host_nodes=k)
            for n in workers for p in POLICIES for k in host_nodes]


def _label(cfg):
    return ",".join(f"{k}={v}" for k, v in cfg.items())


def _check_times(records):
    for r in records:
        assert r.submit <= r.ready <= r.start <= r.end, r


# ---------------------------------------------------------------- public surface
def test_issue_example_runs_and_keywords_reach_the_variant():
    data = np.arange(10.0)
    with hn.Runtime(devices="cpu:2", policy="dmda", executor="local", perfmodel=False) as rt:
        h = rt.register(data)
        parts = h.split(axis=0, n=4)
        assert [p.shape for p in parts] == [(3,), (3,), (2,), (2,)]  # numpy.array_split sizes
        rt.submit(SCALE, parts[1], factor=2.0)
        rt.wait()
        out = rt.fetch(h)
        np.testing.assert_array_equal(out, np.r_[0, 1, 2, 6, 8, 10, 6, 7, 8, 9])
        assert len(rt.trace()) == 1
    with pytest.raises(hn.SubmitError, match="closed"):
        rt.submit(SCALE, h, factor=2.0)


def test_split_is_nestable_and_returns_views():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        h = rt.register(np.zeros((5, 4)))
        rows = h.split(axis=0, n=2)
        assert h.split(axis=0, n=2) is rows  # one partitioning per handle
        with pytest.raises(ValueError, match="already split"):
            h.split(axis=1, n=2)
        cols = rows[0].split(axis=1, n=3)
        assert [c.shape for c in cols] == [(3, 2), (3, 1), (3, 1)]
        for i, c in enumerate(cols):
            rt.submit(FILL, c, value=float(i + 1))
        rt.submit(FILL, rows[1], value=-1.0)
        np.testing.assert_array_equal(rt.fetch(h), [[1, 1, 2, 3]] * 3 + [[-1] * 4] * 2)
        with pytest.raises(ValueError, match="cannot split"):
            cols[2].split(axis=1, n=2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_numba_and_reference_variants_agree(dtype):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((6, 5)).astype(dtype)
    results = {}
    for variant in ("ref", "cpu"):
        with hn.Runtime(devices="cpu:2", variants=(variant,), perfmodel=False) as rt:
            h = rt.register(data.copy())
            for part in h.split(axis=1, n=3):  # non-contiguous views
                rt.submit(SCALE, part, factor=1.7)
            results[variant] = rt.fetch(h, copy=True)
            assert {r.variant for r in rt.trace()} == {variant}
    np.testing.assert_array_equal(results["ref"], results["cpu"])
    np.testing.assert_array_equal(results["ref"], data * np.asarray(1.7, dtype))


def test_empty_handle_written_then_read():
    for executor in ("local", "dask"):
        with hn.Runtime(devices="cpu:2", executor=executor, perfmodel=False) as rt:
            h = rt.empty((4, 3), "float32")
            out = rt.register(np.zeros((4, 3), np.float32))
            for i, part in enumerate(h.split(axis=0, n=2)):
                rt.submit(FILL, part, value=float(i))
            rt.submit(COPY, h, out)
            np.testing.assert_array_equal(rt.fetch(out), [[0] * 3] * 2 + [[1] * 3] * 2)


def test_distributed_executor_starts_and_closes_its_own_cluster():
    with hn.Runtime(devices="cpu:1", executor="distributed", perfmodel=False) as rt:
        h = rt.register(np.arange(6.0))
        for part in h.split(axis=0, n=3):
            rt.submit(SCALE, part, factor=-2.0)
        np.testing.assert_array_equal(rt.fetch(h), -2 * np.arange(6.0))
        client = rt.executor.client
        assert len(client.scheduler_info()["workers"]) == 1
    assert client.status == "closed"


# ---------------------------------------------------------------- dependencies
def _dependency_program(rt):
    """RAW, WAR, WAW and parent/child conflicts; slow first accesses expose a missing edge.

    Returns the handles to check and the tasks whose dependencies the trace must show.
    """
    x = rt.register(np.zeros(4))
    y = rt.register(np.zeros(4))
    root = rt.register(np.zeros(8))
    c0, c1 = root.split(axis=0, n=2)
    g0, g1 = c0.split(axis=0, n=2)
    outs = [rt.register(np.full(8, -1.0)) for _ in range(3)]
    small = rt.register(np.full(2, -1.0))
    t = {}
    t["raw_w"] = rt.submit(FILL, x, value=5.0, delay=SLOW)
    t["raw_r"] = rt.submit(COPY, x, y)                      # RAW: y == 5
    t["waw_1"] = rt.submit(ADD, y, amount=1.0, delay=SLOW)  # y == 6
    t["waw_2"] = rt.submit(FILL, y, value=7.0)               # WAW: y == 7 at the end
    t["war_r"] = rt.submit(COPY, root, outs[0], delay=SLOW)  # reads zeros
    t["war_w"] = rt.submit(FILL, c0, value=9.0)              # WAR across levels
    t["child_w"] = rt.submit(FILL, g1, value=3.0, delay=SLOW)
    t["parent_r"] = rt.submit(COPY, root, outs[1])           # child write -> parent read
    t["parent_w"] = rt.submit(FILL, root, value=4.0, delay=SLOW)
    t["grandchild_r"] = rt.submit(COPY, g0, small)           # parent write -> grandchild read
    t["sibling_w"] = rt.submit(FILL, c1, value=6.0)          # after parent_w (WAW)
    t["other_sibling"] = rt.submit(ADD, g1, amount=1.0)      # independent of sibling_w
    t["final_r"] = rt.submit(COPY, root, outs[2])
    expected = {
        "x": np.full(4, 5.0), "y": np.full(4, 7.0),
        "out0": np.zeros(8),
        "out1": np.r_[9, 9, 3, 3, 0, 0, 0, 0],
        "small": np.full(2, 4.0),
        "out2": np.r_[4, 4, 5, 5, 6, 6, 6, 6],
    }
    handles = {"x": x, "y": y, "out0": outs[0], "out1": outs[1], "small": small,
               "out2": outs[2]}
    return handles, expected, t


EDGES = [("raw_w", "raw_r"), ("raw_r", "waw_1"), ("waw_1", "waw_2"), ("war_r", "war_w"),
         ("war_w", "child_w"), ("child_w", "parent_r"), ("parent_r", "parent_w"),
         ("parent_w", "grandchild_r"), ("parent_w", "sibling_w"), ("parent_w", "other_sibling"),
         ("sibling_w", "final_r"), ("other_sibling", "final_r"), ("parent_w", "final_r")]
NO_EDGES = [("sibling_w", "other_sibling"), ("grandchild_r", "other_sibling"),  # disjoint
            ("raw_w", "war_r"), ("waw_2", "final_r")]                           # other handles


@pytest.mark.parametrize("cfg", _local_configs(workers=(2, 3)), ids=_label)
def test_dependencies_local(cfg):
    with hn.Runtime(**cfg) as rt:
        handles, expected, tasks = _dependency_program(rt)
        rt.wait()
        for name, h in handles.items():
            np.testing.assert_array_equal(rt.fetch(h), expected[name], err_msg=name)
        records = {r.task_id: r for r in rt.trace()}
    _check_times(records.values())
    for a, b in EDGES:
        ra, rb = records[tasks[a].id], records[tasks[b].id]
        assert ra.task_id in rb.deps, (a, b, rb.deps)
        assert rb.start >= ra.end, (a, b)
    for a, b in NO_EDGES:
        assert tasks[a].id not in records[tasks[b].id].deps, (a, b)


@pytest.mark.parametrize("executor", ["dask", "distributed"])
def test_dependencies_dask(executor, dist_client):
    with hn.Runtime(devices="cpu:2", executor=dist_client if executor == "distributed"
                    else executor) as rt:
        handles, expected, _ = _dependency_program(rt)
        for name, h in handles.items():
            np.testing.assert_array_equal(rt.fetch(h), expected[name], err_msg=name)
        _check_times(rt.trace())


# ---------------------------------------------------------------- REDUX bit-identity
def _order_sensitive_rows(rng, nparts, width):
    """float32 rows of mixed magnitudes whose tree sum differs from the left-to-right sum."""
    while True:
        mags = 10.0 ** rng.integers(-3, 8, size=(nparts, width))
        rows = (rng.choice([-1.0, 1.0], size=(nparts, width)) * mags
                * rng.uniform(1, 2, size=(nparts, width))).astype(np.float32)
        init = rng.standard_normal(width).astype(np.float32)
        tree = _tree(list(rows))
        sequential = rows[0].copy()
        for r in rows[1:]:
            sequential += r
        if np.any(tree != sequential):
            return rows, init, init + tree


def _tree(parts):
    parts = [p.copy() for p in parts]
    step = 1
    while step < len(parts):
        for i in range(0, len(parts) - step, 2 * step):
            parts[i] += parts[i + step]
        step *= 2
    return parts[0]


def test_redux_is_bit_identical_everywhere(dist_client):
    rng = np.random.default_rng(2024)
    nparts, width = 13, 16
    rows, init, expected = _order_sensitive_rows(rng, nparts, width)
    configs = [dict(executor="local", **c) for c in _local_configs()]
    configs += [dict(devices="cpu:2", executor="dask"), dict(devices="cpu:2", executor=dist_client),
                dict(devices="cpu:3", executor="dask", host_nodes=2)]
    seen = set()
    for cfg in configs:
        with hn.Runtime(**cfg) as rt:
            x = rt.register(rows.copy())
            acc = rt.register(init.copy())
            for part in x.split(axis=0, n=nparts):
                rt.submit(ACC_ROW, part, acc)
            got = rt.fetch(acc, copy=True)
            assert got.tobytes() == expected.tobytes(), cfg
            seen.add(got.tobytes())
    assert len(seen) == 1


def test_redux_combines_before_the_next_access_and_at_wait():
    with hn.Runtime(devices="cpu:3", policy="ws", perfmodel=False) as rt:
        x = rt.register(np.arange(12.0).reshape(6, 2))
        acc = rt.register(np.ones(2))
        out = rt.register(np.zeros(2))
        parts = x.split(axis=0, n=6)
        for p in parts[:3]:
            rt.submit(ACC_ROW, p, acc)
        rt.submit(COPY, acc, out)          # a read: combines the three partials first
        for p in parts[3:]:
            rt.submit(ACC_ROW, p, acc)     # combined at wait
        rt.wait()
        np.testing.assert_array_equal(rt.fetch(out), 1 + x_rows_sum(0, 3))
        np.testing.assert_array_equal(rt.fetch(acc), 1 + x_rows_sum(0, 6))


def _acc_max_min(a, b, x):
    a += x.max()
    b += x.min()


ACC_MAX_MIN = hn.Codelet("acc_max_min", modes=(REDUX, REDUX, R), variants={"ref": _acc_max_min},
                         init=_zero, redux=_sum_into)


@pytest.mark.parametrize("executor", ["local", "dask"])
def test_redux_operands_of_one_family_in_one_task(executor):
    """Two REDUX siblings and an R sibling in one task: no task's partial is combined
    before the task itself (the graph stays topological, heft can rank it)."""
    with hn.Runtime(devices="cpu:2", policy="heft", executor=executor, perfmodel=False) as rt:
        root = rt.register(np.zeros(6))
        a, b, x = root.split(axis=0, n=3)
        src = rt.register(np.arange(4.0))
        rt.submit(FILL, x, value=2.0)
        for part in src.split(axis=0, n=4):
            rt.submit(ACC_MAX_MIN, a, b, part)
        rt.submit(ACC_MAX_MIN, a, b, x)  # R sibling after the REDUX ones
        # a, b == 0+1+2+3 + 2 == 8 once combined; reading b combines the family first
        rt.submit(ACC_MAX_MIN, a, x, b)
        np.testing.assert_array_equal(rt.fetch(root), [16, 16, 8, 8, 10, 10])


def x_rows_sum(a, b):
    return np.arange(12.0).reshape(6, 2)[a:b].sum(axis=0)


# ---------------------------------------------------------------- arenas and temporaries
def test_repeated_program_makes_no_new_block_allocation():
    rng = np.random.default_rng(3)
    n = 1 << 16  # 256 KiB float32 rows: partials, scratch buffers and a temporary per run
    data = rng.standard_normal((8, n)).astype(np.float32)
    with hn.Runtime(devices="cpu:2", policy="eager", host_nodes=2, perfmodel=False) as rt:
        x = rt.register(data)
        acc = rt.register(np.zeros((1, n), np.float32))
        scratch = rt.empty((1, n), "float32")  # one handle: each task gets a private buffer
        parts = x.split(axis=0, n=8)
        blocks, nodes, stale = [], [], None
        for run in range(4):
            tmp = rt.temporary((1, n), "float32", name=f"tmp{run}")
            rt.submit(FILL, tmp, value=float(run))
            for p in parts:
                rt.submit(ACC_SCRATCH, p, scratch, acc, delay=0.002)
            rt.submit(COPY, acc, tmp)
            rt.wait()
            np.testing.assert_array_equal(rt.fetch(tmp), rt.fetch(acc))  # until the next flush
            if stale is not None:
                with pytest.raises(hn.SubmitError, match="earlier flush"):
                    rt.submit(FILL, stale, value=0.0)
            stale = tmp
            stats = rt.arena_stats()
            assert all(s.allocations > 0 for s in stats.values()), stats
            blocks.append({name: s.block_allocations for name, s in stats.items()})
            nodes.append({r.node for r in rt.trace(clear=True)})
        tree = _tree(list(2 * data.reshape(8, 1, n)))
        expected = tree.copy()
        for _ in range(3):
            expected += tree
        np.testing.assert_array_equal(rt.fetch(acc), expected)
    assert nodes[0] == {"host0", "host1"}  # both arenas served the first run
    assert blocks[1:] == blocks[:1] * 3, blocks


def test_stale_temporary_is_refused_at_fetch():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        tmp = rt.temporary((3,), "float64")
        rt.submit(FILL, tmp, value=2.0)
        np.testing.assert_array_equal(rt.fetch(tmp), [2.0, 2.0, 2.0])
        rt.submit(FILL, rt.register(np.zeros(1)), value=1.0)
        rt.wait()
        with pytest.raises(hn.SubmitError, match="earlier flush"):
            rt.fetch(tmp)


# ---------------------------------------------------------------- failures
def _failing_graph(rt):
    x = rt.register(np.zeros(3))
    others = [rt.register(np.zeros(3)) for _ in range(2)]
    rt.submit(FILL, x, value=1.0)
    bad = rt.submit(BOOM, x)
    after = [rt.submit(ADD, x, amount=10.0), rt.submit(COPY, x, others[0])]
    return x, others, bad, after


@pytest.mark.parametrize("executor", ["local", "dask", "distributed"])
def test_failing_codelet_raises_task_error_and_runtime_stays_usable(executor, dist_client):
    spec = dist_client if executor == "distributed" else executor
    with hn.Runtime(devices="cpu:2", executor=spec, perfmodel=False) as rt:
        x, others, bad, after = _failing_graph(rt)
        with pytest.raises(hn.TaskError) as info:
            rt.wait()
        err = info.value
        assert err.codelet == "boom" and err.task_id == bad.id
        assert "boom" in str(err) and f"task {bad.id}" in str(err)
        if executor != "distributed":  # the cause does not cross processes
            assert isinstance(err.__cause__, ValueError)
        assert rt.fetch(x)[0] in (0.0, 1.0)            # the +10 never ran
        assert rt.fetch(others[0])[0] == 0.0             # nor the copy after it
        ran = {r.task_id for r in rt.trace()}
        assert not ran & {t.id for t in after}
        rt.wait()  # nothing pending, nothing re-raised
        rt.submit(ADD, x, amount=2.0)
        rt.submit(COPY, x, others[1])
        np.testing.assert_array_equal(rt.fetch(others[1]), rt.fetch(x))
        assert rt.fetch(x)[0] in (2.0, 3.0)


def test_failure_cancels_the_queued_rest_of_the_graph():
    """One worker, FIFO: every task queued behind the failing one is cancelled."""
    with hn.Runtime(devices="cpu:1", policy="eager", perfmodel=False) as rt:
        x = rt.register(np.zeros(2))
        bad = rt.submit(BOOM, x)
        independent = [rt.register(np.zeros(2)) for _ in range(5)]
        for h in independent:
            rt.submit(ADD, h, amount=1.0)
        with pytest.raises(hn.TaskError):
            rt.wait()
        (record,) = rt.trace().records
        assert record.task_id == bad.id and "ValueError" in record.error
        assert all(rt.fetch(h)[0] == 0.0 for h in independent)


def test_no_thread_leaks_local_and_dask():
    def alive():
        return {t for t in threading.enumerate()}

    before = alive()
    for executor in ("local", "dask"):
        for policy in POLICIES:
            rt = hn.Runtime(devices="cpu:3", policy=policy, executor=executor, perfmodel=False)
            x, *_ = _failing_graph(rt)
            with pytest.raises(hn.TaskError):
                rt.wait()
            rt.submit(ADD, x, amount=1.0)
            rt.wait()
            rt.close()
            rt.close()  # idempotent
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        leaked = [t for t in alive() - before if t.is_alive()]
        if not leaked:
            break
        time.sleep(0.05)
    assert not leaked, leaked
    assert not [t for t in threading.enumerate() if t.name.startswith("hetero_nn")]


# ---------------------------------------------------------------- misuse
def test_misuse_is_reported_at_submit_time():
    base = threading.active_count()
    with pytest.raises(hn.PolicyError, match="nope"):
        hn.Runtime(devices="cpu:2", policy="nope")
    with pytest.raises(hn.DeviceError, match="tpu"):
        hn.Runtime(devices="tpu:1")
    with pytest.raises(hn.DeviceError, match="CuPy"):
        hn.Runtime(devices="cpu:1,cuda:0")
    with pytest.raises(hn.DeviceError):
        hn.Runtime(devices="cpu:1", executor="nonsense")
    with pytest.raises(hn.DeviceError):
        hn.Runtime(devices="cpu:1", host_nodes=0)
    assert threading.active_count() == base  # nothing started for a refused runtime

    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt, \
            hn.Runtime(devices="cpu:1", perfmodel=False) as other:
        h = rt.register(np.zeros(3))
        foreign = other.register(np.zeros(3))
        with pytest.raises(hn.SubmitError, match="another Runtime"):
            rt.submit(COPY, foreign, h)
        with pytest.raises(hn.SubmitError, match="expected a Handle"):
            rt.submit(COPY, np.zeros(3), h)
        with pytest.raises(hn.SubmitError, match=r"'copy' declares 2 operand\(s\).*with 1"):
            rt.submit(COPY, h)
        with pytest.raises(hn.SubmitError, match="numpy.ndarray"):
            rt.register([1.0, 2.0])
        with pytest.raises(hn.SubmitError, match="not a handle of this Runtime"):
            rt.fetch(foreign)
        cuda_only = hn.Codelet("cuda_only", modes=(RW,), variants={"cuda": _scale_ref})
        with pytest.raises(hn.SubmitError, match="cuda_only"):
            rt.submit(cuda_only, h, factor=2.0)
        rt.wait()
        assert rt.trace().records == []  # nothing refused ever ran
    for call in (lambda: rt.submit(FILL, h, value=1.0), lambda: rt.register(np.zeros(1)),
                 rt.wait, lambda: rt.temporary((2,))):
        with pytest.raises(hn.SubmitError, match="closed"):
            call()


# ---------------------------------------------------------------- traces
def test_trace_records_transfers_across_host_nodes(tmp_path):
    with hn.Runtime(devices="cpu:2", policy="eager", host_nodes=2, perfmodel=False) as rt:
        xs = [rt.register(np.full(64, float(i))) for i in range(16)]
        ys = [rt.register(np.zeros(64)) for _ in range(16)]
        for x, y in zip(xs, ys):
            rt.submit(COPY, x, y, delay=0.002)
        for i, y in enumerate(ys):
            np.testing.assert_array_equal(rt.fetch(y), np.full(64, float(i)))
        trace = rt.trace()
        path = trace.to_chrome(tmp_path / "trace.json")
        empty = rt.trace(clear=True)
        assert len(empty) == 16 and len(rt.trace()) == 0
    records = trace.records
    assert len(records) == 16
    _check_times(records)
    node_of = {"cpu0": "host0", "cpu1": "host1"}
    for r in records:
        assert (r.codelet, r.variant, r.device) == ("copy", "ref", "cpu")
        assert r.node == node_of[r.worker]
        assert r.bytes_in == (64 * 8 if r.node == "host1" else 0), r  # x lives on host0
    assert {r.worker for r in records} == {"cpu0", "cpu1"}
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "transfer"]
    assert len(spans) == 16 and {e["name"] for e in spans} == {"copy"}
    copies = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "transfer"]
    assert sum(e["args"]["bytes"] for e in copies) == trace.bytes_moved >= sum(
        r.bytes_in for r in records)  # copies back to host0 (fetch) are counted too


def test_trace_off_records_nothing():
    with hn.Runtime(devices="cpu:2", trace=False, perfmodel=False) as rt:
        h = rt.register(np.zeros(2))
        rt.submit(ADD, h, amount=1.0)
        np.testing.assert_array_equal(rt.fetch(h), [1.0, 1.0])
        assert len(rt.trace()) == 0


def test_dask_trace_exports(tmp_path):
    with hn.Runtime(devices="cpu:2", executor="dask", perfmodel=False) as rt:
        h = rt.register(np.zeros(4))
        for part in h.split(0, 2):
            rt.submit(ADD, part, amount=1.0)
        rt.wait()
        trace = rt.trace()
    assert len(trace) == 2
    _check_times(trace)
    doc = json.loads(trace.to_chrome(tmp_path / "dask.json").read_text())
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 2


# ---------------------------------------------------------------- performance models
def _run_two_variants(rt, flushes=4, per_flush=10):
    hs = [rt.register(np.zeros(8)) for _ in range(flushes * per_flush)]
    for f in range(flushes):
        for h in hs[f * per_flush:(f + 1) * per_flush]:
            rt.submit(TWO_VARIANTS, h)
        rt.wait()
    assert all(rt.fetch(h)[0] == 1.0 for h in hs)
    return [r.variant for r in rt.trace()]


def test_perfmodel_picks_the_faster_variant_after_exploring(tmp_path):
    with hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=hn.PerfModel(tmp_path)) as rt:
        ran = _run_two_variants(rt)
    assert "cpu:slow" in ran[:10] and "cpu:fast" in ran[:10]  # both explored first
    late = ran[20:]
    assert late.count("cpu:fast") >= 0.9 * len(late), ran
    assert list((tmp_path / "perfmodels").rglob("*.json"))  # saved at close


def test_deterministic_always_runs_the_first_variant(tmp_path):
    with hn.Runtime(devices="cpu:2", deterministic=True, perfmodel=hn.PerfModel(tmp_path)) as rt:
        ran = _run_two_variants(rt, flushes=2, per_flush=6)
    assert set(ran) == {"cpu:slow"}


def test_perfmodel_path_and_false(tmp_path):
    with hn.Runtime(devices="cpu:1", perfmodel=str(tmp_path)) as rt:
        assert isinstance(rt.perfmodel, hn.PerfModel)
        _run_two_variants(rt, flushes=1, per_flush=6)
    assert list((tmp_path / "perfmodels").rglob("*.json"))
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        assert rt.perfmodel is None
        assert set(_run_two_variants(rt, flushes=1, per_flush=3)) == {"cpu:slow"}


def test_a_task_writing_a_handle_and_its_partition_is_refused():
    """Parent and child written by one task would alias in place but not in the Dask graph."""
    copy = hn.Codelet("copy_into", modes=(hn.R, hn.W),
                      variants={"ref": lambda src, dst: np.copyto(dst, src)})
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        h = rt.register(np.arange(8.0))
        left, right = h.split(0, 2)
        with pytest.raises(hn.SubmitError, match=r"operands 0 .* and 1 .* overlap"):
            rt.submit(copy, h, left)
        rt.submit(copy, left, right)            # siblings are disjoint
        same = hn.Codelet("scale_into", modes=(hn.R, hn.W),
                          variants={"ref": lambda src, dst: np.multiply(src, 2.0, out=dst)})
        rt.submit(same, h, h)                   # one handle twice: in place, allowed
        np.testing.assert_array_equal(rt.fetch(h), [0, 2, 4, 6, 0, 2, 4, 6])


def test_variant_preferences_per_codelet():
    """``variants`` as a mapping pins codelets by name, with "*" for the others."""
    def fill(value):
        def variant(x):
            x[...] = value
        return variant

    a = hn.Codelet("pref_a", modes=(hn.W,), variants={"ref": fill(1), "cpu": fill(2)})
    b = hn.Codelet("pref_b", modes=(hn.W,), variants={"ref": fill(3), "cpu": fill(4)})
    with hn.Runtime(devices="cpu:1", perfmodel=False,
                    variants={"*": ("cpu",), "pref_b": "ref"}) as rt:
        ha, hb = rt.empty((2,), "float64"), rt.empty((2,), "float64")
        rt.submit(a, ha)
        rt.submit(b, hb)
        assert rt.fetch(ha).tolist() == [2, 2] and rt.fetch(hb).tolist() == [3, 3]
        assert rt.candidates(a, "cpu") == ("cpu",) and rt.candidates(b, "cpu") == ("ref",)
