"""Lifetimes of a flush's temporaries (scheduler/lifetimes.py) on random programs: released
temporaries share bytes with later ones, every task of a later one follows every task of
the earlier one (checked on the DAG), results equal sequential NumPy in a capture, its
replays and a flush that does not stream, and per-task allocation gives the same."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetero_nn as hn
from hetero_nn import R, RW, W


def _fill(x, value):
    x[...] = value


def _acc(src, dst, scale):
    dst += scale * src.sum()


FILL = hn.Codelet("test_fill", modes=(W,), variants={"ref": _fill, "cuda": _fill})
ACC = hn.Codelet("test_acc", modes=(R, RW), variants={"ref": _acc, "cuda": _acc})


@st.composite
def programs(draw):
    """``(sizes, ops, released, results)``: ops are ("fill", t, part, value) or
    ("acc", src, dst, dst part, scale); a temporary's first op fills it whole."""
    n = draw(st.integers(2, 8))
    sizes = [draw(st.integers(1, 40)) for _ in range(n)]
    ops, born = [], []
    for _ in range(draw(st.integers(n, 4 * n))):
        if len(born) < n and (not born or draw(st.booleans())):
            t = len(born)
            born.append(t)
            ops.append(("fill", t, None, draw(st.integers(-3, 3))))
            continue
        src, dst = draw(st.sampled_from(born)), draw(st.sampled_from(born))
        part = draw(st.sampled_from([None, 0, 1])) if sizes[dst] > 1 else None
        if src == dst:
            ops.append(("fill", dst, part, draw(st.integers(-3, 3))))
        else:
            ops.append(("acc", src, dst, part, draw(st.integers(1, 3))))
    released = {t for t in born if draw(st.booleans())}
    results = [t for t in born if t not in released]
    return sizes, ops, released, results


def reference(sizes, ops):
    arrays = [np.zeros(s) for s in sizes]
    for op in ops:
        if op[0] == "fill":
            _, t, part, value = op
            view = arrays[t] if part is None else np.array_split(arrays[t], 2)[part]
            view[...] = value
        else:
            _, src, dst, part, scale = op
            view = arrays[dst] if part is None else np.array_split(arrays[dst], 2)[part]
            view += scale * arrays[src].sum()
    return arrays


def submit(rt, sizes, ops, released):
    roots = {}
    for op in ops:
        t = op[1] if op[0] == "fill" else op[2]
        if op[0] == "fill" and t not in roots:
            roots[t] = rt.temporary((sizes[t],), "float64", name=f"t{t}")
        h = roots[t]
        part = op[2] if op[0] == "fill" else op[3]
        if part is not None:
            h = h.split(0, 2)[part]
        if op[0] == "fill":
            rt.submit(FILL, h, value=float(op[3]))
        else:
            rt.submit(ACC, roots[op[1]], h, scale=float(op[4]))
    rt.release(*(roots[t] for t in released))
    return roots


def reachable_from(task, succ):
    seen, stack = set(), [task]
    while stack:
        for s in succ[stack.pop()]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return seen


def check_order(graph):
    """Every task of a temporary placed over a released one's bytes follows all of its
    tasks (on the DAG as the capture recorded it: a flush that ran drops its edges)."""
    lifetimes, (segment,) = graph._lifetimes[0], graph._segments
    succ = {t: s for t, _, s in segment}
    layout = lifetimes.layout
    span = {r: (layout.offset[r], layout.offset[r] + r.nbytes) for r in lifetimes.roots}
    for a in lifetimes.roots:
        after = None
        for b in lifetimes.roots:
            if b is a or not (span[a][0] < span[b][1] and span[b][0] < span[a][1]):
                continue
            assert lifetimes.end(a) < lifetimes.first[b] or lifetimes.end(b) < lifetimes.first[a]
            if lifetimes.end(a) < lifetimes.first[b]:
                for t in lifetimes.accessors[a]:
                    after = reachable_from(t, succ)
                    assert all(u in after for u in lifetimes.accessors[b]), (a, b)
    assert layout.peak <= sum(-(-max(r.nbytes, 1) // 64) * 64 for r in lifetimes.roots)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from(["cpu:2", "cpu:1,cuda-emu:1"]))
def test_random_programs_in_a_capture_and_its_replays(program, devices):
    sizes, ops, released, results = program
    expected = reference(sizes, ops)
    with hn.Runtime(devices=devices, perfmodel=False) as rt:
        with rt.capture() as graph:
            roots = submit(rt, sizes, ops, released)
        check_order(graph)
        for _ in range(2):
            for t in results:
                np.testing.assert_array_equal(rt.fetch(roots[t]), expected[t])
            graph.replay()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.booleans())
def test_random_programs_in_one_flush(program, arenas):
    sizes, ops, released, results = program
    expected = reference(sizes, ops)
    with hn.Runtime(devices="cpu:2", perfmodel=False, overlap=False, arenas=arenas) as rt:
        roots = submit(rt, sizes, ops, released)
        rt.wait()
        for t in results:
            np.testing.assert_array_equal(rt.fetch(roots[t]), expected[t])


def test_released_bytes_are_shared_and_the_peak_is_the_live_most():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        with rt.capture() as graph:
            a = rt.temporary((1000,), "float64")
            b = rt.temporary((1000,), "float64")
            c = rt.temporary((1000,), "float64")
            rt.submit(FILL, a, value=1.0)
            rt.submit(FILL, b, value=0.0)
            rt.submit(ACC, a, b, scale=1.0)
            rt.release(a)
            rt.submit(FILL, c, value=2.0)
            rt.submit(ACC, b, c, scale=1.0)
        layout = graph._lifetimes[0].layout
        assert layout.offset[c.root] == layout.offset[a.root]  # c took a's bytes
        assert layout.peak == 2 * 8000 and graph.arena_stats()["host0"].high_water == 16000
        assert rt.fetch(c)[0] == 2.0 + 1000.0 * 1000.0


def test_two_partitions_touching_a_new_root_at_once_share_one_array():
    """Two workers binding the two halves of a root never allocated: one replica, both
    halves views of it (an allocator slow enough for the threads to meet in it)."""
    import threading
    import time

    from hetero_nn.scheduler.lifetimes import PlainAllocation

    class Slow(PlainAllocation):
        def array(self, node, root):
            time.sleep(0.05)
            return super().array(node, root)

    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        root = rt.temporary((10,), "float64")
        root.placed = slow = Slow()
        halves = root.split(0, 2)
        node = rt.nodes[0]
        threads = [threading.Thread(target=h.replica, args=(node,)) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert slow.allocations == {"host0": 1}
        whole = root.replica(node)
        assert all(np.shares_memory(h.replica(node), whole) for h in halves)
