"""Capture and replay: ``Runtime.capture`` / ``Graph.replay`` and the Trainer's use of them.

A replayed step must give the same bits as a submitted one (same tasks, same
REDUX trees, same pinned variants, the same per-step values read from step inputs),
under every policy and granularity.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, SCRATCH, W
from hetero_nn.layers.dropout import dropout_state

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
#
# Values that change every step (Adam's step count and betas, a schedule's lr, OneCycle's
# beta1 or momentum, a Dropout's mask key, a BatchNorm2D's momentum) live in the data of
# step inputs: a replayed run must give the bits of a submitted one with one capture per
# step key, and leave the host counters (optimizer steps, schedule, num_batches_tracked,
# dropout steps) where a submitted run leaves them.

def lenet5():
    return hn.build_model("lenet5", INPUT_SHAPE, 10, dtype="float64", seed=3)


def odd_strided():
    """Stride 2 on 28 gives 13 (odd), pooled to 6 by flooring."""
    hn.manual_seed(3)
    return hn.Sequential(hn.Conv2D(1, 4, 3, stride=2), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dense(144, 10))


def bn_dropout():
    """BatchNorm2D with a momentum and with a cumulative average, and a Dropout after Flatten."""
    hn.manual_seed(3)
    return hn.Sequential(hn.Conv2D(1, 4, 5, stride=3), hn.BatchNorm2D(4, momentum=0.3), hn.ReLU(),
                         hn.Conv2D(4, 4, 3, stride=2), hn.BatchNorm2D(4, momentum=None), hn.ReLU(),
                         hn.Flatten(), hn.Dropout(0.3, seed=1), hn.Dense(36, 10))


def sgd():
    return hn.optim.SGD(lr=0.05, momentum=0.9), None, None


def adam():
    return hn.optim.Adam(lr=1e-2), None, None


def adamw_onecycle_clip():
    opt = hn.optim.AdamW(lr=1e-2, weight_decay=0.05)
    return opt, hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=10), 0.5


def sgd_cosine():
    opt = hn.optim.SGD(lr=0.05, momentum=0.9, nesterov=True)
    return opt, hn.optim.CosineAnnealingLR(opt, T_max=3), None


def adam_onecycle():
    opt = hn.optim.Adam(lr=1e-2)
    return opt, hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=10), None


CASES = {"lenet5": (lenet5, sgd), "odd-strided": (odd_strided, sgd),
         "adam": (odd_strided, adam), "adamw-onecycle-clip": (odd_strided, adamw_onecycle_clip),
         "sgd-cosine": (odd_strided, sgd_cosine), "bn-dropout": (bn_dropout, adam_onecycle)}


def _batches(sizes):
    rng = np.random.default_rng(2024)
    return [(rng.standard_normal((n, *INPUT_SHAPE)), rng.integers(0, 10, n)) for n in sizes]


def _digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@functools.lru_cache(maxsize=None)
def _train(case, policy, g, replay, sizes=(BATCH,) * STEPS):
    """Digests of what a run leaves (losses, weights, buffers, optimizer state, host
    counters and schedule), the number of graphs it captured and how many of their
    tasks the replay engine ran compiled (Numba through the dispatch loop)."""
    net, recipe = CASES[case]
    model = net()
    optimizer, scheduler, clip = recipe()
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=g, dtype="float64", replay=replay, scheduler=scheduler,
                             scheduler_interval="step" if scheduler else None,
                             clip_grad_norm=clip)
        losses = []
        for x, y in _batches(sizes):
            losses.append(trainer.train_step(x, y))
            if scheduler is not None:
                scheduler.step()
        opt_state = optimizer.state_dict()
        arrays = {"losses": np.array(losses), **model.state_dict(),
                  **{f"{p}.{b}": a for p, st in opt_state["state"].items() for b, a in st.items()}}
        host = {"steps": opt_state["steps"], "hyper": opt_state["hyper"],
                "scheduler": scheduler.state_dict() if scheduler else None,
                "dropout": dropout_state(model), "grad_norm": trainer.last_grad_norm}
        compiled = sum(b.calls is not None for graph in trainer.graphs.values()
                       if graph._compiled is not None for seg in graph._compiled.segments
                       for b in seg.bound)
    digests = {k: _digest(a) for k, a in arrays.items()}
    digests["host"] = json.dumps(host, sort_keys=True)
    return digests, trainer.graphs_captured, compiled


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("g", (1, 3))
@pytest.mark.parametrize("policy", POLICIES)
def test_replayed_steps_equal_submitted_steps_bit_for_bit(case, g, policy):
    replayed, captured, compiled = _train(case, policy, g, True)
    submitted, none, _ = _train(case, policy, g, False)
    assert replayed == submitted
    assert (captured, none) == (1, 0)  # one step key: captured once, replayed four times
    assert compiled > 0  # the replays ran on the engine, Numba tasks in its compiled loop


def test_a_shape_change_captures_another_graph():
    sizes = (BATCH, BATCH, BATCH, 5, BATCH, 5, BATCH)
    replayed, captured, _ = _train("odd-strided", "eager", 3, True, sizes)
    submitted, _, _ = _train("odd-strided", "eager", 3, False, sizes)
    assert replayed == submitted
    assert captured == 2  # batches of 12, batches of 5


def test_host_counters_after_replays():
    model = bn_dropout()
    optimizer, scheduler, _ = adam_onecycle()
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=3, dtype="float64", scheduler=scheduler,
                             scheduler_interval="step")
        for x, y in _batches((BATCH,) * STEPS):
            trainer.train_step(x, y)
            scheduler.step()
        assert trainer.graphs_captured == 1
        assert optimizer.steps == STEPS and scheduler.last_epoch == STEPS
        tracked = [v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked")]
        assert [int(t) for t in tracked] == [STEPS, STEPS]
        assert [steps for _, steps in dropout_state(model).values()] == [STEPS]


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


def _fit(replay, model, optimizer, scheduler=None):
    rng = np.random.default_rng(5)
    train = (rng.standard_normal((2 * BATCH + 5, *INPUT_SHAPE)), rng.integers(0, 10, 2 * BATCH + 5))
    val = (rng.standard_normal((7, *INPUT_SHAPE)), rng.integers(0, 10, 7))
    with hn.Runtime(devices="cpu:2", policy="ws", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=3, dtype="float64", replay=replay, scheduler=scheduler)
        history = trainer.fit(train, epochs=3, validation=val, verbose=0)
        state = model.state_dict()
    return ([(r["train_loss"], r["test_loss"], r["train_accuracy"]) for r in history], state,
            trainer.graphs_captured)


def test_fit_with_the_loader_a_short_last_batch_and_evaluation_equals_submission():
    replayed = _fit(True, odd_strided(), *sgd()[:2])
    submitted = _fit(False, odd_strided(), *sgd()[:2])
    assert replayed[0] == submitted[0]
    assert all(np.array_equal(replayed[1][k], submitted[1][k]) for k in submitted[1])
    assert replayed[2] == 3 and submitted[2] == 0  # batches of 12, of 5, and evaluation (7)


def test_fit_with_a_per_step_schedule_dropout_and_batchnorm_equals_submission():
    """OneCycle (stepped by ``fit`` after every step), Dropout in training and off in
    evaluation, BatchNorm2D on batch statistics and then on its running ones."""
    replayed = _fit(True, bn_dropout(), *adam_onecycle()[:2])
    submitted = _fit(False, bn_dropout(), *adam_onecycle()[:2])
    assert replayed[0] == submitted[0]
    assert all(np.array_equal(replayed[1][k], submitted[1][k]) for k in submitted[1])
    assert replayed[2] == 3 and submitted[2] == 0  # batches of 12, of 5, and evaluation (7)
