"""The ``cpu:unrolled`` convolution variants (``codelets/conv_unrolled.py``: one GEMM per
partition with the filters unrolled, on images no larger than the kernel) against their
``ref`` twins and PyTorch: float64 to 1e-10, float32 to 1e-4 and 64 ULPs of the scale,
over hypothesis geometries (1x1 and odd-sized images, strides, dilation, the four padding
modes); the layers they hand to ``cpu:gemm`` (same bits); prepared calls giving the
variant's bits; two geometries sharing one buffer shape; and a training run through 2x2
and 1x1 images equal to PyTorch's and the same bits under two policies."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero_nn as hn
from hetero_nn.codelets import conv, conv_unrolled
from hetero_nn.codelets.pinned import PINNED_VARIANTS
from hetero_nn.codelets.prepared import WorkerBuffers
from helpers import assert_ulp, rel_err
from test_codelets_conv_gemm import (CODELETS, TOL, against_torch, check_prepared_calls,
                                     problem, run)

VARIANT = "cpu:unrolled"


def handled(n, c, o, h, w, k, stride, padding, dilation, mode):
    geo = conv.conv2d_geometry((n, c, h, w), (o, c, k, k), stride, padding, dilation, 1, mode)
    return conv_unrolled.handles(geo, (n, c, h, w), o)


def check_against_ref(dtype, geometry, variant=VARIANT, seed=0):
    params, operands = problem(*geometry, dtype, seed=seed)
    for codelet in CODELETS:
        ref = run(codelet, "ref", operands[codelet.name], params)
        got = run(codelet, variant, operands[codelet.name], params)
        for a, b in zip(got, ref):
            assert rel_err(a, b) <= TOL[dtype], (codelet.name, geometry)


tiny = st.integers(1, 3).flatmap(lambda k: st.tuples(
    st.integers(1, 6), st.integers(1, 9), st.integers(1, 9),      # n, c, o
    st.integers(1, k), st.integers(1, k), st.just(k),              # h, w <= k: h*w <= k*k
    st.integers(1, 2), st.integers(0, 2), st.integers(1, 2),       # stride, padding, dilation
    st.sampled_from(["zeros", "reflect", "replicate", "circular"])))


@settings(max_examples=25, deadline=None)
@given(tiny, st.sampled_from([np.float64, np.float32]))
def test_unrolled_matches_its_ref_twin(geometry, dtype):
    try:
        assert handled(*geometry)
    except ValueError:
        return  # refused before any variant runs (tested in test_codelets_conv.py)
    check_against_ref(dtype, geometry)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unrolled_matches_torch(dtype):
    for geometry in [(6, 16, 24, 1, 1, 3, 1, 1, 1, "zeros"),   # ResNet's layer4: centre taps
                     (5, 8, 12, 2, 2, 3, 1, 1, 1, "zeros"),    # layer3 on 2x2 images
                     (4, 6, 10, 2, 2, 3, 2, 1, 1, "zeros"),    # 2x2 -> 1x1, stride 2
                     (3, 7, 5, 1, 3, 3, 1, 1, 1, "zeros"),     # odd: a 1x3 image
                     (2, 5, 7, 3, 3, 3, 1, 0, 1, "zeros"),     # no padding: one output
                     (3, 5, 4, 3, 3, 3, 1, 2, 2, "zeros"),     # dilated
                     (3, 9, 4, 1, 1, 1, 1, 0, 1, "zeros")]:    # 1x1 kernel: a plain GEMM
        assert handled(*geometry)
        for got, ref in against_torch(VARIANT, geometry, dtype):
            assert rel_err(got, ref) <= TOL[dtype], geometry
            assert_ulp(got, ref, 64, floor="scale")


def test_layers_taken():
    assert handled(64, 512, 512, 1, 1, 3, 1, 1, 1, "zeros")      # ResNet-18 layer4
    assert handled(64, 256, 256, 2, 2, 3, 1, 1, 1, "zeros")      # layer3
    assert handled(64, 256, 512, 2, 2, 3, 2, 1, 1, "zeros")      # layer4's first
    assert not handled(64, 512, 512, 4, 4, 3, 1, 1, 1, "zeros")  # 16 pixels > 9 taps
    assert not handled(64, 256, 512, 2, 2, 1, 2, 0, 1, "zeros")  # 1x1 shortcut on 2x2
    assert not handled(8, 1024, 1024, 2, 2, 3, 1, 1, 1, "zeros")  # past MAX_ELEMENTS
    geo = conv.conv2d_geometry((4, 8, 2, 2), (8, 4, 3, 3), padding=1, groups=2)
    assert not conv_unrolled.handles(geo, (4, 8, 2, 2), 8)


@pytest.mark.parametrize("geometry", [(4, 6, 8, 4, 4, 3, 1, 1, 1, "zeros"),
                                      (3, 5, 4, 6, 5, 1, 2, 0, 1, "zeros")], ids=str)
def test_other_layers_run_partition_gemms(geometry):
    assert not handled(*geometry)
    params, operands = problem(*geometry, np.float64)
    for codelet in CODELETS:
        got = run(codelet, VARIANT, operands[codelet.name], params)
        want = run(codelet, "cpu:gemm", operands[codelet.name], params)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=codelet.name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_prepared_calls_give_the_variants_bits(dtype):
    # two geometries whose unrolled filters have one shape ([9*O, 9*C]) and different
    # zero entries, on one worker's buffers, then the first again
    geometries = [(5, 6, 8, 3, 3, 3, 1, 1, 1, "zeros"), (5, 6, 8, 3, 3, 3, 1, 2, 2, "zeros"),
                  (5, 6, 8, 3, 3, 3, 1, 1, 1, "zeros"), (4, 3, 5, 2, 3, 3, 1, 1, 1, "circular")]
    buffers = WorkerBuffers()
    for seed, geometry in enumerate(geometries):
        assert handled(*geometry)
        check_against_ref(dtype, geometry, seed=seed)
        check_prepared_calls(VARIANT, *problem(*geometry, dtype, seed=seed), buffers)


def tiny_images_net():
    return hn.Sequential(
        hn.Conv2d(1, 4, 3, stride=2, padding=1), hn.ReLU(), hn.MaxPool2d(2),   # 4 x 7 x 7
        hn.Conv2d(4, 8, 3, stride=3), hn.ReLU(),                               # 8 x 2 x 2
        hn.Conv2d(8, 8, 3, padding=1, bias=False), hn.ReLU(),                  # unrolled, 2x2
        hn.Conv2d(8, 12, 3, stride=2, padding=1), hn.ReLU(),                   # 2x2 -> 1x1
        hn.Conv2d(12, 10, 3, padding=1), hn.Flatten(), hn.Dense(10, 10))       # centre taps


@pytest.mark.slow  # 20-60 s: two runtimes and a torch run (CI is at its limit)
def test_training_through_tiny_images_equals_torch_under_two_policies():
    pytest.importorskip("torch", reason="PyTorch is optional")
    import test_training_vs_torch as tvt  # it skips its module without torch

    with mock.patch.dict(tvt.NETS, {"tiny": tiny_images_net}):
        ref = tvt.torch_run("tiny", "sgd-momentum", "float64", 3)
        runs = [tvt.hn_run("tiny", "sgd-momentum", 3, policy, steps=3, variants=PINNED_VARIANTS)
                for policy in ("eager", "dmda")]
    for run_ in runs:
        problems = tvt.compare(run_, ref, tvt.REL_F64, "tiny")
        assert not problems, "\n".join(problems)
        for name in ("conv2d_fwd", "conv2d_fwd_nobias", "conv2d_bwd_input",
                     "conv2d_bwd_params", "conv2d_bwd_weight"):  # which run unrolled calls
            assert run_.variants[name] == {"cpu:winograd"}, name
    assert runs[0].digests() == runs[1].digests()
