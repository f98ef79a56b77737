"""``hn.save_model(model, path)``: a model alone, without a Trainer, in the checkpoint format.

This module owns saving a built model by itself: its weights and buffers, its
architecture (:mod:`hetero_nn.layers.registry`), input shape, dtype and dropout state, in
a ``.npz`` checkpoint (:mod:`.checkpoint`) with no optimizer and no progress, written
atomically (a temporary name in the target's folder, flushed, then renamed), so
:func:`hetero_nn.load_model` rebuilds it and ``hetero-nn evaluate`` reads it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..layers.dropout import dropout_state
from ..layers.time import RateEncode
from .checkpoint import model_architecture, write_checkpoint

__all__ = ["save_model"]


def save_model(model, path) -> Path:
    """Write ``model`` (built) to ``path``; :func:`hetero_nn.load_model` reads it back.

    >>> import tempfile, os, numpy as np, hetero_nn as hn
    >>> model = hn.Sequential(hn.Flatten(), hn.Linear(4, 2))
    >>> _ = model.build((4,), "float64")
    >>> path = hn.save_model(model, os.path.join(tempfile.mkdtemp(), "model.npz"))
    >>> x = np.ones((1, 4))
    >>> bool((hn.load_model(path)(x) == model(x)).all())
    True
    """
    shape = getattr(model, "input_shape", None)
    if shape is None:
        raise ConfigError(f"save_model: {type(model).__name__} is not built; call "
                          "model.build(input_shape, dtype) (or train it) first")
    config = {"input_shape": list(shape), "dtype": model.dtype.name,
              "dropout": dropout_state(model), "rate_encode": dropout_state(model, RateEncode)}
    spec = getattr(model, "spec", None)
    if spec is not None:
        config["model"] = dict(spec)
    return write_checkpoint(path, model_state=model.state_dict(), config=config,
                            architecture=model_architecture(model))
