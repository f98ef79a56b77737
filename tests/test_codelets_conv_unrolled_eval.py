"""The unrolled evaluation fold (``codelets/conv_unrolled_eval.py``):
``bn_[nobias_]fold_unrolled_eval`` (every variant and the prepared calls one bit pattern)
then ``conv2d_unrolled_fwd`` give the bits of the one-task ``conv2d_[nobias_]bn_eval_fwd``
(``cpu``), and match its ``ref`` twin and PyTorch's eval-mode chain (float64 1e-10, float32
1e-4 of the scale), over hypothesis geometries of images no larger than the kernel, padding
modes included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import conv_unrolled_eval as ue
from hetero_nn.codelets.fused_blocks import conv2d_bn_eval_fwd, conv2d_nobias_bn_eval_fwd
from hetero_nn.codelets.prepared import WorkerBuffers, calls_of
from helpers import rel_err
from test_codelets_fused_blocks import TOL, problem, run, torch_chain

geometries = st.tuples(
    st.integers(1, 5), st.integers(1, 9), st.integers(1, 9),           # n, c, o
    st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 3]),    # h, w, k
    st.integers(1, 2), st.integers(0, 1), st.booleans(),              # stride, pad, bias
    st.sampled_from(["zeros", "zeros", "reflect", "circular"]))


def fold_all(fold, ins, u_shape, dtype, params):
    """``(u, bf)`` of each variant of ``fold`` and of the ``cpu`` variant's prepared calls."""
    out = {}
    for variant in ("ref", "cpu", "cuda", "prepared"):
        u, bf = np.full(u_shape, np.nan, dtype), np.full(ins[0].shape[0], np.nan, dtype)
        if variant == "prepared":
            for kernel, args in calls_of(fold.variants["cpu"], WorkerBuffers(), [*ins, u, bf],
                                         params):
                kernel(*args)
        else:
            fold.variants[variant](*ins, u, bf, **params)
        out[variant] = u, bf
    return out


@settings(max_examples=12, deadline=None)
@given(geometries, st.sampled_from([np.float64, np.float32]),
       st.sampled_from(["none", "relu", "relu6"]))
def test_unrolled_fold_gives_the_one_task_bits_and_torch(geometry, dtype, activation):
    n, c, o, h, w, k, stride, padding, bias, mode = geometry
    if (h + 2 * padding < k or w + 2 * padding < k or h * w > k * k
            or (mode != "zeros" and not 0 < padding < min(h, w) + (mode == "circular"))):
        return
    params, operands = problem(n, c, o, h, w, k, stride, padding, 1, bias, dtype)
    params = dict(params, padding_mode=mode)
    x, *ins, y = operands
    assert ue.takes(x.shape, ins[0].shape, **params)  # images of at most k*k pixels
    one = conv2d_bn_eval_fwd if bias else conv2d_nobias_bn_eval_fwd
    kw = dict(params, eps=1e-3, activation=activation)
    want = run(one, "cpu", operands, kw)
    fold = ue.bn_fold_unrolled_eval if bias else ue.bn_nobias_fold_unrolled_eval
    folds = fold_all(fold, ins, ue.unrolled_shape(x.shape, ins[0].shape, **params), dtype,
                     dict(params, input_size=(h, w), eps=1e-3))
    for u, bf in folds.values():
        np.testing.assert_array_equal(u, folds["cpu"][0])
        np.testing.assert_array_equal(bf, folds["cpu"][1])
    u, bf = folds["cpu"]
    got = {}
    for variant in ("ref", "cpu", "cuda"):
        got[variant] = np.full_like(y, np.nan)
        ue.conv2d_unrolled_fwd.variants[variant](x, u, bf, got[variant], activation=activation)
    np.testing.assert_array_equal(got["cpu"], want)
    assert rel_err(got["ref"], run(one, "ref", operands, kw)) <= TOL[dtype]
    assert rel_err(got["cuda"], got["ref"]) <= TOL[dtype]  # NumPy in CI
    if mode == "zeros":  # torch_chain pads with zeros
        torch_params = {key: v for key, v in params.items() if key != "padding_mode"}
        assert rel_err(got["cpu"], torch_chain(operands, torch_params, bias, activation,
                                               1e-3)) <= TOL[dtype]


def test_winograd_layers_and_larger_images_are_not_taken():
    assert not ue.takes((2, 16, 8, 8), (16, 16, 3, 3), padding=1)   # Winograd's
    assert not ue.takes((2, 16, 4, 4), (16, 16, 3, 3), stride=2, padding=1)  # 16 > 9 pixels
    assert not ue.takes((2, 4, 2, 2), (4, 2, 3, 3), padding=1, groups=2)
    assert ue.takes((2, 16, 2, 2), (32, 16, 3, 3), padding=1)
    assert ue.unrolled_shape((2, 16, 2, 2), (32, 16, 3, 3), padding=1) == (32 * 4, 16 * 4)


def test_mismatched_operands_are_refused():
    x, u, bf = np.zeros((2, 3, 1, 1)), np.zeros((4, 3)), np.zeros(4)
    with pytest.raises(ValueError, match="conv2d_unrolled_fwd: u"):
        ue.conv2d_unrolled_fwd.variants["cpu"](x, u, bf, np.zeros((2, 5, 1, 1)))
    w, stats = np.zeros((4, 3, 3, 3)), [np.ones(4)] * 4
    with pytest.raises(ValueError, match="bn_fold_unrolled_eval: u must have shape"):
        ue.bn_nobias_fold_unrolled_eval.variants["cpu"](w, *stats, np.zeros((4, 4)), bf,
                                                        padding=1, input_size=(1, 1))
