"""Max-pooling codelets: every variant against torch max_pool2d(return_indices=True) and
autograd — values and argmax bit for bit, including ties and NaN —, central finite
differences of the backward pass, declarations, and the CuPy run of the "cuda" variants."""

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import R, W
from hetero_nn.codelets import pool
from helpers import assert_ulp, pair, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
DTYPES = [np.float64, np.float32]
VARIANTS = ["ref", "cpu", "cuda"]

# (N, C, H, W, kernel, stride): the usual 2/2, overlapping windows (stride < kernel),
# gaps (stride > kernel), floor on odd sizes, batch 1, 1 channel and > 16, pairs.
CASES = [
    (2, 3, 8, 8, 2, 2),
    (1, 1, 7, 9, 2, 2),
    (3, 17, 9, 7, 3, 2),
    (2, 2, 6, 5, 3, 1),
    (1, 20, 5, 5, 2, 1),
    (2, 3, 11, 10, 2, 3),
    (2, 2, 4, 4, 4, 4),
    (2, 3, 7, 9, (2, 3), (1, 2)),
    (1, 2, 6, 7, (3, 1), (2, 1)),
]
# Inputs: unique values, ReLU outputs (ties of zeros), small integers (ties of all
# kinds), and special values (NaN, several NaN in a window, -inf, +inf).
KINDS = ["normal", "relu", "integers", "special"]


def make_input(case, kind, dtype):
    n, c, h, w = case[:4]
    rng = np.random.default_rng(zlib.crc32(repr((case, kind)).encode()))
    x = rng.standard_normal((n, c, h, w))
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "integers":
        x = rng.integers(-1, 2, size=x.shape).astype(np.float64)
    elif kind == "special":
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, max(4, flat.size // 4)), replace=False)
        flat[picks[0::4]] = np.nan
        flat[picks[1::4]] = -np.inf
        flat[picks[2::4]] = np.inf
        flat[picks[3::4]] = np.nan
        x[0, 0, :2, :2] = np.nan  # several NaN in one window: the last one wins
        x[-1, -1, :2, :2] = -np.inf  # a window of -inf: its first element wins
    return x.astype(dtype)


def torch_reference(x, case, dy=None):
    """PyTorch's (y, argmax) and, given ``dy``, the input gradient."""
    kernel, stride = pair(case[4]), pair(case[5])
    xt = torch.tensor(x, requires_grad=True)
    yt, it = F.max_pool2d(xt, kernel, stride, return_indices=True)
    dx = None
    if dy is not None:
        yt.backward(torch.from_numpy(dy))
        dx = xt.grad.numpy()
    return yt.detach().numpy(), it.numpy(), dx


def params(case):
    return {"kernel_size": case[4], "stride": case[5]}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_variants_match_torch(case, dtype, kind, variant):
    x = make_input(case, kind, dtype)
    y_ref, arg_ref, _ = torch_reference(x, case)
    dy = np.random.default_rng(7).standard_normal(y_ref.shape).astype(dtype)
    _, _, dx_ref = torch_reference(x, case, dy)

    y = np.full(y_ref.shape, 123.0, dtype=dtype)
    argmax = np.full(y_ref.shape, -7, dtype=np.int64)
    pool.maxpool2d_fwd.variants[variant](x, y, argmax, **params(case))
    np.testing.assert_array_equal(y, y_ref)  # NaN compare equal here
    assert_ulp(y, y_ref, 0, name="maxpool2d_fwd")
    np.testing.assert_array_equal(argmax, arg_ref)

    dx = np.full(x.shape, np.nan, dtype=dtype)
    pool.maxpool2d_bwd.variants[variant](dy, arg_ref, dx, **params(case))
    assert dx.dtype == dtype and rel_err(dx, dx_ref) <= TOL[dtype]
    # each element the sum of the gradients routed to it (overlapping windows), in
    # another order than torch's: held to a few ULPs of the largest
    assert_ulp(dx, dx_ref, 4, floor="scale", name="maxpool2d_bwd")


@pytest.mark.parametrize("variant", VARIANTS)
def test_backward_without_geometry(variant):
    """The backward task needs only ``argmax``; the window parameters are optional."""
    case = (2, 3, 7, 7, 3, 2)  # overlapping windows: routed gradients add up
    x = make_input(case, "integers", np.float64)
    dy = np.random.default_rng(3).standard_normal(torch_reference(x, case)[0].shape)
    _, argmax, dx_ref = torch_reference(x, case, dy)
    dx = np.full(x.shape, np.nan)
    pool.maxpool2d_bwd.variants[variant](dy, argmax, dx)
    assert rel_err(dx, dx_ref) <= 1e-12


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 18), h=st.integers(1, 9), w=st.integers(1, 9),
       k=st.integers(1, 4), stride=st.integers(1, 4), kind=st.sampled_from(KINDS))
