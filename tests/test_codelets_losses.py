"""Loss codelets beyond plain cross-entropy against torch.nn.functional: label
smoothing, log-softmax and its backward, NLL, MSE, one-hot and the correct count
(every variant, float64 <= 1e-10 and float32 <= 1e-4), gradients against central
finite differences, reductions 'mean' and 'sum'."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hetero_nn.codelets.strict_xp import guard
from hetero_nn.codelets import loss, loss_rows  # noqa: E402
from helpers import assert_ulp, rel_err  # noqa: E402

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of each result's largest magnitude.
ULPS = 16
DTYPES = [np.float64, np.float32]
SHAPES = [(1, 10), (7, 3), (33, 17), (5, 1)]
VARIANTS = sorted(loss.softmax_xent.variants)


def logits_labels(shape, dtype, seed=0):
    rng = np.random.default_rng(seed + shape[0] * 31 + shape[1])
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    y = rng.integers(0, shape[1], shape[0])
    return x, y


def fd_grad(f, x, h=1e-6):
    """Central finite differences of the scalar ``f`` at ``x`` (float64)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


# --------------------------------------------------------------------------- label smoothing

@pytest.mark.parametrize("eps", [0.1, 0.7])
@pytest.mark.parametrize("batch_of", ["mean", "sum"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_label_smoothing_matches_torch(variant, dtype, shape, batch_of, eps):
    x, y = logits_labels(shape, dtype)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    tl = F.cross_entropy(tx, torch.from_numpy(y), label_smoothing=eps, reduction=batch_of)
    tl.backward()
    batch = shape[0] if batch_of == "mean" else 1
    total, correct = np.zeros((), dtype), np.zeros((), np.int64)
    dx = np.full(shape, np.nan, dtype)
    loss.softmax_xent.variants[variant](x, y, dx, total, correct, batch=batch, label_smoothing=eps)
    assert rel_err(total, tl.item()) <= TOL[dtype]
    # with one class the gradient is zero up to rounding of terms of size 1/batch
    scale = max(float(np.abs(tx.grad.numpy()).max()), 1.0 / batch)
    assert np.abs(dx - tx.grad.numpy()).max() <= TOL[dtype] * scale
    assert correct == np.count_nonzero(x.argmax(1) == y)
    total_eval, correct_eval = np.zeros((), dtype), np.zeros((), np.int64)
    loss.softmax_xent_eval.variants[variant](x, y, total_eval, correct_eval, batch=batch,
                                             label_smoothing=eps)
    assert rel_err(total_eval, tl.item()) <= TOL[dtype] and correct_eval == correct
    assert_ulp(total, tl.item(), ULPS, dtype=dtype, floor="scale", name="softmax_xent")
    assert_ulp(dx, tx.grad.numpy(), ULPS, floor=scale, name="softmax_xent")
    assert_ulp(total_eval, tl.item(), ULPS, dtype=dtype, floor="scale", name="softmax_xent_eval")


@pytest.mark.parametrize("variant", VARIANTS)
def test_label_smoothing_gradient_matches_finite_differences(variant):
    x, y = logits_labels((4, 6), np.float64, seed=3)

    def f(z):
        total, correct = np.zeros(()), np.zeros((), np.int64)
        loss.softmax_xent_eval.variants[variant](z, y, total, correct, batch=4,
                                                 label_smoothing=0.2)
        return float(total)

    dx = np.empty_like(x)
    loss.softmax_xent.variants[variant](x, y, dx, np.zeros(()), np.zeros((), np.int64), batch=4,
                                        label_smoothing=0.2)
    assert rel_err(dx, fd_grad(f, x.copy())) <= 1e-7


def test_zero_smoothing_gives_the_same_bits_as_before():
    """label_smoothing=0 is the plain cross-entropy (the training path unchanged)."""
    x, y = logits_labels((9, 5), np.float64)
    outs = []
    for kw in ({}, {"label_smoothing": 0.0}):
        dx, total = np.empty_like(x), np.zeros(())
        loss.softmax_xent.variants["cpu"](x, y, dx, total, np.zeros((), np.int64), batch=9, **kw)
        outs.append((dx.tobytes(), total.tobytes()))
    assert outs[0] == outs[1]


# --------------------------------------------------------------------------- log-softmax

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss_rows.log_softmax.variants))
def test_log_softmax_forward_and_backward_match_torch(variant, dtype, shape):
    x, _ = logits_labels(shape, dtype, seed=1)
    dy = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = torch.log_softmax(tx, dim=1)
    ty.backward(torch.from_numpy(dy))
    y = np.full(shape, np.nan, dtype)
    loss_rows.log_softmax.variants[variant](x, y)
    assert rel_err(y, ty.detach().numpy()) <= TOL[dtype]
    assert_ulp(y, ty.detach().numpy(), ULPS, floor="scale", name="log_softmax")
    dx = np.full(shape, np.nan, dtype)
    loss_rows.log_softmax_bwd.variants[variant](y, dy, dx)
    assert rel_err(dx, tx.grad.numpy()) <= TOL[dtype]
    assert_ulp(dx, tx.grad.numpy(), ULPS, floor="scale", name="log_softmax_bwd")


