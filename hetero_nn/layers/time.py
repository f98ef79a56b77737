"""The time axis of spiking networks: the layers that make it, and per-step layers over it.

Layout: a spiking network's activations are ``(N, T, ...)`` -- batch first, so the batch
partitions stay the unit of parallelism, then time, then the sample's own shape. Samples
are checked and reported as ``(T, ...)`` (``input_shape``, ``output_shape``, ``summary``).

Three kinds of layers meet the time axis (:func:`build_layer`, called by
:meth:`Sequential.build <hetero_nn.layers.Sequential.build>` for every layer, says which
is which):

- *makers*: :class:`Repeat` (direct encoding) and :class:`RateEncode` (Bernoulli spikes)
  take static samples ``(...)`` and give ``(T, ...)``;
- *scanners*: layers that see a sample's whole time axis (``through_time = True``:
  :class:`~hetero_nn.layers.LIF`), one task per partition scanning all ``T`` steps;
- every other layer after a maker is applied *per time step*: it is built on the step's
  shape, then its shapes (and those of the layers inside it) get the leading ``T``, and its
  tasks see the ``(n, T, ...)`` partitions *folded* into ``(n * T, ...)``: the step
  becomes part of the batch, which is exact for layers that treat samples independently.

Folding is one mechanism for every per-step layer: :func:`runtime_for` gives such a layer
a :class:`PerStep` view of the runtime whose ``submit`` replaces each codelet by its
:func:`stepwise` twin, which reshapes the operands that are batch data (every operand
whose second axis is the time axis, except the layer's parameters, buffers and
gradients) with a view before calling the variant. The layers' own code is unchanged.
Two exceptions: a Dropout layer takes its ``(n, T, ...)`` samples whole (its mask counts
samples, and a sample's steps each get their own elements), and a layer whose samples
interact (batch normalisation) is refused: folding would pool its statistics over steps,
which a per-step application does not.

The build also follows whether the activations are spikes (:class:`Axis`: after
RateEncode or a spiking LIF, through layers that keep zeros zero); a per-step Dense fed
by spikes gets a :class:`~hetero_nn.layers.events.SpikeInput`, and its ``PerStep`` view
submits the event-driven codelets in place of the dense ones (:mod:`hetero_nn.layers.events`).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

from ..codelets._checks import positive_int
from ..codelets.codelet import Codelet
from ..codelets.dropout import key_data
from ..codelets.encode import rate_encode, repeat_bwd, repeat_fwd
from ..codelets.prepared import calls_of
from ..codelets.reduce import fill_zero
from ..errors import ConfigError, ShapeError
from .base import Layer, default_rng, note_step_input
from .dense import Dense, Flatten
from .dropout import Dropout
from .events import SpikeInput
from .normalization import BatchNorm1d, BatchNorm2d
from .pool import MaxPool2D

__all__ = ["Repeat", "RateEncode", "Axis", "PerStep", "build_layer", "runtime_for", "stepwise"]


class Repeat(Layer):
    """Feed a static sample at every one of ``T`` time steps: ``(...)`` -> ``(T, ...)``.

    The direct encoding of snnTorch's tutorials. Layers that treat every step alike may
    come before it (a convolution of a static image is the same at every step: computing
    it once, then repeating, gives the same values for a ``T``-th of the work).

    >>> Repeat(25)
    Repeat(25)
    """

    makes_time = True

    def __init__(self, time_steps):
        super().__init__()
        self.time_steps = positive_int(time_steps, "time_steps", "Repeat")

    def infer_shape(self, input_shape):
        return (self.time_steps, *input_shape)

    def forward(self, rt, xs):
        ys = self.outputs(rt, xs)
        for x, y in zip(xs, ys):
            rt.submit(repeat_fwd, x, y)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for dy, dx in zip(dys, dxs):
            rt.submit(repeat_bwd, dy, dx)
        return dxs

    def extra_repr(self):
        return str(self.time_steps)


class RateEncode(Layer):
    """Rate coding: Bernoulli spikes at each of ``T`` steps with probability ``clamp(x, 0, 1)``.

    snnTorch's ``spikegen.rate``, drawn by a counter-based generator: a spike depends on
    (seed, step count, sample, time step, element) only, so the same spikes come at any
    granularity, worker or policy (:mod:`hetero_nn.codelets.encode`). In training mode
    each forward call is a new step (``steps`` counts them, and checkpoints keep it); in
    eval mode every call draws with one fixed key, so evaluating a batch twice gives the
    same spikes and never moves the training draws. No gradient flows to the intensities.

    Parameters
    ----------
    time_steps : int
    seed : int, optional
        Drawn from the generator :func:`hetero_nn.manual_seed` seeds when absent.

    >>> RateEncode(25, seed=0)
    RateEncode(25, seed=0)
    """

    makes_time = True
    EVAL_STEP = -1  # the key of eval-mode draws: a step count training never reaches

    def __init__(self, time_steps, seed=None):
        super().__init__()
        self.time_steps = positive_int(time_steps, "time_steps", "RateEncode")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ConfigError(f"RateEncode: seed must be an integer, got {seed!r}")
        self.seed = int(default_rng().integers(2 ** 63)) if seed is None else int(seed)
        self.steps = 0

    def infer_shape(self, input_shape):
        return (self.time_steps, *input_shape)

    def replayed(self):
        """Count a training-mode forward run by a replay; the data of its key handle."""
        data = key_data(self.seed, self.steps)
        self.steps += 1
        return data

    def forward(self, rt, xs):
        if self.training:
            key = note_step_input(self, rt.register(self.replayed(), name="rate.key"))
        else:  # a constant of the graph: nothing to write before a replay
            key = rt.register(key_data(self.seed, self.EVAL_STEP), name="rate.key")
        ys = self.outputs(rt, xs)
        start = 0
        for x, y in zip(xs, ys):
            rt.submit(rate_encode, x, key, y, start=start)
            start += x.shape[0]
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        for dx in dxs:  # a Bernoulli draw has no gradient (torch.bernoulli's is zero)
            rt.submit(fill_zero, dx)
        return dxs

    def extra_repr(self):
        return f"{self.time_steps}, seed={self.seed}"


# --------------------------------------------------------------------------- build

class Axis(NamedTuple):
    """The time axis where a layer is built: its steps, and whether the activations there
    are spikes (mostly zeros: after RateEncode or a spiking LIF, through the layers that
    keep zeros zero)."""

    steps: int
    spikes: bool


_KEEP_SPIKES = (Flatten, MaxPool2D, Dropout)  # zeros stay zeros (Dropout scales the rest)


def build_layer(layer, shape, dtype, axis):
    """Build ``layer`` for samples ``shape`` in a network whose time axis is ``axis`` (None
    before a maker); returns ``(output shape, the axis after it)``."""
    for module in layer.modules():
        module.per_step = None
    if isinstance(layer, Dense):
        layer.spike_input = None
    if getattr(layer, "makes_time", False):
        if axis is not None:
            raise ShapeError(f"{type(layer).__name__} makes a time axis, but its input "
                             f"{tuple(shape)} already has one ({axis.steps} steps)")
        out = layer.build(shape, dtype)
        return out, Axis(layer.time_steps, isinstance(layer, RateEncode))
    if getattr(layer, "through_time", False):
        layer.time_steps = None if axis is None else axis.steps
        out = layer.build(shape, dtype)
        return out, axis and Axis(axis.steps, getattr(layer, "output", None) == "spikes")
    if axis is None:
        return layer.build(shape, dtype), None
    for module in layer.modules():
        if isinstance(module, (BatchNorm1d, BatchNorm2d)):
            raise ShapeError(f"{type(module).__name__} after the time axis: its batch statistics "
                             f"would pool every time step; spiking networks here apply layers "
                             f"per step")
    out = layer.build(shape[1:], dtype)
    for module in layer.modules():
        module.input_shape = (axis.steps, *module.input_shape)
        module.output_shape = (axis.steps, *module.output_shape)
        module.per_step = axis.steps
    if isinstance(layer, Dense) and axis.spikes:
        layer.spike_input = SpikeInput()
    return layer.output_shape, Axis(axis.steps, axis.spikes and isinstance(layer, _KEEP_SPIKES))


# --------------------------------------------------------------------------- folding

class PerStep:
    """The runtime as a per-step layer sees it (see the module docstring): ``submit`` folds
    the time axis of the batch operands into the batch; everything else is the runtime's."""

    __slots__ = ("runtime", "time_steps", "own", "events")

    def __init__(self, runtime, time_steps, own, events=None):
        self.runtime = runtime
        self.time_steps = time_steps
        self.own = own  # ids of the layer's parameter, buffer and gradient handles
        self.events = events  # a Dense layer's SpikeInput: its codelets take spikes

    def submit(self, codelet, *handles, **params):
        if self.events is not None:
            codelet, handles, params = self.events.substitute(self.runtime, codelet, handles,
                                                              params)
        steps = self.time_steps
        fold = tuple(i for i, h in enumerate(handles)
                     if id(h) not in self.own and len(h.shape) >= 2 and h.shape[1] == steps)
        return self.runtime.submit(stepwise(codelet, fold) if fold else codelet, *handles,
                                   **params)

    def __getattr__(self, name):
        return getattr(self.runtime, name)


