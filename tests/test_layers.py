"""Layers: forward and backward through the runtime equal PyTorch's autograd and finite
differences; one task per partition; shapes checked at build with messages that name the
layer; constructor arguments checked; ``state_dict`` with PyTorch's keys, shapes and
initial distributions.

Each layer runs the way a network runs it: its parameters bound to a ``Runtime``, a
batch registered and split into ``g`` partitions, ``forward`` and ``backward`` submitting
tasks, one flush. Shapes and values are seeded random; float64 and float32.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

TOL = {"float64": 1e-10, "float32": 1e-4}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torch_layer(layer):
    """The ``torch.nn`` module with the same arguments as a hetero_nn layer (no weights)."""
    if isinstance(layer, hn.Conv2D):
        return torch.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                               stride=layer.stride, padding=layer.padding, bias=layer.bias)
    if isinstance(layer, hn.MaxPool2D):
        return torch.nn.MaxPool2d(layer.kernel_size, layer.stride)
    if isinstance(layer, hn.Dense):
        return torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if isinstance(layer, hn.ReLU):
        return torch.nn.ReLU()
    if isinstance(layer, hn.Flatten):
        return torch.nn.Flatten()
    raise TypeError(f"no torch twin for {layer!r}")


def torch_twin(model: hn.Sequential, dtype=None) -> torch.nn.Sequential:
    """``torch.nn.Sequential`` of the same layers holding a copy of ``model``'s weights."""
    twin = torch.nn.Sequential(*(torch_layer(layer) for layer in model))
    if dtype is not None:
        twin = twin.to(getattr(torch, np.dtype(dtype).name))
    twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    return twin


def lenet5(bias=True):
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2, bias=bias), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5, bias=bias), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120, bias=bias), hn.ReLU(), hn.Dense(120, 84, bias=bias), hn.ReLU(),
        hn.Dense(84, 10, bias=bias))


def small_net():
    return hn.Sequential(hn.Conv2D(1, 4, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dense(676, 10))


def split(h, g):
    return list(h.split(0, g)) if g > 1 else [h]


def run_layer(layer, x, dy, g, dtype, *, variants=None, policy="eager", need_input_grad=True):
    """Forward and backward of one layer through a runtime over ``g`` partitions.

    Returns ``(y, dx, {param: grad}, trace)``; ``dx`` is None without input gradient.
    """
    layer.build(x.shape[1:], dtype)
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=True, perfmodel=False,
                    variants=variants) as rt:
        layer.bind(rt)
        layer.zero_grad(rt)
        ys = layer.forward(rt, split(rt.register(np.ascontiguousarray(x, dtype)), g))
        dys = split(rt.register(np.ascontiguousarray(dy, dtype)), g)
        dxs = layer.backward(rt, dys, need_input_grad=need_input_grad)
        rt.wait()
        y = np.concatenate([rt.fetch(h, copy=True) for h in ys])
        dx = None if dxs is None else np.concatenate([rt.fetch(h, copy=True) for h in dxs])
        grads = {name: rt.fetch(p.grad, copy=True) for name, p in layer.named_parameters()}
        trace = rt.trace()
    return y, dx, grads, trace


def torch_reference(layer, x, dy):
    """``(y, dx, {param: grad})`` of the torch twin of ``layer`` with its weights, float64."""
    module = torch_layer(layer).double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.from_numpy(layer._params[name].host().astype(np.float64)))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = module(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64).reshape(yt.shape))
    return (yt.detach().numpy(), xt.grad.numpy(),
            {name: p.grad.numpy() for name, p in module.named_parameters()})


def input_mix(rng, shape, kind):
    """Inputs of one kind: normal, with exact zeros (ReLU outputs), or with ties."""
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "zeros":
        return np.maximum(rng.standard_normal(shape), 0.0)
    return rng.integers(-2, 3, shape).astype(np.float64)  # "ties": few distinct values


# --------------------------------------------------------------------------- random cases