def test_log_softmax_backward_matches_finite_differences():
    x, _ = logits_labels((3, 7), np.float64, seed=4)
    w = np.random.default_rng(5).standard_normal(x.shape)

    def f(z):
        y = np.empty_like(z)
        loss_rows.log_softmax.variants["cpu"](z, y)
        return float((w * y).sum())

    y, dx = np.empty_like(x), np.empty_like(x)
    loss_rows.log_softmax.variants["cpu"](x, y)
    loss_rows.log_softmax_bwd.variants["cpu"](y, w, dx)
    assert rel_err(dx, fd_grad(f, x.copy())) <= 1e-7


# --------------------------------------------------------------------------- NLL

@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss_rows.nll_loss.variants))
def test_nll_loss_matches_torch(variant, dtype, shape, reduction):
    x, y = logits_labels(shape, dtype, seed=6)
    logp = torch.log_softmax(torch.from_numpy(x), 1).numpy()
    tp = torch.from_numpy(logp.copy()).requires_grad_()
    tl = F.nll_loss(tp, torch.from_numpy(y), reduction=reduction)
    tl.backward()
    total = np.zeros((), dtype)
    dlogp = np.full(shape, np.nan, dtype)
    loss_rows.nll_loss.variants[variant](logp, y, dlogp, total,
                                    batch=shape[0] if reduction == "mean" else 1)
    assert rel_err(total, tl.item()) <= TOL[dtype]
    assert_ulp(total, tl.item(), ULPS, dtype=dtype, floor="scale", name="nll_loss")
    np.testing.assert_array_equal(dlogp, tp.grad.numpy())


@pytest.mark.parametrize("variant", sorted(loss_rows.nll_loss.variants))
def test_nll_loss_names_a_bad_label(variant):
    logp = np.zeros((3, 4))
    if variant == "cuda":  # on a device: flagged there, no host sync (docs/gpu.md)
        total, dlogp = np.zeros(()), np.empty_like(logp)
        guard(loss_rows.nll_loss.variants[variant])(logp, np.array([0, 4, 1]), dlogp, total, batch=3)
        assert np.isnan(total) and np.isnan(dlogp).all()
        return
    with pytest.raises(ValueError, match="label 4 of row 1"):
        loss_rows.nll_loss.variants[variant](logp, np.array([0, 4, 1]), np.empty_like(logp),
                                        np.zeros(()), batch=3)


# --------------------------------------------------------------------------- MSE

@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(1, 1), (6, 10), (4, 3, 5, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss_rows.mse_loss.variants))
def test_mse_loss_matches_torch(variant, dtype, shape, reduction):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(dtype)
    t = rng.standard_normal(shape).astype(dtype)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    tl = F.mse_loss(tx, torch.from_numpy(t), reduction=reduction)
    tl.backward()
    total = np.zeros((), dtype)
    dx = np.full(shape, np.nan, dtype)
    loss_rows.mse_loss.variants[variant](x, t, dx, total,
                                    numel=x.size if reduction == "mean" else 1)
    assert rel_err(total, tl.item()) <= TOL[dtype]
    assert rel_err(dx, tx.grad.numpy()) <= TOL[dtype]
    assert_ulp(total, tl.item(), ULPS, dtype=dtype, floor="scale", name="mse_loss")
    assert_ulp(dx, tx.grad.numpy(), ULPS, floor="scale", name="mse_loss")


def test_mse_gradient_matches_finite_differences():
    rng = np.random.default_rng(11)
    x, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def f(z):
        total = np.zeros(())
        loss_rows.mse_loss.variants["cpu"](z, t, np.empty_like(z), total, numel=12)
        return float(total)

    dx = np.empty_like(x)
    loss_rows.mse_loss.variants["cpu"](x, t, dx, np.zeros(()), numel=12)
    assert rel_err(dx, fd_grad(f, x.copy())) <= 1e-8


