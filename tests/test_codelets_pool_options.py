"""Pooling options: max pooling with padding, dilation and ceil mode (values and argmax bit
for bit, ties and NaN included), average pooling with ceil mode, count_include_pad and
divisor_override, and adaptive average pooling to any output size -- every variant
against torch.nn.functional and autograd on random geometries (hypothesis), central
finite differences, PyTorch's output-size rules and refusals."""

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import avgpool, pool
from helpers import central_differences, rel_err
from test_codelets_pool import KINDS, make_input

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
VARIANTS = ["ref", "cpu", "cuda"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- max pooling

# (N, C, H, W, kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    (2, 3, 7, 7, 3, 2, 1, 1, True),      # ResNet's stem pooling, ceil mode
    (2, 3, 6, 6, 3, 2, 0, 1, True),      # ceil mode adds a clipped last window
    (1, 2, 9, 8, 3, 2, 1, 2, True),
    (2, 2, 5, 7, 2, 1, 1, 2, False),
    (1, 1, 6, 6, (2, 3), (2, 1), (1, 1), (2, 1), True),
    (2, 2, 7, 7, 2, 2, 0, 1, True),      # 2x2 windows, the last one clipped: not the fast path
    (2, 17, 8, 8, 2, 2, 1, 1, False),
]


def torch_max(x, case, dy=None):
    n, c, h, w, k, s, p, d, ceil = case
    xt = torch.tensor(x, requires_grad=True)
    yt, it = F.max_pool2d(xt, k, s, p, d, ceil_mode=ceil, return_indices=True)
    dx = None
    if dy is not None:
        yt.backward(torch.from_numpy(dy))
        dx = xt.grad.numpy()
    return yt.detach().numpy(), it.numpy(), dx


def max_params(case):
    k, s, p, d, ceil = case[4:]
    return {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil}


def check_max(case, kind, dtype):
    x = make_input(case, kind, dtype)
    y_ref, arg_ref, _ = torch_max(x, case)
    dy = np.random.default_rng(7).standard_normal(y_ref.shape).astype(dtype)
    dx_ref = torch_max(x, case, dy)[2]
    assert pool.maxpool2d_output_shape(x.shape, **max_params(case)) == y_ref.shape
    for variant in VARIANTS:
        y = np.full(y_ref.shape, 123.0, dtype=dtype)
        argmax = np.full(y_ref.shape, -7, dtype=np.int64)
        pool.maxpool2d_fwd.variants[variant](x, y, argmax, **max_params(case))
        np.testing.assert_array_equal(y, y_ref)  # NaN compare equal here
        np.testing.assert_array_equal(argmax, arg_ref)
        for geometry in (max_params(case), {}):
            dx = np.full(x.shape, np.nan, dtype=dtype)
            pool.maxpool2d_bwd.variants[variant](dy, arg_ref, dx, **geometry)
            assert rel_err(dx, dx_ref) <= TOL[dtype], variant


@settings(max_examples=15, deadline=None)
@given(h=st.integers(3, 12), w=st.integers(3, 12),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       p=st.tuples(st.integers(0, 1), st.integers(0, 1)), ceil=st.booleans(),
       kind=st.sampled_from(KINDS), dtype=st.sampled_from([np.float64, np.float32]))
def test_3x3_windows_match_torch(h, w, s, p, ceil, kind, dtype):
    """3x3 windows of dilation 1 (torchvision ResNet's stem pool: stride 2, padding 1) have
    a kernel of their own: the windows inside the input unrolled, those the border clips
    scanned; both give PyTorch's values and argmax, ties and NaN included."""
    check_max((2, 3, h, w, 3, s, p, 1, ceil), kind, dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pooling_options_match_torch(case, dtype, kind):
    check_max(case, kind, dtype)


@st.composite
def max_geometries(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    h, w = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 4)), h, w, k, s, p, d,
            draw(st.booleans()))