def conv_case(seed):
    rng = np.random.default_rng(seed)
    k = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
    padding = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    stride = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    c_in, c_out = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    h = int(rng.integers(max(1, k[0] - 2 * padding[0]), 13))
    w = int(rng.integers(max(1, k[1] - 2 * padding[1]), 13))
    n = int(rng.integers(1, 9))
    g = int(rng.integers(1, n + 1))
    bias = bool(rng.integers(2))
    return dict(layer=lambda: hn.Conv2D(c_in, c_out, k, stride=stride, padding=padding, bias=bias),
                x_shape=(n, c_in, h, w), g=g, kind="normal")


def pool_case(seed):
    rng = np.random.default_rng(1000 + seed)
    k = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    stride = None if seed % 2 else (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    n, c = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    h, w = int(rng.integers(k[0], 12)), int(rng.integers(k[1], 12))
    return dict(layer=lambda: hn.MaxPool2D(k, stride), x_shape=(n, c, h, w),
                g=int(rng.integers(1, n + 1)), kind=("normal", "zeros", "ties")[seed % 3])


def dense_case(seed):
    rng = np.random.default_rng(2000 + seed)
    n, n_in, n_out = int(rng.integers(1, 12)), int(rng.integers(1, 40)), int(rng.integers(1, 20))
    bias = bool(seed % 2)
    return dict(layer=lambda: hn.Dense(n_in, n_out, bias=bias), x_shape=(n, n_in),
                g=int(rng.integers(1, n + 1)), kind="normal")


def relu_case(seed):
    rng = np.random.default_rng(3000 + seed)
    n = int(rng.integers(1, 9))
    shape = (n, *(int(d) for d in rng.integers(1, 7, size=int(rng.integers(1, 4)))))
    return dict(layer=hn.ReLU, x_shape=shape, g=int(rng.integers(1, n + 1)),
                kind=("zeros", "ties", "normal")[seed % 3])


CASES = ([("conv", s, conv_case(s)) for s in range(8)] + [("pool", s, pool_case(s)) for s in range(6)]
         + [("dense", s, dense_case(s)) for s in range(4)] + [("relu", s, relu_case(s)) for s in range(3)])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind, seed, case", CASES, ids=[f"{k}{s}" for k, s, _ in CASES])
def test_layer_forward_backward_equal_torch(kind, seed, case, dtype):
    rng = np.random.default_rng(seed + 17)
    hn.manual_seed(seed)
    layer = case["layer"]()
    x = input_mix(rng, case["x_shape"], case["kind"]).astype(dtype)
    out_shape = layer.infer_shape(case["x_shape"][1:])
    dy = rng.standard_normal((case["x_shape"][0], *out_shape)).astype(dtype)
    y, dx, grads, _ = run_layer(layer, x, dy, case["g"], dtype)
    y_ref, dx_ref, grads_ref = torch_reference(layer, x.astype(np.float64), dy.astype(np.float64))
    assert y.dtype == np.dtype(dtype) and y.shape == y_ref.shape
    assert rel_err(y, y_ref) <= TOL[dtype]
    assert dx.shape == x.shape and rel_err(dx, dx_ref) <= TOL[dtype]
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        assert g.shape == grads_ref[name].shape
        assert rel_err(g, grads_ref[name]) <= TOL[dtype], name


@pytest.mark.parametrize("variants", [("cpu:direct", "cpu"), ("cpu:im2col", "cpu")],
                         ids=["direct", "im2col"])
@pytest.mark.parametrize("seed", [0, 3])
def test_conv_layer_with_numba_variants_equals_torch(seed, variants):
    case = conv_case(seed)
    rng = np.random.default_rng(seed)
    layer = case["layer"]()
    x = rng.standard_normal(case["x_shape"])
    dy = rng.standard_normal((x.shape[0], *layer.infer_shape(x.shape[1:])))
    y, dx, grads, trace = run_layer(layer, x, dy, case["g"], "float64", variants=variants)
    y_ref, dx_ref, grads_ref = torch_reference(layer, x, dy)
    kernels = {r.variant for r in trace if r.codelet.startswith("conv2d_") and ".redux" not in r.codelet}
    assert kernels == {variants[0]}
    assert rel_err(y, y_ref) <= 1e-10 and rel_err(dx, dx_ref) <= 1e-10
    for name in grads:
        assert rel_err(grads[name], grads_ref[name]) <= 1e-10


def test_maxpool_routes_ties_to_the_first_maximum_as_torch():
    """Windows of equal values (ReLU zeros, small integers): the gradient goes where
    PyTorch sends it, exactly."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 2, (4, 3, 8, 8)).astype(np.float64)
    dy = rng.standard_normal((4, 3, 4, 4))
    _, dx, _, _ = run_layer(hn.MaxPool2D(2), x, dy, 2, "float64")
    _, dx_ref, _ = torch_reference(hn.MaxPool2D(2), x, dy)
    np.testing.assert_array_equal(dx, dx_ref)


def test_relu_gradient_is_zero_at_zero_as_torch():
    x = np.array([[-1.0, 0.0, 2.0, -0.0, 3.0]])
    dy = np.ones_like(x)
    y, dx, _, _ = run_layer(hn.ReLU(), x, dy, 1, "float64")
    np.testing.assert_array_equal(y, [[0.0, 0.0, 2.0, 0.0, 3.0]])
    np.testing.assert_array_equal(dx, [[0.0, 0.0, 1.0, 0.0, 1.0]])


def test_flatten_then_dense_gives_the_input_gradient_in_the_input_layout():
    rng = np.random.default_rng(9)
    model = hn.Sequential(hn.Flatten(), hn.Dense(2 * 3 * 4, 5))
    x, dy = rng.standard_normal((6, 2, 3, 4)), rng.standard_normal((6, 5))
    model.build(x.shape[1:], "float64")
    with hn.Runtime(devices="cpu:2", deterministic=True, perfmodel=False) as rt:
        model.bind(rt)
        model.zero_grad(rt)
        ys = model.forward(rt, split(rt.register(x), 3))
        dxs = model.backward(rt, split(rt.register(dy), 3), need_input_grad=True)
        y = np.concatenate([rt.fetch(h, copy=True) for h in ys])
        dx = np.concatenate([rt.fetch(h, copy=True) for h in dxs])
        codelets = Counter(r.codelet for r in rt.trace())
    twin = torch_twin(model, "float64")
    xt = torch.tensor(x, requires_grad=True)
    yt = twin(xt)
    yt.backward(torch.from_numpy(dy))
    assert rel_err(y, yt.detach().numpy()) <= 1e-12
    assert dx.shape == x.shape and rel_err(dx, xt.grad.numpy()) <= 1e-12
    assert set(codelets) == {"dense_fwd", "dense_bwd_params.overwrite", "dense_bwd_params",
                             "dense_bwd_params.redux", "dense_bwd_input"}  # Flatten: no task


# --------------------------------------------------------------------------- finite differences

@pytest.mark.parametrize("make", [lambda: hn.Conv2D(2, 3, 3, stride=2, padding=1),
                                  lambda: hn.Dense(7, 4), lambda: hn.MaxPool2D(2, 1)],
                         ids=["conv", "dense", "pool"])
def test_layer_gradients_match_central_differences(make):
    """``dL/dx`` and ``dL/dparam`` for ``L = sum(y * dy)``, each forward run as tasks."""
    rng = np.random.default_rng(11)
    hn.manual_seed(11)
    layer = make()
    x_shape = (3, 7) if isinstance(layer, hn.Dense) else (3, 2, 6, 5)
    x = rng.standard_normal(x_shape)
    dy = rng.standard_normal((x.shape[0], *layer.infer_shape(x.shape[1:])))
    _, dx, grads, _ = run_layer(layer, x, dy, 2, "float64")

    def objective(x_value):
        y, _, _, _ = run_layer(layer, x_value, dy, 2, "float64", need_input_grad=False)
        return float(np.sum(y * dy))

    eps = 1e-6
    for index in [tuple(rng.integers(0, d) for d in x.shape) for _ in range(4)]:
        xp, xm = x.copy(), x.copy()
        xp[index] += eps
        xm[index] -= eps
        numeric = (objective(xp) - objective(xm)) / (2 * eps)
        assert abs(numeric - dx[index]) <= 1e-6 * max(1.0, abs(dx[index])), index
    for name, p in layer.named_parameters():
        for index in [tuple(rng.integers(0, d) for d in p.shape) for _ in range(3)]:
            original = p.data[index]
            p.data[index] = original + eps
            plus = objective(x)
            p.data[index] = original - eps
            minus = objective(x)
            p.data[index] = original
            numeric = (plus - minus) / (2 * eps)
            assert abs(numeric - grads[name][index]) <= 1e-6 * max(1.0, abs(grads[name][index])), \
                (name, index)


def test_network_loss_gradient_matches_central_differences():
    """The gradient a training step accumulates (REDUX over 3 partitions) is the
    derivative of the mean loss that ``evaluate_batch`` computes."""
    rng = np.random.default_rng(12)
    hn.manual_seed(12)
    model = hn.Sequential(hn.Conv2D(1, 3, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                          hn.Dense(3 * 5 * 5, 4))
    x, y = rng.standard_normal((9, 1, 12, 12)), rng.integers(0, 4, 9)
    with hn.Runtime(devices="cpu:2", policy="ws", deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.0), runtime=rt, batch_size=9,
                             granularity=3, dtype="float64")
        trainer.train_step(x, y)  # lr 0: the weights stay, the gradients are left in p.grad
        params = dict(model.named_parameters())
        grads = {name: rt.fetch(p.grad, copy=True) for name, p in params.items()}
        start = model.state_dict()
        eps = 1e-6
        for name, grad in grads.items():
            assert np.max(np.abs(grad)) > 0
            for index in [tuple(rng.integers(0, d) for d in grad.shape) for _ in range(3)]:
                values = []
                for sign in (1, -1):
                    state = {k: v.copy() for k, v in start.items()}
                    state[name][index] += sign * eps
                    model.load_state_dict(state)
                    values.append(trainer.evaluate_batch(x, y)[0])
                numeric = (values[0] - values[1]) / (2 * eps)
                assert abs(numeric - grad[index]) <= 1e-7 * max(1.0, abs(grad[index])), (name, index)


# --------------------------------------------------------------------------- tasks per partition

def lenet_step_counts(g):
    """Tasks of one unfused LeNet-5 training step at granularity ``g`` (SGD with momentum).

    The first partition's contribution to each gradient, the loss and the count
    overwrites it (``.overwrite``, no ``fill_zero``); the ``g - 1`` others are REDUX."""
    counts = {
        "conv2d_fwd": 2 * g, "relu_fwd": 4 * g, "maxpool2d_fwd": 2 * g, "dense_fwd": 3 * g,
        "softmax_xent.overwrite": 1, "softmax_xent": g - 1,
        "softmax_xent.redux": 2 * (g - 1),        # loss and count: g-2 tree adds + 1
        "dense_bwd_params.overwrite": 3, "dense_bwd_params": 3 * (g - 1),
        "dense_bwd_input": 3 * g, "relu_bwd": 4 * g,
        "maxpool2d_bwd": 2 * g, "conv2d_bwd_params.overwrite": 2, "conv2d_bwd_params": 2 * (g - 1),
        "conv2d_bwd_input": g,                      # the first layer needs no input gradient
        "dense_bwd_params.redux": 3 * 2 * (g - 1), "conv2d_bwd_params.redux": 2 * 2 * (g - 1),
        "sgd_step": 10,
    }
    return {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("g", [1, 3, 8])
def test_a_training_step_submits_one_task_per_partition(g):
    hn.manual_seed(0)
    rng = np.random.default_rng(g)
    with hn.Runtime(devices="cpu:2", policy="dmda", deterministic=True, perfmodel=False) as rt:
        model = lenet5()
        model.fuse = False  # the fused step: tests/test_fusion.py
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.01, momentum=0.9), runtime=rt,
                             batch_size=16, granularity=g, dtype="float32")
        for _ in range(2):
            rt.trace(clear=True)
            trainer.train_step(rng.standard_normal((16, 1, 28, 28)), rng.integers(0, 10, 16))
            counts = Counter(r.codelet for r in rt.trace())
            assert dict(counts) == lenet_step_counts(g)
        assert trainer.evaluate_batch(rng.standard_normal((16, 1, 28, 28)), rng.integers(0, 10, 16))
        evaluation = Counter(r.codelet for r in rt.trace()) - counts
    assert dict(evaluation) == {k: v for k, v in {
        "conv2d_fwd": 2 * g, "relu_fwd": 4 * g, "maxpool2d_fwd": 2 * g, "dense_fwd": 3 * g,
        "softmax_xent_eval.overwrite": 1, "softmax_xent_eval": g - 1,
        "softmax_xent_eval.redux": 2 * (g - 1)}.items() if v}


@pytest.mark.parametrize("g", [1, 2, 5])
@pytest.mark.parametrize("make, x_shape, expected", [
    (lambda: hn.Conv2D(2, 3, 3), (5, 2, 6, 6),
     {"conv2d_fwd": 1, "conv2d_bwd_params": 1, "conv2d_bwd_input": 1,
      "conv2d_bwd_params.redux": 2}),
    (lambda: hn.Conv2D(2, 3, 3, bias=False), (5, 2, 6, 6),
     {"conv2d_fwd_nobias": 1, "conv2d_bwd_weight": 1, "conv2d_bwd_input": 1,
      "conv2d_bwd_weight.redux": 1}),
    (lambda: hn.Dense(4, 3), (5, 4),
     {"dense_fwd": 1, "dense_bwd_params": 1, "dense_bwd_input": 1,
      "dense_bwd_params.redux": 2}),
    (lambda: hn.Dense(4, 3, bias=False), (5, 4),
     {"dense_fwd_nobias": 1, "dense_bwd_weight": 1, "dense_bwd_input": 1,
      "dense_bwd_weight.redux": 1}),
    (lambda: hn.MaxPool2D(2), (5, 2, 4, 4), {"maxpool2d_fwd": 1, "maxpool2d_bwd": 1}),
    (hn.ReLU, (5, 7), {"relu_fwd": 1, "relu_bwd": 1}),
], ids=["conv", "conv-nobias", "dense", "dense-nobias", "pool", "relu"])
def test_each_layer_submits_one_task_per_partition(make, x_shape, expected, g):
    """Counts per partition; the first contribution overwrites the gradients, each REDUX
    handle's tree adds the ``g - 1`` other partials with ``g - 1`` tasks."""
    layer = make()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape)
    dy = rng.standard_normal((x_shape[0], *layer.infer_shape(x_shape[1:])))
    _, _, _, trace = run_layer(layer, x, dy, g, "float64")
    counts = Counter(r.codelet for r in trace)
    assert dict(counts) == {k: v for k, v in _first_overwrites(expected, g).items() if v}


