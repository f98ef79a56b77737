"""Convolution codelets: every variant against torch.nn.functional.conv2d and autograd,
central finite differences of the backward codelets, the REDUX accumulation contract,
the declarations (modes, variants, flops) and the CuPy run of the "cuda" variants."""

import functools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import REDUX, R, W
from hetero_nn.codelets import conv
from hetero_nn.codelets.reduce import add_redux, zero_init
from helpers import assert_ulp, pair, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of the result's largest magnitude (sums of
#: products in another order; see docs/codelets.md).
ULPS = {np.float64: 64, np.float32: 64}
DTYPES = [np.float64, np.float32]
CODELETS = [conv.conv2d_fwd, conv.conv2d_fwd_nobias, conv.conv2d_bwd_input,
            conv.conv2d_bwd_params, conv.conv2d_bwd_weight]
VARIANTS = ["ref", "cpu:direct", "cpu:im2col", "cpu:gemm", "cuda"]

# (N, C, H, W, O, kernel, stride, padding): batch 1 and > 1, 1 channel and > 16,
# kernels 1/3/5, strides 1/2, paddings 0/1/2, odd sizes, pairs, a 1x1 output.
CASES = [
    (1, 1, 7, 9, 2, 3, 1, 0),
    (3, 17, 6, 5, 4, 3, 2, 1),
    (2, 3, 9, 7, 5, 5, 1, 2),
    (2, 2, 8, 8, 3, 1, 2, 0),
    (1, 18, 5, 7, 17, 3, 1, 1),
    (2, 3, 11, 13, 4, 5, 2, 2),
    (3, 2, 5, 5, 3, 5, 1, 0),
    (2, 1, 6, 6, 20, 1, 1, 2),
    (2, 3, 7, 8, 2, (3, 1), (1, 2), (2, 0)),
    (1, 4, 9, 6, 3, (2, 5), (2, 1), (0, 2)),
    # output rows wider than 16: the block-copy im2col path
    (2, 3, 5, 21, 4, 3, 1, 1),
    (1, 2, 5, 40, 3, 5, 2, 2),
    (1, 3, 4, 33, 2, 3, 1, 0),
]


def random_case(seed):
    """A seeded random geometry that always fits (kernel <= padded input)."""
    rng = np.random.default_rng(100 + seed)
    k = int(rng.choice([1, 3, 5]))
    padding = int(rng.integers(0, 3))
    size = lambda: int(rng.integers(max(1, k - 2 * padding), 12))  # noqa: E731
    return (int(rng.integers(1, 4)), int(rng.choice([1, 2, 5, 17])), size(), size(),
            int(rng.choice([1, 3, 18])), k, int(rng.integers(1, 3)), padding)


CASES += [random_case(seed) for seed in range(6)]


def garbage(shape, dtype):
    """A W output's previous contents: it must be fully overwritten."""
    return np.full(shape, np.nan, dtype=dtype)


@functools.lru_cache(maxsize=None)
def problem(case, dtype):
    """Inputs and PyTorch's results for one case: x, w, b, dy, y, dx, dw, db (NumPy)."""
    n, c, h, w_, o, k, stride, padding = case
    kh, kw = pair(k)
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal((n, c, h, w_)).astype(dtype)
    w = rng.standard_normal((o, c, kh, kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = F.conv2d(xt, wt, bt, stride=pair(stride), padding=pair(padding))
    dy = rng.standard_normal(tuple(yt.shape)).astype(dtype)
    yt.backward(torch.from_numpy(dy))
    return (x, w, b, dy, yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(),
            bt.grad.numpy())


def params(case):
    return {"stride": case[6], "padding": case[7]}


# --------------------------------------------------------------------------- against PyTorch

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_variants_match_torch(case, dtype, variant):
    x, w, b, dy, y_ref, dx_ref, dw_ref, db_ref = problem(case, dtype)
    kw = params(case)
    tol = TOL[dtype]

    y = garbage(y_ref.shape, dtype)
    conv.conv2d_fwd.variants[variant](x, w, b, y, **kw)
    assert y.dtype == dtype and rel_err(y, y_ref) <= tol
    assert_ulp(y, y_ref, ULPS[dtype], floor="scale", name="conv2d_fwd")

    y = garbage(y_ref.shape, dtype)
    conv.conv2d_fwd_nobias.variants[variant](x, w, y, **kw)
    assert rel_err(y, y_ref - b.reshape(1, -1, 1, 1)) <= tol
    assert_ulp(y, y_ref - b.reshape(1, -1, 1, 1), ULPS[dtype], floor="scale",
               name="conv2d_fwd_nobias")

    dx = garbage(x.shape, dtype)
    conv.conv2d_bwd_input.variants[variant](dy, w, dx, **kw)
    assert dx.dtype == dtype and rel_err(dx, dx_ref) <= tol
    assert_ulp(dx, dx_ref, ULPS[dtype], floor="scale", name="conv2d_bwd_input")

    dw, db = np.zeros_like(w), np.zeros_like(b)  # REDUX partials as init leaves them
    conv.conv2d_bwd_params.variants[variant](x, dy, dw, db, **kw)
    assert rel_err(dw, dw_ref) <= tol and rel_err(db, db_ref) <= tol
    assert_ulp(dw, dw_ref, ULPS[dtype], floor="scale", name="conv2d_bwd_params")
    assert_ulp(db, db_ref, ULPS[dtype], floor="scale", name="conv2d_bwd_params")

    dw = np.zeros_like(w)
    conv.conv2d_bwd_weight.variants[variant](x, dy, dw, **kw)
    assert rel_err(dw, dw_ref) <= tol
    assert_ulp(dw, dw_ref, ULPS[dtype], floor="scale", name="conv2d_bwd_weight")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 19), o=st.integers(1, 19),
       h=st.integers(1, 10), w_=st.integers(1, 10), k=st.sampled_from([1, 3, 5]),
       stride=st.integers(1, 3), padding=st.integers(0, 2))