def valid_max_geometry(case):
    """Whether PyTorch gives an output whose every window holds an input element."""
    try:
        pool.maxpool2d_output_shape(case[:4], **max_params(case))
        return True
    except ValueError:
        return False


@settings(max_examples=60, deadline=None)
@given(case=max_geometries(), kind=st.sampled_from(KINDS))
def test_random_max_pooling_matches_torch(case, kind):
    if not valid_max_geometry(case):  # PyTorch: no output, or a window of padding only
        x = torch.zeros(case[:4])
        try:
            y, i = F.max_pool2d(x, *case[4:8], ceil_mode=case[8], return_indices=True)
        except RuntimeError:
            return  # refused by both
        assert (i.numpy() >= case[2] * case[3]).any() or (y.numpy() == -np.inf).any()
        return
    check_max(case, kind, np.float32)


def test_max_pooling_refusals():
    with pytest.raises(ValueError, match="at most half the kernel"):
        pool.maxpool2d_output_shape((1, 1, 6, 6), 2, padding=2)
    with pytest.raises(ValueError, match="larger than the input"):
        pool.maxpool2d_output_shape((1, 1, 2, 2), 3, 2)
    # PyTorch returns -inf and an index outside the plane for this window: refused here.
    with pytest.raises(ValueError, match="holds no element"):
        pool.maxpool2d_output_shape((1, 1, 3, 3), 2, 1, padding=1, dilation=4)
    with pytest.raises(ValueError, match=">= 1"):
        pool.maxpool2d_output_shape((1, 1, 6, 6), 2, dilation=0)


@pytest.mark.parametrize("size, k, s, p, d", [(6, 3, 2, 0, 1), (7, 3, 2, 1, 1), (5, 2, 2, 1, 1),
                                              (10, 3, 3, 1, 2), (9, 4, 3, 2, 1)])
def test_ceil_mode_output_size_follows_pytorch(size, k, s, p, d):
    for ceil in (False, True):
        expected = F.max_pool2d(torch.zeros(1, 1, size, size), k, s, p, d, ceil_mode=ceil).shape
        assert pool.pooled_size(size, k, s, p, d, ceil) == expected[-1]


def test_max_pooling_backward_matches_central_differences():
    case = (1, 2, 7, 6, 3, 2, 1, (1, 2), True)
    n, c, h, w = case[:4]
    rng = np.random.default_rng(5)
    x = rng.permutation(n * c * h * w).reshape(n, c, h, w).astype(np.float64)  # no ties
    y_shape = pool.maxpool2d_output_shape(x.shape, **max_params(case))
    g = rng.standard_normal(y_shape)

    def loss(x):
        y, argmax = np.empty(y_shape), np.empty(y_shape, dtype=np.int64)
        pool.maxpool2d_fwd.variants["ref"](x, y, argmax, **max_params(case))
        return float(np.sum(y * g))

    numeric = central_differences(lambda: loss(x), x, 1e-3)
    for variant in VARIANTS:
        y, argmax = np.empty(y_shape), np.empty(y_shape, dtype=np.int64)
        pool.maxpool2d_fwd.variants[variant](x, y, argmax, **max_params(case))
        dx = np.full(x.shape, np.nan)
        pool.maxpool2d_bwd.variants[variant](g, argmax, dx, **max_params(case))
        assert rel_err(dx, numeric) <= 1e-9, variant


# --------------------------------------------------------------------------- average pooling

# (N, C, H, W, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    (2, 3, 5, 5, 3, 2, 1, True, True, None),
    (2, 3, 5, 5, 3, 2, 1, True, False, None),
    (1, 2, 6, 6, 3, 2, 0, True, True, None),
    (2, 2, 7, 6, (3, 2), (2, 2), (1, 1), True, False, 3),
    (2, 2, 7, 6, 2, 1, 1, False, False, None),
    (1, 3, 9, 8, (4, 3), (3, 2), (2, 1), True, True, -2),
    (2, 2, 3, 3, 5, None, 0, True, True, None),   # ceil mode: one window wider than the input
]