def _first_overwrites(per_partition, g):
    """Counts at ``g`` partitions: the first contribution to the gradients overwrites them
    (``<codelet>.overwrite``), the ``g - 1`` others are REDUX, added by ``g - 1`` tasks."""
    counts = {}
    for k, v in per_partition.items():
        if k.endswith("_bwd_params") or k.endswith("_bwd_weight"):
            counts[k + ".overwrite"] = v
            counts[k] = v * (g - 1)
        elif k.endswith(".redux"):
            counts[k] = v * (g - 1)
        else:
            counts[k] = v * g
    return counts


def test_without_input_gradient_no_input_gradient_task():
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((4, 2, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    _, dx, grads, trace = run_layer(hn.Conv2D(2, 3, 3), x, dy, 2, "float64", need_input_grad=False)
    assert dx is None and set(grads) == {"weight", "bias"}
    assert "conv2d_bwd_input" not in {r.codelet for r in trace}


# --------------------------------------------------------------------------- shape errors

SHAPE_ERRORS = [
    # model, input shape, index, layer name, substrings the message must hold
    ("wrong-channels", lambda: lenet5(), (3, 28, 28), 0, "Conv2d", ["(1, H, W)", "(3, 28, 28)"]),
    ("wrong-channels-deep",
     lambda: hn.Sequential(hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2), hn.Conv2D(3, 16, 5)),
     (1, 28, 28), 3, "Conv2d", ["(3, H, W)", "(6, 14, 14)"]),
    ("kernel-larger", lambda: hn.Sequential(hn.Conv2D(1, 4, 7)), (1, 5, 5), 0, "Conv2d",
     ["(7, 7)", "(1, 5, 5)"]),
    ("kernel-larger-deep", lambda: lenet5(), (1, 8, 8), 3, "Conv2d", ["(5, 5)", "(6, 4, 4)"]),
    ("dense-after-flatten", lambda: small_net(), (1, 20, 20), 4, "Linear", ["(676,)", "(324,)"]),
    ("lenet-dense", lambda: lenet5(), (1, 32, 32), 7, "Linear", ["(400,)", "(576,)"]),
    ("pool-larger", lambda: hn.Sequential(hn.Conv2D(1, 2, 3), hn.ReLU(), hn.MaxPool2D(4)),
     (1, 5, 5), 2, "MaxPool2d", ["(4, 4)", "(2, 3, 3)"]),
    ("rank-2-into-conv", lambda: lenet5(), (28, 28), 0, "Conv2d", ["(1, H, W)", "(28, 28)"]),
    ("rank-4-into-conv", lambda: small_net(), (16, 1, 28, 28), 0, "Conv2d",
     ["(1, H, W)", "(16, 1, 28, 28)"]),
    ("rank-2-into-pool", lambda: hn.Sequential(hn.MaxPool2D(2)), (28, 28), 0, "MaxPool2d",
     ["(C, H, W)", "(28, 28)"]),
    ("dense-without-flatten", lambda: hn.Sequential(hn.Dense(784, 10)), (1, 28, 28), 0, "Linear",
     ["(784,)", "(1, 28, 28)"]),
]


@pytest.mark.parametrize("make, input_shape, index, name, parts", [c[1:] for c in SHAPE_ERRORS],
                         ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_mismatch_raises_at_build_naming_layer_index_and_shapes(make, input_shape, index,
                                                                       name, parts):
    model = make()
    with pytest.raises(hn.ShapeError) as info:
        model.build(input_shape, "float32")
    message = str(info.value)
    assert f"layer {index} ({name}(" in message, message
    for part in parts:
        assert part in message, (part, message)
    assert isinstance(info.value, ValueError)


def test_shape_error_comes_before_any_task_and_the_runtime_stays_usable():
    rng = np.random.default_rng(0)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        bad = hn.Trainer(lenet5(), runtime=rt, batch_size=4, granularity=2)
        with pytest.raises(hn.ShapeError, match=r"layer 7 \(Linear"):
            bad.train_step(rng.standard_normal((4, 1, 32, 32)), rng.integers(0, 10, 4))
        assert len(rt.trace()) == 0  # nothing ran: no kernel saw the wrong shape
        good = hn.Trainer(small_net(), runtime=rt, batch_size=4, granularity=2)
        loss = good.train_step(rng.standard_normal((4, 1, 28, 28)), rng.integers(0, 10, 4))
        assert np.isfinite(loss)


def test_build_returns_every_output_shape_and_rejects_integer_dtypes():
    model = lenet5()
    assert model.build((1, 28, 28), "float64") == (10,)
    assert [layer.output_shape for layer in model] == [
        (6, 28, 28), (6, 28, 28), (6, 14, 14), (16, 10, 10), (16, 10, 10), (16, 5, 5), (400,),
        (120,), (120,), (84,), (84,), (10,)]
    assert all(p.data.dtype == np.float64 for p in model.parameters())
    with pytest.raises(ValueError, match="dtype"):
        model.build((1, 28, 28), "int32")


CONSTRUCTOR_ERRORS = [
    (lambda: hn.Conv2d(0, 4, 3), "Conv2d", "in_channels"),
    (lambda: hn.Conv2d(1.5, 4, 3), "Conv2d", "in_channels"),
    (lambda: hn.Conv2d(True, 4, 3), "Conv2d", "in_channels"),
    (lambda: hn.Conv2d(1, 0, 3), "Conv2d", "out_channels"),
    (lambda: hn.Conv2d(1, 4, 0), "Conv2d", "kernel_size"),
    (lambda: hn.Conv2d(1, 4, (3, 3, 3)), "Conv2d", "kernel_size"),
    (lambda: hn.Conv2d(1, 4, "3"), "Conv2d", "kernel_size"),
    (lambda: hn.Conv2d(1, 4, 3, stride=0), "Conv2d", "stride"),
    (lambda: hn.Conv2d(1, 4, 3, padding=-1), "Conv2d", "padding"),
    (lambda: hn.Conv2d(1, 4, 3, padding=(1, -2)), "Conv2d", "padding"),
    (lambda: hn.MaxPool2d(0), "MaxPool2d", "kernel_size"),
    (lambda: hn.MaxPool2d(2.0), "MaxPool2d", "kernel_size"),
    (lambda: hn.MaxPool2d(2, stride=(1, 0)), "MaxPool2d", "stride"),
    (lambda: hn.Linear(0, 10), "Linear", "in_features"),
    (lambda: hn.Linear(10, -1), "Linear", "out_features"),
    (lambda: hn.Linear(10, 2.5), "Linear", "out_features"),
]


@pytest.mark.parametrize("make, name, arg", CONSTRUCTOR_ERRORS,
                         ids=[f"{n}-{a}-{i}" for i, (_, n, a) in enumerate(CONSTRUCTOR_ERRORS)])
def test_constructor_argument_errors_name_layer_and_argument(make, name, arg):
    with pytest.raises(hn.ConfigError) as info:
        make()
    assert str(info.value).startswith(f"{name}: {arg} ")
    assert isinstance(info.value, ValueError) and isinstance(info.value, hn.HeteroNNError)


def test_sequential_rejects_what_is_not_a_layer():
    with pytest.raises(TypeError, match=r"Sequential: argument 1 is Linear"):
        hn.Sequential(hn.Flatten(), torch.nn.Linear(3, 4))


# --------------------------------------------------------------------------- state_dict

@pytest.mark.parametrize("make", [lenet5, small_net, lambda: lenet5(bias=False)],
                         ids=["lenet5", "small", "lenet5-nobias"])
def test_state_dict_keys_and_shapes_equal_torch(make):
    model = make()
    twin = torch.nn.Sequential(*(torch_layer(layer) for layer in model))
    ours = model.state_dict()
    theirs = twin.state_dict()
    assert list(ours) == list(theirs)
    assert [v.shape for v in ours.values()] == [tuple(v.shape) for v in theirs.values()]
    assert [name for name, _ in model.named_parameters()] == [n for n, _ in twin.named_parameters()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_state_dict_round_trips_from_torch_and_back(dtype):
    torch.manual_seed(3)
    source = torch.nn.Sequential(*(torch_layer(layer) for layer in lenet5()))
    state = {k: v.numpy().copy() for k, v in source.state_dict().items()}
    model = lenet5()
    model.build((1, 28, 28), dtype)
    model.load_state_dict(state)
    loaded = model.state_dict()
    for k, v in state.items():
        assert loaded[k].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(loaded[k], v)  # float32 values are exact in float64
    back = torch.nn.Sequential(*(torch_layer(layer) for layer in lenet5()))
    back.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in loaded.items()})
    for k, v in source.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    loaded["0.weight"][...] = 0  # a copy: the model's weights are untouched
    assert np.any(model.state_dict()["0.weight"] != 0)


def test_load_state_dict_errors_name_the_keys_and_shapes():
    model = small_net()
    state = model.state_dict()
    with pytest.raises(hn.CheckpointError, match=r"missing keys \['4.bias'\]"):
        model.load_state_dict({k: v for k, v in state.items() if k != "4.bias"})
    with pytest.raises(hn.CheckpointError, match=r"unexpected keys \['9.weight'\]"):
        model.load_state_dict({**state, "9.weight": np.zeros(3)})
    with pytest.raises(hn.ShapeError, match=r"'4.weight' has shape \(10, 675\).*\(10, 676\)"):
        model.load_state_dict({**state, "4.weight": np.zeros((10, 675))})
    model.load_state_dict({"0.bias": np.ones(4)}, strict=False)
    np.testing.assert_array_equal(model.state_dict()["0.bias"], np.ones(4))


def test_load_state_dict_while_training_restores_the_weights():
    """Load into a model a trainer is using: the next steps start from the loaded weights
    (plain SGD has no state, so they repeat the earlier steps bit for bit)."""
    rng = np.random.default_rng(4)
    data = [(rng.standard_normal((8, 1, 28, 28)), rng.integers(0, 10, 8)) for _ in range(4)]
    hn.manual_seed(4)
    model = small_net()
    with hn.Runtime(devices="cpu:2", policy="heft", deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.1), runtime=rt, batch_size=8,
                             granularity=2, dtype="float64")
        trainer.train_step(*data[0])
        saved = model.state_dict()
        first = [trainer.train_step(x, y) for x, y in data[1:]]
        after_first = model.state_dict()
        model.load_state_dict(saved)
        np.testing.assert_array_equal(model.state_dict()["4.weight"], saved["4.weight"])
        again = [trainer.train_step(x, y) for x, y in data[1:]]
        assert again == first
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v, after_first[k])


