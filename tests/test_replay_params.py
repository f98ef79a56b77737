"""Replay of steps whose values change every step: they live in the data of step inputs.

Adam/AdamW (step count, betas), a schedule stepped per step (lr, OneCycle's beta1 or
momentum), Dropout in training (the mask key) and BatchNorm2D tracking running
statistics (its momentum, ``1 / num_batches_tracked`` with ``momentum=None``): a
replayed run must give the bits of a submitted one, with one capture per step key,
and leave the host counters (optimizer steps, schedule, ``num_batches_tracked``,
dropout steps) where a submitted run leaves them.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers.dropout import dropout_state

POLICIES = ("eager", "random", "ws", "dmda", "heft")
INPUT_SHAPE = (1, 8, 8)
BATCH = 12
STEPS = 5


def conv_net():
    hn.manual_seed(3)
    return hn.Sequential(hn.Conv2D(1, 4, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dense(36, 10))


def bn_dropout_net():
    """BatchNorm2D with a momentum and with a cumulative average, and a Dropout."""
    hn.manual_seed(3)
    return hn.Sequential(hn.Conv2D(1, 4, 3), hn.BatchNorm2D(4, momentum=0.3), hn.ReLU(),
                         hn.Conv2D(4, 4, 3), hn.BatchNorm2D(4, momentum=None), hn.ReLU(),
                         hn.Flatten(), hn.Dropout(0.3, seed=1), hn.Dense(64, 10))


def adam():
    return hn.optim.Adam(lr=1e-2), None, None


def adamw_onecycle_clip():
    opt = hn.optim.AdamW(lr=1e-2, weight_decay=0.05)
    return opt, hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS), 0.5


def sgd_cosine():
    opt = hn.optim.SGD(lr=0.05, momentum=0.9, nesterov=True)
    return opt, hn.optim.CosineAnnealingLR(opt, T_max=3), None


def adam_onecycle():
    opt = hn.optim.Adam(lr=1e-2)
    return opt, hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS), None


CASES = {"adam": (conv_net, adam), "adamw-onecycle-clip": (conv_net, adamw_onecycle_clip),
         "sgd-cosine": (conv_net, sgd_cosine), "bn-dropout": (bn_dropout_net, adam_onecycle)}


def _digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@functools.lru_cache(maxsize=None)
def _train(case, policy, g, replay):
    """Digests of everything a run leaves (weights, buffers, optimizer state, the host
    counters), and the number of graphs it captured."""
    net, recipe = CASES[case]
    model = net()
    optimizer, scheduler, clip = recipe()
    rng = np.random.default_rng(2024)
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=g, dtype="float64", replay=replay, scheduler=scheduler,
                             scheduler_interval="step" if scheduler else None,
                             clip_grad_norm=clip)
        losses = []
        for _ in range(STEPS):
            x, y = rng.standard_normal((BATCH, *INPUT_SHAPE)), rng.integers(0, 10, BATCH)
            losses.append(trainer.train_step(x, y))
            if scheduler is not None:
                scheduler.step()
        opt_state = optimizer.state_dict()
        arrays = {"losses": np.array(losses), **model.state_dict(),
                  **{f"{p}.{b}": a for p, st in opt_state["state"].items() for b, a in st.items()}}
        host = {"steps": opt_state["steps"], "hyper": opt_state["hyper"],
                "scheduler": scheduler.state_dict() if scheduler else None,
                "dropout": dropout_state(model), "grad_norm": getattr(trainer, "last_grad_norm", None)}
    digests = {k: _digest(a) for k, a in arrays.items()}
    digests["host"] = json.dumps(host, sort_keys=True)
    return digests, trainer.graphs_captured


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("g", (1, 3))
@pytest.mark.parametrize("policy", POLICIES)
def test_replayed_steps_equal_submitted_steps_bit_for_bit(case, g, policy):
    replayed, captured = _train(case, policy, g, True)
    submitted, none = _train(case, "eager", g, False)
    assert replayed == submitted
    assert (captured, none) == (1, 0)  # one step key: captured once, replayed four times


def test_host_counters_after_replays():
    net, recipe = CASES["bn-dropout"]
    model = net()
    optimizer, scheduler, _ = recipe()
    rng = np.random.default_rng(1)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=3, dtype="float64", scheduler=scheduler,
                             scheduler_interval="step")
        for _ in range(STEPS):
            trainer.train_step(rng.standard_normal((BATCH, *INPUT_SHAPE)),
                               rng.integers(0, 10, BATCH))
            scheduler.step()
        assert trainer.graphs_captured == 1
        assert optimizer.steps == STEPS and scheduler.last_epoch == STEPS
        tracked = [v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked")]
        assert [int(t) for t in tracked] == [STEPS, STEPS]
        assert [steps for _, steps in dropout_state(model).values()] == [STEPS]


def _fit(replay):
    """Adam, a per-step OneCycle, BN and Dropout through ``fit``: batches of 12 and a short
    one of 5, and validation (Dropout off, BN on its running statistics)."""
    net, _ = CASES["bn-dropout"]
    model = net()
    rng = np.random.default_rng(5)
    train = (rng.standard_normal((2 * BATCH + 5, *INPUT_SHAPE)), rng.integers(0, 10, 2 * BATCH + 5))
    val = (rng.standard_normal((7, *INPUT_SHAPE)), rng.integers(0, 10, 7))
    opt = hn.optim.Adam(lr=1e-2)
    sched = hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=9)
    with hn.Runtime(devices="cpu:2", policy="ws", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=opt, runtime=rt, batch_size=BATCH, granularity=3,
                             dtype="float64", replay=replay, scheduler=sched)
        history = trainer.fit(train, epochs=3, validation=val, verbose=0)
        state = {k: _digest(v) for k, v in model.state_dict().items()}
    return ([(r["train_loss"], r["test_loss"], r["train_accuracy"]) for r in history], state,
            trainer.graphs_captured)


def test_fit_with_per_step_schedule_dropout_and_batchnorm_equals_submission():
    replayed, submitted = _fit(True), _fit(False)
    assert replayed[:2] == submitted[:2]
    assert replayed[2] == 3 and submitted[2] == 0  # batches of 12, of 5, and evaluation (7)
