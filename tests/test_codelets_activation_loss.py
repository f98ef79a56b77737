"""ReLU and softmax cross-entropy codelets against PyTorch (relu + autograd,
cross_entropy with reduction='mean'), REDUX accumulation of the loss over uneven
partitions, finite differences of the loss gradient, and label checking."""

import numpy as np
import pytest

from hetero_nn.codelets.strict_xp import guard
from hetero_nn.codelets import activation, loss
from hetero_nn.codelets.reduce import add_redux, zero_init
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

TOL = {np.float64: 1e-10, np.float32: 1e-4}
ULPS = 16
DTYPES = [np.float64, np.float32]


def relu_input(rng, shape, dtype):
    """Normal values with some exact zeros (where the gradient convention matters)."""
    x = rng.standard_normal(shape).astype(dtype)
    x.reshape(-1)[:: 7] = 0
    return x


RELU_SHAPES = [(1,), (37,), (3, 17), (2, 3, 5, 7), (1, 6, 28, 28)]
LOSS_SHAPES = [(1, 10), (7, 3), (64, 10), (33, 17), (5, 1)]


# --------------------------------------------------------------------------- ReLU

@pytest.mark.parametrize("shape", RELU_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(activation.relu_fwd.variants))
def test_relu_forward_and_backward_match_torch(variant, dtype, shape):
    rng = np.random.default_rng(len(shape))
    x = relu_input(rng, shape, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = torch.relu(tx)
    ty.backward(torch.from_numpy(dy))

    y = np.full(shape, np.nan, dtype)
    activation.relu_fwd.variants[variant](x, y)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    assert_ulp(y, ty.detach().numpy(), 0, name="relu_fwd")
    dx = np.full(shape, np.nan, dtype)
    activation.relu_bwd.variants[variant](y, dy, dx)
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    assert_ulp(dx, tx.grad.numpy(), 0, name="relu_bwd")


@pytest.mark.parametrize("variant", sorted(activation.relu_fwd.variants))
def test_relu_keeps_nan_like_torch(variant):
    x = np.array([np.nan, -1.0, 0.0, 2.0, -np.inf, np.inf])
    y = np.empty_like(x)
    activation.relu_fwd.variants[variant](x, y)
    np.testing.assert_array_equal(y, torch.relu(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("variant", sorted(activation.relu_fwd.variants))
def test_relu_on_strided_views(variant):
    rng = np.random.default_rng(2)
    base = relu_input(rng, (6, 10), np.float64)
    x = base[:, ::2]
    y = np.full((5, 6), np.nan).T
    activation.relu_fwd.variants[variant](x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    dy = rng.standard_normal((6, 10))[:, 1::2]
    dx = np.full((5, 6), np.nan).T
    activation.relu_bwd.variants[variant](y, dy, dx)
    np.testing.assert_array_equal(dx, np.where(x > 0, dy, 0))


# --------------------------------------------------------------------------- softmax cross-entropy

def torch_cross_entropy(logits, labels):
    """Mean loss, its gradient, and the number of correct argmaxes, from PyTorch."""
    tl = torch.from_numpy(logits.copy()).requires_grad_()
    value = torch.nn.functional.cross_entropy(tl, torch.from_numpy(labels), reduction="mean")
    value.backward()
    n_correct = int((tl.detach().argmax(dim=1) == torch.from_numpy(labels)).sum())
    return float(value.detach()), tl.grad.numpy(), n_correct


def random_batch(rng, shape, dtype, scale=3.0):
    logits = (scale * rng.standard_normal(shape)).astype(dtype)
    labels = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
    return logits, labels


def run_xent(variant, logits, labels, batch):
    dlogits = np.full(logits.shape, np.nan, logits.dtype)
    loss_partial = np.empty((), logits.dtype)
    correct_partial = np.empty((), np.int64)
    zero_init(loss_partial)
    zero_init(correct_partial)
    loss.softmax_xent.variants[variant](logits, labels, dlogits, loss_partial, correct_partial,
                                        batch=batch)
    return dlogits, loss_partial, correct_partial


@pytest.mark.parametrize("shape", LOSS_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss.softmax_xent.variants))
def test_softmax_xent_matches_torch_cross_entropy(variant, dtype, shape):
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    logits, labels = random_batch(rng, shape, dtype)
    expected_loss, expected_grad, expected_correct = torch_cross_entropy(logits, labels)

    dlogits, total, correct = run_xent(variant, logits, labels, batch=shape[0])
    assert total.shape == () and correct.shape == () and correct.dtype == np.int64
    assert rel_err(total, expected_loss) <= TOL[dtype]
    assert rel_err(dlogits, expected_grad) <= TOL[dtype]
    assert_ulp(total, expected_loss, ULPS, dtype=dtype, floor="scale", name="softmax_xent")
    assert_ulp(dlogits, expected_grad, ULPS, floor="scale", name="softmax_xent")
    assert int(correct) == expected_correct

    eval_loss, eval_correct = np.zeros((), dtype), np.zeros((), np.int64)
    loss.softmax_xent_eval.variants[variant](logits, labels, eval_loss, eval_correct,
                                             batch=shape[0])
    assert rel_err(eval_loss, expected_loss) <= TOL[dtype]
    assert_ulp(eval_loss, expected_loss, ULPS, dtype=dtype, floor="scale",
               name="softmax_xent_eval")
    assert int(eval_correct) == expected_correct


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss.softmax_xent.variants))
def test_loss_over_uneven_partitions_equals_torch_mean(variant, dtype):
    """Each partition divides by the whole batch; partials add up in partition order."""
    rng = np.random.default_rng(42)
    batch, n_classes = 29, 11
    logits, labels = random_batch(rng, (batch, n_classes), dtype)
    expected_loss, expected_grad, expected_correct = torch_cross_entropy(logits, labels)

    bounds = [0, 1, 13, 14, 29]
    pieces, loss_partials, correct_partials = [], [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        dlogits, total, correct = run_xent(variant, logits[lo:hi], labels[lo:hi], batch=batch)
        pieces.append(dlogits)
        loss_partials.append(total)
        correct_partials.append(correct)
    for partial in loss_partials[1:]:
        add_redux(loss_partials[0], partial)
    for partial in correct_partials[1:]:
        add_redux(correct_partials[0], partial)
    assert rel_err(loss_partials[0], expected_loss) <= TOL[dtype]
    assert int(correct_partials[0]) == expected_correct
    for (lo, hi), piece in zip(zip(bounds[:-1], bounds[1:]), pieces):
        assert rel_err(piece, expected_grad[lo:hi]) <= TOL[dtype]


@pytest.mark.parametrize("variant", sorted(loss.softmax_xent.variants))
def test_loss_accumulates_into_the_partial(variant):
    rng = np.random.default_rng(0)
    logits, labels = random_batch(rng, (6, 4), np.float64)
    expected_loss, _, expected_correct = torch_cross_entropy(logits, labels)
    total, correct = np.array(1.5), np.array(3, dtype=np.int64)
    loss.softmax_xent.variants[variant](logits, labels, np.empty_like(logits), total, correct,
                                        batch=6)
    assert rel_err(total, 1.5 + expected_loss) <= 1e-12
    assert int(correct) == 3 + expected_correct


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss.softmax_xent.variants))
def test_loss_is_stable_for_huge_logits(variant, dtype):
    rng = np.random.default_rng(9)
    logits, labels = random_batch(rng, (8, 6), dtype, scale=1e4 if dtype == np.float32 else 1e30)
    expected_loss, expected_grad, _ = torch_cross_entropy(logits, labels)
    dlogits, total, _ = run_xent(variant, logits, labels, batch=8)
    assert np.isfinite(total) and np.all(np.isfinite(dlogits))
    assert rel_err(total, expected_loss) <= TOL[dtype]
    assert rel_err(dlogits, expected_grad) <= TOL[dtype]


