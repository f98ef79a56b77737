"""Dense codelets: every variant against torch.nn.functional.linear and autograd,
REDUX accumulation over uneven batch partitions, and central finite differences;
and the reduce.py codelets and REDUX helpers (zero_init, add_redux) they rely on."""

import numpy as np
import pytest

from hetero_nn.codelets import REDUX, W
from hetero_nn.codelets import dense, reduce
from hetero_nn.codelets.reduce import add_redux, zero_init
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of the result's largest magnitude (dot products
#: summed in another order; see docs/codelets.md).
ULPS = 16
DTYPES = [np.float64, np.float32]
CODELETS = [dense.dense_fwd, dense.dense_fwd_nobias, dense.dense_bwd_input,
            dense.dense_bwd_params, dense.dense_bwd_weight]


def variant_names(*codelets):
    names = set()
    for codelet in codelets:
        names |= set(codelet.variants)
    return sorted(names)


def random_shapes(seed):
    """(N, I, O): batch 1 and odd sizes, and more than 16 features on either side."""
    rng = np.random.default_rng(1000 + seed)
    batch = [1, 3, 7, 16, 33][seed % 5]
    n_out = int(rng.integers(17, 41)) if seed % 2 else int(rng.integers(1, 17))
    return batch, int(rng.integers(1, 70)), n_out


def garbage(shape, dtype):
    """A W output's previous contents: it must be fully overwritten."""
    return np.full(shape, np.nan, dtype=dtype)


def test_declarations():
    for codelet in CODELETS:
        assert {"ref", "cpu", "cuda"} <= set(codelet.variants), codelet
        if REDUX in codelet.modes:
            assert codelet.init is zero_init and codelet.redux is add_redux
    assert dense.dense_fwd.modes[-1] is W
    assert dense.dense_fwd.work([(4, 5), (6, 5), (6,), (4, 6)], {}) == 2 * 4 * 5 * 6 + 4 * 6
    assert dense.dense_bwd_input.work([(4, 6), (6, 5), (4, 5)], {}) == 2 * 4 * 5 * 6
    assert dense.dense_bwd_weight.work([(4, 5), (4, 6), (6, 5)], {}) == 2 * 4 * 5 * 6


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", variant_names(dense.dense_fwd, dense.dense_fwd_nobias))
def test_forward_matches_torch_linear(variant, dtype, seed):
    rng = np.random.default_rng(seed)
    n, i, o = random_shapes(seed)
    x = rng.standard_normal((n, i)).astype(dtype)
    w = rng.standard_normal((o, i)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    expected = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w),
                                          torch.from_numpy(b)).numpy()
    y = garbage((n, o), dtype)
    dense.dense_fwd.variants[variant](x, w, b, y)
    assert y.dtype == dtype
    assert rel_err(y, expected) <= TOL[dtype]
    assert_ulp(y, expected, ULPS, floor="scale", name="dense_fwd")

    expected = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    y = garbage((n, o), dtype)
    dense.dense_fwd_nobias.variants[variant](x, w, y)
    assert rel_err(y, expected) <= TOL[dtype]
    assert_ulp(y, expected, ULPS, floor="scale", name="dense_fwd_nobias")


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", variant_names(dense.dense_bwd_input, dense.dense_bwd_params))
def test_backward_matches_torch_autograd(variant, dtype, seed):
    rng = np.random.default_rng(seed)
    n, i, o = random_shapes(seed)
    x = rng.standard_normal((n, i)).astype(dtype)
    w = rng.standard_normal((o, i)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    dy = rng.standard_normal((n, o)).astype(dtype)
    tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    torch.nn.functional.linear(tx, tw, tb).backward(torch.from_numpy(dy))

    dx = garbage((n, i), dtype)
    dense.dense_bwd_input.variants[variant](dy, w, dx)
    assert rel_err(dx, tx.grad.numpy()) <= TOL[dtype]
    assert_ulp(dx, tx.grad.numpy(), ULPS, floor="scale", name="dense_bwd_input")

    # REDUX: the codelet accumulates into whatever the partial already holds.
    dw_before = rng.standard_normal((o, i)).astype(dtype)
    db_before = rng.standard_normal(o).astype(dtype)
    dw, db = dw_before.copy(), db_before.copy()
    dense.dense_bwd_params.variants[variant](x, dy, dw, db)
    assert rel_err(dw, dw_before + tw.grad.numpy().astype(np.float64)) <= TOL[dtype]
    assert rel_err(db, db_before + tb.grad.numpy().astype(np.float64)) <= TOL[dtype]

    dw = np.zeros((o, i), dtype)
    dense.dense_bwd_weight.variants[variant](x, dy, dw)
    assert rel_err(dw, tw.grad.numpy()) <= TOL[dtype]
    assert_ulp(dw, tw.grad.numpy(), ULPS, floor="scale", name="dense_bwd_weight")
    dw = np.zeros((o, i), dtype)  # the params codelet from zero partials, as the first partition
    db = np.zeros(o, dtype)
    dense.dense_bwd_params.variants[variant](x, dy, dw, db)
    assert_ulp(dw, tw.grad.numpy(), ULPS, floor="scale", name="dense_bwd_params")
    assert_ulp(db, tb.grad.numpy(), ULPS, floor="scale", name="dense_bwd_params")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", variant_names(dense.dense_bwd_params))
def test_gradients_over_uneven_partitions_equal_full_batch(variant, dtype):
    """Partition views of one batch, private zero partials, summed in partition order."""
    rng = np.random.default_rng(7)
    n, i, o = 23, 19, 18
    x = rng.standard_normal((n, i)).astype(dtype)
    w = rng.standard_normal((o, i)).astype(dtype)
    dy = rng.standard_normal((n, o)).astype(dtype)
    tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_()
                  for a in (x, w, np.zeros(o, dtype)))
    torch.nn.functional.linear(tx, tw, tb).backward(torch.from_numpy(dy))

    bounds = [0, 1, 8, 9, 23]
    dx = garbage((n, i), dtype)
    partials = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        dense.dense_bwd_input.variants[variant](dy[lo:hi], w, dx[lo:hi])
        dw, db = np.empty((o, i), dtype), np.empty(o, dtype)
        zero_init(dw)
        zero_init(db)
        dense.dense_bwd_params.variants[variant](x[lo:hi], dy[lo:hi], dw, db)
        partials.append((dw, db))
    dw_total, db_total = partials[0]
    for dw, db in partials[1:]:
        add_redux(dw_total, dw)
        add_redux(db_total, db)
    assert rel_err(dx, tx.grad.numpy()) <= TOL[dtype]
    assert rel_err(dw_total, tw.grad.numpy()) <= TOL[dtype]
    assert rel_err(db_total, tb.grad.numpy()) <= TOL[dtype]


