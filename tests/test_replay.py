"""Capture and replay: ``Runtime.capture`` / ``Graph.replay`` and the Trainer's use of them.

A replayed step must give the same bits as a submitted one (same tasks, same
REDUX trees, same pinned variants), under every policy and granularity.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, SCRATCH, W

POLICIES = ("eager", "random", "ws", "dmda", "heft")
INPUT_SHAPE = (1, 28, 28)
BATCH = 12
STEPS = 5


# --------------------------------------------------------------------------- the API

def _square_rows(x, partial):
    partial += (x * x).sum(axis=0)


def _zero(a):
    a[...] = 0


def _sum_into(a, b):
    a += b


def _affine(x, scratch, a, b):
    scratch[...] = a * x
    x[...] = scratch + b


def _copy(x, y):
    y[...] = x


SQUARE_ROWS = hn.Codelet("replay_square_rows", modes=(R, REDUX), variants={"ref": _square_rows},
                         init=_zero, redux=_sum_into)
AFFINE = hn.Codelet("replay_affine", modes=(RW, SCRATCH), variants={"ref": _affine})
COPY = hn.Codelet("replay_copy", modes=(R, W), variants={"ref": _copy})


def _program(rt, x, acc):
    """y = 2 x + 1 on 3 partitions (a SCRATCH each), then acc += column sums of y^2 (REDUX)."""
    y = rt.temporary(x.shape, x.dtype, name="y")
    for xp, yp in zip(x.split(0, 3), y.split(0, 3)):
        rt.submit(COPY, xp, yp)
        rt.submit(AFFINE, yp, rt.temporary(yp.shape, yp.dtype), a=2.0, b=1.0)
        rt.submit(SQUARE_ROWS, yp, acc)


@pytest.mark.parametrize("policy", POLICIES)
def test_replayed_program_equals_sequential_numpy(policy):
    rng = np.random.default_rng(7)
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        x = rt.register(rng.standard_normal((9, 4)), name="x")
        acc_data = np.zeros(4)
        acc = rt.register(acc_data, name="acc")
        expected = np.zeros(4)
        with rt.capture() as graph:
            _program(rt, x, acc)
        expected += ((2.0 * rt.fetch(x) + 1.0) ** 2).sum(axis=0)
        assert graph.num_tasks == 3 * 3 + 3  # + the REDUX tree (2 adds) and its add into acc
        np.testing.assert_allclose(rt.fetch(acc), expected, rtol=1e-14)
        submitted_before = rt.generation
        for _ in range(3):
            new_x = rng.standard_normal((9, 4))
            rt.submit(COPY, rt.register(np.ones(2)), rt.temporary((2,), "float64"))
            rt.wait()  # another flush between replays: the arena is reset, the graph unharmed
            graph.write(x, new_x)
            graph.replay()
            expected += ((2.0 * new_x + 1.0) ** 2).sum(axis=0)
            np.testing.assert_allclose(rt.fetch(acc), expected, rtol=1e-14)
        assert graph.replays == 3 and rt.generation == submitted_before + 6


def test_replay_builds_no_task_and_renumbers_the_trace():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        x = rt.register(np.arange(6.0).reshape(3, 2), name="x")
        acc = rt.register(np.zeros(2), name="acc")
        with rt.capture() as graph:
            _program(rt, x, acc)
        tasks = [t for segment in graph._segments for t, _, _ in segment]
        graph.replay()
        assert [t for segment in graph._segments for t, _, _ in segment] == tasks
        ids = [r.task_id for r in rt.trace()]
        assert len(ids) == 2 * len(tasks) and len(set(ids)) == len(ids)


def test_replay_before_the_capture_completed_is_refused():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        x = rt.register(np.ones((3, 2)))
        with pytest.raises(ZeroDivisionError):
            with rt.capture() as graph:
                rt.submit(COPY, x, rt.temporary((3, 2), "float64"))
                raise ZeroDivisionError
        with pytest.raises(hn.SubmitError, match="capture has not completed"):
            graph.replay()
        with pytest.raises(hn.SubmitError, match="shape"):
            graph.write(x, np.ones((2, 2)))


def _boom(x):
    raise ValueError("boom")


def test_a_capture_whose_flush_failed_cannot_be_replayed():
    boom = hn.Codelet("replay_boom", modes=(RW,), variants={"ref": _boom})
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        x = rt.register(np.ones(3))
        with pytest.raises(hn.TaskError, match="boom"):
            with rt.capture() as graph:
                rt.submit(boom, x)
        with pytest.raises(hn.SubmitError, match="capture has not completed"):
            graph.replay()
        with rt.capture() as again:  # the runtime is not left capturing
            rt.submit(COPY, x, rt.temporary((3,), "float64"))
        again.replay()


# --------------------------------------------------------------------------- the Trainer

def lenet5():
    return hn.build_model("lenet5", INPUT_SHAPE, 10, dtype="float64", seed=3)


def odd_strided():
    """Stride 2 on 28 gives 13 (odd), pooled to 6 by flooring."""
    hn.manual_seed(3)
    return hn.Sequential(hn.Conv2D(1, 4, 3, stride=2), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dense(144, 10))


NETS = {"lenet5": lenet5, "odd-strided": odd_strided}


def _batches(sizes):
    rng = np.random.default_rng(2024)
    return [(rng.standard_normal((n, *INPUT_SHAPE)), rng.integers(0, 10, n)) for n in sizes]


def _train(net, policy, g, replay, sizes=(BATCH,) * STEPS, optimizer=None):
    model = NETS[net]()
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer or hn.optim.SGD(lr=0.05, momentum=0.9),
                             runtime=rt, batch_size=BATCH, granularity=g, dtype="float64",
                             replay=replay)
        losses = [trainer.train_step(x, y) for x, y in _batches(sizes)]
        arrays = {"losses": np.array(losses), **model.state_dict(),
                  **{f"{p}.{b}": a for p, st in trainer.optimizer.state_dict()["state"].items()
                     for b, a in st.items()}}
    digests = {k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
               for k, a in arrays.items()}
    return digests, trainer.graphs_captured


@pytest.mark.parametrize("net", sorted(NETS))
@pytest.mark.parametrize("g", (1, 3))
@pytest.mark.parametrize("policy", POLICIES)
def test_replayed_steps_equal_submitted_steps_bit_for_bit(net, g, policy):
    replayed, captured = _train(net, policy, g, True)
    submitted, none = _train(net, policy, g, False)
    assert replayed == submitted
    assert (captured, none) == (1, 0)  # SGD's ``first`` is in the hyper handle: one graph


def test_a_shape_change_captures_another_graph():
    sizes = (BATCH, BATCH, BATCH, 5, BATCH, 5, BATCH)
    replayed, captured = _train("odd-strided", "eager", 3, True, sizes)
    submitted, _ = _train("odd-strided", "eager", 3, False, sizes)
    assert replayed == submitted
    assert captured == 2  # batches of 12, batches of 5


def test_adam_whose_step_count_is_in_the_hyper_handle_is_replayed():
    replayed, captured = _train("odd-strided", "ws", 3, True, optimizer=hn.optim.Adam(lr=1e-3))
    submitted, _ = _train("odd-strided", "ws", 3, False, optimizer=hn.optim.Adam(lr=1e-3))
    assert replayed == submitted and captured == 1


def test_heft_plans_once():
    with hn.Runtime(devices="cpu:2", policy="heft", perfmodel=False) as rt:
        policy = rt.executor.policy
        planned = []
        prepare = policy.prepare
        policy.prepare = lambda tasks: (planned.append(len(tasks)), prepare(tasks))
        x = rt.register(np.ones((6, 2)), name="x")
        acc = rt.register(np.zeros(2), name="acc")
        with rt.capture() as graph:
            _program(rt, x, acc)
        assigned = [t.assigned for s in graph._segments for t, _, _ in s]
        graph.replay()
        graph.replay()
        assert planned == [graph.num_tasks]
        assert [t.assigned for s in graph._segments for t, _, _ in s] == assigned
        np.testing.assert_array_equal(rt.fetch(acc), np.full(2, 3 * 6 * 9.0))


def _fit(replay, model):
    rng = np.random.default_rng(5)
    train = (rng.standard_normal((2 * BATCH + 5, *INPUT_SHAPE)), rng.integers(0, 10, 2 * BATCH + 5))
    val = (rng.standard_normal((7, *INPUT_SHAPE)), rng.integers(0, 10, 7))
    with hn.Runtime(devices="cpu:2", policy="ws", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=rt,
                             batch_size=BATCH, granularity=3, dtype="float64", replay=replay)
        history = trainer.fit(train, epochs=3, validation=val, verbose=0)
        state = model.state_dict()
    return ([(r["train_loss"], r["test_loss"], r["train_accuracy"]) for r in history], state,
            trainer.graphs_captured)


def test_fit_with_the_loader_a_short_last_batch_and_evaluation_equals_submission():
    replayed = _fit(True, odd_strided())
    submitted = _fit(False, odd_strided())
    assert replayed[0] == submitted[0]
    assert all(np.array_equal(replayed[1][k], submitted[1][k]) for k in submitted[1])
    assert replayed[2] == 3 and submitted[2] == 0  # batches of 12, of 5, and evaluation (7)


def test_dropout_in_training_mode_is_replayed_with_its_key_in_a_handle():
    def net():
        hn.manual_seed(3)
        return hn.Sequential(hn.Flatten(), hn.Dropout(0.3, seed=1), hn.Dense(784, 10))
    replayed = _fit(True, net())
    submitted = _fit(False, net())
    assert replayed[0] == submitted[0] and replayed[2] == 3  # 12, 5, evaluation (dropout off)
