"""Whole training steps on emulated CUDA devices equal PyTorch's (float64, 1e-9) and are
bit-identical under every policy.

LeNet-5 and an odd strided net (``conv 3@3x3 stride 2 pad 1 -> pool 3 stride 2 ->
dense``) train for a few SGD-momentum steps on ``cuda-emu:1`` (every task on the
device: batches copied in through the staging buffers, results copied back) and on
``cpu:1,cuda-emu:1`` (tasks on both, transfers both ways, REDUX partials on both),
from the weights and batches of ``test_training_vs_torch``.

On ``cuda-emu:1`` every policy gives the same bits. On ``cpu:1,cuda-emu:1`` every policy
equals PyTorch to 1e-9, but the bits depend on where each ``conv2d_fwd`` ran: its
``ref`` variant (window sums) and its ``cuda`` variant (im2col + batched GEMM) round
differently, as cuBLAS and a CPU do (every other codelet's two variants agree
bit for bit on these runs), so there the test asserts the agreement with PyTorch only.
"""

from __future__ import annotations

from unittest import mock

import pytest

torch = pytest.importorskip("torch")

import hetero_nn as hn  # noqa: E402
import test_training_vs_torch as tvt  # noqa: E402

DEVICES = ("cuda-emu:1", "cpu:1,cuda-emu:1")
STEPS = 5
OPT = "sgd-momentum"


def strided_net():
    return hn.Sequential(hn.Conv2D(1, 3, 3, stride=2, padding=1), hn.ReLU(),
                         hn.MaxPool2D(3, stride=2), hn.Flatten(), hn.Dense(108, 10))


@pytest.fixture(autouse=True, scope="module")
def _strided_net_known():
    with mock.patch.dict(tvt.NETS, {"strided": strided_net}):
        yield


def emu_run(net, devices, policy, granularity=3) -> tvt.Run:
    model = tvt.fresh_model(net, "float64")
    with hn.Runtime(devices=devices, policy=policy, deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(), tvt.ALL_OPTIMIZERS[OPT][0](),
                             rt, batch_size=tvt.BATCH, granularity=granularity, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in tvt.batches("float64", STEPS)]
        state = trainer.optimizer.state_dict()["state"]
        weights = model.state_dict()  # while the runtime lives: fetched from the device
        ran, workers = {}, set()
        for record in rt.trace():
            ran.setdefault(record.codelet, set()).add(record.variant)
            workers.add(record.worker)
        moved = rt.trace().bytes_moved
    buffers = {(p, b): a for p, st in state.items() for b, a in st.items()}
    run = tvt.Run(losses, weights, buffers, ran, workers)
    run.moved = moved
    return run


@pytest.mark.parametrize("devices", DEVICES)
@pytest.mark.parametrize("net", ["lenet5", "strided"])
def test_training_on_emulated_devices_equals_torch_and_is_the_same_under_every_policy(net, devices):
    ref = tvt.torch_run(net, OPT, "float64", STEPS)
    first = None
    for policy in tvt.POLICIES:
        run = emu_run(net, devices, policy)
        problems = tvt.compare(run, ref, tvt.REL_F64, f"{net}/{devices}/{policy}")
        assert not problems, "\n".join(problems)
        assert tvt.training_moved(run, net, "float64")
        assert "cuda-emu0" in run.workers and run.moved > 0
        if devices != "cuda-emu:1":
            continue  # bits depend on the placement of conv2d_fwd (module docstring)
        assert run.variants["conv2d_fwd"] == {"cuda"}
        digests = run.digests()
        if first is None:
            first = digests
        differ = [k for k in first if first[k] != digests[k]]
        assert not differ, f"{devices}: {policy} differs from {tvt.POLICIES[0]} in {differ}"