def avg_params(case):
    k, s, p, ceil, include, override = case[4:]
    return {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil,
            "count_include_pad": include, "divisor_override": override}


def check_avg(case, dtype):
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = (rng.standard_normal(case[:4]) * 3 + 1).astype(dtype)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.avg_pool2d(xt, *case[4:])
    dy = rng.standard_normal(yt.shape).astype(dtype)
    yt.backward(torch.from_numpy(dy))
    params = avg_params(case)
    assert avgpool.avgpool2d_output_shape(x.shape, **params) == yt.shape
    for variant in VARIANTS:
        y = np.full(yt.shape, np.nan, dtype)
        avgpool.avgpool2d_fwd.variants[variant](x, y, **params)
        dx = np.full(x.shape, np.nan, dtype)
        avgpool.avgpool2d_bwd.variants[variant](dy, dx, **params)
        assert rel_err(y, yt.detach().numpy()) <= TOL[dtype], variant
        assert rel_err(dx, xt.grad.numpy()) <= TOL[dtype], variant


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_average_pooling_options_match_torch(case, dtype):
    check_avg(case, dtype)


@settings(max_examples=40, deadline=None)
@given(k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3)), data=st.data(),
       ceil=st.booleans(), include=st.booleans(),
       override=st.sampled_from([None, None, 2, 5]), dtype=st.sampled_from([np.float64,
                                                                           np.float32]))
def test_random_average_pooling_matches_torch(k, s, data, ceil, include, override, dtype):
    p = (data.draw(st.integers(0, k[0] // 2)), data.draw(st.integers(0, k[1] // 2)))
    h = data.draw(st.integers(max(1, k[0] - 2 * p[0]), 10))
    w = data.draw(st.integers(max(1, k[1] - 2 * p[1]), 10))
    check_avg((data.draw(st.integers(1, 2)), 2, h, w, k, s, p, ceil, include, override), dtype)


def test_average_pooling_backward_matches_central_differences():
    case = (1, 2, 6, 5, 3, 2, 1, True, False, None)
    x = np.random.default_rng(3).standard_normal(case[:4])
    params = avg_params(case)
    shape = avgpool.avgpool2d_output_shape(x.shape, **params)
    g = np.random.default_rng(4).standard_normal(shape)

    def loss(a):
        y = np.empty(shape)
        avgpool.avgpool2d_fwd.variants["ref"](a, y, **params)
        return float(np.sum(y * g))

    numeric = central_differences(lambda: loss(x), x, 1e-5)
    for variant in VARIANTS:
        dx = np.full(x.shape, np.nan)
        avgpool.avgpool2d_bwd.variants[variant](g, dx, **params)
        assert rel_err(dx, numeric) <= 1e-8, variant


def test_average_pooling_refuses_a_zero_divisor():
    with pytest.raises(ValueError, match="divisor_override"):
        avgpool.avgpool2d_fwd.variants["ref"](np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 2, 2)),
                                              kernel_size=2, divisor_override=0)


# --------------------------------------------------------------------------- adaptive

def check_adaptive(n, c, h, w, out, dtype):
    rng = np.random.default_rng(h * 100 + w * 10 + sum(out))
    x = (rng.standard_normal((n, c, h, w)) * 2 - 1).astype(dtype)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.adaptive_avg_pool2d(xt, out)
    dy = rng.standard_normal(yt.shape).astype(dtype)
    yt.backward(torch.from_numpy(dy))
    for variant in VARIANTS:
        y = np.full(yt.shape, np.nan, dtype)
        avgpool.adaptive_avgpool2d_fwd.variants[variant](x, y)
        dx = np.full(x.shape, np.nan, dtype)
        avgpool.adaptive_avgpool2d_bwd.variants[variant](dy, dx)
        assert rel_err(y, yt.detach().numpy()) <= TOL[dtype], variant
        assert rel_err(dx, xt.grad.numpy()) <= TOL[dtype], variant


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("h, w, out", [(7, 9, (3, 4)), (5, 5, (1, 1)), (4, 6, (7, 9)),
                                       (8, 8, (4, 4)), (7, 5, (7, 5)), (1, 1, (3, 2))], ids=str)
def test_adaptive_pooling_matches_torch(h, w, out, dtype):
    check_adaptive(2, 3, h, w, out, dtype)


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), oh=st.integers(1, 14), ow=st.integers(1, 14),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_random_adaptive_pooling_matches_torch(h, w, oh, ow, dtype):
    check_adaptive(1, 2, h, w, (oh, ow), dtype)


