"""Dropout: a seeded mask that depends on (seed, step, sample, element) only.

Each training-mode forward call is one *step* of the layer; its mask comes from
:func:`hetero_nn.codelets.dropout.dropout_key` of the layer's seed and that step,
and from every element's position in the whole batch, so the same elements drop
whatever the granularity, worker or policy, and a run is reproducible from its
seed. The key reaches the tasks as the data of a small handle (a step input,
registered by each training-mode forward), so a captured step replays every step:
:meth:`Dropout.replayed` counts the step as ``forward`` would and returns the next
key for the trainer to write into the captured handle. In eval mode (or with
``p=0``) the layer is the identity: its input handles flow through, no task.
Checkpoints keep every Dropout's seed and step count (:func:`dropout_state`), so a
resumed run draws the same masks.
"""

from __future__ import annotations

import math
import numbers

from ..codelets.dropout import dropout2d_bwd, dropout2d_fwd, dropout_bwd, dropout_fwd, key_data
from ..errors import CheckpointError, ConfigError, ShapeError
from .base import Layer, default_rng, note_step_input


def dropout_state(model, kind=None) -> dict:
    """``{path: [seed, steps]}`` of every Dropout in ``model``: what a checkpoint keeps so
    a resumed run draws the masks the uninterrupted run would have (JSON-serialisable).
    ``kind``: another class of layers drawing from a seed and a step count (RateEncode)."""
    kind = kind or Dropout
    return {path: [layer.seed, layer.steps] for path, layer in model.named_modules()
            if isinstance(layer, kind)}


def load_dropout_state(model, state: dict, kind=None) -> None:
    """Give every Dropout (or ``kind``) layer of ``model`` the seed and step count ``state``
    holds for its path."""
    kind = kind or Dropout
    layers = {path: layer for path, layer in model.named_modules() if isinstance(layer, kind)}
    if set(layers) != set(state):
        raise CheckpointError(f"{kind.__name__} state for layers {sorted(state)}, the model has "
                              f"{kind.__name__} layers {sorted(layers)}")
    for path, (seed, steps) in state.items():
        layers[path].seed, layers[path].steps = int(seed), int(steps)


class Dropout(Layer):
    """``torch.nn.Dropout(p=0.5, inplace=False)``: zero elements with probability ``p``,
    scale the rest by ``1 / (1 - p)``.

    Parameters
    ----------
    p : float
        Probability of an element being zeroed, in [0, 1].
    inplace : bool
        Accepted for PyTorch's signature; the output is a handle of its own.
    seed : int, optional
        The mask's seed; drawn from the generator :func:`hetero_nn.manual_seed` seeds
        when absent. ``steps`` counts the training-mode forward calls so far.

    >>> Dropout(0.25, seed=0)
    Dropout(p=0.25)
    """

    fwd, bwd = dropout_fwd, dropout_bwd

    def __init__(self, p=0.5, inplace=False, *, seed=None):
        super().__init__()
        name = type(self).__name__
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ConfigError(f"{name}: p must be a probability in [0, 1], got {p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ConfigError(f"{name}: seed must be an integer, got {seed!r}")
        self.p = float(p)
        self.inplace = bool(inplace)
        self.seed = int(default_rng().integers(2 ** 63)) if seed is None else int(seed)
        self.steps = 0
        self._mask = None

    def replayed(self):
        """Count a training-mode forward run by a replay; the data of its key handle."""
        data = key_data(self.seed, self.steps)
        self.steps += 1
        return data

    def forward(self, rt, xs):
        if not self.training or self.p == 0:
            self._mask = None
            return xs
        if self.recomputing and self._mask is not None:  # the step's mask again
            key = self._mask[0]
        else:
            key = note_step_input(self, rt.register(self.replayed(), name="dropout.key"))
        layout = xs[0].shape[1:]  # the input's own (after a Flatten: unflattened)
        ys = self.outputs(rt, xs, shape=layout)
        starts = []
        start = self.batch_span[0] if self.batch_span else 0  # the sample's place in the batch
        kw = self._mask_kw(layout)
        for x, y in zip(xs, ys):
            rt.submit(self.fwd, x, y, key, p=self.p, start=start, **kw)
            starts.append(start)
            start += x.shape[0]
        self._mask = (key, starts, layout)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        if self._mask is None:
            return dys
        key, starts, layout = self._mask
        dxs = self.outputs(rt, dys, shape=layout)
        kw = self._mask_kw(layout)
        for dy, dx, start in zip(dys, dxs, starts):
            rt.submit(self.bwd, dy, dx, key, p=self.p, start=start, **kw)
        return dxs

    def _mask_kw(self, layout):
        """The codelets' parameters besides ``p`` and ``start``, for samples of ``layout``."""
        return {}

    def extra_repr(self):
        return f"p={self.p}"


class Dropout2d(Dropout):
    """``torch.nn.Dropout2d(p=0.5, inplace=False)``: zero whole channels of a sample with
    probability ``p`` (one draw per channel), scale the rest by ``1 / (1 - p)``.

    Samples are ``(C, H, W)``, or ``(C, L)`` (PyTorch's 3-D input, channel-wise). The
    mask depends on (seed, step, sample, channel) only, as Dropout's.

    >>> Dropout2d(0.2, seed=0)
    Dropout2d(p=0.2)
    """

    fwd, bwd = dropout2d_fwd, dropout2d_bwd

    def infer_shape(self, input_shape):
        if len(input_shape) not in (2, 3):
            raise ShapeError(f"Dropout2d: expects samples (C, H, W) or (C, L), got "
                             f"{tuple(input_shape)}")
        return input_shape

    def _mask_kw(self, layout):
        return {"block": math.prod(layout[1:])}
