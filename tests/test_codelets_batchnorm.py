"""Batch-norm codelets: every variant, run as the layer runs them over partitions (REDUX
partials added in order), against torch.nn.functional.batch_norm and autograd in train
and eval mode, the running statistics, central finite differences, and the CuPy run."""

import numpy as np
import pytest

from hetero_nn.codelets import batchnorm as bn
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of each result's largest magnitude; the input
#: gradient subtracts two means from dy (cancellation), torch in another order.
ULPS = {"bn_bwd_input": 512, "bn_fwd": 32, "bn_param_grads": 32, "bn_running": 4}
VARIANTS = ["ref", "cpu", "cuda"]
EPS, MOMENTUM = 1e-5, 0.1
# (N, C, H, W, partitions): batch 2 to 9, 1 to 7 channels, 1x1 planes, uneven splits
CASES = [(4, 3, 5, 6, 1), (7, 2, 3, 4, 3), (2, 5, 1, 1, 2), (9, 1, 4, 3, 4), (3, 7, 6, 2, 3)]


def make(case, dtype, seed=0):
    n, c, h, w, _ = case
    rng = np.random.default_rng([seed, *case[:4]])
    x = (rng.standard_normal((n, c, h, w)) * rng.uniform(0.5, 3, (1, c, 1, 1))
         + rng.uniform(-2, 2, (1, c, 1, 1))).astype(dtype)
    weight, bias = rng.uniform(0.5, 1.5, c).astype(dtype), rng.standard_normal(c).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    running = (rng.standard_normal(c).astype(dtype), rng.uniform(0.5, 2, c).astype(dtype))
    return x, weight, bias, dy, running


def reduce_over(codelet, variant, parts, *operands_after, shape):
    """Each partition's REDUX contribution into a private zero partial, partials added in order."""
    totals = None
    for part in parts:
        partials = [np.zeros(s[0], s[1]) for s in shape]
        codelet.variants[variant](*part, *operands_after, *partials)
        totals = partials if totals is None else [t + p for t, p in zip(totals, partials)]
    return totals


def run_bn(variant, x, weight, bias, dy, running, parts, batch_stats=True):
    """The layer's task sequence on arrays: returns y, dx, dweight, dbias, running stats."""
    v = lambda cl: cl.variants[variant]  # noqa: E731
    c, dtype = x.shape[1], x.dtype
    count = x.size // c
    xs, dys = np.array_split(x, parts), np.array_split(dy, parts)
    rmean, rvar = running[0].copy(), running[1].copy()
    if batch_stats:
        (total,) = reduce_over(bn.bn_sum, variant, [(p,) for p in xs], shape=[(c, dtype)])
        mean = np.full(c, np.nan, dtype)
        v(bn.bn_mean)(total, mean, count=count)
        sqdev = np.zeros(c, dtype)
        for p in xs:
            partial = np.zeros(c, dtype)
            v(bn.bn_sqdev)(p, mean, partial)
            sqdev += partial
        var = np.full(c, np.nan, dtype)
        v(bn.bn_var)(sqdev, var, count=count)
        v(bn.bn_running)(mean, sqdev, rmean, rvar, np.array([MOMENTUM]), count=count)
    else:
        mean, var = rmean, rvar
    y = np.full_like(x, np.nan)
    for p, yp in zip(xs, np.array_split(y, parts)):
        v(bn.bn_fwd)(p, mean, var, weight, bias, yp, eps=EPS)
    sum_dy, dotp = np.zeros(c, dtype), np.zeros(c, dtype)
    for p, g in zip(xs, dys):
        a, b = np.zeros(c, dtype), np.zeros(c, dtype)
        v(bn.bn_bwd_sums)(p, g, mean, a, b)
        sum_dy += a
        dotp += b
    dweight, dbias = np.zeros(c, dtype), np.zeros(c, dtype)
    v(bn.bn_param_grads)(sum_dy, dotp, var, dweight, dbias, eps=EPS)
    dx = np.full_like(x, np.nan)
    for p, g, dxp in zip(xs, dys, np.array_split(dx, parts)):
        v(bn.bn_bwd_input)(p, g, mean, var, weight, sum_dy, dotp, dxp, count=count, eps=EPS,
                           batch_stats=batch_stats)
    return y, dx, dweight, dbias, rmean, rvar


