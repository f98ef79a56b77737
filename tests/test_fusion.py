"""Fusion: the fused codelets against their unfused composition, PyTorch and central
finite differences; in-place first contributions; task counts of fused and unfused
training steps; whole steps with ``fuse=False`` (the fused ones are the default that
``test_training_vs_torch.py`` checks under every policy)."""

import zlib
from collections import Counter

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.codelets import REDUX, W, conv, dense, fused, pool
from hetero_nn.codelets.activation import relu_bwd, relu_fwd
from hetero_nn.codelets.reduce import add_redux, overwriting, zero_init
from hetero_nn.layers import Layer
from hetero_nn.layers.fused import ConvReLUPool, DenseReLU, plan
from helpers import assert_ulp, rel_err, torch_sgd_losses
from twins import torch_twin

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch (in float64, rounded to the dtype) in ULPs of each
#: result's largest magnitude.
ULPS = 32
DTYPES = [np.float64, np.float32]
CONV_VARIANTS = ["ref", "cpu:direct", "cpu:im2col", "cuda"]
DENSE_VARIANTS = ["ref", "cpu", "cpu:blas", "cuda"]

# (N, C, H, W, O, kernel, stride, padding, pool, pool stride)
CONV_CASES = [
    (3, 1, 12, 12, 4, 5, 1, 2, 2, 2),       # LeNet's first layer, small
    (2, 3, 9, 11, 5, 3, 1, 1, 2, 2),        # odd sizes: the pooling floors
    (2, 2, 10, 9, 3, (3, 2), (2, 1), (1, 0), 3, 1),  # pairs, overlapping pooling windows
    (1, 4, 7, 7, 6, 3, 2, 1, (2, 1), None),
]
DENSE_CASES = [(5, 7, 4), (9, (2, 3, 3), 6), (1, 3, 2)]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def conv_operands(case, dtype):
    n, c, h, w_, o, k, s, p, ps, pss = case
    kh, kw = k if isinstance(k, tuple) else (k, k)
    rng = _rng("conv", case)
    x = rng.standard_normal((n, c, h, w_)).astype(dtype)
    w = (0.5 * rng.standard_normal((o, c, kh, kw))).astype(dtype)
    b = (0.2 * rng.standard_normal(o)).astype(dtype)
    params = dict(stride=s, padding=p, pool_size=ps, pool_stride=pss)
    z_shape = conv.conv2d_output_shape(x.shape, w.shape, s, p)
    y_shape = pool.maxpool2d_output_shape(z_shape, ps, pss)
    dy = rng.standard_normal(y_shape).astype(dtype)
    return x, w, b, dy, params


def unfused_conv(x, w, b, dy, params):
    """The unfused composition by the existing codelets' reference variants."""
    s, p, ps, pss = (params[k] for k in ("stride", "padding", "pool_size", "pool_stride"))
    z = np.empty(conv.conv2d_output_shape(x.shape, w.shape, s, p), x.dtype)
    conv.conv2d_fwd.variants["ref"](x, w, b, z, stride=s, padding=p)
    r = np.empty_like(z)
    relu_fwd.variants["ref"](z, r)
    y = np.empty(pool.maxpool2d_output_shape(z.shape, ps, pss), x.dtype)
    a = np.empty(y.shape, np.int64)
    pool.maxpool2d_fwd.variants["ref"](r, y, a, kernel_size=ps, stride=pss)
    dr = np.empty_like(z)
    pool.maxpool2d_bwd.variants["ref"](dy, a, dr)
    dz = np.empty_like(z)
    relu_bwd.variants["ref"](r, dr, dz)
    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    conv.conv2d_bwd_params.variants["ref"](x, dz, dw, db, stride=s, padding=p)
    conv.conv2d_bwd_input.variants["ref"](dz, w, dx, stride=s, padding=p)
    return y, a, dx, dw, db


