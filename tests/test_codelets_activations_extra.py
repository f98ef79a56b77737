"""LeakyReLU, Sigmoid, Tanh and GELU codelets: every variant against torch.nn.functional
and autograd on random shapes and values (special values included), central finite
differences of the backward passes, and the CuPy run of the "cuda" variants."""

import numpy as np
import pytest

from hetero_nn.codelets import activation as act
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
ULPS = 16
VARIANTS = ["ref", "cpu", "cuda"]
# name: (forward codelet, backward codelet, params, torch function, backward reads "x" or "y")
OPS = {
    "leaky_relu": (act.leaky_relu_fwd, act.leaky_relu_bwd, {"negative_slope": 0.07},
                   lambda t: F.leaky_relu(t, 0.07), "x"),
    "leaky_relu_default": (act.leaky_relu_fwd, act.leaky_relu_bwd, {}, F.leaky_relu, "x"),
    "sigmoid": (act.sigmoid_fwd, act.sigmoid_bwd, {}, torch.sigmoid, "y"),
    "tanh": (act.tanh_fwd, act.tanh_bwd, {}, torch.tanh, "y"),
    "gelu": (act.gelu_fwd, act.gelu_bwd, {}, F.gelu, "x"),
}
SHAPES = [(3, 4, 5, 6), (7,), (2, 33), (1, 1, 1, 1)]


def make(shape, dtype, seed=0):
    rng = np.random.default_rng([seed, *shape])
    x = rng.standard_normal(shape) * rng.choice([0.5, 3.0, 12.0])
    x.reshape(-1)[0] = 0.0  # the kink of LeakyReLU
    return x.astype(dtype), rng.standard_normal(shape).astype(dtype)


def torch_pair(op, x, dy):
    xt = torch.tensor(x, requires_grad=True)
    yt = OPS[op][3](xt)
    yt.backward(torch.from_numpy(dy))
    return yt.detach().numpy(), xt.grad.numpy()


def run(op, variant, x, dy):
    fwd, bwd, params, _, reads = OPS[op]
    y = np.full_like(x, np.nan)
    fwd.variants[variant](x, y, **params)
    dx = np.full_like(x, np.nan)
    bwd.variants[variant](x if reads == "x" else y, dy, dx, **params)
    return y, dx


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_variants_match_torch(op, shape, dtype, variant):
    x, dy = make(shape, dtype)
    y, dx = run(op, variant, x, dy)
    ey, edx = torch_pair(op, x, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    assert rel_err(y, ey) <= TOL[dtype]
    assert rel_err(dx, edx) <= TOL[dtype]
    fwd, bwd = OPS[op][:2]
    assert_ulp(y, ey, ULPS, floor="scale", name=fwd.name)
    assert_ulp(dx, edx, ULPS, floor="scale", name=bwd.name)


@pytest.mark.parametrize("op", list(OPS))
def test_special_values_as_torch(op):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 40.0, -40.0, 1e-300])
    dy = np.ones_like(x)
    ey, edx = torch_pair(op, x, dy)
    for variant in VARIANTS:
        y, dx = run(op, variant, x, dy)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ey))
        finite = np.isfinite(ey)
        np.testing.assert_allclose(y[finite], ey[finite], rtol=1e-12, atol=0)
        np.testing.assert_array_equal(y[~finite & ~np.isnan(ey)], ey[~finite & ~np.isnan(ey)])
        ok = np.isfinite(edx)
        np.testing.assert_allclose(dx[ok], edx[ok], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("op", list(OPS))
def test_backward_matches_finite_differences(op):
    x, dy = make((4, 5), np.float64, seed=1)
    x[np.abs(x) < 1e-3] = 0.5  # keep away from LeakyReLU's kink
    x.reshape(-1)[0] = 0.25
    _, dx = run(op, "cpu", x, dy)
    h = 1e-6
    fd = np.empty_like(x)
    for k in range(x.size):
        plus, minus = x.copy(), x.copy()
        plus.reshape(-1)[k] += h
        minus.reshape(-1)[k] -= h
        fd.reshape(-1)[k] = (np.sum(run(op, "cpu", plus, dy)[0] * dy)
                             - np.sum(run(op, "cpu", minus, dy)[0] * dy)) / (2 * h)
    assert rel_err(dx, fd) <= 1e-7


def test_non_contiguous_output_is_written():
    x, dy = make((4, 6), np.float64)
    out = np.full((6, 4), np.nan).T  # a transposed view: no flat view of its memory
    act.gelu_fwd.variants["cpu"](x, out)
    assert rel_err(out, torch_pair("gelu", x, dy)[0]) <= 1e-10


@pytest.mark.cuda
@pytest.mark.parametrize("op", list(OPS))
def test_cuda_variants_on_cupy(op, cupy):
    x, dy = make((3, 4, 5), np.float64)
    fwd, bwd, params, _, reads = OPS[op]
    xg, dyg = cupy.asarray(x), cupy.asarray(dy)
    y = cupy.full(x.shape, cupy.nan)
    fwd.variants["cuda"](xg, y, **params)
    dx = cupy.full(x.shape, cupy.nan)
    bwd.variants["cuda"](xg if reads == "x" else y, dyg, dx, **params)
    ey, edx = torch_pair(op, x, dy)
    assert rel_err(cupy.asnumpy(y), ey) <= 1e-10 and rel_err(cupy.asnumpy(dx), edx) <= 1e-10