def torch_bn(x, weight, bias, dy, running, training):
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    rm, rv = torch.tensor(running[0]), torch.tensor(running[1])
    y = F.batch_norm(xt, rm, rv, wt, bt, training=training, momentum=MOMENTUM, eps=EPS)
    y.backward(torch.from_numpy(dy))
    return (y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy(), rm.numpy(),
            rv.numpy())


NAMES = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")
#: The codelet that computes each of NAMES last.
CODELET_OF = dict(zip(NAMES, ("bn_fwd", "bn_bwd_input", "bn_param_grads", "bn_param_grads",
                              "bn_running", "bn_running")))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_variants_match_torch(case, dtype, training, variant):
    x, weight, bias, dy, running = make(case, dtype)
    got = run_bn(variant, x, weight, bias, dy, running, case[4], batch_stats=training)
    expected = torch_bn(x, weight, bias, dy, running, training)
    for name, a, e in zip(NAMES, got, expected):
        assert a.dtype == dtype, name
        assert rel_err(a, e) <= TOL[dtype], (name, rel_err(a, e))
        assert_ulp(a, e, ULPS[CODELET_OF[name]], floor="scale", name=CODELET_OF[name])


def test_partitioning_changes_only_rounding():
    case = (9, 3, 4, 5, 1)
    x, weight, bias, dy, running = make(case, np.float64)
    whole = run_bn("cpu", x, weight, bias, dy, running, 1)
    for parts in (2, 5, 9):
        split = run_bn("cpu", x, weight, bias, dy, running, parts)
        for name, a, b in zip(NAMES, split, whole):
            assert rel_err(a, b) <= 1e-13, (parts, name)


def test_badly_centred_input_keeps_float64_precision():
    """Two passes (sum, then squared deviations) keep the variance of data far from zero:
    values 1e4 +- 1e-3 give a variance of 1e-6 that ``E[x^2] - E[x]^2`` would get wrong by
    about 1e-8 / 1e-6 = 1e-2; here the agreement is at the rounding of the mean (the
    problem's condition number is about 1e7)."""
    x, weight, bias, dy, running = make((6, 2, 3, 3, 3), np.float64)
    x = x * 1e-3 + 1e4
    got = run_bn("cpu", x, weight, bias, dy, running, 3)
    expected = torch_bn(x, weight, bias, dy, running, True)
    for name, a, e in zip(NAMES, got, expected):
        assert rel_err(a, e) <= 1e-7, (name, rel_err(a, e))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_gradients_match_finite_differences(training):
    x, weight, bias, dy, running = make((5, 2, 3, 2, 2), np.float64, seed=3)
    _, dx, dweight, dbias, _, _ = run_bn("ref", x, weight, bias, dy, running, 2, training)

    def objective(x_, w_, b_):
        return float(np.sum(run_bn("ref", x_, w_, b_, dy, running, 2, training)[0] * dy))

    rng = np.random.default_rng(7)
    h = 1e-6
    for which, grad in ((0, dx), (1, dweight), (2, dbias)):
        args = [x, weight, bias]
        flat = args[which].reshape(-1)
        for k in rng.choice(flat.size, size=min(6, flat.size), replace=False):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which].reshape(-1)[k] += h
            minus[which].reshape(-1)[k] -= h
            fd = (objective(*plus) - objective(*minus)) / (2 * h)
            assert abs(fd - grad.reshape(-1)[k]) <= 1e-6 * max(1.0, abs(fd)), (which, k)


def test_redux_operands_are_accumulated_not_overwritten():
    x = np.random.default_rng(0).standard_normal((3, 2, 2, 2))
    for variant in VARIANTS:
        total = np.array([1.0, -2.0])
        bn.bn_sum.variants[variant](x, total)
        np.testing.assert_allclose(total, np.array([1.0, -2.0]) + x.sum(axis=(0, 2, 3)))


@pytest.mark.cuda
def test_cuda_variants_on_cupy(cupy):
    x, weight, bias, dy, running = make((4, 3, 5, 5, 2), np.float64)
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    y = cupy.full(x.shape, cupy.nan)
    bn.bn_fwd.variants["cuda"](*(cupy.asarray(a) for a in (x, mean, var, weight, bias)), y, eps=EPS)
    expected = torch_bn(x, weight, bias, dy, running, True)[0]
    assert rel_err(cupy.asnumpy(y), expected) <= 1e-10