def torch_conv(x, w, b, dy, params):
    """PyTorch's ``max_pool2d(relu(conv2d))`` and its autograd gradients, float64."""
    t = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w, b)]
    z = F.relu(F.conv2d(t[0], t[1], t[2], stride=params["stride"], padding=params["padding"]))
    y, a = F.max_pool2d(z, params["pool_size"], params["pool_stride"], return_indices=True)
    y.backward(torch.tensor(dy.astype(np.float64)))
    return y.detach().numpy(), a.numpy(), *(v.grad.numpy() for v in t)


def run_conv(variant, x, w, b, dy, params, dw0, db0, with_dx=True):
    y_shape = dy.shape
    y, a = np.full(y_shape, np.nan, x.dtype), np.full(y_shape, -1, np.int64)
    fused.conv2d_relu_pool_fwd.variants[variant](x, w, b, y, a, **params)
    dw, db = dw0.copy(), db0.copy()
    if with_dx:
        dx = np.full(x.shape, np.nan, x.dtype)
        fused.conv2d_relu_pool_bwd.variants[variant](x, w, y, a, dy, dx, dw, db, **params)
    else:
        dx = None
        fused.conv2d_relu_pool_bwd_params.variants[variant](x, y, a, dy, dw, db, **params)
    return y, a, dx, dw, db


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", CONV_CASES, ids=range(len(CONV_CASES)))
@pytest.mark.parametrize("variant", CONV_VARIANTS)
def test_conv_relu_pool_equals_unfused_and_torch(variant, case, dtype):
    x, w, b, dy, params = conv_operands(case, dtype)
    rng = _rng("before", case)
    dw0, db0 = rng.standard_normal(w.shape).astype(dtype), rng.standard_normal(b.shape).astype(dtype)
    y, a, dx, dw, db = run_conv(variant, x, w, b, dy, params, dw0, db0)
    uy, ua, udx, udw, udb = unfused_conv(x, w, b, dy, params)
    ty, ta, tdx, tdw, tdb = torch_conv(x, w, b, dy, params)
    tol = TOL[dtype]
    assert rel_err(y, uy) <= tol and rel_err(y, ty) <= tol
    if dtype == np.float64:  # float32 rounding may pick another of two near-equal maxima
        np.testing.assert_array_equal(a, ua)
        np.testing.assert_array_equal(a, ta)
    assert rel_err(dx, udx) <= tol and rel_err(dx, tdx) <= tol
    # dw and db are REDUX: the chain's gradient was added to what was there
    assert rel_err(dw - dw0, udw) <= tol and rel_err(dw.astype(np.float64) - dw0, tdw) <= tol
    assert rel_err(db - db0, udb) <= tol and rel_err(db.astype(np.float64) - db0, tdb) <= tol
    assert_ulp(y, ty, ULPS, dtype=dtype, floor="scale", name="conv2d_relu_pool_fwd")
    for got, ref in ((dx, tdx), (dw, dw0 + tdw), (db, db0 + tdb)):
        assert_ulp(got, ref, ULPS, dtype=dtype, floor="scale", name="conv2d_relu_pool_bwd")
    _, _, none, pdw, pdb = run_conv(variant, x, w, b, dy, params, dw0, db0, with_dx=False)
    assert none is None
    np.testing.assert_array_equal(pdw, dw)  # the same kernels, the same bits
    np.testing.assert_array_equal(pdb, db)


@pytest.mark.parametrize("variant", ["cpu:direct", "cpu:im2col"])
def test_conv_relu_pool_forward_by_chunks_gives_the_same_bits(variant, monkeypatch):
    """Samples convolved chunk by chunk (here one at a time) give the whole batch's bits."""
    x, w, b, dy, params = conv_operands(CONV_CASES[0], np.float32)
    whole = run_conv(variant, x, w, b, dy, params, np.zeros_like(w), np.zeros_like(b))
    monkeypatch.setattr(fused, "CHUNK_BYTES", 1)
    chunked = run_conv(variant, x, w, b, dy, params, np.zeros_like(w), np.zeros_like(b))
    for a, c in zip(whole, chunked):
        np.testing.assert_array_equal(a, c)


