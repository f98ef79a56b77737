"""Compiled replays on several memory nodes: the data plan's copies, fixed once.

With ``host_nodes`` > 1, or CPU workers beside (emulated) CUDA devices, a replayed
segment's copies between nodes are planned at compile time
(``hetero_nn/scheduler/engine/data_plan.py``): its CPU tasks bind to fixed replicas and run
compiled, the copies run as units of their own (compiled between host nodes, on the
device's stream otherwise), and the coherence state after a replay is what submitted
tasks would have left. The random handle programs of ``test_replay_engine.py`` run on
such runtimes too, and a replay's Python calls are counted there on two host nodes;
here: whole training steps, the plan's shape, failures, a root cut again between replays.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from helpers import within
from test_replay_engine import AXPY, BOOM, CPU_FIRST, SCALE


def _train(devices, host_nodes, policy, replay, steps=4):
    """``(digest of losses and weights, the trainer's compiled segments)``."""
    model = hn.build_model("lenet5", (1, 12, 12), 10, dtype="float64", seed=4)
    rng = np.random.default_rng(3)
    h = hashlib.sha256()
    with hn.Runtime(devices=devices, host_nodes=host_nodes, policy=policy,
                    perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=rt,
                             batch_size=6, granularity=3, dtype="float64", replay=replay)
        for _ in range(steps):
            x, y = rng.standard_normal((6, 1, 12, 12)), rng.integers(0, 10, 6)
            h.update(np.float64(trainer.train_step(x, y)).tobytes())
        for _, a in sorted(model.state_dict().items()):
            h.update(np.ascontiguousarray(a).tobytes())
        segments = [seg for g in trainer.graphs.values() if g._compiled is not None
                    for seg in g._compiled.segments or ()]
        copies = len(rt.trace().transfers)
    return h.hexdigest(), segments, copies


@pytest.mark.parametrize("devices, host_nodes, policy", [
    ("cpu:2", 2, "eager"), ("cpu:3", 3, "heft"), ("cpu:1,cuda-emu:1", 1, "heft")])
def test_training_steps_replay_compiled_on_several_nodes_bit_for_bit(devices, host_nodes,
                                                                     policy):
    replayed, segments, copies = _train(devices, host_nodes, policy, True)
    submitted, _, _ = _train(devices, host_nodes, policy, False)
    assert replayed == submitted
    assert segments and all(seg.data is not None for seg in segments)  # planned
    cpu = [b for seg in segments for b in seg.bound if b.worker.kind == "cpu"]
    assert cpu and all(b.calls is not None for b in cpu), [b for b in cpu if b.calls is None]
    assert sum(len(seg.moves) for seg in segments) > 0 and copies > 0  # planned, traced


def test_a_value_crossing_nodes_is_copied_once_before_its_readers():
    """x's halves are scaled apart (on both workers, so both nodes), then all of x is read
    twice: the half written on the other node is copied once, before its first reader,
    and every reader on that node waits for the copy; x's first read is the prologue's."""
    n = 200_000  # long enough tasks for the schedule to use both workers
    with hn.Runtime(devices="cpu:2", host_nodes=2, perfmodel=False, variants=CPU_FIRST) as rt:
        x = rt.register(np.arange(2.0 * n))
        y, z = rt.register(np.zeros(2 * n)), rt.register(np.zeros(2 * n))
        with rt.capture() as graph:
            for half in x.split(0, 2):
                rt.submit(SCALE, half, factor=2.0)
            rt.submit(AXPY, x, y, a=1.0)
            rt.submit(AXPY, x, z, a=1.0)
        total = 2 * np.arange(2.0 * n)  # what the capture's run added
        for step in range(1, 4):
            graph.write(x, np.arange(2.0 * n) * step)
            graph.replay()
            total += 2 * step * np.arange(2.0 * n)
            np.testing.assert_array_equal(rt.fetch(y), total)
            np.testing.assert_array_equal(rt.fetch(z), total)
        (seg,) = graph._compiled.segments
        plan = seg.data
        assert plan is not None and plan.transfers and seg.python_tasks == 0
        assert {b.worker for b in seg.bound[:2]} == set(rt.workers)  # the halves apart
        node_of = [b.worker.node for b in seg.bound]
        for k, copy in enumerate(plan.transfers):
            readers = sorted(t for t, through in plan.waits.items() if k in through)
            assert readers[0] == copy.first and all(node_of[t] is copy.dst for t in readers)
            brought = {plan.transfers[j].dst for j in copy.after}  # earlier copies to src
            assert copy.writers and all(node_of[w] is copy.src or copy.src in brought
                                        for w in copy.writers)
        assert any(sh.inputs for sh in plan.shadows if sh.root is x.root)  # read first


def _coherent(rt, h):
    """Every replica of ``h``'s root that its cells' state marks valid holds the same data."""
    root = h.root
    grid = root._grid
    cells = [((slice(None),), grid)] if type(grid) is int else \
        [(grid.cell_box(i), int(grid.mask[i])) for i in np.ndindex(grid.mask.shape)]
    for box, bits in cells:
        held = [node for node in rt.nodes if bits >> node.index & 1]
        for node in held[1:]:
            np.testing.assert_array_equal(root.replica(node)[box], root.replica(held[0])[box],
                                          err_msg=f"{root.name} {box} on {node.name}")


def test_a_failed_replay_leaves_every_node_coherent():
    """A task that raises halfway (the others' tasks not started are cancelled): the
    replay's TaskError, then the state says where each cell's data is (every replica
    marked valid holds it), and the next replay builds on what the failed one left."""
    with hn.Runtime(devices="cpu:2", host_nodes=2, policy="eager", perfmodel=False,
                    variants=CPU_FIRST) as rt:
        x = rt.register(np.ones(8))
        y = rt.register(np.zeros(8))
        parts = list(zip(x.split(0, 4), y.split(0, 4)))
        with rt.capture() as graph:
            for xp, yp in parts:
                rt.submit(SCALE, xp, factor=3.0)
                rt.submit(BOOM, xp, limit=100.0)
                rt.submit(AXPY, xp, yp, a=1.0)
            rt.submit(AXPY, x, y, a=1.0)  # all of x and y on one node: copies both ways
        graph.replay()
        assert graph._compiled.segments[0].data.transfers
        graph.write(x, np.array([1.0, 1, 1, 1, 50, 50, 1, 1]))  # the third part fails
        with pytest.raises(hn.TaskError, match="engine_boom"):
            within(60, graph.replay)
        _coherent(rt, x)
        _coherent(rt, y)
        left = rt.fetch(y).copy()
        graph.write(x, np.ones(8))
        within(60, graph.replay)
        np.testing.assert_array_equal(rt.fetch(x), np.full(8, 3.0))
        np.testing.assert_array_equal(rt.fetch(y), left + 6.0)
        _coherent(rt, x)
        _coherent(rt, y)


def test_a_root_cut_again_between_replays_is_planned_again():
    with hn.Runtime(devices="cpu:2", host_nodes=2, policy="eager", perfmodel=False,
                    variants=CPU_FIRST) as rt:
        x = rt.register(np.ones(6))
        with rt.capture() as graph:
            for part in x.split(0, 2):
                rt.submit(SCALE, part, factor=2.0)
        graph.replay()
        (seg,) = graph._compiled.segments
        thirds = x.split(0, 3)  # new cells in x's root
        rt.submit(SCALE, thirds[1], factor=10.0)
        rt.wait()
        graph.replay()
        (again,) = graph._compiled.segments
        assert again is not seg and again.data.current()
        np.testing.assert_array_equal(rt.fetch(x), [8, 8, 80, 80, 8, 8])  # capture ran too
