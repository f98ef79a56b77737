"""The layers that came with PyTorch's names: SiLU, ReLU6, Hardswish, Softmax, LayerNorm,
BatchNorm1d, Identity, Dropout2d.

Every codelet variant (``ref``, ``cpu``, ``cuda`` under NumPy) against
``torch.nn.functional`` and autograd on random shapes and values drawn by hypothesis,
in float64 (relative error <= 1e-10) and float32 (<= 1e-4); every layer through a
runtime at a random granularity against its ``torch.nn`` twin holding the same
weights (outputs, input gradients, parameter gradients, running statistics); the
backward passes against central finite differences; Dropout2d's mask by channel,
the same at every granularity, scaled as torch scales.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hetero_nn as hn
from hetero_nn.codelets import activation as act
from hetero_nn.codelets.dropout import dropout2d_bwd, dropout2d_fwd, dropout_key, keep_mask
from hetero_nn.codelets.layernorm import (layer_norm_bwd_input, layer_norm_bwd_params,
                                          layer_norm_bwd_weight, layer_norm_fwd)
from hetero_nn.codelets.softmax import softmax_bwd, softmax_fwd
from helpers import central_differences, rel_err, torch_sgd_losses

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks need it")
F = torch.nn.functional
from test_layers import run_layer  # noqa: E402 (needs torch)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = {"float64": 1e-10, "float32": 1e-4}
VARIANTS = ("ref", "cpu", "cuda")
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None)

POINTWISE = {"silu": (act.silu_fwd, act.silu_bwd, F.silu),
             "relu6": (act.relu6_fwd, act.relu6_bwd, F.relu6),
             "hardswish": (act.hardswish_fwd, act.hardswish_bwd, F.hardswish)}

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
dtypes = st.sampled_from(["float64", "float32"])


def torch_grad(fn, x, dy, *params):
    """``(y, dx, [dparam])`` of ``fn(x, *params)`` in float64 by autograd."""
    xt = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    pt = [torch.tensor(np.asarray(p, np.float64), requires_grad=True) for p in params]
    yt = fn(xt, *pt)
    yt.backward(torch.tensor(np.asarray(dy, np.float64)))
    return yt.detach().numpy(), xt.grad.numpy(), [p.grad.numpy() for p in pt]


# --------------------------------------------------------------------------- codelets

@PROPERTY
@given(op=st.sampled_from(sorted(POINTWISE)), shape=shapes, dtype=dtypes,
       scale=st.sampled_from([0.5, 3.0, 8.0]), seed=st.integers(0, 2 ** 16))
def test_pointwise_variants_match_torch(op, shape, dtype, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    x.reshape(-1)[0] = rng.choice([0.0, -3.0, 3.0, 6.0])  # the kinks, where torch chooses
    dy = rng.standard_normal(shape).astype(dtype)
    fwd, bwd, fn = POINTWISE[op]
    y_ref, dx_ref, _ = torch_grad(fn, x, dy)
    for variant in VARIANTS:
        y, dx = np.full_like(x, np.nan), np.full_like(x, np.nan)
        fwd.variants[variant](x, y)
        bwd.variants[variant](x, dy, dx)
        assert y.dtype == x.dtype and dx.dtype == x.dtype
        assert rel_err(y, y_ref) <= TOL[dtype], variant
        assert rel_err(dx, dx_ref) <= TOL[dtype], variant


def test_pointwise_special_values_as_torch():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -3.0, 3.0, 6.0, 40.0, -40.0])
    dy = np.ones_like(x)
    for op, (fwd, bwd, fn) in POINTWISE.items():
        y_ref, dx_ref, _ = torch_grad(fn, x, dy)
        for variant in VARIANTS:
            y, dx = np.empty_like(x), np.empty_like(x)
            fwd.variants[variant](x, y)
            bwd.variants[variant](x, dy, dx)
            np.testing.assert_allclose(y, y_ref, rtol=1e-14, err_msg=f"{op} {variant}")
            # the sign of -0.0 and of infinities as torch's; a NaN's sign bit is not a value
            # (IEEE 754 leaves it to the implementation: numpy's and torch's builds differ)
            num = ~np.isnan(y_ref)
            np.testing.assert_array_equal(np.signbit(y[num]), np.signbit(y_ref[num]))
            # at a NaN input torch's gradient depends on which vectorised kernel its CPU
            # runs (hardswish: NaN on one machine, the upstream gradient on another)
            real = ~np.isnan(x)
            np.testing.assert_allclose(dx[real], dx_ref[real], rtol=1e-14,
                                       err_msg=f"{op} {variant}")


@PROPERTY
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple), dtype=dtypes,
       data=st.data())
def test_softmax_variants_match_torch(shape, dtype, data):
    dim = data.draw(st.integers(1, len(shape) - 1))
    rng = np.random.default_rng(list(shape))
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y_ref, dx_ref, _ = torch_grad(lambda t: F.softmax(t, dim), x, dy)
    for variant in VARIANTS:
        y, dx = np.full_like(x, np.nan), np.full_like(x, np.nan)
        softmax_fwd.variants[variant](x, y, dim=dim)
        softmax_bwd.variants[variant](y, dy, dx, dim=dim)
        assert rel_err(y, y_ref) <= TOL[dtype] and rel_err(dx, dx_ref) <= TOL[dtype], variant


def layer_norm_case(shape, d, dtype, seed, affine=True):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.uniform(0.5, 4) + rng.uniform(-2, 2)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    norm = shape[len(shape) - d:]
    w = (rng.standard_normal(norm) if affine else np.ones(norm)).astype(dtype)
    b = (rng.standard_normal(norm) if affine else np.zeros(norm)).astype(dtype)
    return x, dy, w, b


@PROPERTY
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple), dtype=dtypes,
       data=st.data(), eps=st.sampled_from([1e-5, 1e-3]))
def test_layer_norm_variants_match_torch(shape, dtype, data, eps):
    d = data.draw(st.integers(1, len(shape) - 1))
    norm = shape[len(shape) - d:]
    if np.prod(norm) == 1:  # one value per row: x - mean is 0, torch's is rounding noise
        norm, shape = (2, *norm[1:]), (*shape[:len(shape) - d], 2, *norm[1:])
    x, dy, w, b = layer_norm_case(shape, d, dtype, list(shape) + [d])
    y_ref, dx_ref, (dw_ref, db_ref) = torch_grad(
        lambda t, wt, bt: F.layer_norm(t, norm, wt, bt, eps), x, dy, w, b)
    _, mean_ref, rstd_ref = torch.native_layer_norm(
        torch.tensor(x, dtype=torch.float64), norm, None, None, eps)
    stats = shape[:len(shape) - d]
    for variant in VARIANTS:
        y = np.full_like(x, np.nan)
        mean, rstd = np.full(stats, np.nan), np.full(stats, np.nan)
        layer_norm_fwd.variants[variant](x, w, b, y, mean, rstd, eps=eps)
        dx = np.full_like(x, np.nan)
        layer_norm_bwd_input.variants[variant](x, dy, mean, rstd, w, dx)
        dw, db, dw_only = np.zeros_like(w), np.zeros_like(b), np.zeros_like(w)
        layer_norm_bwd_params.variants[variant](x, dy, mean, rstd, dw, db)
        layer_norm_bwd_weight.variants[variant](x, dy, mean, rstd, dw_only)
        tol = TOL[dtype]
        terms = float(np.abs(dy).max() * np.abs(w).max() * rstd_ref.abs().max())
        assert rel_err(y, y_ref) <= tol and rel_err(dx, dx_ref, terms) <= tol, variant
        assert rel_err(mean, mean_ref.numpy().reshape(stats)) <= tol
        assert rel_err(rstd, rstd_ref.numpy().reshape(stats)) <= tol
        assert rel_err(dw, dw_ref) <= tol and rel_err(db, db_ref) <= tol, variant
        assert np.array_equal(dw_only, dw)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout2d_drops_whole_channels_the_same_at_every_partitioning(p, dtype):
    x = np.random.default_rng(1).standard_normal((7, 5, 3, 4)).astype(dtype)
    key = dropout_key(99, 3)
    block = 12

    def run(codelet, variant, src, parts):
        out = np.full_like(src, np.nan)
        start = 0
        for a, o in zip(np.array_split(src, parts), np.array_split(out, parts)):
            codelet.variants[variant](a, o, np.array([key], np.uint64), p=p, start=start,
                                      block=block)
            start += len(a)
        return out

    y = run(dropout2d_fwd, "ref", x, 1)
    for variant in VARIANTS:
        for parts in (1, 3, 7):
            assert np.array_equal(run(dropout2d_fwd, variant, x, parts), y), (variant, parts)
            assert np.array_equal(run(dropout2d_bwd, variant, x, parts), y), (variant, parts)
    keep = keep_mask(np, x.shape, p, key, 0, block).reshape(7, 5, 12)
    assert (keep == keep[:, :, :1]).all()  # one draw per channel
    channels = torch.from_numpy(keep[:, :, 0].astype(dtype))[:, :, None, None]
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    expected = (torch.from_numpy(x) * channels * scale).numpy()  # torch's dropout2d, given a mask
    assert rel_err(y, expected) <= TOL[np.dtype(dtype).name]


def test_dropout2d_keeps_one_minus_p_of_the_channels_as_torch():
    x = np.ones((400, 50, 2, 2))
    ours = hn.Dropout2d(0.3, seed=5)(x)
    torch.manual_seed(5)
    theirs = F.dropout2d(torch.from_numpy(x), 0.3, training=True).numpy()
    for out in (ours, theirs):
        per_channel = out.reshape(400, 50, 4)
        assert (per_channel == per_channel[:, :, :1]).all()
        assert set(np.unique(out)) == {0.0, 1 / 0.7}
    bound = 5 * np.sqrt(0.3 * 0.7 / (400 * 50))  # five standard errors over 20,000 channels
    assert abs((ours == 0).mean() - 0.3) < bound and abs((theirs == 0).mean() - 0.3) < bound
    hn.close_default_runtime()


# --------------------------------------------------------------------------- layers vs torch

def layer_case(kind, draw):
    """``(hetero_nn layer, torch module, sample shape, batch)`` of one kind, drawn."""
    n = draw(st.integers(2, 6))
    if kind in POINTWISE or kind == "identity":
        shape = draw(shapes)
        hn_layer = {"silu": hn.SiLU, "relu6": hn.ReLU6, "hardswish": hn.Hardswish,
                    "identity": hn.Identity}[kind]()
        tm = {"silu": torch.nn.SiLU, "relu6": torch.nn.ReLU6, "hardswish": torch.nn.Hardswish,
              "identity": torch.nn.Identity}[kind]()
        return hn_layer, tm, shape, n
    if kind == "softmax":
        shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
        dim = draw(st.sampled_from([d for d in range(-len(shape), len(shape) + 1)
                                    if d not in (0, -len(shape) - 1)]))
        return hn.Softmax(dim), torch.nn.Softmax(dim), shape, n
    if kind == "layernorm":
        shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
        d = draw(st.integers(1, len(shape)))
        affine, bias = draw(st.booleans()), draw(st.booleans())
        eps = draw(st.sampled_from([1e-5, 1e-2]))
        norm = shape[len(shape) - d:]
        return (hn.LayerNorm(norm, eps, affine, bias),
                torch.nn.LayerNorm(norm, eps, affine, bias), shape, n)
    c = draw(st.integers(1, 5))
    shape = draw(st.sampled_from([(c,), (c, draw(st.integers(1, 5)))]))
    momentum = draw(st.sampled_from([0.1, 0.5, None]))
    affine = draw(st.booleans())
    return (hn.BatchNorm1d(c, momentum=momentum, affine=affine),
            torch.nn.BatchNorm1d(c, momentum=momentum, affine=affine), shape, n)


def cancelling_terms(kind, layer, x, dy) -> float:
    """The size of the terms a normalization's input gradient sums (``|dy| |w| rstd``),
    0 for the other kinds: see ``helpers.rel_err``."""
    if kind not in ("layernorm", "batchnorm1d"):
        return 0.0
    x = x.astype(np.float64)
    axes = (tuple(range(x.ndim - len(layer.normalized_shape), x.ndim)) if kind == "layernorm"
            else (0,) + tuple(range(2, x.ndim)))
    rstd = 1 / np.sqrt(x.var(axis=axes) + layer.eps)
    w = [p.data for name, p in layer.named_parameters() if name == "weight"]
    return float(np.abs(dy).max() * rstd.max() * (np.abs(w[0]).max() if w else 1.0))


def random_weights(layer, rng):
    for p in layer.parameters():
        p.data[...] = rng.standard_normal(p.data.shape)


@PROPERTY
@given(kind=st.sampled_from(["silu", "relu6", "hardswish", "identity", "softmax", "layernorm",
                             "batchnorm1d"]),
       dtype=dtypes, data=st.data())
def test_layers_through_the_runtime_equal_torch(kind, dtype, data):
    layer, module, shape, n = layer_case(kind, data.draw)
    g = data.draw(st.integers(1, n))
    rng = np.random.default_rng([n, *shape])
    layer.build(shape, dtype)
    random_weights(layer, rng)
    module = module.double()
    module.load_state_dict({k: torch.from_numpy(np.array(v, np.float64) if v.dtype.kind == "f"
                                                else np.array(v))
                            for k, v in layer.state_dict().items()})
    x = (rng.standard_normal((n, *shape)) * 3).astype(dtype)
    dy = rng.standard_normal((n, *shape)).astype(dtype)
    y, dx, grads, _ = run_layer(layer, x, dy, g, dtype)
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    yt = module(xt)
    yt.backward(torch.from_numpy(dy.astype(np.float64)))
    tol = TOL[dtype]
    assert y.dtype == np.dtype(dtype) and rel_err(y, yt.detach().numpy()) <= tol
    assert rel_err(dx, xt.grad.numpy(), cancelling_terms(kind, layer, x, dy)) <= tol
    torch_params = dict(module.named_parameters())
    assert grads.keys() == torch_params.keys()
    normalizing = kind in ("layernorm", "batchnorm1d")  # weight: sum of dy * x_hat, bias: dy
    for name, grad in grads.items():
        floor = float(np.abs(dy).max()) if normalizing else 0.0  # |x_hat| is about 1
        assert rel_err(grad, torch_params[name].grad.numpy(), floor) <= tol, name
    for name, buf in layer.named_buffers():  # running statistics updated as torch's
        assert rel_err(buf.host(), module.state_dict()[name].numpy()) <= tol, name


def test_identity_submits_nothing_and_accepts_torch_arguments():
    layer = hn.Identity(54, unused_argument=0.1)
    y, dx, _, trace = run_layer(layer, np.arange(6.0).reshape(2, 3), np.ones((2, 3)), 2, "float64")
    assert np.array_equal(y, np.arange(6.0).reshape(2, 3)) and np.array_equal(dx, np.ones((2, 3)))
    assert len(trace) == 0


# --------------------------------------------------------------------------- finite differences

FD_LAYERS = {
    "silu": lambda: hn.SiLU(), "hardswish": lambda: hn.Hardswish(), "relu6": lambda: hn.ReLU6(),
    "softmax": lambda: hn.Softmax(dim=-2),
    "layernorm": lambda: hn.LayerNorm((3, 4), eps=1e-3),
    "layernorm-nobias": lambda: hn.LayerNorm(4, bias=False),
    "batchnorm1d": lambda: hn.BatchNorm1d(3, momentum=None),
}


@pytest.mark.parametrize("kind", sorted(FD_LAYERS))
def test_layer_backward_matches_central_differences(kind):
    """``d sum(layer(x) * dy)`` by central differences, through the runtime, against the
    layer's backward (input and parameter gradients), float64."""
    rng = np.random.default_rng(3)
    layer = FD_LAYERS[kind]()
    shape = (2, 3, 4)
    x = rng.standard_normal(shape) * 2
    x[np.abs(x) < 0.05] = 0.5  # away from the kinks (0 for ReLU6, +-3 stay unlikely)
    x[np.abs(np.abs(x) - 3) < 0.05] = 1.0
    dy = rng.standard_normal(shape)
    layer.build(shape[1:], "float64")
    random_weights(layer, rng)
    _, dx, grads, _ = run_layer(layer, x, dy, 2, "float64")
    eps = 1e-6
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        layer.bind(rt)

        def loss():
            ys = layer.forward(rt, [rt.register(x.copy())])
            return float(np.sum(rt.fetch(ys[0]) * dy))

        assert rel_err(dx, central_differences(loss, x, eps)) <= 1e-7
        for name, p in layer.named_parameters():
            assert rel_err(grads[name], central_differences(loss, p.data, eps)) <= 1e-7, name


