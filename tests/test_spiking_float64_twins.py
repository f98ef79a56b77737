"""Float64 spiking networks equal their snnTorch float64 twins built from the same Python
values (``beta=0.9``, not a float32-rounded 0.8999999761581421): losses and weights
within 1e-12 over 5 Adam steps, a spiking MLP and a spiking CNN, granularity 1 and 3
(issue 30, item 3; tests/snn_twins.py has the twins)."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the snnTorch cross-checks need it")
pytest.importorskip("snntorch", reason="snnTorch is optional; the cross-checks against it need it")

from snn_twins import snn_twin  # noqa: E402  (imports torch)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = hn.layers
SHAPE, BATCH, STEPS, T, LR, SEED = (1, 28, 28), 6, 5, 8, 5e-4, 7


def mlp():
    """784-64-10, T=8, the issue's network (beta 0.9, thresholds float32 cannot hold)."""
    return [L.Flatten(), L.Dense(784, 64), L.Repeat(T), L.LIF(0.9, threshold=0.7),
            L.Dense(64, 10), L.LIF(0.9, output="membrane")]


def cnn():
    return [L.Conv2D(1, 4, 5), L.MaxPool2D(2), L.Repeat(T), L.LIF(0.9), L.Conv2D(4, 8, 5),
            L.MaxPool2D(2), L.LIF(0.85, threshold=0.9), L.Flatten(), L.Dense(128, 10),
            L.LIF(0.9, output="membrane")]


AMPLITUDE = {mlp: 2.0, cnn: 4.0}


def build(layers):
    model = L.Sequential(*layers())
    model.build(SHAPE, "float64")
    model.reset_parameters(np.random.default_rng(SEED))
    return model


def batches(scale):
    rng = np.random.default_rng(SEED)
    return [(np.where(rng.random((BATCH, *SHAPE)) < 0.3, scale * rng.random((BATCH, *SHAPE)),
                      0.0), rng.integers(0, 10, BATCH)) for _ in range(STEPS)]


def twin_of(model):
    """snn_twin with each neuron's beta and threshold the Python values the LIF was given."""
    twin = snn_twin(model, "float64")
    for i, layer in enumerate(model):
        if isinstance(layer, L.LIF):
            neuron = twin.layers[str(i)]
            neuron.beta.fill_(layer._given["beta"])
            neuron.threshold.fill_(layer._given["threshold"])
    return twin


@pytest.mark.parametrize("granularity", [1, 3])
@pytest.mark.parametrize("layers", [mlp, cnn], ids=["mlp", "cnn"])
def test_float64_network_equals_snntorch_float64_twin_to_1e12(layers, granularity):
    data = batches(AMPLITUDE[layers])
    reference = build(layers)
    twin = twin_of(reference)
    opt = torch.optim.Adam(twin.parameters(), lr=LR)
    twin_losses, rates = [], []
    for x, y in data:
        opt.zero_grad()
        out, records = twin(torch.from_numpy(x))
        loss = sum(torch.nn.functional.cross_entropy(out[:, t], torch.from_numpy(y))
                   for t in range(out.shape[1]))
        loss.backward()
        opt.step()
        twin_losses.append(loss.item())
        rates.append([float(spikes.detach().mean()) for spikes, _ in records.values()])
    assert all(0.0 < r < 1.0 for r in rates[0][:-1]), rates[0]  # the hidden layers spike

    model = build(layers)
    assert [lif.beta for lif in model if isinstance(lif, L.LIF)][0] == 0.9
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.MembraneCrossEntropy(), hn.optim.Adam(lr=LR), rt,
                             batch_size=BATCH, granularity=granularity)
        losses = [trainer.train_step(x, y) for x, y in data]
    np.testing.assert_allclose(losses, twin_losses, rtol=1e-12, atol=0)
    weights = {k.split(".", 1)[1]: v.detach().numpy() for k, v in twin.named_parameters()}
    state = model.state_dict()
    for key, value in weights.items():
        assert rel_err(state[key], value) <= 1e-12, (key, rel_err(state[key], value))
