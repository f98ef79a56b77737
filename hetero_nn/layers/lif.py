"""LIF: leaky integrate-and-fire neurons, one time-scan task per batch partition each way.

The neuron is snnTorch's ``snn.Leaky`` with the fast-sigmoid surrogate; its equations, the
layout through time and the recomputation are in :mod:`hetero_nn.codelets.lif`. The layer
sees a sample's whole time axis (``through_time``): its input is ``(N, T, ...)`` (after
:class:`~hetero_nn.layers.Repeat` or :class:`~hetero_nn.layers.RateEncode`), its forward
task scans the ``T`` steps of its partition and its backward task scans them in reverse.

``beta`` and ``threshold`` are 0-d arrays in the ``state_dict`` under those names (as
snnTorch's); each is a parameter (its gradient a REDUX sum over the partitions, the first
contribution of a step written in place) with ``learn_beta`` / ``learn_threshold``, a
buffer otherwise.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..codelets.lif import OUTPUTS, RESETS, checkpoints, lif_bwd_codelet, lif_fwd, lif_fwd_membrane
from ..errors import ConfigError, ShapeError
from .base import Buffer, Layer, contribution
from ..codelets._checks import positive_int

__all__ = ["LIF"]


def _real(value, arg, positive=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) \
            or (positive and not value > 0):
        raise ConfigError(f"LIF: {arg} must be a finite{' positive' if positive else ''} number, "
                          f"got {value!r}")
    return float(value)


class LIF(Layer):
    """Leaky integrate-and-fire neurons over ``(N, T, ...)`` inputs (``snn.Leaky``).

    Parameters
    ----------
    beta : float
        Membrane decay per step, clamped to [0, 1] where it is used (as snnTorch does).
    threshold : float
        Firing threshold (default 1.0).
    slope : float
        Slope of the fast-sigmoid surrogate ``1 / (slope * |U - threshold| + 1)**2`` (25).
    reset : {"subtract", "zero"}
        Reset by subtracting the threshold (default) or to zero, the step after a spike.
    output : {"spikes", "membrane"}
        What the layer gives the next one: the spikes, or the membrane potential (a
        readout layer, for :class:`~hetero_nn.losses.MembraneCrossEntropy`).
    learn_beta, learn_threshold : bool
        Train ``beta`` / ``threshold`` (0-d parameters) instead of keeping them fixed.
    recompute : int
        Keep the membrane every ``recompute`` steps only and recompute the others in the
        backward scan (``output="spikes"``): ``ceil(T / k)`` instead of ``T`` membranes per
        neuron, the same bits.

    >>> LIF(0.95)
    LIF(beta=0.95)
    """

    through_time = True
    overwrites_grads = True

    def __init__(self, beta, threshold=1.0, slope=25.0, reset="subtract", output="spikes",
                 learn_beta=False, learn_threshold=False, recompute=1):
        super().__init__()
        if reset not in RESETS:
            raise ConfigError(f"LIF: reset must be one of {', '.join(map(repr, RESETS))}, "
                              f"got {reset!r}")
        if output not in OUTPUTS:
            raise ConfigError(f"LIF: output must be one of {', '.join(map(repr, OUTPUTS))}, "
                              f"got {output!r}")
        self.slope = _real(slope, "slope", positive=True)
        self.reset = reset
        self.output = output
        self.learn_beta = bool(learn_beta)
        self.learn_threshold = bool(learn_threshold)
        self.recompute = positive_int(recompute, "recompute", "LIF")
        if output == "membrane" and self.recompute != 1:
            raise ConfigError("LIF: recompute applies to output='spikes'; a membrane output is "
                              "every membrane already")
        self._buffers = {}
        #: The values given, which build() stores at the model's dtype (not via float32).
        self._given = {"beta": _real(beta, "beta"), "threshold": _real(threshold, "threshold")}
        for name, learn in (("beta", self.learn_beta), ("threshold", self.learn_threshold)):
            value = self._given[name]
            if learn:
                self.add_parameter(name, np.zeros(1, self.dtype))
                self._params[name].data = np.array(value, self.dtype)  # 0-d, as snnTorch's
            else:
                self._buffers[name] = Buffer(name, np.array(value, self.dtype))
        self.time_steps = None  # set when built after Repeat or RateEncode

    # ------------------------------------------------------------ state
    def _state(self, name):
        return self._params.get(name) or self._buffers[name]

    @property
    def beta(self) -> float:
        return float(self._state("beta").host())

    @property
    def threshold(self) -> float:
        return float(self._state("threshold").host())

    def settings(self):
        """Base's, without ``beta`` and ``threshold``: the tasks read them as data."""
        kind, values = super().settings()
        return kind, tuple((k, v) for k, v in values if k not in ("beta", "threshold"))

    def named_buffers(self):
        return list(self._buffers.items())

    def named_state(self):
        return [(name, self._state(name)) for name in ("beta", "threshold")]

    def build(self, input_shape, dtype):
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return super().build(input_shape, dtype)
        # beta and threshold as given, at the new dtype, unless loaded or trained since
        given = [name for name, state in self.named_state()
                 if state.host().item() == np.array(self._given[name], self.dtype).item()]
        for b in self._buffers.values():
            b.data = b.data.astype(dtype)
            b.unbind()
        shape = super().build(input_shape, dtype)
        for name in given:
            state = self._state(name)
            state.data = np.array(self._given[name], dtype)
            state.unbind()
        return shape

    def bind(self, rt):
        super().bind(rt)
        for b in self._buffers.values():
            b.bind(rt)

    def infer_shape(self, input_shape):
        if self.time_steps is None:
            raise ShapeError("LIF needs inputs (N, T, ...): put Repeat(T) or RateEncode(T, "
                             "seed) before it")
        if len(input_shape) < 2:
            raise ShapeError(f"LIF expects samples (T, features...), got {tuple(input_shape)}")
        return input_shape

    # ------------------------------------------------------------ tasks
    def _kw(self):
        return {"reset": self.reset, "recompute": self.recompute}

    def forward(self, rt, xs):
        self._xs = xs
        beta, thr = self._state("beta").handle, self._state("threshold").handle
        ys = self.outputs(rt, xs)
        if self.output == "membrane":
            for x, y in zip(xs, ys):
                rt.submit(lif_fwd_membrane, x, beta, thr, y, reset=self.reset)
            self._states = ys
            return ys
        shape = (checkpoints(self.time_steps, self.recompute), *self.input_shape[1:])
        self._states = self.outputs(rt, xs, shape=shape)
        for x, y, s in zip(xs, ys, self._states):
            rt.submit(lif_fwd, x, beta, thr, y, s, **self._kw())
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        learned = [p for p in (self._params.get("beta"), self._params.get("threshold")) if p]
        if not need_input_grad and not learned:
            return None
        codelet = lif_bwd_codelet(tuple(p.name for p in learned))
        beta, thr = self._state("beta").handle, self._state("threshold").handle
        dxs = self.outputs(rt, dys, shape=self.input_shape)
        kw = {**self._kw(), "output": self.output, "slope": self.slope}
        for x, s, dy, dx in zip(self._xs, self._states, dys, dxs):
            rt.submit(contribution(codelet, learned) if learned else codelet,
                      x, s, dy, beta, thr, dx, *(p.grad for p in learned), **kw)
        return dxs if need_input_grad else None

    def extra_repr(self):
        parts = [f"beta={self._state('beta').data.item():g}"]
        defaults = {"threshold": 1.0, "slope": 25.0, "reset": "subtract", "output": "spikes",
                    "learn_beta": False, "learn_threshold": False, "recompute": 1}
        values = {"threshold": self._state("threshold").data.item(), "slope": self.slope,
                  "reset": self.reset, "output": self.output, "learn_beta": self.learn_beta,
                  "learn_threshold": self.learn_threshold, "recompute": self.recompute}
        parts += [f"{k}={v!r}" for k, v in values.items() if v != defaults[k]]
        return ", ".join(parts)
