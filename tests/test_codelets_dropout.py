"""Dropout codelets: the same mask from every variant, independent of how the batch is
partitioned, keyed by (seed, step); PyTorch's scaling and its backward given the same mask;
the keep rate; and the CuPy run of the "cuda" variants."""

import numpy as np
import pytest

from hetero_nn.codelets.dropout import dropout_bwd, dropout_fwd, dropout_key, keep_mask, key_data
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch")

VARIANTS = ["ref", "cpu", "cuda"]


def run(codelet, variant, x, p, key, parts=1):
    """The layer's tasks: one per partition, ``start`` its first sample's index."""
    y = np.full_like(x, np.nan)
    start = 0
    for xp_, yp in zip(np.array_split(x, parts), np.array_split(y, parts)):
        codelet.variants[variant](xp_, yp, np.array([key], np.uint64), p=p, start=start)
        start += len(xp_)
    return y


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_variants_and_partitions_give_one_mask_scaled_as_torch(p, dtype):
    x = np.random.default_rng(0).standard_normal((9, 3, 4, 5)).astype(dtype)
    key = dropout_key(1234, 7)
    y = run(dropout_fwd, "ref", x, p, key)
    for variant in VARIANTS:
        for parts in (1, 3, 9):
            assert np.array_equal(run(dropout_fwd, variant, x, p, key, parts), y), (variant, parts)
    keep = keep_mask(np, x.shape, p, key, 0)
    # torch's dropout given this mask: native_dropout_backward is input * mask * 1/(1-p)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    expected = torch.ops.aten.native_dropout_backward(torch.from_numpy(x), torch.from_numpy(keep),
                                                      scale).numpy()
    assert y.dtype == dtype
    assert rel_err(y, expected) <= (1e-10 if dtype == np.float64 else 1e-6)
    assert_ulp(y, expected, 0, name="dropout_fwd")  # one product per element: exact
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    for variant in VARIANTS:
        assert np.array_equal(run(dropout_bwd, variant, dy, p, key, 3),
                              run(dropout_fwd, "ref", dy, p, key))


def test_mask_depends_on_seed_and_step_and_keeps_one_minus_p():
    shape = (64, 50)
    masks = {(s, t): keep_mask(np, shape, 0.3, dropout_key(s, t), 0)
             for s in (0, 1) for t in (0, 1)}
    assert len({m.tobytes() for m in masks.values()}) == 4
    rate = np.mean([m.mean() for m in masks.values()])
    assert abs(rate - 0.7) < 0.01  # 12,800 draws: the standard error is 0.004
    assert np.array_equal(masks[(0, 0)], keep_mask(np, shape, 0.3, dropout_key(0, 0), 0))


def test_torch_dropout_statistics_agree():
    """The same distribution as torch.nn.functional.dropout: kept values scaled by 1/(1-p)."""
    x = np.ones((200, 100))
    ours = run(dropout_fwd, "cpu", x, 0.25, dropout_key(3, 0))
    torch.manual_seed(3)
    theirs = torch.nn.functional.dropout(torch.from_numpy(x), 0.25, training=True).numpy()
    assert set(np.unique(ours)) == set(np.unique(theirs)) == {0.0, 1 / 0.75}
    bound = 5 * np.sqrt(0.25 * 0.75 / x.size)  # five standard errors of a rate over 20,000 draws
    assert abs((ours == 0).mean() - 0.25) < bound and abs((theirs == 0).mean() - 0.25) < bound


@pytest.mark.cuda
def test_cuda_variant_on_cupy(cupy):
    x = np.random.default_rng(0).standard_normal((5, 7))
    key = dropout_key(5, 2)
    y = cupy.full(x.shape, cupy.nan)
    dropout_fwd.variants["cuda"](cupy.asarray(x), y, cupy.asarray(key_data(5, 2)), p=0.4, start=0)
    assert np.array_equal(cupy.asnumpy(y), run(dropout_fwd, "ref", x, 0.4, key))
