"""Whole training steps through every new convolution and pooling option equal PyTorch's and
are bit-identical under every policy.

One network on 28x28 inputs holds them all: a fused ``Conv2d('same', reflect), ReLU,
MaxPool2d(3, 2, padding=1, ceil_mode)`` chain, a depthwise convolution, a grouped,
dilated, bias-free circular convolution, an ``AvgPool2d`` in ceil mode without the
padding in its divisors, a second fused chain with an even kernel ('same' padded
asymmetrically, replicate) and a dilated pooling, and ``AdaptiveAvgPool2d((2, 3))``.
It trains from ``test_training_vs_torch``'s weights and batches with SGD momentum:
with the pinned variants (the Numba kernels a user runs) at granularity 1 and 3 under
the five policies, with the NumPy references and with fusion off, and on an emulated
CUDA device (the ``cuda`` variants under NumPy); each run equals PyTorch within 1e-9
(float64) and, per setting, every policy gives the same bits.
"""

from __future__ import annotations

from unittest import mock

import pytest

torch = pytest.importorskip("torch")

import hetero_nn as hn  # noqa: E402
import test_training_vs_torch as tvt  # noqa: E402
from hetero_nn.codelets.pinned import PINNED_VARIANTS  # noqa: E402

OPT = "sgd-momentum"
STEPS = 5  # test_training_emu's emu_run trains this many steps

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


def options_net():
    return hn.Sequential(
        hn.Conv2d(1, 6, 3, padding="same", padding_mode="reflect"), hn.ReLU(),
        hn.MaxPool2d(3, 2, padding=1, ceil_mode=True),                        # 6 x 15 x 15
        hn.Conv2d(6, 6, 3, padding=1, groups=6), hn.ReLU(),                   # depthwise
        hn.Conv2d(6, 8, 3, padding=2, dilation=2, groups=2, bias=False, padding_mode="circular"),
        hn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),  # 8 x 8 x 8
        hn.Conv2d(8, 8, 2, padding="same", padding_mode="replicate"), hn.ReLU(),
        hn.MaxPool2d(2, 2, padding=1, dilation=2),                            # 8 x 4 x 4
        hn.AdaptiveAvgPool2d((2, 3)), hn.Flatten(), hn.Dense(48, 10))


@pytest.fixture(autouse=True, scope="module")
def _options_net_known():
    with mock.patch.dict(tvt.NETS, {"options": options_net}):
        yield


def check_policies(label, runs):
    """Every run equals PyTorch; all runs give the same bits."""
    ref = tvt.torch_run("options", OPT, "float64", STEPS)
    first = None
    for policy, run in runs:
        problems = tvt.compare(run, ref, tvt.REL_F64, f"{label}/{policy}")
        assert not problems, "\n".join(problems)
        assert tvt.training_moved(run, "options", "float64")
        first = first or run.digests()
        differ = [k for k, v in run.digests().items() if first[k] != v]
        assert not differ, f"{label}: {policy} differs from {tvt.POLICIES[0]} in {differ}"
    return run


@pytest.mark.parametrize("granularity", [1, 3])
def test_pinned_kernels_train_like_torch_and_identically_under_every_policy(granularity):
    runs = [(policy, tvt.hn_run("options", OPT, granularity, policy, steps=STEPS,
                                variants=PINNED_VARIANTS)) for policy in tvt.POLICIES]
    last = check_policies(f"pinned/g={granularity}", runs)
    ran = last.variants
    assert ran["conv2d_relu_pool_fwd"] == {"cpu:im2col"}  # both chains fused
    assert ran["conv2d_depthwise_fwd"] == {"cpu"} and ran["conv2d_depthwise_bwd_input"] == {"cpu"}
    assert ran["conv2d_fwd_nobias"] == {"cpu:winograd"} and ran["avgpool2d_fwd"] == {"cpu"}
    assert ran["adaptive_avgpool2d_fwd"] == {"cpu"} and ran["adaptive_avgpool2d_bwd"] == {"cpu"}


def test_references_and_unfused_layers_train_like_torch():
    check_policies("ref", [(p, tvt.hn_run("options", OPT, 3, p, steps=STEPS))
                           for p in ("eager", "heft")])
    run = check_policies("unfused", [(p, tvt.hn_run("options", OPT, 3, p, steps=STEPS,
                                                    fuse=False, variants=PINNED_VARIANTS))
                                     for p in ("dmda", "ws")])
    assert "conv2d_relu_pool_fwd" not in run.variants
    assert run.variants["maxpool2d_fwd"] == {"cpu"}


def test_cuda_variants_on_an_emulated_device_train_like_torch():
    import test_training_emu as emu

    assert emu.STEPS == STEPS and emu.OPT == OPT
    last = check_policies("cuda-emu", [(p, emu.emu_run("options", "cuda-emu:1", p))
                                       for p in tvt.POLICIES])
    assert all(v == {"cuda"} for v in last.variants.values()), last.variants
    assert "conv2d_depthwise_bwd_params" in last.variants