def test_random_geometry_matches_torch(n, c, o, h, w_, k, stride, padding):
    if h + 2 * padding < k or w_ + 2 * padding < k:
        with pytest.raises(ValueError, match="does not fit"):
            conv.conv2d_output_shape((n, c, h, w_), (o, c, k, k), stride, padding)
        return
    case = (n, c, h, w_, o, k, stride, padding)
    x, w, b, dy, y_ref, dx_ref, dw_ref, db_ref = problem(case, np.float64)
    assert conv.conv2d_output_shape(x.shape, w.shape, stride, padding) == y_ref.shape
    for variant in VARIANTS:
        y, dx = garbage(y_ref.shape, np.float64), garbage(x.shape, np.float64)
        dw, db = np.zeros_like(w), np.zeros_like(b)
        conv.conv2d_fwd.variants[variant](x, w, b, y, **params(case))
        conv.conv2d_bwd_input.variants[variant](dy, w, dx, **params(case))
        conv.conv2d_bwd_params.variants[variant](x, dy, dw, db, **params(case))
        for got, ref, name in ((y, y_ref, "conv2d_fwd"), (dx, dx_ref, "conv2d_bwd_input"),
                               (dw, dw_ref, "conv2d_bwd_params"), (db, db_ref, "conv2d_bwd_params")):
            assert rel_err(got, ref) <= 1e-10, variant
            assert_ulp(got, ref, ULPS[np.float64], floor="scale", name=name)


# --------------------------------------------------------------------------- finite differences

FD_CASES = [(2, 2, 5, 6, 3, 3, 2, 1), (1, 3, 6, 5, 2, (3, 2), (1, 2), (1, 0))]


@pytest.mark.parametrize("case", FD_CASES, ids=str)
def test_backward_matches_central_differences(case):
    """The loss ``sum(conv(x, w, b) * g)`` differentiated numerically, element by element."""
    x, w, b, g, *_ = problem(case, np.float64)
    kw = params(case)

    def loss(x, w, b):
        y = np.empty(g.shape)
        conv.conv2d_fwd.variants["ref"](x, w, b, y, **kw)
        return float(np.sum(y * g))

    def numeric(which):
        args = [x.copy(), w.copy(), b.copy()]
        grad = np.empty_like(args[which])
        eps = 1e-4  # the loss is linear in each argument: only rounding limits eps
        for i in np.ndindex(grad.shape):
            saved = args[which][i]
            args[which][i] = saved + eps
            up = loss(*args)
            args[which][i] = saved - eps
            down = loss(*args)
            args[which][i] = saved
            grad[i] = (up - down) / (2 * eps)
        return grad

    dx_num, dw_num, db_num = numeric(0), numeric(1), numeric(2)
    for variant in VARIANTS:
        dx = garbage(x.shape, np.float64)
        conv.conv2d_bwd_input.variants[variant](g, w, dx, **kw)
        dw, db = np.zeros_like(w), np.zeros_like(b)
        conv.conv2d_bwd_params.variants[variant](x, g, dw, db, **kw)
        assert rel_err(dx, dx_num) <= 1e-8, variant
        assert rel_err(dw, dw_num) <= 1e-8, variant
        assert rel_err(db, db_num) <= 1e-8, variant


