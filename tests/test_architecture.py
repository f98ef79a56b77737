"""Models as data (``hetero_nn.layers.registry``): every package layer, nested containers
and named layers recorded as JSON and rebuilt to the same model; custom classes through
``hn.layers.register``; what cannot be recorded or rebuilt says so in one line."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers import registry


def every_layer_model():
    return hn.Sequential(OrderedDict([
        ("stem", hn.Conv2D(3, 4, 3, padding=1, bias=False)),
        ("bn", hn.BatchNorm2d(4, momentum=None)),
        ("act", hn.SiLU(inplace=True)),
        ("block", hn.Residual([hn.Conv2D(4, 4, 3, padding=(1, 1)), hn.BatchNorm2D(4),
                               hn.Hardswish(), hn.Dropout2d(0.1, seed=3)],
                              shortcut=hn.Sequential(hn.Identity()))),
        ("pool", hn.MaxPool2D(2)), ("avg", hn.AvgPool2D(2, stride=1)),
        ("ln", hn.LayerNorm((4, 3, 3), eps=1e-3, bias=False)), ("gap", hn.GlobalAvgPool2D()),
        ("flat", hn.Flatten()), ("fc", hn.Linear(4, 8)), ("bn1", hn.BatchNorm1d(8)),
        ("r6", hn.ReLU6()), ("lr", hn.LeakyReLU(0.2)), ("gelu", hn.GELU()), ("tanh", hn.Tanh()),
        ("sig", hn.Sigmoid()), ("drop", hn.Dropout(0.25, seed=1)), ("out", hn.Dense(8, 5)),
        ("sm", hn.Softmax(dim=-1))]), fuse=False)


def test_every_package_layer_round_trips_through_json():
    model = every_layer_model()
    model.build((3, 8, 8), "float64")
    document = json.loads(json.dumps(registry.architecture(model)))
    rebuilt = registry.build(document)
    rebuilt.build((3, 8, 8), "float64")
    assert repr(rebuilt) == repr(model) and rebuilt.fuse is False
    assert [n for n, _ in rebuilt.named_state()] == [n for n, _ in model.named_state()]
    rebuilt.load_state_dict(model.state_dict())
    model.eval(), rebuilt.eval()
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8))
    assert np.array_equal(model(x), rebuilt(x))
    hn.close_default_runtime()


def test_the_record_is_the_current_model_and_readable():
    model = hn.Sequential(hn.Linear(3, 2))
    model.layers.append(hn.ReLU())  # changed after construction: recorded as it is now
    model.names.append("1")
    spec = registry.to_spec(model)
    assert spec == {"class": "Sequential",
                    "args": [{"class": "Linear", "args": [3, 2], "kwargs": {}},
                             {"class": "ReLU", "args": [], "kwargs": {}}],
                    "kwargs": {"fuse": True}}


class Scale(hn.layers.Layer):
    """A custom layer with arguments of its own (a number, a keyword tuple); its tasks are none."""

    def __init__(self, factor, *, channels=(1, 2)):
        super().__init__()
        self.factor, self.channels = factor, channels

    def forward(self, rt, xs):
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys


def test_custom_layers_take_part_once_registered():
    model = hn.Sequential(hn.Linear(2, 2), Scale(0.5, channels=(3, 4)))
    document = json.loads(json.dumps(registry.architecture(model)))
    qualified = f"{__name__}.Scale"
    assert document["model"]["args"][1]["class"] == qualified
    with pytest.raises(hn.ConfigError) as info:
        registry.build(document)
    assert str(info.value) == (f"unknown layer class {qualified!r}: not a hetero_nn layer; "
                               "register it with hn.layers.register(Scale) before loading")
    hn.layers.register(Scale)
    try:
        document = json.loads(json.dumps(registry.architecture(model)))
        assert document["model"]["args"][1] == {"class": "Scale", "args": [0.5],
                                                "kwargs": {"channels": {"tuple": [3, 4]}}}
        rebuilt = registry.build(document)
        assert rebuilt[1].factor == 0.5 and rebuilt[1].channels == (3, 4)
        with pytest.raises(hn.ConfigError, match="already"):
            hn.layers.register(Scale, name="Linear")
    finally:
        registry._registered.pop("Scale")


def test_what_cannot_be_recorded_names_the_layer_and_argument():
    model = hn.Sequential(hn.ReLU(), Scale(lambda x: x))
    with pytest.raises(hn.ConfigError, match=r"cannot record model\.1 \(Scale\) argument 0: "
                                             r"a function is not data"):
        registry.architecture(model)
    with pytest.raises(hn.ConfigError, match="architecture format"):
        registry.build({"format": "something else"})
    with pytest.raises(hn.ConfigError, match="cannot rebuild Linear"):
        registry.from_spec({"class": "Linear", "args": [], "kwargs": {"nope": 1}})
