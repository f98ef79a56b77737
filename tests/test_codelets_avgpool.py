"""Average-pooling codelets: every variant against torch avg_pool2d / adaptive_avg_pool2d
and autograd (padding, overlapping and gapped windows, global windows), central finite
differences of the backward pass, and the CuPy run of the "cuda" variants."""

import zlib

import numpy as np
import pytest

from hetero_nn.codelets import avgpool
from helpers import assert_ulp, pair, rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
ULPS = 8
VARIANTS = ["ref", "cpu", "cuda"]
# (N, C, H, W, kernel, stride, padding)
CASES = [
    (2, 3, 8, 8, 2, None, 0),
    (1, 2, 7, 9, 3, 2, 1),
    (3, 4, 6, 5, 3, 1, 1),
    (2, 2, 11, 10, 2, 3, 0),
    (2, 3, 7, 9, (2, 3), (1, 2), (1, 1)),
    (1, 5, 5, 7, (5, 7), None, 0),   # global average pooling
    (4, 1, 1, 1, 1, 1, 0),
]


def make(case, dtype):
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal(case[:4]) * 4 + 1
    return x.astype(dtype)


def params(case):
    return {"kernel_size": case[4], "stride": case[5], "padding": case[6]}


def torch_pool(x, case, dy=None):
    xt = torch.tensor(x, requires_grad=True)
    k, s, p = pair(case[4]), case[5], pair(case[6])
    yt = F.avg_pool2d(xt, k, pair(s) if s is not None else None, p)
    dx = None
    if dy is not None:
        yt.backward(torch.from_numpy(dy))
        dx = xt.grad.numpy()
    return yt.detach().numpy(), dx


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_variants_match_torch(case, dtype, variant):
    x = make(case, dtype)
    shape = avgpool.avgpool2d_output_shape(x.shape, **params(case))
    dy = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    ey, edx = torch_pool(x, case, dy)
    y = np.full(shape, np.nan, dtype)
    avgpool.avgpool2d_fwd.variants[variant](x, y, **params(case))
    dx = np.full(x.shape, np.nan, dtype)
    avgpool.avgpool2d_bwd.variants[variant](dy, dx, **params(case))
    assert y.shape == ey.shape
    assert rel_err(y, ey) <= TOL[dtype]
    assert rel_err(dx, edx) <= TOL[dtype]
    # window sums in another order than torch's: a few ULPs of the largest value
    assert_ulp(y, ey, ULPS, floor="scale", name="avgpool2d_fwd")
    assert_ulp(dx, edx, ULPS, floor="scale", name="avgpool2d_bwd")


def test_global_window_equals_adaptive_avg_pool():
    x = make((3, 4, 6, 5, None, None, 0), np.float64)
    y = np.full((3, 4, 1, 1), np.nan)
    avgpool.avgpool2d_fwd.variants["cpu"](x, y, kernel_size=(6, 5))
    assert rel_err(y, F.adaptive_avg_pool2d(torch.tensor(x), 1).numpy()) <= 1e-10


def test_backward_matches_finite_differences():
    case = (1, 2, 5, 6, 3, 2, 1)
    x = make(case, np.float64)
    shape = avgpool.avgpool2d_output_shape(x.shape, **params(case))
    dy = np.random.default_rng(2).standard_normal(shape)
    dx = np.empty_like(x)
    avgpool.avgpool2d_bwd.variants["cpu"](dy, dx, **params(case))

    def objective(a):
        y = np.empty(shape)
        avgpool.avgpool2d_fwd.variants["cpu"](a, y, **params(case))
        return float(np.sum(y * dy))

    fd = np.empty_like(x)
    for k in range(x.size):
        plus, minus = x.copy(), x.copy()
        plus.reshape(-1)[k] += 1e-6
        minus.reshape(-1)[k] -= 1e-6
        fd.reshape(-1)[k] = (objective(plus) - objective(minus)) / 2e-6
    assert rel_err(dx, fd) <= 1e-8


@pytest.mark.parametrize("bad, match", [
    ({"kernel_size": 2, "padding": 2}, "half the kernel"),
    ({"kernel_size": 0}, ">= 1"),
    ({"kernel_size": 9}, "larger than the input 4x4 padded"),
])
def test_bad_geometry_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        avgpool.avgpool2d_output_shape((1, 1, 4, 4), **bad)


@pytest.mark.cuda
def test_cuda_variants_on_cupy(cupy):
    case = (2, 3, 7, 9, 3, 2, 1)
    x = make(case, np.float64)
    shape = avgpool.avgpool2d_output_shape(x.shape, **params(case))
    dy = np.random.default_rng(1).standard_normal(shape)
    ey, edx = torch_pool(x, case, dy)
    y, dx = cupy.full(shape, cupy.nan), cupy.full(x.shape, cupy.nan)
    avgpool.avgpool2d_fwd.variants["cuda"](cupy.asarray(x), y, **params(case))
    avgpool.avgpool2d_bwd.variants["cuda"](cupy.asarray(dy), dx, **params(case))
    assert rel_err(cupy.asnumpy(y), ey) <= 1e-10 and rel_err(cupy.asnumpy(dx), edx) <= 1e-10
