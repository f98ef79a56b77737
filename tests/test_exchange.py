"""Reductions between ranks (hetero_nn.training.cluster.exchange) against one process's REDUX tree.

Each rank is a Runtime of its own with a real Endpoint (TCP on localhost) in one
test process, its thread submitting its partitions' contributions as a layer would,
the runtime handing the tree to ``Exchange.combine``: every rank must end with the
bytes one runtime gets from all the partitions, for random partition counts, rank
counts (reduce-scatter included) and both modes of the first partition.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("distributed")

import hetero_nn as hn  # noqa: E402
from hetero_nn.codelets.codelet import REDUX, R, Codelet  # noqa: E402
from hetero_nn.codelets.reduce import add_redux, fill_zero, overwriting, zero_init  # noqa: E402
from hetero_nn.training.cluster import exchange as ex_mod  # noqa: E402
from hetero_nn.training.cluster.messages import partition_starts  # noqa: E402
from hetero_nn.training.cluster.endpoint import Endpoint  # noqa: E402
from hetero_nn.training.cluster.exchange import Exchange, GroupBroken, tree_ops  # noqa: E402


def _accumulate(v, h):
    np.add(h, v, out=h)


contrib = Codelet("test_contrib", modes=(R, REDUX), variants={"ref": _accumulate},
                  init=zero_init, redux=add_redux)
read = Codelet("test_read", modes=(R,), variants={"ref": lambda h: None})


def _submit(rt, h, values, mode):
    """A layer's per-partition contributions to ``h`` (the first in place in overwrite mode)."""
    if mode == "zero":
        rt.submit(fill_zero, h)
    for i, v in enumerate(values):
        codelet = overwriting(contrib) if mode == "overwrite" and i == 0 else contrib
        rt.submit(codelet, rt.register(v), h)
    rt.submit(read, h)  # the next non-REDUX access: the tree is due here


def _one_process(values, mode):
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt:
        h = rt.register(np.zeros_like(values[0]))
        _submit(rt, h, values, mode)
        return rt.fetch(h, copy=True)


@pytest.fixture(scope="module")
def endpoints():
    eps = []
    for _ in range(4):
        ep = Endpoint("x", "127.0.0.1", lambda peer, m, eps=eps: None)
        ep.name = ep.address
        eps.append(ep)
    for ep in eps:
        for other in eps:
            if other is not ep:
                ep.connect(other.address, other.address)
    yield eps
    for ep in eps:
        ep.close()


_generation = iter(range(1, 10 ** 6))


def _group(endpoints, ranks, tree=False):
    eps = endpoints[:ranks]
    gen = next(_generation)
    exchanges = [Exchange(ep, gen, j, [e.address for e in eps], tree_from=2 if tree else 10 ** 6)
                 for j, ep in enumerate(eps)]
    for ep, ex in zip(eps, exchanges):
        ep.on_message = lambda peer, m, ex=ex: ex.on_message(m)
    return exchanges


def _across(exchanges, values, mode, starts, step=1):
    results, errors = [None] * len(exchanges), []

    def rank(j):
        ex = exchanges[j]
        try:
            with hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt:
                ex.begin(step)
                ex.start_submission(starts)
                h = rt.register(np.zeros_like(values[0]))
                with rt.combining_with(ex.combine):
                    _submit(rt, h, values[starts[j]:starts[j + 1]], mode)
                results[j] = rt.fetch(h, copy=True)
        except Exception as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(j,)) for j in range(len(exchanges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def _values(rng, g, size):
    """Values whose sum depends on the order of the additions (magnitudes 1e-3..1e3)."""
    return [(rng.standard_normal(size) * 10.0 ** rng.uniform(-3, 3, size)).astype(np.float32)
            for _ in range(g)]


def test_tree_ops_is_the_runtimes_tree():
    assert list(tree_ops(5)) == [(0, 1, 1), (2, 3, 1), (0, 2, 2), (0, 4, 4)]
    assert list(tree_ops(1)) == [] and list(tree_ops(0)) == []


@settings(max_examples=16, deadline=None)
@given(st.data())
def test_ranks_end_with_the_bytes_of_one_process(endpoints, data):
    ranks = data.draw(st.integers(1, 4), label="ranks")
    g = data.draw(st.integers(ranks, ranks + 5), label="partitions")
    mode = data.draw(st.sampled_from(["zero", "overwrite"]), label="mode")
    starts = partition_starts(g, ranks)
    if mode == "overwrite" and min(b - a for a, b in zip(starts, starts[1:])) < 2:
        mode = "zero"  # a rank of one partition in place has no tree for the hook to take
    big = data.draw(st.booleans(), label="big")  # past SCATTER_MIN_BYTES: reduce-scatter
    size = (ex_mod.SCATTER_MIN_BYTES // 4 + 37) if big else data.draw(st.integers(1, 40))
    tree = data.draw(st.booleans(), label="along the tree")
    values = _values(np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1))), g, size)
    want = _one_process(values, mode)
    for got in _across(_group(endpoints, ranks, tree), values, mode, starts):
        assert got.tobytes() == want.tobytes()


