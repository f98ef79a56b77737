"""``model(x)``: the outputs of a NumPy batch, in the mode set, equal to the torch twin's;
on the runtime a trainer bound the model to, else on the package's default runtime
(created on first use, reused, closable); ``Sequential`` given layers, a list or an
``OrderedDict`` (names as ``state_dict`` prefixes, as torch's)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.scheduler import default
from helpers import rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks need it")
from twins import torch_twin  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _no_default_runtime_left():
    hn.close_default_runtime()
    yield
    hn.close_default_runtime()


def small_model():
    hn.manual_seed(4)
    return hn.Sequential(hn.Conv2D(2, 4, 3, padding=1), hn.BatchNorm2D(4), hn.ReLU(),
                         hn.Residual([hn.Conv2D(4, 4, 3, padding=1), hn.BatchNorm2D(4)]),
                         hn.GlobalAvgPool2D(), hn.Flatten(), hn.Dense(4, 3))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_model_call_equals_torch_in_the_mode_set(mode):
    model = small_model()
    model.build((2, 6, 6), "float64")
    twin = torch_twin(model, "float64")
    getattr(model, mode)()
    getattr(twin, mode)()
    x = np.random.default_rng(0).standard_normal((5, 2, 6, 6))
    for _ in range(2):  # train mode: running statistics move as torch's
        y = model(x)
        with torch.no_grad():
            expected = twin(torch.from_numpy(x)).numpy()
        assert y.shape == (5, 3) and y.dtype == np.float64
        assert rel_err(y, expected) <= 1e-10
    state = model.state_dict()
    for key, value in twin.state_dict().items():
        assert rel_err(state[key], value.numpy()) <= 1e-10, key


def test_default_runtime_is_made_once_reused_and_closable():
    assert default._runtime is None
    model = small_model().eval()
    x = np.ones((2, 2, 5, 5), np.float32)
    first = model(x)
    rt = hn.default_runtime()
    assert not rt.closed and first.dtype == np.float32  # built for x, in float32
    assert np.array_equal(model(x), first) and hn.default_runtime() is rt
    assert hn.ReLU()(-x).max() == 0  # a single layer is callable too
    hn.close_default_runtime()
    assert rt.closed
    assert np.array_equal(model(x), first)  # rebinds to a new default runtime
    assert hn.default_runtime() is not rt


def test_model_bound_by_a_trainer_runs_on_its_runtime():
    model = small_model()
    data = (np.random.default_rng(1).standard_normal((8, 2, 5, 5)).astype(np.float32),
            np.arange(8) % 3)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
            hn.Trainer(model, runtime=rt, batch_size=4) as trainer:
        trainer.fit(data, epochs=1, verbose=0)
        with hn.layers.evaluating(model):
            logits = model(data[0])
        assert default._runtime is None  # the trainer's runtime ran it
        assert np.array_equal(logits.argmax(1), trainer.predict(data[0]))


def test_a_user_runtime_can_be_the_default():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        hn.set_default_runtime(rt)
        assert hn.default_runtime() is rt
        hn.ReLU()(np.ones((1, 3)))
        hn.close_default_runtime()  # not the package's: left open
        assert not rt.closed


def test_model_call_refuses_a_batch_less_array():
    with pytest.raises(hn.ShapeError, match=r"Sequential\(x\): expected a batch"):
        small_model()(np.ones(5))


# --------------------------------------------------------------------------- Sequential

def test_sequential_takes_layers_a_list_or_an_ordered_dict_named_as_torch():
    hn.manual_seed(0)
    layers = OrderedDict([("conv", hn.Conv2D(1, 2, 3)), ("bn", hn.BatchNorm2D(2)),
                          ("act", hn.ReLU()), ("flat", hn.Flatten()), ("fc", hn.Linear(8, 2))])
    named = hn.Sequential(layers)
    twin = torch.nn.Sequential(OrderedDict([
        ("conv", torch.nn.Conv2d(1, 2, 3)), ("bn", torch.nn.BatchNorm2d(2)),
        ("act", torch.nn.ReLU()), ("flat", torch.nn.Flatten()), ("fc", torch.nn.Linear(8, 2))]))
    named.build((1, 4, 4))
    assert list(named.state_dict()) == list(twin.state_dict())
    assert named.fc is layers["fc"] and named[0] is layers["conv"]
    assert [n for n, _ in named.named_children()] == list(layers)
    assert "(conv): Conv2d(" in repr(named)
    listed = hn.Sequential(list(layers.values()))
    assert [n for n, _ in listed.named_parameters()] == \
        [n for n, _ in hn.Sequential(*layers.values()).named_parameters()]
    head = named[3:]
    assert isinstance(head, hn.Sequential) and head.names == ["flat", "fc"] and head.fc is named.fc
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in named.state_dict().items()})
    named.eval(), twin.eval()
    x = np.random.default_rng(0).standard_normal((3, 1, 4, 4)).astype(np.float32)
    with torch.no_grad():
        assert rel_err(named(x), twin(torch.from_numpy(x)).numpy()) <= 1e-5
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        named.nope
    with pytest.raises(hn.ConfigError, match=r"layer name 'a\.b'"):
        hn.Sequential(OrderedDict([("a.b", hn.ReLU())]))
