"""The built-in spiking networks, as snnTorch's tutorials train them on MNIST.

``snn-mlp``: 784-1000-10 fully connected, ``beta = 0.95``; ``snn-conv``: Conv 12@5,
MaxPool 2, LIF; Conv 64@5, MaxPool 2, LIF; Linear 1024->10, LIF; ``beta = 0.5``. Both run
``time_steps`` steps (25) and end with a LIF whose output is its membrane, for
:class:`~hetero_nn.losses.MembraneCrossEntropy` (:data:`LOSSES`).

Encodings: ``"rate"`` puts :class:`~hetero_nn.layers.RateEncode` first (Bernoulli spikes
from the intensities, which should lie in [0, 1]); ``"direct"`` feeds the image at every
step through :class:`~hetero_nn.layers.Repeat`, placed after the layers before the first
LIF: those see the same image at every step, so they run once and their output is
repeated (the same values as running them per step, a ``T``-th of the work).
"""

from __future__ import annotations

import math

from .errors import ConfigError
from .layers import LIF, Conv2D, Dense, Flatten, MaxPool2D, RateEncode, Repeat, Sequential
from .layers.spike_loss import MembraneCrossEntropy

ENCODINGS = ("direct", "rate")
OPTIONS = ("time_steps", "encoding", "rate_seed")  # what build_model passes a spiking builder


def _encoded(head, rest, time_steps, encoding, rate_seed):
    """``head`` (the layers before the first LIF) and ``rest`` with the encoder placed."""
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    if encoding == "direct":
        return [*head, Repeat(time_steps), *rest]
    return [RateEncode(time_steps, seed=rate_seed), *head, *rest]


def snn_mlp(input_shape, num_classes=10, *, time_steps=25, encoding="direct", rate_seed=None):
    """Flatten, Linear(784, 1000), LIF(0.95), Linear(1000, K), LIF(0.95, output="membrane")."""
    head = [Flatten(), Dense(math.prod(input_shape), 1000)]
    rest = [LIF(0.95), Dense(1000, num_classes), LIF(0.95, output="membrane")]
    return _encoded(head, rest, time_steps, encoding, rate_seed)


def snn_conv(input_shape, num_classes=10, *, time_steps=25, encoding="direct", rate_seed=None):
    """Conv 12@5, MaxPool 2, LIF; Conv 64@5, MaxPool 2, LIF; Linear(., K), LIF (beta 0.5)."""
    head = [Conv2D(input_shape[0], 12, 5), MaxPool2D(2)]
    body = [Conv2D(12, 64, 5), MaxPool2D(2)]
    features = math.prod(Sequential(*head, *body).build(input_shape))
    rest = [LIF(0.5), *body, LIF(0.5), Flatten(), Dense(features, num_classes),
            LIF(0.5, output="membrane")]
    return _encoded(head, rest, time_steps, encoding, rate_seed)


#: Model name -> builder; each takes ``time_steps``, ``encoding`` and ``rate_seed``.
SPIKING_MODELS = {"snn-mlp": snn_mlp, "snn-conv": snn_conv}


def spiking_loss(name):
    """The loss the spiking model ``name`` trains with (None for the other models)."""
    return MembraneCrossEntropy() if name in SPIKING_MODELS else None


def intensities(*datasets) -> None:
    """Give ``datasets`` (Dataset objects) pixels scaled to [0, 1] and no further
    normalisation, as snnTorch's tutorials feed their spiking networks (``ToTensor``):
    what rate coding needs, and what the direct encoding was tuned on. Mutates them."""
    for data in datasets:
        data.mean = (0.0,) * len(data.mean)
        data.std = (1.0,) * len(data.std)