def test_the_test_can_fail_a_left_to_right_sum_differs():
    values = _values(np.random.default_rng(0), 7, 2000)
    left = values[0].copy()
    for v in values[1:]:
        left += v
    assert left.tobytes() != _one_process(values, "zero").tobytes()


def test_a_broken_group_raises_in_every_wait(endpoints):
    ex = _group(endpoints, 2)[1]
    ex.begin(1)
    ex.start_submission([0, 1, 2])
    tag, shape = ex._tag("zero", [(3,)], np.float32)
    ex.fail("rank 0 is gone")
    with pytest.raises(GroupBroken, match="rank 0 is gone"):
        ex.wait(tag, shape)
    with pytest.raises(GroupBroken, match="not a sum over the batch"):
        ex._mode(5, "h")  # a rank of one partition: 0 or 1 partials, never 5


@pytest.mark.parametrize("ranks,g,mode", [(3, 5, "zero"), (4, 9, "overwrite"), (2, 7, "overwrite")])
def test_reduce_scatter_and_all_gather_give_the_same_bytes(endpoints, ranks, g, mode):
    size = ex_mod.SCATTER_MIN_BYTES // 4 + 1001  # reduce-scattered past two ranks
    values = _values(np.random.default_rng(g), g, size)
    want = _one_process(values, mode)
    for got in _across(_group(endpoints, ranks), values, mode, partition_starts(g, ranks)):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("ranks,g,mode", [(2, 3, "zero"), (3, 7, "overwrite"), (4, 4, "zero"),
                                          (4, 11, "overwrite"), (3, 3, "zero")])
def test_along_the_tree_gives_the_same_bytes(endpoints, ranks, g, mode):
    """Batch statistics from TREE_FROM ranks on: sent up the tree between the ranks and
    back down, the same additions in the same order."""
    starts = partition_starts(g, ranks)
    if mode == "overwrite" and min(b - a for a, b in zip(starts, starts[1:])) < 2:
        mode = "zero"
    values = _values(np.random.default_rng(ranks * g), g, 300)
    want = _one_process(values, mode)
    for got in _across(_group(endpoints, ranks, tree=True), values, mode, starts):
        assert got.tobytes() == want.tobytes()



def test_the_tasks_that_wait_are_chained_in_submission_order():
    """A rank's waiting tasks (batch norm's reductions, the gradients' receive) each
    depend on the one submitted before it, so every schedule -- the replay engine's plan
    included -- runs them in the same order on every rank (two ranks waiting each on the
    other's other reduction would never wake; seen under the engine before the chain)."""
    from hetero_nn.training.cluster.planner import capture_share

    steps, rt = capture_share("resnet-small", (3, 8, 8), 16, 4, 2, rank=1)
    try:
        tasks = sorted((t for g in steps[-1].graphs for t in g), key=lambda t: t.id)
        waiting = [t for t in tasks if t.codelet.name in ("cluster_reduce", "cluster_recv")]
        assert len(waiting) == 9 * 4 + 1  # 9 batch norms x 4 sums, one receive
        for before, after in zip(waiting, waiting[1:]):
            assert before in after.preds, (before, after)
        sends = [t for t in tasks if t.codelet.name == "cluster_send"]
        assert sends and not any(s in w.preds for s in sends for w in waiting[:-1])
    finally:
        rt.close()