def _modules(block):
    """The layers of a block: a layer and those inside it, or a fused run's layers."""
    return block.modules() if isinstance(block, Layer) else list(block.layers)


def runtime_for(rt, block):
    """``rt``, or a :class:`PerStep` view of it when ``block`` is applied per time step."""
    layers = _modules(block)
    steps = getattr(layers[0], "per_step", None)
    if steps is None or isinstance(layers[0], Dropout):
        return rt
    own = {id(h) for layer in layers for _, p in layer.named_state()
           for h in (p.handle, p.grad) if h is not None}
    events = getattr(layers[0], "spike_input", None)
    if events is not None:
        events.begin(rt)
    return PerStep(rt, steps, own, events)


_STEPWISE: dict = {}


def _folded(a):
    """``(n, T, ...)`` as ``(n * T, ...)``: a view (the arena's partitions are contiguous)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"operand of shape {a.shape} is not C-contiguous: its time axis "
                         f"cannot be folded into the batch with a view")
    return a.reshape((a.shape[0] * a.shape[1], *a.shape[2:]))


def stepwise(codelet: Codelet, fold) -> Codelet:
    """``codelet`` on operands whose time axis is folded into the batch: the operands at the
    positions ``fold`` are given to the variants as ``(n * T, ...)`` views of their
    ``(n, T, ...)`` arrays. Same name, modes, REDUX pair and cost (of the folded shapes), so
    the pinned table, the traces and the performance model's regression treat it as the
    codelet it is. Memoized per ``(codelet, fold)``."""
    fold = tuple(fold)
    key = (codelet, fold)
    twin = _STEPWISE.get(key)
    if twin is not None:
        return twin

    def folded(arrays):
        arrays = list(arrays)
        for i in fold:
            arrays[i] = _folded(arrays[i])
        return arrays

    def wrap(variant):
        def per_step(*arrays, **params):
            return variant(*folded(arrays), **params)

        def prepare(buffers, *arrays, **params):  # a replay runs the inner variant's calls
            return calls_of(variant, buffers, folded(arrays), params)
        per_step.__name__ = getattr(variant, "__name__", "variant")
        per_step.prepare = prepare
        return per_step

    def folded_shape(i, s):
        return (s[0] * s[1], *s[2:]) if i in fold else s

    twin = Codelet(codelet.name, modes=codelet.modes,
                   variants={name: wrap(v) for name, v in codelet.variants.items()},
                   init=codelet.init, redux=codelet.redux, footprint=codelet.footprint,
                   same_bits=codelet.same_bits,
                   flops=lambda *shapes, **params: codelet.work(
                       [folded_shape(i, s) for i, s in enumerate(shapes)], params))
    _STEPWISE[key] = twin
    return twin