def test_adaptive_windows_follow_pytorchs_rule():
    assert avgpool.adaptive_windows(5, 3) == ([0, 1, 3], [2, 4, 5])
    assert avgpool.adaptive_windows(3, 5) == ([0, 0, 1, 1, 2], [1, 2, 2, 3, 3])
    starts, ends = avgpool.adaptive_windows(10, 10)
    assert starts == list(range(10)) and ends == list(range(1, 11))


def test_adaptive_pooling_backward_matches_central_differences():
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 7))
    g = np.random.default_rng(1).standard_normal((1, 2, 3, 4))

    def loss(a):
        y = np.empty(g.shape)
        avgpool.adaptive_avgpool2d_fwd.variants["ref"](a, y)
        return float(np.sum(y * g))

    numeric = central_differences(lambda: loss(x), x, 1e-5)
    for variant in VARIANTS:
        dx = np.full(x.shape, np.nan)
        avgpool.adaptive_avgpool2d_bwd.variants[variant](g, dx)
        assert rel_err(dx, numeric) <= 1e-8, variant


@pytest.mark.parametrize("variant", ["cpu", "ref"])
def test_global_adaptive_pooling_has_the_bits_of_an_average_window_over_the_plane(variant):
    """``GlobalAvgPool2D`` keeps the results it had as an ``avgpool2d`` window (docs)."""
    x = np.random.default_rng(0).standard_normal((3, 4, 7, 6)).astype(np.float32)
    dy = np.random.default_rng(1).standard_normal((3, 4, 1, 1)).astype(np.float32)
    runs = []
    for fwd, bwd, params in ((avgpool.adaptive_avgpool2d_fwd, avgpool.adaptive_avgpool2d_bwd, {}),
                             (avgpool.avgpool2d_fwd, avgpool.avgpool2d_bwd,
                              {"kernel_size": (7, 6)})):
        y, dx = np.empty(dy.shape, np.float32), np.empty_like(x)
        fwd.variants["cpu"](x, y, **params)
        bwd.variants[variant](dy, dx, **params)
        runs.append((y, dx))
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


def test_adaptive_pooling_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="share N and C"):
        avgpool.adaptive_avgpool2d_fwd.variants["cpu"](np.zeros((1, 2, 4, 4)),
                                                       np.zeros((1, 3, 2, 2)))


@pytest.mark.cuda
def test_cuda_pooling_variants_on_cupy(cupy):
    case = MAX_CASES[0]
    x = make_input(case, "special", np.float64)
    y_ref, arg_ref, _ = torch_max(x, case)
    y = cupy.empty(y_ref.shape)
    argmax = cupy.empty(y_ref.shape, dtype=cupy.int64)
    pool.maxpool2d_fwd.variants["cuda"](cupy.asarray(x), y, argmax, **max_params(case))
    np.testing.assert_array_equal(cupy.asnumpy(y), y_ref)
    np.testing.assert_array_equal(cupy.asnumpy(argmax), arg_ref)
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 9))
    y = cupy.empty((2, 3, 3, 4))
    avgpool.adaptive_avgpool2d_fwd.variants["cuda"](cupy.asarray(x), y)
    assert rel_err(cupy.asnumpy(y), F.adaptive_avg_pool2d(torch.tensor(x), (3, 4)).numpy()) \
        <= 1e-10