def test_conv_relu_pool_gradients_match_central_differences():
    x, w, b, dy, params = conv_operands(CONV_CASES[1], np.float64)
    _, _, dx, dw, db = run_conv("cpu:im2col", x, w, b, dy, params, np.zeros_like(w),
                                np.zeros_like(b))

    def objective(x, w, b):
        y, a = np.empty(dy.shape), np.empty(dy.shape, np.int64)
        fused.conv2d_relu_pool_fwd.variants["ref"](x, w, b, y, a, **params)
        return float(np.sum(y * dy))

    rng = _rng("fd")
    eps = 1e-6
    for which, grad in ((0, dx), (1, dw), (2, db)):
        for _ in range(4):
            args = [x.copy(), w.copy(), b.copy()]
            index = tuple(rng.integers(0, d) for d in args[which].shape)
            values = []
            for sign in (1, -1):
                args[which][index] += sign * eps
                values.append(objective(*args))
                args[which][index] -= sign * eps
            numeric = (values[0] - values[1]) / (2 * eps)
            assert abs(numeric - grad[index]) <= 1e-6 * max(1.0, abs(grad[index])), (which, index)


def dense_operands(case, dtype):
    n, features, o = case
    features = features if isinstance(features, tuple) else (features,)
    rng = _rng("dense", case)
    x = rng.standard_normal((n, *features)).astype(dtype)
    w = (0.5 * rng.standard_normal((o, int(np.prod(features))))).astype(dtype)
    b = (0.2 * rng.standard_normal(o)).astype(dtype)
    dy = rng.standard_normal((n, o)).astype(dtype)
    return x, w, b, dy


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", DENSE_CASES, ids=range(len(DENSE_CASES)))
@pytest.mark.parametrize("variant", DENSE_VARIANTS)
def test_dense_relu_equals_unfused_and_torch(variant, case, dtype):
    x, w, b, dy = dense_operands(case, dtype)
    y = np.full(dy.shape, np.nan, dtype)
    fused.dense_relu_fwd.variants[variant](x, w, b, y)
    dx = np.full(x.shape, np.nan, dtype)
    dw, db = np.zeros_like(w), np.zeros_like(b)
    fused.dense_relu_bwd.variants[variant](x, w, y, dy, dx, dw, db)
    pdw, pdb = np.zeros_like(w), np.zeros_like(b)
    fused.dense_relu_bwd_params.variants[variant](x, y, dy, pdw, pdb)
    np.testing.assert_array_equal(pdw, dw)
    np.testing.assert_array_equal(pdb, db)
    # unfused: dense_fwd, relu_fwd, relu_bwd, dense_bwd_params, dense_bwd_input (ref)
    uz, uy = np.empty_like(y), np.empty_like(y)
    dense.dense_fwd.variants["ref"](x, w, b, uz)
    relu_fwd.variants["ref"](uz, uy)
    udz = np.empty_like(dy)
    relu_bwd.variants["ref"](uy, dy, udz)
    udw, udb, udx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    dense.dense_bwd_params.variants["ref"](x, udz, udw, udb)
    dense.dense_bwd_input.variants["ref"](udz, w, udx)
    t = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w, b)]
    ty = F.relu(F.linear(t[0].reshape(len(x), -1), t[1], t[2]))
    ty.backward(torch.tensor(dy.astype(np.float64)))
    tol = TOL[dtype]
    for got, mine, ref in ((y, uy, ty.detach().numpy()), (dx, udx, t[0].grad.numpy()),
                           (dw, udw, t[1].grad.numpy()), (db, udb, t[2].grad.numpy())):
        assert rel_err(got, mine) <= tol and rel_err(got, ref) <= tol
        assert_ulp(got, ref, ULPS, dtype=dtype, floor="scale",
                   name="dense_relu_fwd" if got is y else "dense_relu_bwd")