@pytest.mark.parametrize("variant", variant_names(*CODELETS))
def test_strided_operands(variant):
    """Views that are not C-contiguous (a transposed weight, a column slice) still work."""
    rng = np.random.default_rng(3)
    n, i, o = 6, 21, 17
    x = rng.standard_normal((n, 2 * i))[:, ::2]
    w = np.asfortranarray(rng.standard_normal((o, i)))
    b = rng.standard_normal(o)
    dy = rng.standard_normal((o, n)).T
    y = garbage((o, n), np.float64).T
    dense.dense_fwd.variants[variant](x, w, b, y)
    assert rel_err(y, x @ w.T + b) <= 1e-12
    dx = garbage((i, n), np.float64).T
    dense.dense_bwd_input.variants[variant](dy, w, dx)
    assert rel_err(dx, dy @ w) <= 1e-12
    dw, db = np.zeros((o, i)), np.zeros(o)
    dense.dense_bwd_params.variants[variant](x, dy, dw, db)
    assert rel_err(dw, dy.T @ x) <= 1e-12
    assert rel_err(db, dy.sum(0)) <= 1e-12


def test_cpu_variant_rejects_mismatched_shapes():
    x, w, b = np.zeros((4, 5)), np.zeros((3, 5)), np.zeros(3)
    with pytest.raises(ValueError, match="dense_fwd"):
        dense.dense_fwd.variants["cpu"](x, w, b, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="bias"):
        dense.dense_fwd.variants["cpu"](x, w, np.zeros(4), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="dense_bwd_input"):
        dense.dense_bwd_input.variants["cpu"](np.zeros((4, 3)), w, np.zeros((4, 6)))
    with pytest.raises(ValueError, match="dense_bwd_params"):
        dense.dense_bwd_params.variants["cpu"](x, np.zeros((4, 2)), np.zeros((3, 5)), np.zeros(3))


