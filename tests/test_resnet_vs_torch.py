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
import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err
from twins import torch_twin

torch = pytest.importorskip("torch")

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


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def fresh_model(p=0.0):
    model = resnet(p)
    model.build(INPUT_SHAPE, "float64")
    model.load_state_dict(initial_state())
    return model


@functools.lru_cache(maxsize=None)
def batches(steps=STEPS):
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(steps + 1):  # the last one is held out for evaluation
        x = rng.standard_normal((BATCH, *INPUT_SHAPE)) * rng.uniform(0.5, 3) + rng.uniform(-1, 1)
        out.append((x, rng.integers(0, 10, BATCH)))
    return tuple(out)


class Run:
    def __init__(self, losses, state, buffers, eval_loss):
        self.losses = np.asarray(losses)
        self.state = state        # model.state_dict(): weights and running statistics
        self.buffers = buffers    # {(param, buffer): array} of the optimizer
        self.eval_loss = eval_loss

    def digest(self):
        h = hashlib.sha256(self.losses.tobytes())
        for key in sorted(self.state):
            h.update(np.ascontiguousarray(self.state[key]).tobytes())
        for key in sorted(self.buffers):
            h.update(np.ascontiguousarray(self.buffers[key]).tobytes())
        h.update(np.float64(self.eval_loss).tobytes())
        return h.hexdigest()


@functools.lru_cache(maxsize=None)
def torch_run(opt):
    twin = torch_twin(fresh_model())
    names = dict(twin.named_parameters())
    optimizer = OPTIMIZERS[opt][1](twin.parameters())
    losses = []
    for x, y in batches()[:-1]:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    twin.eval()
    x, y = batches()[-1]
    with torch.no_grad():
        eval_loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)),
                                                      torch.from_numpy(y)).item()
    state = {k: v.numpy().copy() for k, v in twin.state_dict().items()}
    buffers = {(n, b): t.numpy().copy() for n, p in names.items()
               for b, t in optimizer.state[p].items() if b != "step" and t is not None}
    return Run(losses, state, buffers, eval_loss)


def hn_run(opt, granularity, policy, p=0.0, variants=None):
    model = fresh_model(p)
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=True, perfmodel=False,
                    variants=variants) as rt:
        trainer = hn.Trainer(model, optimizer=OPTIMIZERS[opt][0](), runtime=rt, batch_size=BATCH,
                             granularity=granularity, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in batches()[:-1]]
        eval_loss, _ = trainer.evaluate(batches()[-1])
        assert model.training  # evaluate switched to eval mode and back
        state = model.state_dict()
        opt_state = trainer.optimizer.state_dict()["state"]
        ran = {(r.codelet, r.variant) for r in rt.trace()}
    if variants is not None:
        assert ("bn_fwd", variants[-1]) in ran and ("gelu_bwd", variants[-1]) in ran
    buffers = {(name, b): a for name, st in opt_state.items() for b, a in st.items()}
    return Run(losses, state, buffers, eval_loss)


def compare(run, ref, rel):
    problems = []
    err = float(np.max(np.abs(run.losses - ref.losses) / np.abs(ref.losses)))
    if not err <= rel:
        problems.append(f"losses differ by {err:.3g}")
    assert list(run.state) == list(ref.state)
    for key, expected in ref.state.items():
        assert run.state[key].shape == expected.shape, key
        e = rel_err(run.state[key], expected)
        if not e <= rel:
            problems.append(f"{key} differs by {e:.3g}")
    assert run.buffers.keys() == ref.buffers.keys()
    for key, expected in ref.buffers.items():
        e = rel_err(run.buffers[key], expected)
        if not e <= rel:
            problems.append(f"optimizer buffer {key} differs by {e:.3g}")
    e = abs(run.eval_loss - ref.eval_loss) / abs(ref.eval_loss)
    if not e <= rel:
        problems.append(f"eval-mode loss differs by {e:.3g}")
    return problems


_DIGESTS: dict = {}


@pytest.mark.parametrize("granularity", [1, 3])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_training_steps_equal_torch_and_policies_give_the_same_bits(opt, granularity):
    ref = torch_run(opt)
    runs = {policy: hn_run(opt, granularity, policy) for policy in POLICIES}
    run = runs[POLICIES[0]]
    problems = compare(run, ref, REL_F64)
    assert not problems, "\n".join(problems)
    start = initial_state()
    assert all(rel_err(run.state[k], start[k]) > 1e-3 for k in start
               if k.endswith(("weight", "running_mean"))), "training did not move"
    assert int(run.state["1.num_batches_tracked"]) == STEPS
    assert abs(run.eval_loss - run.losses[-1]) > 1e-6  # eval mode is not train mode
    digests = {policy: r.digest() for policy, r in runs.items()}
    assert len(set(digests.values())) == 1, digests


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
    assert first.digest() == again.digest()
    other = hn_run("sgd-momentum", 1, "dmda", p=0.3)
    assert not compare(other, first, 1e-9)  # the same masks: equal to rounding
    no_dropout = hn_run("sgd-momentum", 3, "eager")
    assert compare(no_dropout, first, 1e-3)  # dropout did change the run
