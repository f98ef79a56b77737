"""The built-in ResNet-18 (CIFAR layout) and MobileNetV2 (CIFAR strides).

Their parameter counts are torchvision's for 10 classes (11,173,962 and 2,236,682); two
SGD-momentum steps in float64 at granularity 2, on 8x8 images (so the last stages run on
2x2 and 1x1 images), equal those of the ``torch.nn`` module ``to_torch`` makes of them
(1e-9), with the same bits under two policies; the CLI trains ``--model resnet18``.
"""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.cli import main
from hetero_nn.models import MODELS, build_model
from helpers import rel_err, torch_sgd_losses

BATCH, STEPS, LR, MOMENTUM = 4, 2, 0.005, 0.9
SHAPES = {"resnet18": (3, 8, 8), "mobilenetv2": (3, 16, 16)}
"""Images small enough for a short test; MobileNetV2's batch norms over 4 images of 1x1
(after 8x8 input) leave its second loss at 3e-9 of torch's, so it takes 16x16."""


@pytest.mark.parametrize("name, count", [("resnet18", 11_173_962), ("mobilenetv2", 2_236_682)])
def test_parameter_counts_are_torchvisions(name, count):
    assert name in MODELS
    model = build_model(name, (3, 32, 32), 10, seed=0)
    assert sum(p.data.size for p in model.parameters()) == count
    assert model.output_shape == (10,)


def hn_steps(name, batches, policy):
    model = build_model(name, SHAPES[name], 10, dtype="float64", seed=1)
    initial = model.state_dict()
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt, \
            hn.Trainer(model, optimizer=hn.optim.SGD(model.parameters(), lr=LR,
                                                     momentum=MOMENTUM),
                       runtime=rt, batch_size=BATCH, granularity=2) as trainer:
        losses = [trainer.train_step(x, y) for x, y in batches]
    return model, initial, losses


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_training_steps_equal_torch_and_policies_agree(name, one_torch_thread):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-check needs it")
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((BATCH, *SHAPES[name])), rng.integers(0, 10, BATCH))
               for _ in range(STEPS)]
    model, initial, losses = hn_steps(name, batches, "eager")
    twin = hn.to_torch(build_model(name, SHAPES[name], 10, dtype="float64", seed=1)).train()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    assert rel_err(losses, torch_sgd_losses(twin, batches, LR, MOMENTUM)) <= 1e-9
    expected = {k: v.numpy() for k, v in twin.state_dict().items()}
    for key, value in model.state_dict().items():  # floor: biases whose gradient is 0 (a
        assert rel_err(value, expected[key], floor=1e-6) <= 1e-9, key  # batch norm follows)
    heft, _, heft_losses = hn_steps(name, batches, "heft")
    assert heft_losses == losses  # the same bits
    assert all(np.array_equal(a, b) for a, b in zip(heft.state_dict().values(),
                                                    model.state_dict().values()))
    hn.close_default_runtime()


def test_cli_trains_resnet18(tmp_path, capsys):
    assert main(["train", "--dataset", "synthetic", "--limit", "16", "--batch-size", "8",
                 "--epochs", "1", "--model", "resnet18", "--devices", "cpu:1", "-q",
                 "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run").is_dir()
