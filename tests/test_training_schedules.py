"""Whole training runs with the training toolbox against PyTorch, and resumed runs.

The small net of test_training_vs_torch (same seeded weights and batches) trains
20 steps with AdamW + OneCycleLR + gradient clipping + label smoothing, and with
SGD Nesterov + CosineAnnealingLR + clipping; NLLLoss after LogSoftmax and MSELoss
train like torch's. float64 results equal PyTorch's to 1e-9 at granularity 1 and
3, and every policy gives the same bits. A run interrupted mid-epoch and resumed
from its checkpoint -- through a schedule, clipping and augmentation -- ends with
the same bits as an uninterrupted one.
"""

import functools
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hetero_nn as hn  # noqa: E402
from helpers import rel_err  # noqa: E402
from test_training_vs_torch import (BATCH, POLICIES, Run, batches, compare,  # noqa: E402
                                    fresh_model, torch_twin, training_moved)
from test_training_vs_torch import _one_torch_thread  # noqa: E402,F401 (autouse fixture)

STEPS = 20
REL_F64 = 1e-9
F = torch.nn.functional

RECIPES = {  # name: (hetero_nn optimizer + schedule, torch's, loss kwargs, clip max_norm)
    "adamw-onecycle": (
        lambda: hn.optim.AdamW(lr=2e-3, weight_decay=0.05),
        lambda o: hn.optim.OneCycleLR(o, max_lr=0.01, total_steps=STEPS),
        lambda ps: torch.optim.AdamW(ps, lr=2e-3, weight_decay=0.05),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.01, total_steps=STEPS),
        {"label_smoothing": 0.1}, 0.5),
    "sgd-nesterov-cosine": (
        lambda: hn.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda o: hn.optim.CosineAnnealingLR(o, T_max=8, eta_min=1e-3),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8, eta_min=1e-3),
        {}, 1.0),
}


@functools.lru_cache(maxsize=None)
def torch_recipe_run(name):
    _, _, make_opt, make_sched, loss_kw, max_norm = RECIPES[name]
    twin = torch_twin(fresh_model("small", "float64"), "float64")
    opt = make_opt(twin.parameters())
    sched = make_sched(opt)
    losses, norms = [], []
    for x, y in batches("float64", STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(twin(torch.from_numpy(x.copy())), torch.from_numpy(y.copy()),
                               **loss_kw)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm).item())
        opt.step()
        sched.step()
        losses.append(loss.item())
    names = dict(twin.named_parameters())
    buffers = {(n, b): t.numpy().copy() for n, p in names.items()
               for b, t in opt.state[p].items() if b != "step"}
    weights = {k: v.detach().numpy().copy() for k, v in twin.state_dict().items()}
    return Run(losses, weights, buffers), np.array(norms)


def hn_recipe_run(name, granularity, policy):
    make_opt, make_sched, _, _, loss_kw, max_norm = RECIPES[name]
    model = fresh_model("small", "float64")
    opt = make_opt()
    sched = make_sched(opt)
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(**loss_kw), opt, rt,
                             batch_size=BATCH, granularity=granularity, dtype="float64",
                             scheduler=sched, clip_grad_norm=max_norm)
        losses, norms = [], []
        for x, y in batches("float64", STEPS):
            losses.append(trainer.train_step(x, y))
            norms.append(trainer.last_grad_norm)
            sched.step()  # as the PyTorch loop: after the optimizer step
        state = opt.state_dict()["state"]
        weights = model.state_dict()
    buffers = {(p, b): a for p, st in state.items() for b, a in st.items()}
    return Run(losses, weights, buffers), np.array(norms)


@pytest.mark.parametrize("granularity", [1, 3])
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_training_equals_torch(name, granularity):
    ref, ref_norms = torch_recipe_run(name)
    run, norms = hn_recipe_run(name, granularity, "eager")
    problems = compare(run, ref, REL_F64, f"{name}/g={granularity}")
    assert not problems, "\n".join(problems)
    assert rel_err(norms, ref_norms) <= REL_F64
    max_norm = RECIPES[name][5]
    assert (norms > max_norm).any()  # clipping did act
    assert training_moved(run, "small", "float64")


def test_recipe_bit_identical_across_policies():
    first = hn_recipe_run("adamw-onecycle", 3, POLICIES[0])[0].digests()
    for policy in POLICIES[1:]:
        other = hn_recipe_run("adamw-onecycle", 3, policy)[0].digests()
        assert other == first, f"{policy} differs from {POLICIES[0]}"


