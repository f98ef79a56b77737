"""Convolution options (dilation, groups, depthwise, 'same'/'valid', padding modes): every
variant of the ``conv2d_*`` and ``conv2d_depthwise_*`` codelets against torch.nn.Conv2d and
autograd on random geometries and values (hypothesis), central finite differences, the
padding fold as the adjoint of the padding, PyTorch's refusals, and the declarations."""

import functools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import REDUX, R, W, conv, depthwise, padding
from hetero_nn.codelets.reduce import add_redux, zero_init
from helpers import central_differences, draw_window, pair, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

TOL = {np.float64: 1e-10, np.float32: 1e-4}
GENERAL = ["ref", "cpu:direct", "cpu:im2col", "cuda"]
DEPTHWISE = ["ref", "cpu", "cpu:stacked", "cuda"]
MODES = list(padding.MODES)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")]


# (N, C, H, W, O, kernel, stride, padding, dilation, groups, mode)
CASES = [
    (2, 4, 7, 8, 6, 3, 1, "same", 2, 2, "reflect"),
    (2, 4, 9, 8, 4, 4, 1, "same", 1, 4, "replicate"),        # even kernel: asymmetric 'same'
    (1, 6, 9, 7, 6, 3, 2, 2, 2, 3, "circular"),
    (2, 3, 10, 11, 6, (2, 3), (2, 1), (1, 2), (2, 1), 3, "reflect"),
    (2, 4, 12, 12, 8, 3, 1, 2, 2, 4, "zeros"),
    (2, 2, 5, 5, 4, 5, 1, "same", 1, 2, "circular"),
    (1, 3, 8, 20, 3, 3, 1, "valid", 3, 1, "zeros"),           # long rows: block copies
    (2, 3, 6, 30, 3, 3, 1, "same", 2, 3, "replicate"),
    (2, 2, 6, 6, 4, 3, 3, 3, 1, 1, "replicate"),              # padding as large as the kernel
]
# (N, C, multiplier, H, W, kernel, stride, padding, dilation, mode)
DW_CASES = [
    (2, 4, 1, 9, 9, 3, 1, 1, 1, "zeros"),
    (2, 3, 2, 8, 9, 3, 2, 1, 1, "reflect"),
    (1, 5, 1, 12, 11, 3, 1, "same", 2, "circular"),
    (2, 2, 3, 7, 7, (3, 5), 1, "same", (1, 2), "replicate"),
    (3, 3, 1, 6, 6, 4, 1, "same", 1, "zeros"),
    (2, 3, 1, 10, 21, 5, (1, 2), 2, 1, "reflect"),
]


def torch_conv(x, w, b, dy, stride, pad, dilation, groups, mode):
    """PyTorch's ``y, dx, dw, db`` through ``torch.nn.Conv2d`` (its padding modes)."""
    o, _, kh, kw = w.shape
    dtype = torch.float64 if x.dtype == np.float64 else torch.float32
    module = torch.nn.Conv2d(x.shape[1], o, (kh, kw), stride=stride, padding=pad,
                             dilation=dilation, groups=groups, padding_mode=mode).to(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(w))
        module.bias.copy_(torch.from_numpy(b))
    xt = torch.tensor(x, requires_grad=True)
    yt = module(xt)
    if dy is None:
        return yt.detach().numpy(), None, None, None
    yt.backward(torch.from_numpy(dy))
    return (yt.detach().numpy(), xt.grad.numpy(), module.weight.grad.numpy(),
            module.bias.grad.numpy())