# --------------------------------------------------------------------------- one-hot, count

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(loss_rows.one_hot.variants))
def test_one_hot_and_count_correct_match_torch(variant, dtype):
    x, y = logits_labels((13, 5), dtype, seed=9)
    x[0, :] = 1.0  # a tie: the first index wins, as torch.argmax
    out = np.full(x.shape, np.nan, dtype)
    loss_rows.one_hot.variants[variant](y, out)
    np.testing.assert_array_equal(out, F.one_hot(torch.from_numpy(y), 5).numpy().astype(dtype))
    correct = np.full((), 2, np.int64)  # REDUX: adds to what is there
    loss_rows.count_correct.variants[variant](x, y, correct)
    expected = int((torch.from_numpy(x).argmax(1) == torch.from_numpy(y)).sum())
    assert correct == 2 + expected
    if variant == "cuda":  # on a device: flagged there, no host sync (docs/gpu.md)
        out = np.empty((1, 5), dtype)
        guard(loss_rows.one_hot.variants[variant])(np.array([-1]), out)
        assert np.isnan(out).all()
        return
    with pytest.raises(ValueError, match="label -1 of row 0"):
        loss_rows.one_hot.variants[variant](np.array([-1]), np.empty((1, 5), dtype))


@pytest.mark.cuda
def test_new_loss_cuda_variants_on_cupy_match_ref(cupy):
    x, y = logits_labels((8, 6), np.float64, seed=12)
    dx_h, tot_h = np.empty_like(x), np.zeros(())
    loss.softmax_xent.variants["ref"](x, y, dx_h, tot_h, np.zeros((), np.int64), batch=8,
                                      label_smoothing=0.1)
    dx_d, tot_d = cupy.empty(x.shape), cupy.zeros(())
    loss.softmax_xent.variants["cuda"](cupy.asarray(x), cupy.asarray(y), dx_d, tot_d,
                                       cupy.zeros((), np.int64), batch=8, label_smoothing=0.1)
    assert rel_err(cupy.asnumpy(dx_d), dx_h) <= 1e-12
    y_h, y_d = np.empty_like(x), cupy.empty(x.shape)
    loss_rows.log_softmax.variants["ref"](x, y_h)
    loss_rows.log_softmax.variants["cuda"](cupy.asarray(x), y_d)
    assert rel_err(cupy.asnumpy(y_d), y_h) <= 1e-12


# --------------------------------------------------------------------------- losses through the runtime

@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_layers_over_partitions_match_torch(reduction):
    """Losses submitted over 3 uneven partitions: one REDUX scalar, torch's value."""
    import hetero_nn as hn

    rng = np.random.default_rng(13)
    x = rng.standard_normal((10, 4))
    t = rng.standard_normal((10, 4))
    y = rng.integers(0, 4, 10)
    logp = torch.log_softmax(torch.from_numpy(x), 1).numpy()
    cases = [
        (hn.losses.MSELoss(reduction), x, t, F.mse_loss(torch.from_numpy(x), torch.from_numpy(t),
                                                       reduction=reduction), None),
        (hn.losses.NLLLoss(reduction), logp, y,
         F.nll_loss(torch.from_numpy(logp), torch.from_numpy(y), reduction=reduction),
         int((x.argmax(1) == y).sum())),
        (hn.losses.CrossEntropyLoss(reduction, label_smoothing=0.3), x, y,
         F.cross_entropy(torch.from_numpy(x), torch.from_numpy(y), reduction=reduction,
                         label_smoothing=0.3), int((x.argmax(1) == y).sum())),
    ]
    with hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True) as rt:
        for loss_fn, out, target, expected, expected_correct in cases:
            outs = list(rt.register(out.copy()).split(0, 3))
            targets = list(rt.register(target.copy()).split(0, 3))
            value, correct, grads = loss_fn(rt, outs, targets)
            assert rel_err(rt.fetch(value), expected.item()) <= 1e-12, loss_fn
            assert len(grads) == 3
            if expected_correct is not None:
                assert int(rt.fetch(correct)) == expected_correct


def test_reduction_none_is_refused_naming_it():
    import hetero_nn as hn

    with pytest.raises(hn.ConfigError, match="'none' gives no scalar"):
        hn.losses.MSELoss("none")
    with pytest.raises(hn.ConfigError, match="label_smoothing"):
        hn.losses.CrossEntropyLoss(label_smoothing=2)