@pytest.mark.parametrize("variant", sorted(loss.argmax_rows.variants))
def test_argmax_ties_go_to_the_first_index_like_torch(variant):
    rng = np.random.default_rng(4)
    logits = rng.integers(0, 3, size=(40, 5)).astype(np.float32)  # many ties
    labels = rng.integers(0, 5, size=40).astype(np.int64)
    expected = torch.from_numpy(logits).argmax(dim=1).numpy()
    pred = np.full(40, -7, np.int64)
    loss.argmax_rows.variants[variant](logits, pred)
    np.testing.assert_array_equal(pred, expected)
    _, _, correct = run_xent(variant, logits, labels, batch=40)
    assert int(correct) == int(np.count_nonzero(expected == labels))


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
@pytest.mark.parametrize("variant", sorted(loss.softmax_xent.variants))
def test_label_out_of_range_raises_naming_it(variant, bad):
    logits = np.zeros((4, 10))
    labels = np.array([1, 2, bad, 3], dtype=np.int64)
    dlogits = np.zeros_like(logits)
    total, correct = np.zeros(()), np.zeros((), np.int64)
    if variant == "cuda":  # on a device: flagged there, no host sync (docs/gpu.md)
        guard(loss.softmax_xent.variants[variant])(logits, labels, dlogits, total, correct,
                                                   batch=4)
        assert np.isnan(total) and np.isnan(dlogits).all()
        return
    with pytest.raises(ValueError, match=rf"label {bad} of row 2 .*\[0, 10\)"):
        loss.softmax_xent.variants[variant](logits, labels, dlogits, total, correct, batch=4)
    with pytest.raises(ValueError, match=rf"label {bad} of row 2"):
        loss.softmax_xent_eval.variants[variant](logits, labels, total, correct, batch=4)
    assert float(total) == 0 and int(correct) == 0