# --------------------------------------------------------------------------- construction

@pytest.mark.parametrize("make, match", [
    (lambda: hn.LayerNorm(0), "LayerNorm: normalized_shape"),
    (lambda: hn.LayerNorm(4, eps=0), "LayerNorm: eps"),
    (lambda: hn.Softmax(dim=1.5), "Softmax: dim"),
    (lambda: hn.Dropout2d(2.0), "Dropout2d: p"),
    (lambda: hn.BatchNorm1d(0), "BatchNorm1d: num_features"),
    (lambda: hn.Flatten(0), "Flatten: start_dim"),
])
def test_constructor_errors_name_the_layer_and_argument(make, match):
    with pytest.raises(hn.ConfigError, match=match):
        make()


@pytest.mark.parametrize("model, shape, match", [
    (lambda: hn.Sequential(hn.Softmax(dim=0)), (4,), r"Softmax: dim=0 is the batch axis"),
    (lambda: hn.Sequential(hn.Softmax(dim=3)), (4, 2), r"Softmax: dim=3 is out of range"),
    (lambda: hn.Sequential(hn.Softmax()), (3, 4), r"Softmax: dim=None is the batch axis"),
    (lambda: hn.Sequential(hn.LayerNorm((4, 5))), (4, 6), r"LayerNorm.*ending with \(4, 5\)"),
    (lambda: hn.Sequential(hn.BatchNorm1d(3)), (3, 4, 5), r"BatchNorm1d.*\(3,\) or \(3, L\)"),
    (lambda: hn.Sequential(hn.Dropout2d()), (8,), r"Dropout2d: expects samples \(C, H, W\)"),
    (lambda: hn.Sequential(hn.Flatten(1, 2)), (2, 3, 4), r"Flatten: end_dim=2"),
])
def test_shape_errors_name_the_layer(model, shape, match):
    with pytest.raises((hn.ShapeError, hn.ConfigError), match=match):
        model().build(shape)