@functools.lru_cache(maxsize=None)
def problem(case, dtype, depthwise_case=False):
    """Inputs, parameters and PyTorch's results: ``x, w, b, dy, y, dx, dw, db, params``."""
    rng = np.random.default_rng(zlib.crc32(repr((case, depthwise_case)).encode()))
    if depthwise_case:
        n, c, m, h, w_, k, stride, pad, dilation, mode = case
        o, groups = c * m, c
    else:
        n, c, h, w_, o, k, stride, pad, dilation, groups, mode = case
    kh, kw = pair(k)
    x = rng.standard_normal((n, c, h, w_)).astype(dtype)
    w = rng.standard_normal((o, c // groups, kh, kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    y, *_ = torch_conv(x, w, b, None, stride, pad, dilation, groups, mode)
    dy = rng.standard_normal(y.shape).astype(dtype)
    y, dx, dw, db = torch_conv(x, w, b, dy, stride, pad, dilation, groups, mode)
    params = {"stride": stride, "padding": pad, "dilation": dilation, "padding_mode": mode}
    if not depthwise_case:
        params["groups"] = groups
    return x, w, b, dy, y, dx, dw, db, params


def run_variant(codelets, variant, x, w, b, dy, params):
    """``y, y_nobias, dx, dw, db, dw_alone`` from one variant of the five codelets."""
    fwd, fwd_nobias, bwd_input, bwd_params, bwd_weight = codelets
    y_shape = (x.shape[0], w.shape[0], *dy.shape[2:])
    y = np.full(y_shape, np.nan, x.dtype)
    fwd.variants[variant](x, w, b, y, **params)
    y_nobias = np.full(y_shape, np.nan, x.dtype)
    fwd_nobias.variants[variant](x, w, y_nobias, **params)
    dx = np.full(x.shape, np.nan, x.dtype)
    bwd_input.variants[variant](dy, w, dx, **params)
    dw, db = np.zeros_like(w), np.zeros_like(b)  # REDUX partials as init leaves them
    bwd_params.variants[variant](x, dy, dw, db, **params)
    dw_alone = np.zeros_like(w)
    bwd_weight.variants[variant](x, dy, dw_alone, **params)
    return y, y_nobias, dx, dw, db, dw_alone


GENERAL_CODELETS = (conv.conv2d_fwd, conv.conv2d_fwd_nobias, conv.conv2d_bwd_input,
                    conv.conv2d_bwd_params, conv.conv2d_bwd_weight)
DW_CODELETS = (depthwise.conv2d_depthwise_fwd, depthwise.conv2d_depthwise_fwd_nobias,
               depthwise.conv2d_depthwise_bwd_input, depthwise.conv2d_depthwise_bwd_params,
               depthwise.conv2d_depthwise_bwd_weight)


def check_against_torch(codelets, variants, x, w, b, dy, y_ref, dx_ref, dw_ref, db_ref, params):
    tol = TOL[x.dtype.type]
    for variant in variants:
        y, y_nobias, dx, dw, db, dw_alone = run_variant(codelets, variant, x, w, b, dy, params)
        assert y.dtype == x.dtype and dx.dtype == x.dtype
        for name, got, ref in (("y", y, y_ref), ("y_nobias", y_nobias, y_ref - b[:, None, None]),
                               ("dx", dx, dx_ref), ("dw", dw, dw_ref), ("db", db, db_ref),
                               ("dw_alone", dw_alone, dw_ref)):
            assert rel_err(got, ref) <= tol, (variant, name, rel_err(got, ref))


# --------------------------------------------------------------------------- against PyTorch

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_general_codelets_match_torch(case, dtype):
    x, w, b, dy, y, dx, dw, db, params = problem(case, dtype)
    assert conv.conv2d_output_shape(x.shape, w.shape, **params) == y.shape
    check_against_torch(GENERAL_CODELETS, GENERAL, x, w, b, dy, y, dx, dw, db, params)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", DW_CASES, ids=str)
def test_depthwise_codelets_match_torch(case, dtype):
    x, w, b, dy, y, dx, dw, db, params = problem(case, dtype, depthwise_case=True)
    check_against_torch(DW_CODELETS, DEPTHWISE, x, w, b, dy, y, dx, dw, db, params)


def geometries(draw, depthwise_case):
    """A random convolution that fits its input (hypothesis draws)."""
    k, stride, pad, dilation, mode, h, w_ = draw_window(draw, 4, 3, 3, 3, 11)
    groups = draw(st.sampled_from([1, 2, 3]))
    c = groups * draw(st.integers(1, 3))
    multiplier = draw(st.integers(1, 3))
    n = draw(st.integers(1, 3))
    if depthwise_case:
        return (n, c, multiplier, h, w_, k, stride, pad, dilation, mode)
    return (n, c, h, w_, groups * multiplier, k, stride, pad, dilation, groups, mode)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_general_convolutions_match_torch(data, dtype):
    case = data.draw(st.composite(lambda draw: geometries(draw, False))())
    x, w, b, dy, y, dx, dw, db, params = problem(case, dtype)
    check_against_torch(GENERAL_CODELETS, GENERAL, x, w, b, dy, y, dx, dw, db, params)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_depthwise_convolutions_match_torch(data, dtype):
    case = data.draw(st.composite(lambda draw: geometries(draw, True))())
    x, w, b, dy, y, dx, dw, db, params = problem(case, dtype, depthwise_case=True)
    check_against_torch(DW_CODELETS, DEPTHWISE, x, w, b, dy, y, dx, dw, db, params)


# --------------------------------------------------------------------------- finite differences

FD_CASES = [((1, 4, 5, 6, 4, 3, 1, "same", 2, 2, "reflect"), False),
            ((2, 2, 5, 5, 2, (2, 3), (2, 1), 1, 1, 1, "circular"), False),
            ((1, 3, 2, 6, 5, 3, 1, "same", (2, 1), "replicate"), True)]


@pytest.mark.parametrize("case, depthwise_case", FD_CASES, ids=str)
def test_backward_matches_central_differences(case, depthwise_case):
    """The loss ``sum(conv(x, w, b) * g)`` differentiated numerically, element by element."""
    x, w, b, g, *_, params = problem(case, np.float64, depthwise_case)
    codelets = DW_CODELETS if depthwise_case else GENERAL_CODELETS

    def loss(x, w, b):
        y = np.empty(g.shape)
        codelets[0].variants["ref"](x, w, b, y, **params)
        return float(np.sum(y * g))

    args = [x.copy(), w.copy(), b.copy()]  # the loss is linear in each: rounding limits eps
    expected = [central_differences(lambda: loss(*args), a, 1e-4) for a in args]
    for variant in (DEPTHWISE if depthwise_case else GENERAL):
        _, _, dx, dw, db, _ = run_variant(codelets, variant, x, w, b, g, params)
        for got, ref in zip((dx, dw, db), expected):
            assert rel_err(got, ref) <= 1e-8, variant


# --------------------------------------------------------------------------- padding

@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 6), w=st.integers(1, 6), mode=st.sampled_from(MODES), data=st.data())
def test_fold_is_the_adjoint_of_the_padding(h, w, mode, data):
    """``<pad(x), g> == <x, fold(g)>`` for every mode within PyTorch's limits."""
    limit = {"reflect": lambda n: n - 1, "circular": lambda n: n}.get(mode, lambda n: 3)
    pads = tuple(data.draw(st.integers(0, min(3, limit(n)))) for n in (h, h, w, w))
    rng = np.random.default_rng(h * 7 + w)
    x = rng.standard_normal((2, 3, h, w))
    padded = padding.pad_xp(np, x, pads, mode)
    assert padded.shape == (2, 3, h + pads[0] + pads[1], w + pads[2] + pads[3])
    torch_padded = torch.nn.functional.pad(torch.from_numpy(x), (pads[2], pads[3], pads[0],
                                                                 pads[1]),
                                           mode="constant" if mode == "zeros" else mode)
    np.testing.assert_array_equal(padded, torch_padded.numpy())
    g = rng.standard_normal(padded.shape)
    folded = padding.fold_xp(np, g, h, w, pads, mode)
    assert abs(np.sum(padded * g) - np.sum(x * folded)) <= 1e-10 * np.abs(g).sum() * 4