@pytest.mark.parametrize("make, fan_in", [(lambda: hn.Conv2D(16, 32, 5), 16 * 25),
                                          (lambda: hn.Dense(500, 300), 500)],
                         ids=["conv", "dense"])
def test_initialisation_follows_torch_distributions(make, fan_in):
    """Weights and biases uniform on +-1/sqrt(fan_in), as torch's kaiming_uniform(a=sqrt(5))."""
    hn.manual_seed(0)
    layer = make()
    torch.manual_seed(0)
    reference = torch_layer(layer)
    bound = 1 / math.sqrt(fan_in)
    w = layer._params["weight"].data.astype(np.float64)
    tw = reference.weight.detach().numpy().astype(np.float64)
    assert w.shape == tw.shape
    for values in (w, tw):
        assert np.max(np.abs(values)) <= bound
        assert np.max(values) > 0.99 * bound and np.min(values) < -0.99 * bound
        assert abs(np.mean(values)) < 5 * bound / math.sqrt(3 * values.size)
        assert abs(np.var(values) / (bound ** 2 / 3) - 1) < 0.05
    assert abs(np.var(w) / np.var(tw) - 1) < 0.06
    b = layer._params["bias"].data
    assert np.max(np.abs(b)) <= bound and np.std(b) > bound / 4
    assert layer._params["weight"].data.dtype == np.float32  # float32 until built otherwise


def test_manual_seed_gives_the_same_weights_twice():
    hn.manual_seed(123)
    first = lenet5().state_dict()
    hn.manual_seed(123)
    second = lenet5().state_dict()
    hn.manual_seed(124)
    other = lenet5().state_dict()
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
        assert not np.array_equal(first[k], other[k])
    hn.manual_seed(123)
    a, b = hn.Dense(5, 5), hn.Dense(5, 5)  # the stream moves on from layer to layer
    assert not np.array_equal(a._params["weight"].data, b._params["weight"].data)


def test_reset_parameters_draws_again_from_a_given_generator():
    model = small_net()
    before = model.state_dict()
    model.reset_parameters(np.random.default_rng(1))
    once = model.state_dict()
    model.reset_parameters(np.random.default_rng(1))
    for k in before:
        assert not np.array_equal(before[k], once[k])
        np.testing.assert_array_equal(once[k], model.state_dict()[k])
