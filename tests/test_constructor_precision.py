"""Every layer keeps the values it was constructed with at the model's dtype, not through
float32 (issue 30, item 3): built in float64, each stored value equals the Python value."""

import inspect

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers import base

L = hn.layers
# Values float32 cannot hold exactly, for every float constructor argument of the layers.
EXAMPLES = [
    (lambda: L.LIF(0.9, threshold=0.7, slope=25.3), (3, 4), {"beta": 0.9, "threshold": 0.7,
                                                              "slope": 25.3}),
    (lambda: L.LIF(0.9, threshold=0.7, learn_beta=True, learn_threshold=True), (3, 4),
     {"beta": 0.9, "threshold": 0.7}),
    (lambda: L.BatchNorm2d(2, eps=1.1e-5, momentum=0.3), (2, 4, 4),
     {"eps": 1.1e-5, "momentum": 0.3}),
    (lambda: L.BatchNorm1d(4, eps=1.1e-5, momentum=0.3), (4,), {"eps": 1.1e-5, "momentum": 0.3}),
    (lambda: L.LayerNorm(4, eps=1.1e-5), (4,), {"eps": 1.1e-5}),
    (lambda: L.Dropout(0.3), (4,), {"p": 0.3}),
    (lambda: L.Dropout2d(0.3), (2, 4, 4), {"p": 0.3}),
    (lambda: L.LeakyReLU(0.1), (4,), {"negative_slope": 0.1}),
]
LOSSES = [(L.SoftmaxCrossEntropy(label_smoothing=0.1), {"label_smoothing": 0.1}),
          (hn.losses.MembraneCrossEntropy(threshold=0.7), {"threshold": 0.7})]


def _built(make, shape):
    layer = make()
    if isinstance(layer, L.LIF):  # a LIF sees a time axis: after Repeat
        L.Sequential(L.Repeat(shape[0]), layer).build(shape[1:], "float64")
    else:
        layer.build(shape, "float64")
    return layer


@pytest.mark.parametrize("make, shape, values", EXAMPLES)
def test_every_stored_constructor_value_equals_the_python_value_in_float64(make, shape, values):
    layer = _built(make, shape)
    for name, value in values.items():
        stored = getattr(layer, name)
        assert stored == value, f"{type(layer).__name__}.{name} = {stored!r}, given {value!r}"
    for name, state in layer.named_state():
        if name == "num_batches_tracked":  # a count
            continue
        assert state.data.dtype == np.float64, name
        if state.data.ndim == 0:  # LIF's beta and threshold: the arrays the tasks read
            assert state.data.item() == values[name], name


@pytest.mark.parametrize("loss, values", LOSSES)
def test_the_losses_keep_their_values(loss, values):
    for name, value in values.items():
        assert getattr(loss, name) == value


def test_a_loaded_beta_is_kept_when_the_model_is_built_in_another_dtype():
    lif = L.LIF(0.9)
    lif.load_state_dict({"beta": np.array(0.8, np.float32), "threshold": np.array(1.0)})
    L.Sequential(L.Repeat(2), lif).build((3,), "float64")
    assert lif.beta == float(np.float32(0.8))  # the loaded value, not the given one


def test_every_layer_with_a_float_argument_is_covered():
    """A new layer with a float constructor argument must join EXAMPLES."""
    covered = {type(make()).__name__ for make, _, _ in EXAMPLES}
    for name in L.__all__:
        cls = getattr(L, name)
        if not (inspect.isclass(cls) and issubclass(cls, base.Layer)):
            continue
        floats = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if isinstance(p.default, float) or p.name in ("beta", "threshold")]
        assert not floats or cls.__name__ in covered, (cls.__name__, floats)
