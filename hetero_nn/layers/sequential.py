"""Sequential: layers in order, shapes checked at build, PyTorch state_dict keys, and a
granularity per block.

Per-block granularity (``granularities``): a block whose granularity differs from
the number of partitions it receives re-splits their parent (the batch handle) with
another partition plan (``handle.split(0, g)``: a view, no copy; the runtime orders
the plans' accesses by index overlap), and its output keeps that plan. The
backward pass re-splits each block's output gradient to the plan its forward ran
at. The model's output and input gradient come back in the partitions the caller
gave, so the loss and the trainer see one granularity.

Liveness: after a block's backward its output and the gradient it was given are read
by no later task of the step; they are released (``Runtime.release``), so in a step
laid out whole their bytes serve later temporaries (``scheduler/lifetimes.py``), as
PyTorch frees saved activations after their backward. Kept: the model's output, the
caller's gradient, and what a later block or the block itself passes through (Flatten).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..errors import ConfigError, ShapeError
from . import fused, time
from .base import Layer
from .summary import layer_repr, summary


class Sequential(Layer):
    """``torch.nn.Sequential``: layers in order, given as arguments, as one list, or as one
    ``OrderedDict`` of names to layers (as PyTorch's). Parameters are named
    ``"<name>.<parameter>"``, the name being the layer's index unless the
    ``OrderedDict`` gave one; ``model[i]`` and ``model.<name>`` reach a layer.

    >>> from collections import OrderedDict
    >>> from hetero_nn.layers import Linear, ReLU
    >>> model = Sequential(OrderedDict(fc=Linear(4, 3), act=ReLU()))
    >>> [name for name, _ in model.named_parameters()], model.fc is model[0]
    (['fc.weight', 'fc.bias'], True)

    ``build(input_shape, dtype)`` infers and checks every shape; a mismatch
    raises :class:`~hetero_nn.errors.ShapeError` naming the layer, its index and
    both shapes, before any task is submitted.

    ``fuse`` (default True; an attribute, may be changed between steps): submit
    the runs ``Conv2D, ReLU, MaxPool2D`` and ``Dense, ReLU`` as one fused task per
    partition (``layers/fused.py``), and in evaluation ``Conv2D, BatchNorm2D[, ReLU]``
    with the batch norm folded, and ``Residual, ReLU`` with one join task
    (``layers/fused_blocks.py``), and in training ``BatchNorm2D, ReLU | ReLU6`` with the
    activation inside the batch norm's tasks (``layers/bn_activation.py``, the same
    bits); ``fuse=False`` submits every layer's own tasks.

    ``granularities`` (default None; may be changed between steps): one positive int
    per layer, the number of partitions the block starting at that layer runs at
    (a fused run takes its first layer's), or None for every block at the
    partitions the model is given (module docstring). ``granularity="auto"`` sets it
    where the performance models say a block pays at its own g.

    ``state_names`` (default None): a map from parameter and buffer paths
    (``"layer1_0.body.layer1_0_bn1.weight"``) to the names ``named_state``,
    ``state_dict`` and checkpoints use instead (``"layer1.0.bn1.weight"``): how a
    model from ``from_torch`` keeps the torch module's ``state_dict`` keys.
    """

    def __init__(self, *layers, fuse=True, state_names=None):
        super().__init__()
        self.state_names = dict(state_names) if state_names else None
        names = None
        if len(layers) == 1 and isinstance(layers[0], dict):
            names, layers = [str(k) for k in layers[0]], list(layers[0].values())
            for name in names:
                if not name or "." in name:
                    raise ConfigError(f"Sequential: layer name {name!r} must be non-empty and "
                                      "hold no '.'")
        elif len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = layers[0]
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                hint = ("; convert a torch module with hn.from_torch(module, input_shape)"
                        if type(layer).__module__.startswith("torch") else "")
                raise TypeError(f"Sequential: argument {i} is {type(layer).__name__}, not a "
                                f"Layer{hint}")
        self.layers = list(layers)
        self.names = names or [str(i) for i in range(len(self.layers))]
        self.fuse = bool(fuse)
        self._blocks = None
        self._granularities = None
        self._parts = []  # partitions each block's forward ran at

    @property
    def granularities(self):
        return self._granularities

    @granularities.setter
    def granularities(self, value):
        if value is not None:
            value = tuple(value)
            if len(value) != len(self.layers):
                raise ConfigError(f"Sequential.granularities: {len(value)} values for "
                                  f"{len(self.layers)} layers")
            for i, g in enumerate(value):
                if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
                    raise ConfigError(f"Sequential.granularities: layer {i} "
                                      f"({self.layers[i]!r}) has {g!r}, not a positive integer")
            value = tuple(int(g) for g in value)
        self._granularities = value

    def blocks(self):
        """``[(first layer, last layer + 1, name)]`` of the blocks a forward pass runs now
        (fused runs when ``fuse``)."""
        return [(i, i + len(getattr(b, "layers", (b,))), type(b).__name__)
                for i, b in self._plan()]

    def _plan(self):
        """``[(first layer index, block)]``: fused runs when ``fuse``, else every layer."""
        return fused.choose_fusion(self.layers) if self.fuse else list(enumerate(self.layers))

    def constructor_args(self):
        """The current layers (an ``OrderedDict`` where they have names) and ``fuse``."""
        kwargs = {"fuse": self.fuse}
        if self.state_names:
            kwargs["state_names"] = dict(self.state_names)
        if self.names == [str(i) for i in range(len(self.layers))]:
            return tuple(self.layers), kwargs
        return (OrderedDict(zip(self.names, self.layers)),), kwargs

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):  # a Sequential of the same layer objects, as PyTorch's
            return Sequential(dict(zip(self.names[i], self.layers[i])), fuse=self.fuse)
        return self.layers[i]

    def __getattr__(self, name):
        names = self.__dict__.get("names")
        if names is not None and name in names:
            return self.layers[names.index(name)]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def __iter__(self):
        return iter(self.layers)

    # ------------------------------------------------------------ parameters
    def named_parameters(self):
        return self._prefixed("named_parameters")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        return self._prefixed("named_buffers")

    def named_state(self):
        return self._prefixed("named_state")

    def named_children(self):
        return list(zip(self.names, self.layers))

    def _prefixed(self, method):
        """Children's names prefixed, then renamed by ``state_names`` (``from_torch``'s map
        from these paths to the torch module's ``state_dict`` keys) where given."""
        named = super()._prefixed(method)
        rename = self.state_names
        return [(rename.get(k, k), v) for k, v in named] if rename else named

    def reset_parameters(self, rng=None):
        for layer in self.layers:
            layer.reset_parameters(rng)

    def bind(self, rt):
        for layer in self.layers:
            layer.bind(rt)

    def zero_grad(self, rt):
        for layer in self.layers:
            layer.zero_grad(rt)

    # ------------------------------------------------------------ shapes
    def build(self, input_shape, dtype="float32"):
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError(f"Sequential.build: dtype must be float32 or float64, got {dtype}")
        shape = tuple(int(d) for d in input_shape)
        self.input_shape, self.dtype = shape, dtype
        axis = None  # the time axis, once a Repeat or RateEncode made one
        for i, layer in enumerate(self.layers):
            try:
                shape, axis = time.build_layer(layer, shape, dtype, axis)
            except ShapeError as exc:
                raise ShapeError(f"layer {i} ({layer!r}): {exc}") from None
        self.output_shape = shape
        return shape

    @property
    def built(self) -> bool:
        return self.output_shape is not None

    # ------------------------------------------------------------ tasks
    def forward(self, rt, xs):
        self._blocks = self._plan()
        given, per_block = len(xs), self._granularities
        self._parts = []
        self._outputs = []  # per block: the root of its output
        for i, block in self._blocks:
            if per_block is not None:
                xs = regroup(xs, per_block[i])
            self._parts.append(len(xs))
            xs = block.forward(time.runtime_for(rt, block), xs)
            self._outputs.append(xs[0].root)
        return regroup(xs, given)

    def backward(self, rt, dys, need_input_grad=False):
        given = len(dys)
        # the model's output, the caller's gradient and, as blocks are done, their outputs
        kept = {self._outputs[-1], dys[0].root}
        for (i, block), parts, output in zip(
                reversed(self._blocks), reversed(self._parts), reversed(self._outputs)):
            need = need_input_grad or self.needs_input_grad(i)
            incoming = dys
            dys = block.backward(time.runtime_for(rt, block), regroup(dys, parts),
                                 need_input_grad=need)
            release_dead(rt, [output, incoming[0].root], kept, dys)
            kept.add(output)
            if not need:
                return None
        return None if dys is None else regroup(dys, given)

    def needs_input_grad(self, i) -> bool:
        """Whether the block starting at layer ``i`` passes an input gradient back: only
        where a layer before it has parameters (the caller may ask for it regardless)."""
        return any(layer.parameters() for layer in self.layers[:i])

    def summary(self, input_shape=None, dtype=None) -> str:
        """Each layer's output shape and parameter count, as torchsummary prints them.

        Builds the model for ``input_shape`` (one sample) first when given.
        """
        return summary(self, input_shape, dtype)

    def __repr__(self):
        return layer_repr(self)


def release_dead(rt, roots, kept, outgoing):
    """After a block's backward, its output and the gradient it was given are read by no
    later task of the step, unless they are in ``kept`` (the model's output, the caller's
    gradient, the outputs of later blocks: pass-through layers such as Flatten hand
    their input on) or passed on as the input gradient (``outgoing``): release the
    others (:meth:`Runtime.release`), so their bytes serve later temporaries."""
    passed = {h.root for h in outgoing or ()}
    dead = [r for r in roots if r not in kept and r not in passed and rt.is_temporary(r)]
    if dead:
        rt.release(*dead)


def regroup(xs, g):
    """The batch that the partitions ``xs`` make up, in ``g`` partitions (another plan of
    their parent, or the parent itself for ``g = 1``; at most one sample each)."""
    if len(xs) == g:
        return xs
    whole = xs[0] if len(xs) == 1 else xs[0].parent
    if len(xs) > 1 and (xs[0].plan.axis != 0 or list(xs[0].plan.children) != list(xs)):
        raise ConfigError(f"Sequential.granularities: the partitions given are not one "
                          f"batch split along its first axis ({xs[0]!r}, ...)")
    g = min(g, whole.shape[0])
    return list(whole.split(0, g)) if g > 1 else [whole]