def test_dense_relu_gradients_match_central_differences():
    x, w, b, dy = dense_operands(DENSE_CASES[1], np.float64)
    y = np.empty(dy.shape)
    fused.dense_relu_fwd.variants["cpu"](x, w, b, y)
    dx, dw, db = np.empty_like(x), np.zeros_like(w), np.zeros_like(b)
    fused.dense_relu_bwd.variants["cpu"](x, w, y, dy, dx, dw, db)

    def objective(x, w, b):
        out = np.empty(dy.shape)
        fused.dense_relu_fwd.variants["ref"](x, w, b, out)
        return float(np.sum(out * dy))

    rng, eps = _rng("fd-dense"), 1e-6
    for which, grad in ((0, dx), (1, dw), (2, db)):
        for _ in range(4):
            args = [x.copy(), w.copy(), b.copy()]
            index = tuple(rng.integers(0, d) for d in args[which].shape)
            args[which][index] += eps
            plus = objective(*args)
            args[which][index] -= 2 * eps
            numeric = (plus - objective(*args)) / (2 * eps)
            assert abs(numeric - grad[index]) <= 1e-6 * max(1.0, abs(grad[index])), (which, index)


@pytest.mark.cuda
def test_fused_cuda_variants_on_cupy_match_ref(cupy):
    x, w, b, dy, params = conv_operands(CONV_CASES[1], np.float64)
    _, _, rdx, rdw, rdb = run_conv("ref", x, w, b, dy, params, np.zeros_like(w), np.zeros_like(b))
    g = [cupy.asarray(a) for a in (x, w, b, dy)]
    y = cupy.empty(dy.shape, dtype=x.dtype)
    a = cupy.empty(dy.shape, dtype=cupy.int64)
    fused.conv2d_relu_pool_fwd.variants["cuda"](g[0], g[1], g[2], y, a, **params)
    dx = cupy.empty(x.shape, x.dtype)
    dw, db = cupy.zeros(w.shape, x.dtype), cupy.zeros(b.shape, x.dtype)
    fused.conv2d_relu_pool_bwd.variants["cuda"](g[0], g[1], y, a, g[3], dx, dw, db, **params)
    for got, ref in ((dx, rdx), (dw, rdw), (db, rdb)):
        assert rel_err(cupy.asnumpy(got), ref) <= 1e-10


def test_declarations():
    assert fused.conv2d_relu_pool_bwd.modes.count(REDUX) == 2
    for codelet in (fused.conv2d_relu_pool_fwd, fused.conv2d_relu_pool_bwd,
                    fused.conv2d_relu_pool_bwd_params):
        assert set(codelet.variants) == set(CONV_VARIANTS)
    for codelet in (fused.dense_relu_fwd, fused.dense_relu_bwd, fused.dense_relu_bwd_params):
        assert set(codelet.variants) == set(DENSE_VARIANTS)


def test_overwriting_writes_what_init_then_the_variant_would():
    twin = overwriting(dense.dense_bwd_params)
    assert twin is overwriting(dense.dense_bwd_params)  # one per codelet
    assert twin.name == "dense_bwd_params.overwrite" and twin.modes[2:] == (W, W)
    rng = _rng("overwrite")
    x, dy = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    for name, variant in twin.variants.items():
        dw, db = np.full((2, 3), np.nan), np.full(2, np.nan)  # W: fully overwritten
        variant(x, dy, dw, db)
        assert rel_err(dw, dy.T @ x) <= 1e-12 and rel_err(db, dy.sum(0)) <= 1e-12, name
    with pytest.raises(ValueError, match="no REDUX operand"):
        overwriting(relu_fwd)


def _scale_fwd(x, s, y):
    np.multiply(x, s, out=y)


def _scale_bwd(x, dy, ds):
    ds += (x * dy).sum(axis=0)


SCALE_FWD = hn.Codelet("test_scale_fwd", modes=(hn.R, hn.R, hn.W), variants={"ref": _scale_fwd})
SCALE_BWD = hn.Codelet("test_scale_bwd", modes=(hn.R, hn.R, hn.REDUX), variants={"ref": _scale_bwd},
                       init=zero_init, redux=add_redux)


