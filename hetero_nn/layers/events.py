"""Dense layers fed by spikes: the event-driven variants, chosen from the measured spike rate.

Policy
------
A Dense layer applied per time step to spikes (built after RateEncode or a LIF with
``output="spikes"``, through layers that keep zeros zero: Flatten, MaxPool2D, Dropout)
gets a :class:`SpikeInput` at build (``Dense.spike_input``). Its tasks then run the
codelets of :mod:`hetero_nn.codelets.spike_dense` in place of the dense ones, with the
same operands (:meth:`SpikeInput.substitute`, called by the per-step view of the runtime,
:class:`~hetero_nn.layers.time.PerStep`): the forward also adds the count of nonzero
inputs into the layer's count handle (the first partition of a step writes it), and every
task carries, as its parameter ``rate``, the spike rate measured in the previous steps
rounded to a power of two. The rate enters the tasks' footprint, so the performance model
keeps each variant's times per rate, and a pinned runtime lets it choose between the
dense and the event-driven variant, which give the same bits: the event-driven one runs
where the model finds it faster, below the crossover rate
(``benchmarks/bench_spiking.py --sparse`` measures it).

Measuring: after each training step the trainer calls :func:`measure_rates` (the step
has ended: reading a count waits for nothing), which sets each layer's ``rate`` to its
count over the inputs it saw. :func:`rate_key` (the rounded rates) is part of the step
key, so a captured step is replayed at the rate it was captured at and a new rate captures
a new one. Before any measurement ``rate`` is None and the model explores both variants.
"""

from __future__ import annotations

import math

import numpy as np

from ..codelets.dense import dense_bwd_params, dense_bwd_weight, dense_fwd, dense_fwd_nobias
from ..codelets.reduce import overwriting
from ..codelets.spike_dense import (rate_bucket, spike_dense_bwd_params, spike_dense_bwd_weight,
                                    spike_dense_fwd, spike_dense_fwd_nobias)

__all__ = ["SpikeInput", "measure_rates", "rate_key"]

_FORWARD = {dense_fwd: spike_dense_fwd, dense_fwd_nobias: spike_dense_fwd_nobias}
_GRADIENT = {dense_bwd_params: spike_dense_bwd_params, dense_bwd_weight: spike_dense_bwd_weight}
_SUBSTITUTES = {**_GRADIENT, **{overwriting(c): overwriting(s) for c, s in _GRADIENT.items()}}


class SpikeInput:
    """A Dense layer's input is spikes: its count handle and measured rate (module docstring).

    ``rate``: nonzero inputs over inputs in the last measured step (None before);
    ``count``: the handle the forward tasks add their counts into, on ``runtime``;
    ``elements``: the inputs the last forward call saw.
    """

    __slots__ = ("rate", "count", "runtime", "elements", "_first")

    def __init__(self):
        self.rate = None
        self.count = self.runtime = None
        self.elements = 0
        self._first = True

    def begin(self, rt) -> None:
        """A forward or backward call of the layer starts on ``rt``."""
        if self.runtime is not rt or rt.closed:
            self.runtime = rt
            self.count = rt.empty((), np.int64, name="spike_count")
        self._first = True

    def substitute(self, rt, codelet, handles, params):
        """``(codelet, handles, params)`` to submit for a dense task of the layer."""
        spike = _FORWARD.get(codelet)
        if spike is not None:
            if self._first:  # the step's first partition writes the count in place
                spike = overwriting(spike)
                self._first = False
                self.elements = 0
            self.elements += math.prod(handles[0].shape)
            handles = (*handles, self.count)
        else:
            spike = _SUBSTITUTES.get(codelet)
            if spike is None:  # the input gradient: dense
                return codelet, handles, params
        return spike, handles, {**params, "rate": rate_bucket(self.rate)}


def _inputs(model):
    return [s for layer in model.modules()
            if (s := getattr(layer, "spike_input", None)) is not None]


def measure_rates(model, rt) -> None:
    """Set every spike-fed Dense layer's ``rate`` from the step that has just run on ``rt``."""
    for s in _inputs(model):
        if s.runtime is rt and s.elements and not rt.closed:
            s.rate = float(rt.fetch(s.count)) / s.elements


def rate_key(model) -> tuple:
    """The rounded rates of ``model``'s spike-fed Dense layers (part of the step key)."""
    return tuple(rate_bucket(s.rate) for s in _inputs(model))