@pytest.mark.parametrize("variant", ["ref", "cpu"])
def test_loss_gradient_matches_central_finite_differences(variant):
    rng = np.random.default_rng(21)
    batch, n_classes = 6, 7
    logits, labels = random_batch(rng, (batch, n_classes), np.float64, scale=2.0)

    def objective(z):
        total, correct = np.zeros(()), np.zeros((), np.int64)
        loss.softmax_xent_eval.variants[variant](z, labels, total, correct, batch=batch)
        return float(total)

    numeric = np.empty_like(logits)
    h = 1e-6
    for idx in np.ndindex(logits.shape):
        z = logits.copy()
        z[idx] += h
        up = objective(z)
        z[idx] -= 2 * h
        numeric[idx] = (up - objective(z)) / (2 * h)
    dlogits, _, _ = run_xent(variant, logits, labels, batch=batch)
    assert rel_err(dlogits, numeric) <= 1e-7


# --------------------------------------------------------------------------- GPU

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_variants_on_cupy_match_ref(dtype, cupy):
    rng = np.random.default_rng(8)
    x = relu_input(rng, (4, 3, 9, 9), dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y_ref, dx_ref = np.empty_like(x), np.empty_like(x)
    activation.relu_fwd.variants["ref"](x, y_ref)
    activation.relu_bwd.variants["ref"](y_ref, dy, dx_ref)
    y_dev, dx_dev = cupy.empty(x.shape, dtype), cupy.empty(x.shape, dtype)
    activation.relu_fwd.variants["cuda"](cupy.asarray(x), y_dev)
    activation.relu_bwd.variants["cuda"](y_dev, cupy.asarray(dy), dx_dev)
    np.testing.assert_array_equal(cupy.asnumpy(y_dev), y_ref)
    np.testing.assert_array_equal(cupy.asnumpy(dx_dev), dx_ref)

    logits, labels = random_batch(rng, (37, 10), dtype)
    dl_ref, loss_ref, correct_ref = run_xent("ref", logits, labels, batch=50)
    dl_dev = cupy.empty(logits.shape, dtype)
    loss_dev, correct_dev = cupy.zeros((), dtype), cupy.zeros((), np.int64)
    loss.softmax_xent.variants["cuda"](cupy.asarray(logits), cupy.asarray(labels), dl_dev,
                                       loss_dev, correct_dev, batch=50)
    assert rel_err(cupy.asnumpy(dl_dev), dl_ref) <= TOL[dtype]
    assert rel_err(cupy.asnumpy(loss_dev), loss_ref) <= TOL[dtype]
    assert int(correct_dev) == int(correct_ref)
    eval_loss, eval_correct = cupy.zeros((), dtype), cupy.zeros((), np.int64)
    loss.softmax_xent_eval.variants["cuda"](cupy.asarray(logits), cupy.asarray(labels),
                                            eval_loss, eval_correct, batch=50)
    assert rel_err(cupy.asnumpy(eval_loss), loss_ref) <= TOL[dtype]
    pred = cupy.empty(37, np.int64)
    loss.argmax_rows.variants["cuda"](cupy.asarray(logits), pred)
    np.testing.assert_array_equal(cupy.asnumpy(pred), logits.argmax(axis=1))
    # on a GPU a label outside [0, K) is flagged on the device (no host sync): NaN results
    loss.softmax_xent.variants["cuda"](cupy.asarray(logits), cupy.full(37, 10, np.int64),
                                       dl_dev, loss_dev, correct_dev, batch=50)
    assert np.isnan(cupy.asnumpy(loss_dev)) and np.isnan(cupy.asnumpy(dl_dev)).all()
