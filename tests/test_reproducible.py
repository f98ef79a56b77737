"""Reproducible by default: a default ``Runtime()`` trains to the same bits everywhere.

LeNet-5 in float64, trained for a few SGD steps at granularity 2 (partitions and
REDUX trees in play) by a ``Runtime`` given nothing but its devices and policy:
under ``eager``, ``dmda`` and ``heft`` with 1 and 2 workers the weights are bit
for bit the same, they equal PyTorch's to 1e-9, and two identical Python
processes give the same bits. The runs use the pinned variants of
:data:`hetero_nn.codelets.pinned.PINNED_VARIANTS` (checked on the trace), with
the performance model active: it records but does not choose.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.codelets.pinned import PINNED_VARIANTS
from hetero_nn.models import build_model
from helpers import torch_sgd_losses

STEPS, BATCH, GRANULARITY, SEED = 4, 8, 2, 7
CONFIGS = [(policy, workers) for policy in ("eager", "dmda", "heft") for workers in (1, 2)]


def batches():
    rng = np.random.default_rng(SEED)
    return [(rng.standard_normal((BATCH, 1, 28, 28)), rng.integers(0, 10, BATCH))
            for _ in range(STEPS)]


def initial_model():
    return build_model("lenet5", (1, 28, 28), 10, dtype="float64", seed=SEED)


def train(policy="eager", workers=2):
    """``(weights, variants run per codelet)`` after ``STEPS`` steps on a default Runtime."""
    model = initial_model()
    with hn.Runtime(devices=f"cpu:{workers}", policy=policy) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.05, momentum=0.9), rt, batch_size=BATCH,
                             granularity=GRANULARITY, dtype="float64")
        for x, y in batches():
            trainer.train_step(x, y)
        ran = {}
        for record in rt.trace():
            ran.setdefault(record.codelet, set()).add(record.variant)
    return model.state_dict(), ran


def digest(weights) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name]).tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def run(policy, workers):
    return train(policy, workers)


def test_default_runtime_is_pinned():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        assert rt.deterministic and rt.preferred == PINNED_VARIANTS
    weights, ran = run("eager", 2)
    assert all(len(variants) == 1 for variants in ran.values()), ran
    convolutions = [name for name in ran if name.startswith("conv2d") and "." not in name]
    assert convolutions and all(ran[name] == {"cpu:im2col"} for name in convolutions), ran
    assert ran["dense_fwd"] == {"cpu:blas"} and ran["sgd_step"] == {"cpu"}, ran
    fused_dense = [name for name in ran if name.startswith("dense_relu") and ".redux" not in name]
    assert fused_dense and all(ran[name] == {"cpu:blas"} for name in fused_dense), ran
    twins = [name for name in ran if name.endswith(".overwrite")]  # first contributions
    assert twins and all(ran[name] == ran.get(name.partition(".")[0], ran[name]) for name in twins)
    assert ran["dense_bwd_params.overwrite"] == {"cpu:blas"}, ran  # as its base: one kernel per gradient


@pytest.mark.parametrize("policy, workers", CONFIGS[1:], ids=[f"{p}-{w}" for p, w in CONFIGS[1:]])
def test_every_policy_and_worker_count_gives_the_same_bits(policy, workers):
    expected = digest(run(*CONFIGS[0])[0])
    assert digest(run(policy, workers)[0]) == expected


def test_equal_to_pytorch():
    pytest.importorskip("torch", reason="the PyTorch cross-check needs torch")
    from test_training_vs_torch import torch_twin

    model = initial_model()
    twin = torch_twin(model, "float64")
    torch_sgd_losses(twin, batches(), 0.05, 0.9)
    expected = {k: v.detach().numpy() for k, v in twin.state_dict().items()}
    weights, _ = run("dmda", 2)
    start = model.state_dict()
    for name, value in expected.items():
        scale = np.max(np.abs(value))
        assert np.max(np.abs(weights[name] - value)) / scale <= 1e-9, name
        assert np.max(np.abs(weights[name] - start[name])) / scale > 1e-4, name  # it trained


def test_two_python_processes_give_the_same_bits():
    root = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root.parent), str(root), os.environ.get("PYTHONPATH", "")]))
    script = ("import test_reproducible as t; "
              "print(t.digest(t.train('dmda', 2)[0]))")
    digests = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, check=True, timeout=300).stdout.strip()
               for _ in range(2)]
    assert digests[0] == digests[1] == digest(run("dmda", 2)[0])