def test_same_padding_follows_pytorch_for_even_kernels_and_dilation():
    assert padding.resolve_padding("same", (4, 3), (1, 1), (1, 2)) == (1, 2, 2, 2)
    assert padding.resolve_padding("same", (2, 2), (1, 1), (3, 1)) == (1, 2, 0, 1)
    assert padding.resolve_padding("valid", (5, 5), (2, 2), (1, 1)) == (0, 0, 0, 0)
    for k, d in (((4, 3), (1, 2)), ((2, 2), (3, 1))):
        module = torch.nn.Conv2d(1, 1, k, padding="same", dilation=d, padding_mode="reflect")
        t, b, l, r = padding.resolve_padding("same", k, (1, 1), d)
        assert module._reversed_padding_repeated_twice == [l, r, t, b]


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("shapes, params, match", [
    (((1, 2, 5, 5), (2, 2, 3, 3)), {"stride": 2, "padding": "same"}, "not supported with stride"),
    (((1, 2, 5, 5), (2, 2, 3, 3)), {"padding": "full"}, "'same' or 'valid'"),
    (((1, 2, 5, 5), (2, 2, 3, 3)), {"padding_mode": "mirror"}, "padding_mode must be one of"),
    (((1, 2, 3, 3), (2, 2, 3, 3)), {"padding": 3, "padding_mode": "reflect"}, "reflect"),
    (((1, 2, 3, 3), (2, 2, 3, 3)), {"padding": 4, "padding_mode": "circular"}, "circular"),
    (((1, 3, 5, 5), (2, 1, 3, 3)), {"groups": 3}, "groups=3 must divide"),
    (((1, 4, 5, 5), (2, 1, 3, 3)), {"groups": 2}, "expect 2"),
    (((1, 2, 5, 5), (2, 2, 3, 3)), {"dilation": 0}, "dilation must be >= 1"),
    (((1, 2, 4, 4), (2, 2, 3, 3)), {"dilation": 2}, "does not fit"),
    (((1, 2, 5, 5), (2, 2, 3, 3)), {"groups": 0}, "groups must be"),
])
def test_bad_geometry_is_refused_with_its_reason(shapes, params, match):
    with pytest.raises(ValueError, match=match):
        conv.conv2d_output_shape(*shapes, **params)