def _train_other_loss(kind, granularity):
    """20 Adam steps with NLLLoss after LogSoftmax, or MSELoss on one-hot labels."""
    model = fresh_model("small", "float64")
    twin = torch_twin(model, "float64")
    if kind == "nll":
        model = hn.Sequential(*model, hn.LogSoftmax())
        model.build((1, 28, 28), "float64")
        model.load_state_dict(fresh_model("small", "float64").state_dict())
        loss, twin = hn.losses.NLLLoss(), torch.nn.Sequential(*twin, torch.nn.LogSoftmax(dim=1))

        def torch_loss(out, y):
            return F.nll_loss(out, y)
    else:
        loss = hn.losses.MSELoss(reduction="sum")

        def torch_loss(out, y):
            return F.mse_loss(out, F.one_hot(y, 10).to(out.dtype), reduction="sum")
    topt = torch.optim.Adam(twin.parameters(), lr=1e-3)
    ref_losses = []
    for x, y in batches("float64", STEPS):
        topt.zero_grad()
        out = torch_loss(twin(torch.from_numpy(x.copy())), torch.from_numpy(y.copy()))
        out.backward()
        topt.step()
        ref_losses.append(out.item())
    with hn.Runtime(devices="cpu:2", deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, loss, hn.optim.Adam(lr=1e-3), rt, batch_size=BATCH,
                             granularity=granularity, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in batches("float64", STEPS)]
        correct = trainer.last_correct
        x, y = batches("float64", STEPS)[-1]
        _, eval_correct = trainer.evaluate_batch(x, y)
    assert rel_err(losses, ref_losses) <= REL_F64
    for k, v in twin.state_dict().items():
        assert rel_err(model.state_dict()[k], v.detach().numpy()) <= REL_F64, k
    assert 0 <= correct <= BATCH and 0 <= eval_correct <= BATCH


@pytest.mark.parametrize("kind", ["nll", "mse"])
def test_nll_and_mse_training_equal_torch(kind):
    _train_other_loss(kind, 3)


# --------------------------------------------------------------------------- resume

class _Stop(Exception):
    pass


def _toy_images(n=40):
    rng = np.random.default_rng(12)
    images = rng.integers(0, 256, (n, 1, 10, 10), dtype=np.uint8)
    labels = rng.integers(0, 3, n)
    return hn.datasets.Dataset("toy", "train", labels, ["a", "b", "c"], (0.5,), (0.25,),
                               images=images)


class _Recorded:
    """An augmentation that records what it was asked to do, and on which thread."""

    def __init__(self, augment):
        self.augment, self.calls = augment, []

    def __call__(self, x, indices, *, seed, epoch):
        self.calls.append((epoch, tuple(indices), threading.current_thread().name))
        return self.augment(x, indices, seed=seed, epoch=epoch)


def _resume_trainer(data, schedule):
    hn.manual_seed(1)
    model = hn.Sequential(hn.Conv2D(1, 3, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dense(48, 3))
    opt = hn.optim.AdamW(lr=1e-2) if schedule == "onecycle" else \
        hn.optim.SGD(lr=0.05, momentum=0.9)
    sched = (hn.optim.OneCycleLR(opt, max_lr=0.05, total_steps=3 * 5) if schedule == "onecycle"
             else hn.optim.StepLR(opt, step_size=1, gamma=0.5))
    rt = hn.Runtime(devices="cpu:2", deterministic=True, perfmodel=False)
    return hn.Trainer(model, optimizer=opt, runtime=rt, batch_size=8, granularity=3,
                      dtype="float64", seed=4, scheduler=sched, clip_grad_norm=0.5,
                      augment=_Recorded(hn.transforms.standard_augmentation(data, padding=2)))


@pytest.mark.parametrize("schedule", ["onecycle", "step"])  # per step / per epoch
def test_resume_through_schedule_and_augmentation_is_bit_identical(tmp_path, schedule):
    data = _toy_images()
    with _resume_trainer(data, schedule) as whole:
        history = whole.fit(data, epochs=3, verbose=0)
        calls = whole.augment.calls
        expected = whole.model.state_dict()
        expected_lr = whole.optimizer.lr
        whole.runtime.close()

    def stop_after_seven(trainer, _loss):
        if trainer.global_step == 7:  # mid-epoch 2 (5 steps per epoch)
            raise _Stop

    with _resume_trainer(data, schedule) as first:
        with pytest.raises(_Stop):
            first.fit(data, epochs=3, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=1,
                      on_step=stop_after_seven)
        first.runtime.close()
    with _resume_trainer(data, schedule) as resumed:
        resumed.load_checkpoint(tmp_path / "checkpoint.npz")
        assert resumed.global_step == 6 and resumed.step_in_epoch == 1  # on_step runs first
        history2 = resumed.fit(data, epochs=3, verbose=0)
        resumed_calls = resumed.augment.calls
        got = resumed.model.state_dict()
        assert resumed.optimizer.lr == expected_lr
        resumed.runtime.close()
    for k in expected:
        assert np.array_equal(got[k], expected[k]), k
    assert [r["train_loss"] for r in history2] == [r["train_loss"] for r in history]
    # every training batch was augmented, on the loader thread, with its epoch and samples
    assert [c[0] for c in calls] == [e for e in range(3) for _ in range(5)]
    assert all(c[2].startswith("hetero_nn-loader") for c in calls)
    assert sorted(i for c in calls[5:10] for i in c[1]) == list(range(40))
    assert resumed_calls == calls[6:]


def test_checkpoint_without_the_schedule_is_refused(tmp_path):
    data = _toy_images(16)
    with _resume_trainer(data, "step") as trainer:
        trainer.fit(data, epochs=1, verbose=0, checkpoint_dir=tmp_path)
        trainer.runtime.close()
    hn.manual_seed(1)
    model = hn.Sequential(hn.Conv2D(1, 3, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dense(48, 3))
    with hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), batch_size=8,
                    dtype="float64") as plain:
        with pytest.raises(hn.CheckpointError, match="StepLR schedule's state"):
            plain.load_checkpoint(tmp_path / "checkpoint.npz")
