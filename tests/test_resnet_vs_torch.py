"""Whole training steps of a small residual network with batch norm equal PyTorch's.

A network of the new layers -- a conv + BatchNorm2D + ReLU stem, an identity residual
block, a strided block with a 1x1 conv + batch norm shortcut, LeakyReLU, GELU, Dropout,
global average pooling, a dense head -- starts from the same weights as its torch twin
(copied through ``state_dict``) and sees the same seeded batches. After 20 optimizer
steps in train mode (batch statistics gathered across partitions by REDUX) the losses,
the weights, the running statistics and the optimizer's buffers equal PyTorch's
(float64, relative error <= 1e-9) at granularity 1 and 3, and the loss of a held-out
batch in eval mode (running statistics) equals torch's in ``.eval()``. The policies
give the same bits. Dropout runs with ``p=0`` in the cross-check (the masks of two
generators cannot agree); the seeded dropout run checks reproducibility instead.

``OPTIMIZERS`` maps a name to ``(hetero_nn optimizer, torch.optim constructor)``:
add an entry to run every test here with another optimizer.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err
from twins import torch_twin

torch = pytest.importorskip("torch")
from test_training_vs_torch import Run, compare as compare_run  # noqa: E402 (needs torch)

INPUT_SHAPE = (2, 10, 10)
BATCH = 12
STEPS = 20
SEED = 7
REL_F64 = 1e-9
POLICIES = ("eager", "dmda", "heft")

OPTIMIZERS = {
    "sgd-momentum": (lambda: hn.optim.SGD(lr=0.05, momentum=0.9),
                     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "sgd-nesterov-wd": (lambda: hn.optim.SGD(lr=0.03, momentum=0.8, nesterov=True,
                                             weight_decay=1e-3),
                        lambda ps: torch.optim.SGD(ps, lr=0.03, momentum=0.8, nesterov=True,
                                                   weight_decay=1e-3)),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def resnet(p=0.0):
    return hn.Sequential(
        hn.Conv2D(2, 4, 3, padding=1, bias=False), hn.BatchNorm2D(4), hn.ReLU(),
        hn.Residual([hn.Conv2D(4, 4, 3, padding=1, bias=False), hn.BatchNorm2D(4), hn.ReLU(),
                     hn.Conv2D(4, 4, 3, padding=1, bias=False), hn.BatchNorm2D(4)]),
        hn.LeakyReLU(0.05),
        hn.Residual([hn.Conv2D(4, 6, 3, stride=2, padding=1, bias=False), hn.BatchNorm2D(6),
                     hn.GELU(), hn.Conv2D(6, 6, 3, padding=1, bias=False),
                     hn.BatchNorm2D(6, momentum=0.2)],
                    [hn.Conv2D(4, 6, 1, stride=2, bias=False), hn.BatchNorm2D(6)]),
        hn.ReLU(), hn.Dropout(p, seed=SEED), hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(6, 10))


@functools.lru_cache(maxsize=None)
def initial_state():
    hn.manual_seed(SEED)
    model = resnet()
    model.build(INPUT_SHAPE, "float64")
    return model.state_dict()


def fresh_model(p=0.0, dtype="float64"):
    model = resnet(p)
    model.build(INPUT_SHAPE, dtype)
    model.load_state_dict(initial_state())
    return model


@functools.lru_cache(maxsize=None)
def batches(steps=STEPS, dtype="float64"):
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(steps + 1):  # the last one is held out for evaluation
        x = rng.standard_normal((BATCH, *INPUT_SHAPE)) * rng.uniform(0.5, 3) + rng.uniform(-1, 1)
        out.append((x.astype(dtype), rng.integers(0, 10, BATCH)))
    return tuple(out)


def with_eval_loss(run, eval_loss):
    """A training run's record (weights: the whole state_dict) and its held-out eval loss."""
    run.eval_loss = eval_loss
    return run


@functools.lru_cache(maxsize=None)
def torch_run(opt, steps=STEPS, dtype="float64"):
    twin = torch_twin(fresh_model(dtype=dtype), dtype)
    names = dict(twin.named_parameters())
    optimizer = OPTIMIZERS[opt][1](twin.parameters())
    losses = []
    for x, y in batches(steps, dtype)[:-1]:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    twin.eval()
    x, y = batches(steps, dtype)[-1]
    with torch.no_grad():
        eval_loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)),
                                                      torch.from_numpy(y)).item()
    state = {k: v.numpy().copy() for k, v in twin.state_dict().items()}
    buffers = {(n, b): t.numpy().copy() for n, p in names.items()
               for b, t in optimizer.state[p].items() if b != "step" and t is not None}
    return with_eval_loss(Run(losses, state, buffers), eval_loss)


