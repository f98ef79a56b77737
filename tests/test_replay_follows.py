"""Replay follows every change: a setting changed between steps reaches the next step.

Each case trains two steps, changes one thing (the loss, clipping, a layer's setting,
an optimizer hyper-parameter outside any schedule, the model's mode), and trains two
more. The replaying trainer must end on the bits of a trainer that submits every step
(the truth: nothing is cached there), and on other bits than a run without the change
(so the change mattered). Changes baked into task parameters capture a new graph
(the step key holds every layer's ``settings()``, the loss's, the clipping norm);
those the optimizer keeps in its hyper handle update the step inputs of the same graph.
"""

import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers.base import constructor_names, settings_signature
from hetero_nn.layers.loss import SoftmaxCrossEntropy

SHAPE = (1, 12, 12)
BATCH = 8


def _model():
    hn.manual_seed(11)
    return hn.Sequential(hn.Conv2D(1, 3, 3), hn.BatchNorm2D(3, momentum=0.2),
                         hn.LeakyReLU(0.1), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dropout(0.2, seed=5), hn.Dense(75, 10))


def _layer(model, kind):
    return next(m for m in model.modules() if isinstance(m, kind))


#: name -> (optimizer factory, change(trainer), graphs a replaying run captures)
CHANGES = {
    "loss setting": ("sgd", lambda t: setattr(t.loss, "label_smoothing", 0.3), 2),
    "loss object": ("sgd", lambda t: setattr(t, "loss", SoftmaxCrossEntropy(reduction="sum")), 2),
    "clipping": ("sgd", lambda t: setattr(t, "clip_grad_norm", 0.05), 2),
    "Dropout.p": ("sgd", lambda t: setattr(_layer(t.model, hn.Dropout), "p", 0.6), 2),
    "LeakyReLU slope": ("sgd", lambda t: setattr(_layer(t.model, hn.LeakyReLU),
                                                 "negative_slope", 0.5), 2),
    "BatchNorm2D momentum": ("sgd", lambda t: setattr(_layer(t.model, hn.BatchNorm2D),
                                                      "momentum", 0.9), 2),
    "eval mode": ("sgd", lambda t: t.model.eval(), 2),
    "SGD weight decay": ("sgd", lambda t: setattr(t.optimizer, "weight_decay", 0.1), 2),
    "SGD dampening": ("sgd", lambda t: setattr(t.optimizer, "dampening", 0.5), 2),
    "SGD lr": ("sgd", lambda t: setattr(t.optimizer, "lr", 0.3), 1),
    "SGD momentum": ("sgd", lambda t: setattr(t.optimizer, "momentum", 0.3), 1),
    "Adam eps": ("adam", lambda t: setattr(t.optimizer, "eps", 1e-2), 2),
    "Adam betas": ("adam", lambda t: setattr(t.optimizer, "betas", (0.5, 0.6)), 1),
}


def _optimizer(kind):
    return (hn.optim.SGD(lr=0.05, momentum=0.9) if kind == "sgd"
            else hn.optim.Adam(lr=1e-2))


def _run(name, replay, change=True):
    """The digest of every weight and buffer after 2 steps, the change, 2 steps; and the
    graphs captured."""
    kind, apply, _ = CHANGES[name]
    model = _model()
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((BATCH, *SHAPE)), rng.integers(0, 10, BATCH))
               for _ in range(4)]
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=_optimizer(kind), runtime=rt, batch_size=BATCH,
                             granularity=2, dtype="float64", replay=replay)
        for i, (x, y) in enumerate(batches):
            if i == 2 and change:
                apply(trainer)
            trainer.train_step(x, y)
        state = {**model.state_dict(),
                 **{f"{p}.{b}": a for p, st in trainer.optimizer.state_dict()["state"].items()
                    for b, a in st.items()}}
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode() + np.ascontiguousarray(state[key]).tobytes())
    return digest.hexdigest(), trainer.graphs_captured


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_the_step_after_a_change_uses_it(name):
    replayed, captured = _run(name, replay=True)
    submitted, _ = _run(name, replay=False)
    unchanged, _ = _run(name, replay=False, change=False)
    assert replayed == submitted, f"{name}: the replaying trainer missed the change"
    assert submitted != unchanged, f"{name}: the change has no effect (the test tests nothing)"
    assert captured == CHANGES[name][2]


def test_settings_are_the_constructor_arguments_kept_as_attributes():
    class Scaled(hn.ReLU):  # a new layer: no key code of its own
        def __init__(self, factor=2.0, *args, name="s", **kwargs):
            super().__init__()
            self.factor = factor
            self.name = name

    layer = Scaled(3.0)
    assert constructor_names(Scaled) == ("factor", "name")
    before = layer.settings()
    assert before == (Scaled, (("factor", 3.0), ("name", "s")))
    layer.factor = 4.0
    assert layer.settings() != before and hash(layer.settings())
    # unhashable values and arrays still give a hashable signature
    layer.factor = {"a": [1, 2]}
    layer.name = np.zeros((2, 3))
    assert hash(settings_signature(layer))
