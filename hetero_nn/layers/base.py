"""The layer interface: parameters as handles, forward and backward as submitted tasks.

A layer never computes. ``forward(rt, xs)`` gets the handles of one batch's
partitions (children of the batch handle, split along the batch axis) and
submits one codelet task per partition, returning the partitions of its
output; ``backward(rt, dys)`` does the same for gradients, accumulating
parameter gradients into REDUX handles. Activations are temporaries from the
runtime's arenas: they live for the step's flush.

Parameters are NumPy arrays owned by the layer (as ``torch.nn.Parameter`` owns
its tensor); ``bind(rt)`` registers them with a runtime without copying, and
creates a gradient handle for each.
"""

from __future__ import annotations

import math

import numpy as np

from ..codelets.reduce import fill_zero

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed the generator layers draw their initial weights from (``torch.manual_seed``)."""
    global _rng
    _rng = np.random.default_rng(seed)


def default_rng() -> np.random.Generator:
    return _rng


class Parameter:
    """A trainable array, its handle in a runtime and its gradient handle."""

    __slots__ = ("name", "data", "handle", "grad", "runtime")

    def __init__(self, name: str, data: np.ndarray):
        self.name = name
        self.data = np.ascontiguousarray(data)
        self.handle = None
        self.grad = None
        self.runtime = None

    @property
    def shape(self):
        return self.data.shape

    def bind(self, rt):
        if self.runtime is rt and self.handle is not None and not rt.closed:
            return
        self.runtime = rt
        self.handle = rt.register(self.data, name=self.name)
        self.grad = rt.empty(self.data.shape, self.data.dtype, name=f"{self.name}.grad")

    def unbind(self):
        self.runtime = self.handle = self.grad = None

    def host(self) -> np.ndarray:
        """The current values as a host array (coherent if bound)."""
        if self.handle is not None and not self.runtime.closed:
            return self.runtime.fetch(self.handle)
        return self.data

    def __repr__(self):
        return f"Parameter({self.name!r}, shape={self.data.shape}, dtype={self.data.dtype.name})"


class Layer:
    """Base class of every layer; see the module docstring."""

    def __init__(self):
        self._params: dict[str, Parameter] = {}
        self.input_shape = None    # per-sample shapes, set by build()
        self.output_shape = None
        self.dtype = np.dtype("float32")

    # ------------------------------------------------------------ parameters
    def add_parameter(self, name, data):
        self._params[name] = Parameter(name, data)

    def named_parameters(self):
        return list(self._params.items())

    def parameters(self):
        return list(self._params.values())

    def reset_parameters(self, rng=None):
        """Draw initial weights (PyTorch's default distributions)."""

    def bind(self, rt):
        for p in self._params.values():
            p.bind(rt)

    def zero_grad(self, rt):
        for p in self._params.values():
            rt.submit(fill_zero, p.grad)

    # ------------------------------------------------------------ shapes
    def build(self, input_shape, dtype):
        """Check ``input_shape`` (one sample), set dtypes, return the output shape."""
        dtype = np.dtype(dtype)
        if dtype != self.dtype:
            for p in self._params.values():
                p.data = p.data.astype(dtype)
                p.unbind()
            self.dtype = dtype
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(self.infer_shape(self.input_shape))
        return self.output_shape

    def infer_shape(self, input_shape):
        return input_shape

    # ------------------------------------------------------------ tasks
    def outputs(self, rt, xs, shape=None, dtype=None):
        """Temporaries for this layer's output, partitioned like ``xs``."""
        return _like_batch(rt, xs, self.output_shape if shape is None else shape,
                           self.dtype if dtype is None else dtype, type(self).__name__)

    def forward(self, rt, xs):
        raise NotImplementedError

    def backward(self, rt, dys, need_input_grad=True):
        raise NotImplementedError

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class AffineLayer(Layer):
    """A layer ``y = op(x, weight) (+ bias)``: Conv2D and Dense share these tasks.

    Subclasses name their codelets (``fwd``, ``fwd_nobias``, ``bwd_input``,
    ``bwd_params``, ``bwd_weight``) and the keyword parameters in ``_kw``.
    """

    fwd = fwd_nobias = bwd_input = bwd_params = bwd_weight = None
    bias = True
    _kw: dict = {}

    @property
    def fan_in(self) -> int:
        raise NotImplementedError

    def _uniform(self, shape, rng=None):
        bound = 1.0 / math.sqrt(self.fan_in)
        return (rng or default_rng()).uniform(-bound, bound, size=shape).astype(self.dtype)

    def reset_parameters(self, rng=None):
        """PyTorch's default: kaiming_uniform(a=sqrt(5)) weights and bias U(+-1/sqrt(fan_in))."""
        for p in self.parameters():
            p.data[...] = self._uniform(p.data.shape, rng)

    def forward(self, rt, xs):
        self._xs = xs
        ys = self.outputs(rt, xs)
        w, kw = self._params["weight"].handle, self._kw
        if self.bias:
            b = self._params["bias"].handle
            for x, y in zip(xs, ys):
                rt.submit(self.fwd, x, w, b, y, **kw)
        else:
            for x, y in zip(xs, ys):
                rt.submit(self.fwd_nobias, x, w, y, **kw)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        w, kw = self._params["weight"], self._kw
        for x, dy in zip(self._xs, dys):
            if self.bias:
                rt.submit(self.bwd_params, x, dy, w.grad, self._params["bias"].grad, **kw)
            else:
                rt.submit(self.bwd_weight, x, dy, w.grad, **kw)
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self._xs[0].shape[1:])  # the input's own layout
        for dy, dx in zip(dys, dxs):
            rt.submit(self.bwd_input, dy, w.handle, dx, **kw)
        return dxs


def _like_batch(rt, xs, sample_shape, dtype, name):
    """A temporary batch handle with one partition per handle of ``xs`` (same sizes)."""
    n = sum(x.shape[0] for x in xs)
    h = rt.temporary((n, *sample_shape), dtype, name=name)
    if len(xs) == 1:
        return [h]
    parts = list(h.split(0, len(xs)))
    if [p.shape[0] for p in parts] != [x.shape[0] for x in xs]:
        raise ValueError(f"{name}: partitions of sizes {[x.shape[0] for x in xs]} are not "
                         "numpy.array_split's")
    return parts
