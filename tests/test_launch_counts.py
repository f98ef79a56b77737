"""Launches per training step on ``cuda-emu``, counted by the strict CuPy stand-in
(issue 29): batch norm over one partition is two tasks a layer a step, no task zeroes a
gradient, and a ResNet-18 step at batch 64 (one partition) stays within 400 launches.
The counts do not depend on the batch size (one task, one kernel, whatever it holds)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hetero_nn as hn
from helpers import REPO, within
from hetero_nn.codelets.strict_xp import checking, counters

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import launches  # noqa: E402  (benchmarks/gpu/launches.py)


def _residual():
    return hn.Sequential(
        hn.Conv2D(2, 4, 3, padding=1, bias=False), hn.BatchNorm2D(4), hn.ReLU(),
        hn.Residual([hn.Conv2D(4, 4, 3, padding=1, bias=False), hn.BatchNorm2D(4)],
                    [hn.Conv2D(4, 4, 1, bias=False), hn.BatchNorm2D(4)]),
        hn.ReLU(), hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(4, 10))


def _second_step(granularity):
    model = _residual()
    model.build((2, 6, 6), "float32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 2, 6, 6)).astype(np.float32)
    y = rng.integers(0, 10, 6)
    with checking(), hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.01, momentum=0.9), rt, batch_size=6,
                             granularity=granularity)
        trainer.train_step(x, y)
        counters.reset()
        trainer.train_step(x, y)
        return counters.snapshot(), dict(counters.variants)


def test_batch_norm_over_one_partition_is_two_tasks_a_layer_and_nothing_is_zeroed():
    counts, tasks = within(60, _second_step, 1)
    assert tasks["bn_train_fwd"] == tasks["bn_train_bwd"] == 3, tasks
    assert not {"fill_zero", "bn_sum", "bn_mean", "bn_running", "bn_param_grads"} & set(tasks)
    assert counts["syncs"] == counts["implicit"] == counts["unordered"] == 0


def test_over_several_partitions_only_the_batch_norm_sums_are_zeroed_by_a_task():
    """The chain a cluster reproduces: its four sums zeroed; no gradient reset."""
    counts, tasks = within(60, _second_step, 3)
    # the first batch norm and its ReLU run fused (layers/bn_activation.py)
    assert tasks["bn_sum"] == tasks["bn_fwd"] + tasks["bn_act_fwd"] == 3 * 3
    assert tasks["bn_act_fwd"] == 3 and "bn_train_fwd" not in tasks
    assert tasks["fill_zero"] == 4 * 3, tasks
    assert counts["syncs"] == counts["implicit"] == counts["unordered"] == 0


@pytest.mark.slow
def test_a_resnet18_step_at_batch_64_is_at_most_400_launches():
    """``python benchmarks/gpu/launches.py resnet18 --granularity 1``: 308 (717 before)."""
    counts = within(600, launches.step_counts, "resnet18", 64, 1)
    total = counts["total"]
    assert total["launches"] <= 400, counts["by_codelet"]
    assert total["syncs"] == total["implicit"] == total["unordered"] == 0