@pytest.mark.parametrize("variant", ["ref", "cpu"])
def test_backward_matches_central_finite_differences(variant):
    """L = sum(r * dense(x, w, b)): its gradients are the backward codelets' with dy = r."""
    rng = np.random.default_rng(11)
    n, i, o = 5, 7, 18
    x, w, b = rng.standard_normal((n, i)), rng.standard_normal((o, i)), rng.standard_normal(o)
    r = rng.standard_normal((n, o))

    def objective(x, w, b):
        y = np.empty((n, o))
        dense.dense_fwd.variants[variant](x, w, b, y)
        return float(np.sum(r * y))

    def numeric_grad(arg_index):
        args = [x.copy(), w.copy(), b.copy()]
        target = args[arg_index]
        grad = np.empty_like(target)
        h = 1e-6
        for idx in np.ndindex(target.shape):
            saved = target[idx]
            target[idx] = saved + h
            up = objective(*args)
            target[idx] = saved - h
            down = objective(*args)
            target[idx] = saved
            grad[idx] = (up - down) / (2 * h)
        return grad

    dx = np.empty((n, i))
    dense.dense_bwd_input.variants[variant](r, w, dx)
    dw, db = np.zeros((o, i)), np.zeros(o)
    dense.dense_bwd_params.variants[variant](x, r, dw, db)
    assert rel_err(dx, numeric_grad(0)) <= 1e-7
    assert rel_err(dw, numeric_grad(1)) <= 1e-7
    assert rel_err(db, numeric_grad(2)) <= 1e-7


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_variants_on_cupy_match_ref(dtype, cupy):
    rng = np.random.default_rng(5)
    n, i, o = 33, 45, 19
    host = {
        "x": rng.standard_normal((n, i)).astype(dtype),
        "w": rng.standard_normal((o, i)).astype(dtype),
        "b": rng.standard_normal(o).astype(dtype),
        "dy": rng.standard_normal((n, o)).astype(dtype),
    }
    dev = {k: cupy.asarray(v) for k, v in host.items()}

    def both(codelet, names, out_shapes):
        ref_out = [np.zeros(s, dtype) for s in out_shapes]
        dev_out = [cupy.zeros(s, dtype) for s in out_shapes]
        codelet.variants["ref"](*[host[k] for k in names], *ref_out)
        codelet.variants["cuda"](*[dev[k] for k in names], *dev_out)
        for r, d in zip(ref_out, dev_out):
            assert isinstance(d, cupy.ndarray)
            assert rel_err(cupy.asnumpy(d), r) <= TOL[dtype]

    both(dense.dense_fwd, ["x", "w", "b"], [(n, o)])
    both(dense.dense_fwd_nobias, ["x", "w"], [(n, o)])
    both(dense.dense_bwd_input, ["dy", "w"], [(n, i)])
    both(dense.dense_bwd_params, ["x", "dy"], [(o, i), (o,)])
    both(dense.dense_bwd_weight, ["x", "dy"], [(o, i)])


# --------------------------------------------------------------------------- reduce.py

@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("variant", variant_names(reduce.fill_zero, reduce.add, reduce.copy))
@pytest.mark.parametrize("shape", [(), (1,), (7, 19), (2, 3, 5)])
def test_fill_zero_add_copy(variant, shape, dtype):
    rng = np.random.default_rng(len(shape))
    a = (100 * rng.standard_normal(shape)).astype(dtype)
    b = (100 * rng.standard_normal(shape)).astype(dtype)
    out = np.array(a, copy=True)
    reduce.add.variants[variant](out, b)
    np.testing.assert_array_equal(out, a + b)
    dst = np.full(shape, 7, dtype)
    reduce.copy.variants[variant](a, dst)
    np.testing.assert_array_equal(dst, a)
    reduce.fill_zero.variants[variant](dst)
    np.testing.assert_array_equal(dst, np.zeros(shape, dtype))


@pytest.mark.parametrize("variant", variant_names(reduce.fill_zero, reduce.add, reduce.copy))
def test_reduce_codelets_on_strided_views(variant):
    base = np.arange(24.0).reshape(4, 6)
    dst = np.zeros((6, 4)).T  # not C-contiguous
    reduce.copy.variants[variant](base[:, ::2].repeat(2, axis=1), dst)
    np.testing.assert_array_equal(dst, base[:, ::2].repeat(2, axis=1))
    reduce.add.variants[variant](dst, base)
    np.testing.assert_array_equal(dst, base[:, ::2].repeat(2, axis=1) + base)
    reduce.fill_zero.variants[variant](dst)
    assert not dst.any()


def test_zero_init_and_add_redux_work_in_place():
    partial = np.full((3, 2), 5.0)
    zero_init(partial)
    assert not partial.any()
    add_redux(partial, np.ones((3, 2)))
    add_redux(partial, np.ones((3, 2)))
    np.testing.assert_array_equal(partial, 2.0)
    count = np.array(4, np.int64)
    add_redux(count, np.array(3, np.int64))
    assert int(count) == 7