def test_keras_spellings_are_the_same_classes():
    assert hn.Dense is hn.Linear and hn.BatchNorm2D is hn.BatchNorm2d
    assert hn.layers.Dense is hn.layers.Linear
    linear = hn.Linear(3, 2, bias=False)
    assert isinstance(linear, hn.Dense) and repr(linear) == "Linear(3, 2, bias=False)"
    keys = [name for name, _ in hn.BatchNorm1d(4).named_state()]
    assert keys == list(torch.nn.BatchNorm1d(4).state_dict())
    assert [name for name, _ in hn.LayerNorm(4).named_state()] == \
        list(torch.nn.LayerNorm(4).state_dict())


# --------------------------------------------------------------------------- on an emulated GPU

def test_training_on_cuda_emu_runs_the_cuda_variants_and_equals_torch():
    """Three SGD-momentum steps of a network of the new layers with every task on an
    emulated CUDA device (the ``cuda`` variants under NumPy), against torch, float64."""
    hn.manual_seed(5)
    model = hn.Sequential(hn.Conv2D(2, 4, 3, padding=1), hn.SiLU(), hn.Dropout2d(0.0),
                          hn.LayerNorm((4, 6, 6)), hn.Hardswish(), hn.Flatten(),
                          hn.Linear(144, 12), hn.BatchNorm1d(12), hn.ReLU6(), hn.Identity(),
                          hn.Linear(12, 5), hn.Softmax(dim=1), hn.Linear(5, 5))
    model.build((2, 6, 6), "float64")
    for p in model.parameters():  # LayerNorm and BatchNorm away from 1 and 0
        p.data[...] += np.random.default_rng(1).standard_normal(p.data.shape) * 0.1
    twin = hn.to_torch(model)
    rng = np.random.default_rng(2)
    data = [(rng.standard_normal((6, 2, 6, 6)), rng.integers(0, 5, 6)) for _ in range(3)]
    expected = torch_sgd_losses(twin, data, 0.1, 0.9)
    with hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.1, momentum=0.9), runtime=rt,
                             batch_size=6, granularity=3)
        losses = [trainer.train_step(x, y) for x, y in data]
        state = model.state_dict()
        ran = {(r.codelet, r.variant) for r in rt.trace()}
    assert rel_err(losses, expected) <= 1e-9
    for key, value in twin.state_dict().items():
        assert rel_err(state[key], value.numpy()) <= 1e-9, key
    for name in ("silu_fwd", "hardswish_bwd", "layer_norm_fwd", "layer_norm_bwd_input",
                 "relu6_bwd", "softmax_fwd", "softmax_bwd", "bn_fwd"):
        assert (name, "cuda") in ran, name
