"""Optimizers as torch's: parameters first (``model.parameters()`` or parameter groups with
their own ``lr``, ``weight_decay``, ``momentum``, ``betas``...), trained by the Trainer
equal to ``torch.optim`` with the same groups (float64, <= 1e-9) under replay and
without, per-group schedules equal to torch's, groups and schedules surviving a
checkpoint bit for bit, and wrong calls that say what was expected."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks need it")
from twins import torch_twin  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = (2, 8, 8)
BATCH = 6
STEPS = 6


def make_model():
    hn.manual_seed(11)
    model = hn.Sequential(hn.Conv2D(2, 4, 3, padding=1, bias=False), hn.BatchNorm2d(4), hn.ReLU(),
                          hn.MaxPool2D(2), hn.Flatten(), hn.Linear(64, 16), hn.ReLU(),
                          hn.Linear(16, 5))
    model.build(SHAPE, "float64")
    return model


def batches(steps=STEPS):
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((BATCH, *SHAPE)), rng.integers(0, 5, BATCH))
            for _ in range(steps)]


def split_groups(named):
    """Biases and batch-norm parameters apart from the weights, as a recipe exempts them."""
    decay = [p for n, p in named if n.endswith("weight") and p.data.ndim > 1]
    rest = [p for n, p in named if not (n.endswith("weight") and p.data.ndim > 1)]
    return decay, rest


GROUPED = {  # name: (hetero_nn optimizer of named parameters, torch's, schedule or None)
    "sgd": (lambda d, r: hn.optim.SGD([{"params": d, "weight_decay": 1e-2},
                                       {"params": r, "lr": 0.02, "momentum": 0.0}],
                                      lr=0.05, momentum=0.9, nesterov=False),
            lambda d, r: torch.optim.SGD([{"params": d, "weight_decay": 1e-2},
                                          {"params": r, "lr": 0.02, "momentum": 0.0}],
                                         lr=0.05, momentum=0.9)),
    "sgd-nesterov": (lambda d, r: hn.optim.SGD([{"params": d}, {"params": r, "lr": 0.1,
                                                                "dampening": 0.0}],
                                               lr=0.03, momentum=0.8, nesterov=True),
                     lambda d, r: torch.optim.SGD([{"params": d}, {"params": r, "lr": 0.1}],
                                                  lr=0.03, momentum=0.8, nesterov=True)),
    "adamw": (lambda d, r: hn.optim.AdamW([{"params": d},
                                           {"params": r, "weight_decay": 0.0,
                                            "betas": (0.8, 0.99)}], lr=3e-3),
              lambda d, r: torch.optim.AdamW([{"params": d},
                                              {"params": r, "weight_decay": 0.0,
                                               "betas": (0.8, 0.99)}], lr=3e-3)),
}


def schedule(opt, kind, total=STEPS):
    if kind == "onecycle":
        return hn.optim.OneCycleLR(opt, max_lr=[0.1, 0.05], total_steps=total) \
            if isinstance(opt, hn.optim.Optimizer) else \
            torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.1, 0.05], total_steps=total)
    cls = hn.optim.StepLR if isinstance(opt, hn.optim.Optimizer) else torch.optim.lr_scheduler.StepLR
    return cls(opt, 2, gamma=0.5)


def torch_run(name, sched):
    model = make_model()
    twin = torch_twin(model, "float64")
    named = list(twin.named_parameters())
    opt = GROUPED[name][1](*split_groups([(n, p) for n, p in named]))
    scheduler = schedule(opt, sched) if sched else None
    losses = []
    for x, y in batches():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses, {k: v.numpy() for k, v in twin.state_dict().items()}


def hn_trainer(name, sched, rt, replay=True, granularity=2, total=STEPS):
    model = make_model()
    opt = GROUPED[name][0](*split_groups(model.named_parameters()))
    scheduler = schedule(opt, sched, total) if sched else None
    return hn.Trainer(model, optimizer=opt, runtime=rt, batch_size=BATCH, replay=replay,
                      granularity=granularity, scheduler=scheduler,
                      scheduler_interval="step" if sched else None)


@pytest.mark.parametrize("name, sched", [("sgd", None), ("sgd-nesterov", "step"),
                                         ("adamw", "onecycle")])
def test_parameter_groups_train_as_torch_and_replay_gives_the_same_bits(name, sched):
    expected_losses, expected = torch_run(name, sched)
    runs = []
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        for replay in (True, False):
            trainer = hn_trainer(name, sched, rt, replay=replay)
            losses = []
            for x, y in batches():
                losses.append(trainer.train_step(x, y))
                if trainer.scheduler is not None:
                    trainer.scheduler.step()
            runs.append((losses, trainer.model.state_dict()))
    for losses, state in runs:
        assert rel_err(losses, expected_losses) <= 1e-9
        for key, value in expected.items():
            assert rel_err(state[key], value) <= 1e-9, key
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(runs[0][1][k], runs[1][1][k]) for k in expected)


class _Stop(Exception):
    pass


def stop_at(step):
    def on_step(trainer, loss):
        if trainer.global_step == step:
            raise _Stop
    return on_step


def test_groups_and_schedules_survive_a_checkpoint_bit_for_bit(tmp_path):
    data = batches(8)
    xy = (np.concatenate([b[0] for b in data]), np.concatenate([b[1] for b in data]))
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        whole = hn_trainer("adamw", "onecycle", rt, total=8)
        whole.fit(xy, epochs=1, verbose=0)
        expected = whole.model.state_dict()
        first = hn_trainer("adamw", "onecycle", rt, total=8)
        with pytest.raises(_Stop):  # killed after step 4; the checkpoint of step 3 stays
            first.fit(xy, epochs=1, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=3,
                      on_step=stop_at(4))
    ckpt = hn.checkpoint.read_checkpoint(tmp_path / "checkpoint.npz")
    groups = ckpt.optimizer["hyper"]["param_groups"]
    assert ckpt.global_step == 3
    assert [len(g["params"]) for g in groups] == [3, 4] and groups[1]["weight_decay"] == 0.0
    assert len(ckpt.scheduler["group_momentum"]) == 2
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        resumed = hn_trainer("adamw", "onecycle", rt, total=8)
        for group in resumed.optimizer.param_groups:
            group["lr"] = 123.0  # the checkpoint's values replace these
        resumed.load_checkpoint(tmp_path / "checkpoint.npz")
        assert [g["lr"] for g in resumed.optimizer.param_groups] == ckpt.scheduler["last_lr"]
        resumed.fit(xy, epochs=1, verbose=0)
        state = resumed.model.state_dict()
    assert all(np.array_equal(state[k], expected[k]) for k in expected)


def test_the_optimizer_state_names_the_groups_and_load_restores_their_options():
    model = make_model()
    decay, rest = split_groups(model.named_parameters())
    opt = hn.optim.SGD([{"params": decay}, {"params": rest, "lr": 0.5}], lr=0.1, momentum=0.9)
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        model.bind(rt)
        opt.bind(model.named_parameters(), rt)
        sd = opt.state_dict()
    assert sd["hyper"]["param_groups"][1]["params"] == ["1.weight", "1.bias", "5.bias", "7.bias"]
    assert sd["hyper"]["lr"] == 0.1 and sd["hyper"]["param_groups"][1]["lr"] == 0.5
    other = hn.optim.SGD([{"params": decay}, {"params": rest, "lr": 0.01}], lr=0.1, momentum=0.9)
    other.bind(model.named_parameters(), None)
    other.load_state_dict(sd)
    assert other.param_groups[1]["lr"] == 0.5
    swapped = hn.optim.SGD([{"params": rest}, {"params": decay}], lr=0.1, momentum=0.9)
    swapped.bind(model.named_parameters(), None)
    with pytest.raises(hn.CheckpointError, match="parameter group 0 holds"):
        swapped.load_state_dict(sd)


def test_a_standalone_step_updates_the_parameters_given():
    model = make_model()
    opt = hn.optim.SGD(model.parameters(), lr=0.5)
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        model.bind(rt)
        model.zero_grad(rt)
        for p in model.parameters():
            rt.submit(hn.codelets.Codelet("ones", modes=(hn.W,),
                                          variants={"ref": lambda a: a.fill(1.0)}), p.grad)
        before = model.state_dict()
        opt.step()
        after = model.state_dict()
    for name, _ in model.named_parameters():
        np.testing.assert_allclose(after[name], before[name] - 0.5, rtol=0, atol=1e-15)


@pytest.mark.parametrize("call, match", [
    (lambda m: hn.optim.Adam(0.01), r"Adam: the first argument is the parameters to optimize: "
                                    r"model.parameters\(\) or a list of parameter groups .*; got "
                                    r"the number 0.01 \(give the learning rate as lr=0.01\)"),
    (lambda m: hn.optim.SGD(m, lr=0.1), r"got a hetero_nn.Sequential; give model.parameters\(\)"),
    (lambda m: hn.optim.SGD([], lr=0.1), "empty parameter list"),
    (lambda m: hn.optim.SGD([{"params": m.parameters(), "betas": (0.9, 0.9)}]),
     r"parameter group 0 has the unknown option 'betas' \(expected 'params', 'lr', 'momentum'"),
    (lambda m: hn.optim.AdamW([{"params": m.parameters()[:2]}, {"params": m.parameters()[1:]}]),
     "more than one parameter group"),
    (lambda m: hn.optim.SGD([{"lr": 0.1}]), "parameter group 0 must be a dict with 'params'"),
    (lambda m: hn.optim.SGD([{"params": m.parameters(), "lr": -1}]),
     "SGD parameter group 0: lr must be >= 0"),
    (lambda m: hn.optim.SGD(torch.nn.Linear(2, 2).parameters()), "a torch.Parameter among them"),
    (lambda m: hn.optim.Adam(m.parameters(), betas=0.9), "Adam: betas must be a pair"),
])
def test_wrong_calls_say_what_was_expected(call, match):
    with pytest.raises(hn.ConfigError, match=match):
        call(make_model())


def test_parameters_of_another_model_are_refused_at_bind():
    opt = hn.optim.SGD(make_model().parameters(), lr=0.1)
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        with pytest.raises(hn.ConfigError, match="parameter group 0 holds a parameter that is "
                                                 "not the model's"):
            hn.Trainer(make_model(), optimizer=opt, runtime=rt, batch_size=BATCH).train_step(
                *batches(1)[0])