class Scale(Layer):
    """A layer that adds its gradient contributions as REDUX itself (``overwrites_grads``
    left False), as layers written before in-place first contributions do."""

    def __init__(self, n):
        super().__init__()
        self.add_parameter("scale", np.linspace(0.5, 1.5, n))

    def forward(self, rt, xs):
        self._xs, ys = xs, self.outputs(rt, xs)
        for x, y in zip(xs, ys):
            rt.submit(SCALE_FWD, x, self._params["scale"].handle, y)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        for x, dy in zip(self._xs, dys):
            rt.submit(SCALE_BWD, x, dy, self._params["scale"].grad)


def test_layers_that_accumulate_their_gradients_still_get_them_zeroed():
    layer = Scale(3)
    layer.build((3,), "float64")
    rng = np.random.default_rng(4)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        layer.bind(rt)
        for _ in range(2):  # the second step must not add onto the first
            x, dy = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
            layer.zero_grad(rt)
            layer.forward(rt, list(rt.register(x).split(0, 2)))
            layer.backward(rt, list(rt.register(dy).split(0, 2)))
            grad = rt.fetch(layer._params["scale"].grad, copy=True)
            assert rel_err(grad, (x * dy).sum(axis=0)) <= 1e-12
        assert "fill_zero" in {r.codelet for r in rt.trace()}


# --------------------------------------------------------------------------- layers and steps

def lenet5(fuse=True):
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120), hn.ReLU(), hn.Dense(120, 84), hn.ReLU(), hn.Dense(84, 10), fuse=fuse)


def test_plan_fuses_the_chains_only():
    blocks = plan(lenet5().layers)
    assert [(i, type(b).__name__) for i, b in blocks] == [
        (0, "ConvReLUPool"), (3, "ConvReLUPool"), (6, "Flatten"), (7, "DenseReLU"),
        (9, "DenseReLU"), (11, "Linear")]
    unfusable = [hn.Conv2D(1, 2, 3, bias=False), hn.ReLU(), hn.MaxPool2D(2),
                 hn.Conv2D(2, 2, 3), hn.ReLU(), hn.Conv2D(2, 2, 1), hn.MaxPool2D(2),
                 hn.Flatten(), hn.ReLU(), hn.Dense(2, 2, bias=False), hn.ReLU()]
    assert [b for _, b in plan(unfusable)] == unfusable
    assert isinstance(plan([hn.Dense(3, 2), hn.ReLU(), hn.ReLU()])[0][1], DenseReLU)
    assert isinstance(plan([hn.Conv2D(1, 2, 3), hn.ReLU(), hn.MaxPool2D(2)])[0][1], ConvReLUPool)