def test_random_geometry_matches_torch(n, c, h, w, k, stride, kind):
    case = (n, c, h, w, k, stride)
    if k > min(h, w):
        with pytest.raises(ValueError, match="larger than the input"):
            pool.maxpool2d_output_shape((n, c, h, w), k, stride)
        return
    x = make_input(case, kind, np.float32)
    y_ref, arg_ref, _ = torch_reference(x, case)
    assert pool.maxpool2d_output_shape(x.shape, k, stride) == y_ref.shape
    dy = np.ones(y_ref.shape, dtype=np.float32)
    _, _, dx_ref = torch_reference(x, case, dy)
    for variant in VARIANTS:
        y = np.empty(y_ref.shape, dtype=np.float32)
        argmax = np.empty(y_ref.shape, dtype=np.int64)
        pool.maxpool2d_fwd.variants[variant](x, y, argmax, **params(case))
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(argmax, arg_ref)
        dx = np.empty_like(x)
        pool.maxpool2d_bwd.variants[variant](dy, argmax, dx, **params(case))
        np.testing.assert_array_equal(dx, dx_ref)  # sums of ones: exact


@pytest.mark.parametrize("case", [(2, 3, 7, 6, 3, 2), (1, 2, 6, 6, 2, 2)], ids=str)
def test_backward_matches_central_differences(case):
    """``sum(maxpool(x) * g)`` differentiated numerically, away from ties."""
    n, c, h, w = case[:4]
    rng = np.random.default_rng(5)
    # Distinct values at least 1 apart: a step of 1e-3 never changes a window's winner.
    x = rng.permutation(n * c * h * w).reshape(n, c, h, w).astype(np.float64)
    y_shape = pool.maxpool2d_output_shape(x.shape, case[4], case[5])
    g = rng.standard_normal(y_shape)

    def loss(x):
        y, argmax = np.empty(y_shape), np.empty(y_shape, dtype=np.int64)
        pool.maxpool2d_fwd.variants["ref"](x, y, argmax, **params(case))
        return float(np.sum(y * g))

    numeric = np.empty_like(x)
    eps = 1e-3
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (loss(up) - loss(down)) / (2 * eps)
    for variant in VARIANTS:
        y, argmax = np.empty(y_shape), np.empty(y_shape, dtype=np.int64)
        pool.maxpool2d_fwd.variants[variant](x, y, argmax, **params(case))
        dx = np.full(x.shape, np.nan)
        pool.maxpool2d_bwd.variants[variant](g, argmax, dx, **params(case))
        assert rel_err(dx, numeric) <= 1e-9, variant


def test_cpu_backward_rejects_an_index_outside_the_plane():
    dy = np.ones((1, 1, 1, 1))
    dx = np.empty((1, 1, 2, 2))
    with pytest.raises(IndexError, match="outside the input plane"):
        pool.maxpool2d_bwd.variants["cpu"](dy, np.array([[[[4]]]], dtype=np.int64), dx)


def test_declarations_flops_and_geometry():
    assert pool.maxpool2d_fwd.modes == (R, W, W)
    assert pool.maxpool2d_bwd.modes == (R, R, W)
    for codelet in (pool.maxpool2d_fwd, pool.maxpool2d_bwd):
        assert sorted(codelet.variants) == sorted(VARIANTS)
        assert codelet.kinds == {"cpu": ("ref", "cpu"), "cuda": ("cuda",)}
    x, y = (2, 3, 8, 8), (2, 3, 4, 4)
    assert pool.maxpool2d_fwd.work([x, y, y], {"kernel_size": 2, "stride": 2}) == 2 * 3 * 16 * 4
    assert pool.maxpool2d_bwd.work([y, y, x], {"kernel_size": 2}) == 2 * 3 * (64 + 16)
    assert pool.maxpool2d_output_shape((64, 6, 28, 28), 2) == (64, 6, 14, 14)
    assert pool.maxpool2d_output_shape((1, 1, 7, 9), (2, 3), (1, 2)) == (1, 1, 6, 4)
    with pytest.raises(ValueError, match=">= 1"):
        pool.maxpool2d_output_shape((1, 1, 4, 4), 2, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_cuda_variants_on_cupy_match_ref(case, cupy):
    for dtype in DTYPES:
        x = make_input(case, "special", dtype)
        y_ref, arg_ref, _ = torch_reference(x, case)
        dy = np.random.default_rng(1).standard_normal(y_ref.shape).astype(dtype)
        dx_ref = np.empty_like(x)
        pool.maxpool2d_bwd.variants["ref"](dy, arg_ref, dx_ref)
        y = cupy.empty(y_ref.shape, dtype=dtype)
        argmax = cupy.empty(y_ref.shape, dtype=cupy.int64)
        pool.maxpool2d_fwd.variants["cuda"](cupy.asarray(x), y, argmax, **params(case))
        np.testing.assert_array_equal(cupy.asnumpy(y), y_ref)
        np.testing.assert_array_equal(cupy.asnumpy(argmax), arg_ref)
        for geometry in (params(case), {}):
            dx = cupy.full(x.shape, cupy.nan, dtype=dtype)
            pool.maxpool2d_bwd.variants["cuda"](cupy.asarray(dy), argmax, dx, **geometry)
            assert rel_err(cupy.asnumpy(dx), dx_ref) <= TOL[dtype]
