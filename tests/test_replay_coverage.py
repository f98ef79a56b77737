"""Which tasks of a replayed training step run in the engine's compiled loop.

Every task of the built-in models' steps (dahl-basic, LeNet-5 fused and unfused,
cifar-small, resnet-small; SGD with momentum, Adam, AdamW with gradient clipping; a
network with BatchNorm2D, Dropout and Dropout2d; the evaluation step) must be bound to
compiled calls: a task that runs as Python makes its worker take the interpreter lock
back for it. Where one may not, it is named in ``PYTHON_TASKS`` with the reason. And the
compiled steps give the bits of submitted ones.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import pytest

import hetero_nn as hn

BATCH = 6
STEPS = 3
#: (codelet, variant) -> why its tasks run as Python in a replayed step (none today).
PYTHON_TASKS: dict = {}


def _bn_dropout(shape, dtype):
    hn.manual_seed(5)
    c = shape[0]
    model = hn.Sequential(hn.Conv2D(c, 4, 3, padding=1), hn.BatchNorm2D(4), hn.ReLU(),
                          hn.Dropout2d(0.25, seed=2), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dropout(0.3, seed=1), hn.Dense(4 * (shape[1] // 2) ** 2, 10))
    model.build(shape, dtype)
    return model


def _every_layer(shape, dtype):
    """The layers the built-in models do not use: a depthwise convolution, the other
    activations, average pooling, LayerNorm, Softmax and LogSoftmax (with NLLLoss)."""
    hn.manual_seed(6)
    c = shape[0]
    model = hn.Sequential(
        hn.Conv2D(c, 2 * c, 3, padding=1, groups=c), hn.LeakyReLU(0.1), hn.GELU(),
        hn.AvgPool2D(2), hn.SiLU(), hn.Conv2D(2 * c, 4, 1), hn.ReLU6(), hn.Hardswish(),
        hn.AdaptiveAvgPool2d(2), hn.LayerNorm((4, 2, 2)), hn.Flatten(), hn.Dense(16, 12), hn.Tanh(),
        hn.Sigmoid(), hn.Softmax(dim=1), hn.Dense(12, 10), hn.LogSoftmax())
    model.build(shape, dtype)
    return model


def _model(name, shape, dtype):
    if name == "bn-dropout":
        return _bn_dropout(shape, dtype)
    if name == "every-layer":
        return _every_layer(shape, dtype)
    return hn.build_model(name, shape, 10, dtype=dtype, seed=4)


def _optimizer(name):
    if name == "sgd":
        return hn.optim.SGD(lr=0.05, momentum=0.9), None
    if name == "adam":
        return hn.optim.Adam(lr=1e-2), None
    return hn.optim.AdamW(lr=1e-2, weight_decay=0.05), 0.5  # with clipping


# (model, input shape, optimizer, fuse)
CASES = [("dahl-basic", (1, 10, 10), "sgd", True),
         ("lenet5", (1, 12, 12), "sgd", True),
         ("lenet5", (1, 12, 12), "adam", False),
         ("cifar-small", (3, 8, 8), "adamw", True),
         ("resnet-small", (3, 8, 8), "sgd", True),
         ("resnet-small", (3, 8, 8), "adam", True),
         ("bn-dropout", (3, 8, 8), "adamw", True)]


def _run(name, shape, opt, fuse, replay, g=2, dtype="float64", loss=None,
         draw="standard_normal"):
    """``(digest of losses, weights, buffers and optimizer state, Counter of the replayed
    tasks that ran as Python by (codelet, variant, why), tasks bound)``."""
    model = _model(name, shape, dtype)
    model.fuse = fuse
    optimizer, clip = _optimizer(opt)
    rng = np.random.default_rng(11)
    h = hashlib.sha256()
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = hn.Trainer(model, loss=loss, optimizer=optimizer, runtime=rt, batch_size=BATCH,
                             granularity=g, dtype=dtype, replay=replay, clip_grad_norm=clip)
        for _ in range(STEPS):
            x = getattr(rng, draw)((BATCH, *shape)).astype(dtype)
            y = rng.integers(0, 10, BATCH)
            h.update(np.float64(trainer.train_step(x, y)).tobytes())
            h.update(np.float64(trainer.evaluate_batch(x, y)[0]).tobytes())
        for key, a in sorted(model.state_dict().items()):
            h.update(key.encode() + np.ascontiguousarray(a).tobytes())
        for state in optimizer.state_dict()["state"].values():
            for key, a in sorted(state.items()):
                h.update(key.encode() + np.ascontiguousarray(a).tobytes())
        python, bound = collections.Counter(), 0
        for graph in trainer.graphs.values():
            if graph._compiled is None or graph._compiled.segments is None:
                continue
            for seg in graph._compiled.segments:
                for b in seg.bound:
                    bound += 1
                    if b.calls is None:
                        python[(b.task.codelet.name, b.variant, b.why)] += 1
        trainer.close()
    return h.hexdigest(), python, bound


@pytest.mark.parametrize("name, shape, opt, fuse", CASES,
                         ids=[f"{c[0]}-{c[2]}{'' if c[3] else '-unfused'}" for c in CASES])
def test_every_task_of_a_built_in_model_s_step_runs_compiled(name, shape, opt, fuse):
    replayed, python, bound = _run(name, shape, opt, fuse, True)
    assert bound > 0  # training and evaluation steps were replayed on the engine
    unexpected = {k: n for k, n in python.items() if k[:2] not in PYTHON_TASKS}
    assert not unexpected, f"{sum(unexpected.values())} of {bound} tasks run as Python: " \
                           f"{unexpected}"
    submitted, _, _ = _run(name, shape, opt, fuse, False)
    assert replayed == submitted


#: Codelets of the spiking models whose tasks still run as Python in a replay, and why.
SPIKING_PYTHON = {
    "spike_dense_fwd": "the weight's transpose and the bias fill are NumPy around the kernel",
    "spike_dense_bwd_params": "the transpose-add into dw is NumPy around the kernel",
    "membrane_xent": "a Python loop over the time steps of the softmax cross-entropy",
    "membrane_xent_eval": "the same loop, evaluating",
    "lif_bwd": "beta's and the threshold's gradients are added to their partials in Python",
}


@pytest.mark.parametrize("name", ["snn-mlp", "snn-conv"])
def test_spiking_models_replay_compiled_but_for_the_codelets_named(name):
    """The per-step layers (time folded into the batch), Repeat and the LIF forward scans
    run compiled; what does not is in ``SPIKING_PYTHON``. Same bits as submitted steps.
    (Intensities in [0, 1], as the CLI feeds a spiking model: their spike rates, part of
    the step key, then stay in one bucket, so the steps replay.)"""
    shape = (1, 12, 12) if name == "snn-mlp" else (1, 28, 28)
    replayed, python, bound = _run(name, shape, "sgd", True, True, draw="random",
                                   loss=hn.losses.MembraneCrossEntropy())
    unexpected = {k: n for k, n in python.items() if k[0].split(".")[0] not in SPIKING_PYTHON}
    assert bound > 0 and not unexpected, f"{sum(unexpected.values())} of {bound} tasks run " \
                                         f"as Python: {unexpected}"
    assert sum(python.values()) < bound / 3
    submitted, _, _ = _run(name, shape, "sgd", True, False, draw="random",
                           loss=hn.losses.MembraneCrossEntropy())
    assert replayed == submitted


@pytest.mark.parametrize("loss", ("nll", "mse"))
def test_the_other_layers_and_losses_run_compiled(loss):
    """A network of every layer the built-in models leave out, under NLLLoss (it ends with
    LogSoftmax) and MSELoss (one-hot targets), with Adam; granularity 3."""
    make = {"nll": hn.losses.NLLLoss, "mse": hn.losses.MSELoss}[loss]
    replayed, python, bound = _run("every-layer", (2, 8, 8), "adam", True, True, g=3,
                                   loss=make())
    assert bound > 0 and not python, f"{sum(python.values())} of {bound} tasks run as " \
                                     f"Python: {dict(python)}"
    submitted, _, _ = _run("every-layer", (2, 8, 8), "adam", True, False, g=3, loss=make())
    assert replayed == submitted