def step_counts(g, fuse, batch=16):
    hn.manual_seed(0)
    rng = np.random.default_rng(g)
    with hn.Runtime(devices="cpu:2", policy="eager", deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(lenet5(fuse), optimizer=hn.optim.SGD(lr=0.01, momentum=0.9),
                             runtime=rt, batch_size=batch, granularity=g)
        for _ in range(2):  # the second step is what every later step submits
            rt.trace(clear=True)
            trainer.train_step(rng.standard_normal((batch, 1, 28, 28)), rng.integers(0, 10, batch))
        return dict(Counter(r.codelet for r in rt.trace()))


@pytest.mark.parametrize("g", [1, 2, 3])
def test_fused_lenet_step_tasks(g):
    """One task per fused run and partition; the first partition's contribution to each
    gradient (and to the loss) overwrites it, the ``g - 1`` others are REDUX (``g - 1`` adds)."""
    counts = step_counts(g, fuse=True)
    first = {"conv2d_relu_pool_bwd.overwrite": 1, "conv2d_relu_pool_bwd_params.overwrite": 1,
             "dense_relu_bwd.overwrite": 2, "dense_bwd_params.overwrite": 1,
             "softmax_xent.overwrite": 1}
    expected = {"conv2d_relu_pool_fwd": 2 * g, "dense_relu_fwd": 2 * g, "dense_fwd": g,
                "dense_bwd_input": g, "sgd_step": 10, **first}
    if g > 1:
        expected.update({"conv2d_relu_pool_bwd": g - 1, "conv2d_relu_pool_bwd_params": g - 1,
                         "dense_relu_bwd": 2 * (g - 1), "dense_bwd_params": g - 1,
                         "softmax_xent": g - 1,
                         # each REDUX handle: g - 1 partials, g - 2 pair adds + 1 into the handle
                         "conv2d_relu_pool_bwd.redux": 2 * (g - 1),
                         "conv2d_relu_pool_bwd_params.redux": 2 * (g - 1),
                         "dense_relu_bwd.redux": 4 * (g - 1), "dense_bwd_params.redux": 2 * (g - 1),
                         "softmax_xent.redux": 2 * (g - 1)})
    assert counts == expected
    assert sum(counts.values()) == {1: 22, 2: 46, 3: 70}[g]


def test_unfused_lenet_step_has_no_bookkeeping_at_g1():
    counts = step_counts(1, fuse=False)
    assert not any(k == "fill_zero" or k.endswith(".redux") for k in counts)
    assert sum(counts.values()) == 37  # 61 before: 12 fill_zero and 12 REDUX adds are gone
    assert sum(step_counts(2, fuse=False).values()) == 76  # 100 before


@pytest.mark.parametrize("g", [1, 3])
def test_fused_and_unfused_steps_agree_and_equal_torch(g):
    """Three float64 SGD steps on LeNet-5: fused, unfused and PyTorch agree to 1e-9."""
    rng = np.random.default_rng(7)
    data = [(rng.standard_normal((12, 1, 28, 28)), rng.integers(0, 10, 12)) for _ in range(3)]
    hn.manual_seed(3)
    start = lenet5().state_dict()
    results = {}
    for fuse in (True, False):
        model = lenet5(fuse)
        model.build((1, 28, 28), "float64")
        model.load_state_dict(start)
        with hn.Runtime(devices="cpu:2", policy="ws", deterministic=True, perfmodel=False) as rt:
            trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=rt,
                                 batch_size=12, granularity=g, dtype="float64")
            losses = [trainer.train_step(x, y) for x, y in data]
            results[fuse] = losses, model.state_dict()
    model = lenet5()
    model.build((1, 28, 28), "float64")
    model.load_state_dict(start)
    twin = torch_twin(model, "float64")
    ref_losses = torch_sgd_losses(twin, data, 0.05, 0.9)
    for fuse, (losses, state) in results.items():
        assert rel_err(losses, ref_losses) <= 1e-9, fuse
        for name, value in twin.state_dict().items():
            assert rel_err(state[name], value.numpy()) <= 1e-9, (fuse, name)


@pytest.mark.parametrize("config", [dict(devices="cpu:2", executor="dask"),
                                    dict(devices="cpu:3", host_nodes=2, policy="dmda")],
                         ids=["dask", "two-nodes"])
def test_fused_steps_give_the_same_bits_on_dask_and_two_memory_nodes(config):
    """The fused codelets and the in-place first contributions run pure in the Dask graph
    and across memory nodes (copies, validity) with the local executor's bits."""
    rng = np.random.default_rng(11)
    data = [(rng.standard_normal((9, 1, 28, 28)), rng.integers(0, 10, 9)) for _ in range(2)]
    hn.manual_seed(5)
    start = lenet5().state_dict()
    results = []
    for cfg in (dict(devices="cpu:2"), config):
        model = lenet5()
        model.build((1, 28, 28), "float64")
        model.load_state_dict(start)
        with hn.Runtime(deterministic=True, perfmodel=False, **cfg) as rt:
            trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9),
                                 runtime=rt, batch_size=9, granularity=3, dtype="float64")
            losses = [trainer.train_step(x, y) for x, y in data]
            assert "conv2d_relu_pool_bwd.overwrite" in {r.codelet for r in rt.trace()}
            results.append((losses, model.state_dict()))  # fetched while the runtime is open
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(results[1][1][name], value, err_msg=name)