def test_depthwise_codelets_refuse_groups_and_non_depthwise_weights():
    x = np.zeros((1, 3, 5, 5))
    y = np.zeros((1, 3, 3, 3))
    with pytest.raises(TypeError, match="no 'groups'"):
        depthwise.conv2d_depthwise_fwd_nobias.variants["cpu"](x, np.zeros((3, 1, 3, 3)), y,
                                                              groups=3)
    with pytest.raises(ValueError, match="not depthwise"):
        depthwise.conv2d_depthwise_fwd_nobias.variants["ref"](x, np.zeros((3, 3, 3, 3)), y)


# --------------------------------------------------------------------------- declarations

def test_depthwise_declarations():
    assert [c.modes for c in DW_CODELETS] == [(R, R, R, W), (R, R, W), (R, R, W),
                                             (R, R, REDUX, REDUX), (R, R, REDUX)]
    for codelet in DW_CODELETS:
        assert codelet.name.startswith("conv2d_depthwise_")
        assert sorted(codelet.variants) == sorted(DEPTHWISE)
        assert codelet.kinds == {"cpu": ("ref", "cpu", "cpu:stacked"), "cuda": ("cuda",)}
        if REDUX in codelet.modes:
            assert codelet.init is zero_init and codelet.redux is add_redux
    # Each output sums KH*KW products (the convolution's flops with C/G = 1).
    x, w, y = (2, 4, 9, 9), (8, 1, 3, 3), (2, 8, 7, 7)
    assert depthwise.conv2d_depthwise_fwd_nobias.work([x, w, y], {}) == 2 * 2 * 8 * 49 * 9


def test_groups_scale_the_flops():
    x, y = (2, 6, 9, 9), (2, 6, 7, 7)
    dense = conv.conv2d_fwd_nobias.work([x, (6, 6, 3, 3), y], {})
    grouped = conv.conv2d_fwd_nobias.work([x, (6, 2, 3, 3), y], {"groups": 3})
    assert dense == 3 * grouped


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES[:3] + DW_CASES[:2], ids=str)
def test_cuda_variants_on_cupy_match_torch(case, cupy):
    depthwise_case = len(case) == 10
    codelets = DW_CODELETS if depthwise_case else GENERAL_CODELETS
    for dtype in (np.float64, np.float32):
        x, w, b, dy, y_ref, dx_ref, dw_ref, db_ref, params = problem(case, dtype, depthwise_case)
        xg, wg, bg, dyg = (cupy.asarray(a) for a in (x, w, b, dy))
        y = cupy.full(y_ref.shape, cupy.nan, dtype=dtype)
        codelets[0].variants["cuda"](xg, wg, bg, y, **params)
        dx = cupy.full(x.shape, cupy.nan, dtype=dtype)
        codelets[2].variants["cuda"](dyg, wg, dx, **params)
        dw, db = cupy.zeros_like(wg), cupy.zeros_like(bg)
        codelets[3].variants["cuda"](xg, dyg, dw, db, **params)
        for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref), (db, db_ref)):
            assert isinstance(got, cupy.ndarray)
            assert rel_err(cupy.asnumpy(got), ref) <= TOL[dtype]
