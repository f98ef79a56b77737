"""Learning-rate schedules against torch.optim.lr_scheduler (the same floats over
100+ steps, momentum/beta1 cycling included), their state_dict round trip, their
argument checks, and clip_grad_norm through the runtime against
torch.nn.utils.clip_grad_norm_."""

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hetero_nn as hn  # noqa: E402
from hetero_nn.errors import CheckpointError, ConfigError  # noqa: E402
from helpers import rel_err  # noqa: E402

OPTIMIZERS = {  # name: (hetero_nn, torch), the same arguments
    "sgd": (lambda: hn.optim.SGD(lr=0.1, momentum=0.9),
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    "adam": (lambda: hn.optim.Adam(lr=3e-3), lambda ps: torch.optim.Adam(ps, lr=3e-3)),
    "adamw": (lambda: hn.optim.AdamW(lr=2e-3, weight_decay=0.05),
              lambda ps: torch.optim.AdamW(ps, lr=2e-3, weight_decay=0.05)),
}
SCHEDULES = {  # name: (args, kwargs) given to both, and the steps to compare
    "StepLR": ((7,), {"gamma": 0.3}, 120),
    "StepLR-default": ((10,), {}, 100),
    "CosineAnnealingLR": ((13,), {"eta_min": 1e-4}, 120),  # past T_max: torch's recursion cycles
    "CosineAnnealingLR-default": ((50,), {}, 100),
    "OneCycleLR": ((0.5,), {"total_steps": 100}, 100),
    "OneCycleLR-linear-3phase": ((0.2,), {"total_steps": 97, "anneal_strategy": "linear",
                                          "three_phase": True, "div_factor": 10.0}, 97),
    "OneCycleLR-epochs": ((0.3,), {"epochs": 4, "steps_per_epoch": 25, "pct_start": 0.25,
                                   "base_momentum": 0.8, "max_momentum": 0.9,
                                   "final_div_factor": 100.0}, 100),
}


def momentum_of(opt):
    if isinstance(opt, torch.optim.Optimizer):
        group = opt.param_groups[0]
        return group["betas"][0] if "betas" in group else group["momentum"]
    return opt.betas[0] if isinstance(opt, hn.optim.Adam) else opt.momentum


def torch_schedule(opt_name, sched_name):
    args, kwargs, steps = SCHEDULES[sched_name]
    opt = OPTIMIZERS[opt_name][1]([torch.nn.Parameter(torch.zeros(1))])
    cls = getattr(torch.optim.lr_scheduler, sched_name.split("-")[0])
    sched = cls(opt, *args, **kwargs)
    lrs, moms = [sched.get_last_lr()[0]], [momentum_of(opt)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            opt.step()
            sched.step()
            lrs.append(sched.get_last_lr()[0])
            moms.append(momentum_of(opt))
    return lrs, moms


@pytest.mark.parametrize("sched_name", list(SCHEDULES))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_schedule_gives_torchs_floats(opt_name, sched_name):
    args, kwargs, steps = SCHEDULES[sched_name]
    opt = OPTIMIZERS[opt_name][0]()
    sched = getattr(hn.optim, sched_name.split("-")[0])(opt, *args, **kwargs)
    lrs, moms = [sched.get_last_lr()[0]], [momentum_of(opt)]
    for _ in range(steps):
        sched.step()
        lrs.append(sched.get_last_lr()[0])
        moms.append(momentum_of(opt))
        assert opt.lr == lrs[-1]
    expected_lrs, expected_moms = torch_schedule(opt_name, sched_name)
    assert lrs == expected_lrs  # bit for bit: the same Python float arithmetic
    assert moms == expected_moms
    assert len(set(lrs)) > 3  # the schedule did move


def test_state_dict_round_trip_continues_identically():
    opt = hn.optim.SGD(lr=0.1, momentum=0.9)
    sched = hn.optim.OneCycleLR(opt, max_lr=0.4, total_steps=50)
    for _ in range(17):
        sched.step()
    state = json.loads(json.dumps(sched.state_dict()))  # what a checkpoint stores
    rest = []
    for _ in range(20):
        sched.step()
        rest.append((opt.lr, opt.momentum))
    opt2 = hn.optim.SGD(lr=0.1, momentum=0.9)
    sched2 = hn.optim.OneCycleLR(opt2, max_lr=0.4, total_steps=50)
    sched2.load_state_dict(state)
    assert sched2.get_last_lr() == [state["last_lr"][0]] and opt2.lr == state["last_lr"][0]
    rest2 = []
    for _ in range(20):
        sched2.step()
        rest2.append((opt2.lr, opt2.momentum))
    assert rest == rest2
    with pytest.raises(CheckpointError, match="for OneCycleLR, the run uses StepLR"):
        hn.optim.StepLR(hn.optim.SGD(lr=0.1), 3).load_state_dict(state)


@pytest.mark.parametrize("make, message", [
    (lambda: hn.optim.StepLR(hn.optim.SGD(lr=0.1), 0), "step_size"),
    (lambda: hn.optim.CosineAnnealingLR(hn.optim.SGD(lr=0.1), T_max=0), "T_max"),
    (lambda: hn.optim.OneCycleLR(hn.optim.SGD(lr=0.1, momentum=0.9), 0.1), "total_steps"),
    (lambda: hn.optim.OneCycleLR(hn.optim.SGD(lr=0.1), 0.1, total_steps=10), "momentum"),
    (lambda: hn.optim.OneCycleLR(hn.optim.Adam(), 0.1, total_steps=10, anneal_strategy="exp"),
     "anneal_strategy"),
    (lambda: hn.optim.StepLR("sgd", 3), "optimizer"),
])
def test_bad_schedule_arguments_are_named(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_onecycle_refuses_to_step_past_its_end():
    sched = hn.optim.OneCycleLR(hn.optim.Adam(), 0.01, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ConfigError, match="total_steps is 3"):
        sched.step()


def test_adamw_defaults_are_torchs():
    ours, theirs = hn.optim.AdamW(), torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    d = theirs.defaults
    assert (ours.lr, ours.betas, ours.eps, ours.weight_decay) == \
        (d["lr"], d["betas"], d["eps"], d["weight_decay"])


@pytest.mark.parametrize("max_norm", [0.05, 100.0])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_clip_grad_norm_through_the_runtime_matches_torch(dtype, max_norm):
    hn.manual_seed(3)
    model = hn.Sequential(hn.Conv2D(2, 3, 3), hn.ReLU(), hn.Flatten(), hn.Dense(3 * 4 * 4, 5))
    model.build((2, 6, 6), dtype)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 2, 6, 6)).astype(dtype)
    y = rng.integers(0, 5, 6)
    with hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=6, granularity=3, dtype=dtype)
        xs, ys = trainer.register_batch(x, y)
        model.zero_grad(rt)
        logits = model.forward(rt, xs)
        _, _, dlogits = trainer.loss(rt, logits, ys)
        model.backward(rt, dlogits)
        norm = hn.optim.clip_grad_norm(model, max_norm)
        grads = {name: rt.fetch(p.grad, copy=True) for name, p in model.named_parameters()}
    tw = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                             torch.nn.Linear(48, 5)).to(getattr(torch, dtype))
    tw.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    torch.nn.functional.cross_entropy(tw(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    expected = torch.nn.utils.clip_grad_norm_(tw.parameters(), max_norm)
    tol = 1e-10 if dtype == "float64" else 1e-4
    assert rel_err(norm, expected.item()) <= tol
    for name, p in tw.named_parameters():
        assert rel_err(grads[name], p.grad.numpy()) <= tol
    assert (norm > max_norm) == (max_norm == 0.05)  # one case clips, the other does not