def hn_run(opt, granularity, policy, p=0.0, variants=None, steps=STEPS, dtype="float64",
           perfmodel=False):
    model = fresh_model(p, dtype)
    data = batches(steps, dtype)
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=perfmodel is False,
                    perfmodel=perfmodel, variants=variants) as rt:
        trainer = hn.Trainer(model, optimizer=OPTIMIZERS[opt][0](), runtime=rt, batch_size=BATCH,
                             granularity=granularity, dtype=dtype)
        losses = [trainer.train_step(x, y) for x, y in data[:-1]]
        eval_loss, _ = trainer.evaluate(data[-1])
        assert model.training  # evaluate switched to eval mode and back
        state = model.state_dict()
        opt_state = trainer.optimizer.state_dict()["state"]
        ran = {(r.codelet, r.variant) for r in rt.trace()}
    if variants is not None:
        assert ("bn_fwd", variants[-1]) in ran and ("gelu_bwd", variants[-1]) in ran
    if perfmodel is not False:  # explored: the references and the Numba kernels both ran
        assert {("bn_fwd", "ref"), ("bn_fwd", "cpu")} <= ran
    buffers = {(name, b): a for name, st in opt_state.items() for b, a in st.items()}
    return with_eval_loss(Run(losses, state, buffers), eval_loss)


def compare(run, ref, rel, label=""):
    """The losses, weights, running statistics and optimizer buffers (as in the LeNet test),
    and the eval-mode loss of the held-out batch, whose error exceeds ``rel``."""
    problems = compare_run(run, ref, rel, label)
    err = abs(run.eval_loss - ref.eval_loss) / abs(ref.eval_loss)
    if not err <= rel:
        problems.append(f"{label}: eval-mode loss differs by {err:.3g}")
    return problems


@pytest.mark.parametrize("granularity", [1, 3])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_training_steps_equal_torch_and_policies_give_the_same_bits(opt, granularity):
    ref = torch_run(opt)
    runs = {policy: hn_run(opt, granularity, policy) for policy in POLICIES}
    run = runs[POLICIES[0]]
    problems = compare(run, ref, REL_F64)
    assert not problems, "\n".join(problems)
    start = initial_state()
    assert all(rel_err(run.weights[k], start[k]) > 1e-3 for k in start
               if k.endswith(("weight", "running_mean"))), "training did not move"
    assert int(run.weights["1.num_batches_tracked"]) == STEPS
    assert abs(run.eval_loss - run.losses[-1]) > 1e-6  # eval mode is not train mode
    digests = {policy: r.digests() for policy, r in runs.items()}
    for policy in POLICIES[1:]:
        differ = [k for k, v in digests[policy].items() if v != digests[POLICIES[0]][k]]
        assert not differ and runs[policy].eval_loss == run.eval_loss, (policy, differ)


def test_granularity_changes_only_the_last_bits():
    one, three = hn_run("sgd-momentum", 1, "eager"), hn_run("sgd-momentum", 3, "eager")
    assert not compare(three, one, 1e-11)


def test_numba_variants_train_like_torch():
    """The ``cpu`` (Numba) kernels of every codelet in the network, not the references."""
    run = hn_run("sgd-momentum", 3, "dmda", variants=("cpu:direct", "cpu"))
    problems = compare(run, torch_run("sgd-momentum"), REL_F64)
    assert not problems, "\n".join(problems)


def test_seeded_dropout_training_is_reproducible_and_independent_of_granularity():
    first = hn_run("sgd-momentum", 3, "heft", p=0.3)
    again = hn_run("sgd-momentum", 3, "eager", p=0.3)
    assert first.digests() == again.digests() and first.eval_loss == again.eval_loss
    other = hn_run("sgd-momentum", 1, "dmda", p=0.3)
    assert not compare(other, first, 1e-9)  # the same masks: equal to rounding
    no_dropout = hn_run("sgd-momentum", 3, "eager")
    assert compare(no_dropout, first, 1e-3)  # dropout did change the run


def test_float32_with_perfmodel_active_matches_torch_float32(tmp_path):
    """Variants explored by the performance model (ref and Numba mixed in one run)."""
    steps = 6
    ref = torch_run("sgd-momentum", steps, "float32")
    run = hn_run("sgd-momentum", 2, "dmda", steps=steps, dtype="float32",
                 perfmodel=tmp_path / "perfmodel")
    problems = compare(run, ref, 1e-4)
    assert not problems, "\n".join(problems)
    assert run.weights["0.weight"].dtype == np.float32