# --------------------------------------------------------------------------- REDUX contract

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_redux_accumulates_over_batch_partitions(dtype, variant):
    """Two calls on the halves of a batch into one partial equal one call on the batch."""
    case = (5, 3, 7, 6, 4, 3, 1, 1)
    x, w, b, dy, *_ = problem(case, dtype)
    kw = params(case)
    for codelet, n_grads in ((conv.conv2d_bwd_params, 2), (conv.conv2d_bwd_weight, 1)):
        run = codelet.variants[variant]
        whole = [np.zeros_like(w), np.zeros_like(b)][:n_grads]
        run(x, dy, *whole, **kw)
        halves = [np.zeros_like(w), np.zeros_like(b)][:n_grads]
        run(x[:2], dy[:2], *halves, **kw)  # views of the batch, as a handle split gives
        run(x[2:], dy[2:], *halves, **kw)
        for got, ref in zip(halves, whole):
            assert rel_err(got, ref) <= TOL[dtype]
        # Accumulation, not overwrite: a partial that already holds a sum keeps it.
        start = [np.full_like(w, 3.0), np.full_like(b, -2.0)][:n_grads]
        run(x, dy, *start, **kw)
        assert rel_err(start[0], whole[0] + 3.0) <= TOL[dtype]
        if n_grads == 2:
            assert rel_err(start[1], whole[1] - 2.0) <= TOL[dtype]


# --------------------------------------------------------------------------- declarations

def test_declarations():
    assert conv.conv2d_fwd.modes == (R, R, R, W)
    assert conv.conv2d_fwd_nobias.modes == (R, R, W)
    assert conv.conv2d_bwd_input.modes == (R, R, W)
    assert conv.conv2d_bwd_params.modes == (R, R, REDUX, REDUX)
    assert conv.conv2d_bwd_weight.modes == (R, R, REDUX)
    for codelet in CODELETS:
        assert sorted(codelet.variants) == sorted(VARIANTS + ["cpu:winograd", "cpu:unrolled"])
        assert codelet.kinds["cpu"] == ("ref", "cpu:direct", "cpu:im2col", "cpu:gemm",
                                        "cpu:winograd", "cpu:unrolled")
        if REDUX in codelet.modes:
            assert codelet.init is zero_init and codelet.redux is add_redux


def test_flops():
    n, c, o, oh, ow, kh, kw = 2, 3, 4, 5, 6, 3, 2
    x, w, y = (n, c, 9, 9), (o, c, kh, kw), (n, o, oh, ow)
    macs = n * o * oh * ow * c * kh * kw
    p = {"stride": 1, "padding": 0}
    assert conv.conv2d_fwd.work([x, w, (o,), y], p) == 2 * macs + n * o * oh * ow
    assert conv.conv2d_fwd_nobias.work([x, w, y], p) == 2 * macs
    assert conv.conv2d_bwd_input.work([y, w, x], p) == 2 * macs
    assert conv.conv2d_bwd_params.work([x, y, w, (o,)], p) == 2 * macs + n * o * oh * ow
    assert conv.conv2d_bwd_weight.work([x, y, w], p) == 2 * macs


def test_output_shape_and_bad_geometry():
    assert conv.conv2d_output_shape((64, 1, 28, 28), (6, 1, 5, 5), 1, 2) == (64, 6, 28, 28)
    assert conv.conv2d_output_shape((2, 3, 7, 8), (4, 3, 3, 1), (1, 2), (2, 0)) == (2, 4, 9, 4)
    with pytest.raises(ValueError, match="does not fit"):
        conv.conv2d_output_shape((1, 1, 3, 3), (1, 1, 5, 5), 1, 0)
    with pytest.raises(ValueError, match="stride"):
        conv.conv2d_output_shape((1, 1, 3, 3), (1, 1, 1, 1), 0, 0)
    with pytest.raises(ValueError, match="channels"):
        conv.conv2d_output_shape((1, 2, 3, 3), (1, 3, 1, 1), 1, 0)
    with pytest.raises(ValueError, match="pair"):
        conv.conv2d_output_shape((1, 1, 3, 3), (1, 1, 1, 1), (1, 1, 1), 0)


def test_im2col_refuses_a_non_contiguous_output():
    x = np.ones((2, 1, 4, 4))
    w = np.ones((3, 1, 3, 3))
    y = np.empty((3, 2, 2, 2)).transpose(1, 0, 2, 3)  # (2, 3, 2, 2), not C-contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        conv.conv2d_fwd_nobias.variants["cpu:im2col"](x, w, y, stride=1, padding=0)


# --------------------------------------------------------------------------- CuPy

@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_cuda_variants_on_cupy_match_ref(case, cupy):
    for dtype in DTYPES:
        x, w, b, dy, y_ref, dx_ref, dw_ref, db_ref = problem(case, dtype)
        xg, wg, bg, dyg = (cupy.asarray(a) for a in (x, w, b, dy))
        y = cupy.full(y_ref.shape, cupy.nan, dtype=dtype)
        conv.conv2d_fwd.variants["cuda"](xg, wg, bg, y, **params(case))
        dx = cupy.full(x.shape, cupy.nan, dtype=dtype)
        conv.conv2d_bwd_input.variants["cuda"](dyg, wg, dx, **params(case))
        dw, db = cupy.zeros_like(wg), cupy.zeros_like(bg)
        conv.conv2d_bwd_params.variants["cuda"](xg, dyg, dw, db, **params(case))
        for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref), (db, db_ref)):
            assert isinstance(got, cupy.ndarray)
            assert rel_err(cupy.asnumpy(got), ref) <= TOL[dtype]
