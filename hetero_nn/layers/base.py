"""The layer interface: parameters as handles, forward and backward as submitted tasks.

A layer never computes. ``forward(rt, xs)`` gets the handles of one batch's
partitions (children of the batch handle, split along the batch axis) and
submits one codelet task per partition, returning the partitions of its
output; ``backward(rt, dys)`` does the same for gradients, accumulating
parameter gradients into REDUX handles. Activations are temporaries from the
runtime's arenas: they live for the step's flush.

No bookkeeping where none is needed: in a layer that submits its gradient
contributions through :func:`contribution` (``overwrites_grads = True``, as
``AffineLayer``), ``zero_grad`` submits no task, it marks each gradient
*fresh*; the first contribution of the step is then submitted as the codelet's
``overwriting`` twin (the gradient written in place, its ``init`` inside the
task) and only the later partitions' contributions are REDUX. With one
partition a gradient costs no ``fill_zero``, no partial and no ``add``; with
``g`` partitions, ``g - 1`` partials and adds. Other layers' gradients are
zeroed by a ``fill_zero`` task and accumulated into, as before.

Parameters are NumPy arrays owned by the layer (as ``torch.nn.Parameter`` owns
its tensor); ``bind(rt)`` registers them with a runtime without copying, and
creates a gradient handle for each.

As a ``torch.nn.Module``: ``layer(x)`` returns the outputs of a NumPy batch (the forward
tasks on the runtime the layer is bound to, else the package's default runtime),
``state_dict``/``load_state_dict`` hold every layer's weights and buffers, and each
layer keeps the arguments it was constructed with (``constructor_args``), which is what
a checkpoint records to rebuild the model (:mod:`hetero_nn.layers.registry`).

Settings: a captured step graph bakes each task's parameters in, so the trainer's
step key holds every layer's :meth:`Layer.settings` (and the loss's, through
:func:`settings_signature`): the current values of the attributes named like the
constructor's arguments — PyTorch's convention, ``Dropout(p)`` keeps ``self.p`` —
so ``dropout.p = 0.3`` after a step captures a new graph, and a new layer takes
part without writing key code. A layer whose graph depends on something else
extends ``settings()``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections import OrderedDict

import numpy as np

from ..codelets.reduce import fill_zero, overwriting
from ..errors import CheckpointError, ShapeError
from ..scheduler.default import default_runtime
from .forward_graphs import ForwardGraphs

_rng = np.random.default_rng(0)
_CONSTRUCTOR_NAMES: dict = {}  # class -> names of its __init__'s named arguments
_MISSING = object()


def constructor_names(cls) -> tuple:
    """The named arguments of ``cls.__init__`` (not ``self``, ``*args``, ``**kwargs``), cached."""
    names = _CONSTRUCTOR_NAMES.get(cls)
    if names is None:
        try:
            parameters = inspect.signature(cls.__init__).parameters.values()
        except (TypeError, ValueError):  # a builtin __init__: nothing to read
            parameters = ()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names = _CONSTRUCTOR_NAMES[cls] = tuple(
            p.name for p in parameters if p.kind in kinds and p.name != "self")
    return names


def _hashable(value):
    if isinstance(value, np.ndarray):  # data, not a setting: only its form counts
        return ("ndarray", value.shape, value.dtype.str)
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def settings_signature(obj) -> tuple:
    """``(type, ((name, value), ...))``: ``obj``'s current values of the attributes named
    like its constructor's arguments (those it keeps), in a hashable form."""
    values = []
    for name in constructor_names(type(obj)):
        value = getattr(obj, name, _MISSING)
        if value is not _MISSING:
            values.append((name, _hashable(value)))
    return type(obj), tuple(values)


def manual_seed(seed: int) -> None:
    """Seed the generator layers draw their initial weights from (``torch.manual_seed``)."""
    global _rng
    _rng = np.random.default_rng(seed)


def default_rng() -> np.random.Generator:
    return _rng


def note_step_input(owner, handle):
    """Record ``handle``, per-step data its owner (a layer, an optimizer) registered, in
    ``owner.step_inputs`` while a step is captured (the step cache writes each in turn,
    from ``owner.replayed()``, before a replay); returns ``handle``."""
    if owner.step_inputs is not None:
        owner.step_inputs.append(handle)
    return handle


class Parameter:
    """A trainable array, its handle in a runtime and its gradient handle."""

    __slots__ = ("name", "data", "handle", "grad", "runtime", "fresh")

    def __init__(self, name: str, data: np.ndarray):
        self.name = name
        self.data = np.ascontiguousarray(data)
        self.handle = None
        self.grad = None
        self.runtime = None
        self.fresh = True  # the gradient holds nothing yet: the next contribution overwrites it

    @property
    def shape(self):
        return self.data.shape

    @property
    def size(self) -> int:
        """Elements (``numpy.ndarray.size``)."""
        return self.data.size

    def numel(self) -> int:
        """Elements (``torch.Tensor.numel``): ``sum(p.numel() for p in model.parameters())``."""
        return self.data.size

    def bind(self, rt):
        if self.runtime is rt and self.handle is not None and not rt.closed:
            return
        self.runtime = rt
        self.handle = rt.register(self.data, name=self.name)
        self.grad = rt.empty(self.data.shape, self.data.dtype, name=f"{self.name}.grad")
        self.fresh = True

    def unbind(self):
        self.runtime = self.handle = self.grad = None

    def host(self) -> np.ndarray:
        """The current values as a host array (coherent if bound)."""
        if self.handle is not None and not self.runtime.closed:
            return self.runtime.fetch(self.handle)
        return self.data

    def __repr__(self):
        return f"Parameter({self.name!r}, shape={self.data.shape}, dtype={self.data.dtype.name})"


class Buffer(Parameter):
    """A non-trainable array in a layer's ``state_dict`` (running statistics): no gradient."""

    __slots__ = ()

    def __init__(self, name: str, data: np.ndarray):
        super().__init__(name, data)
        self.data = np.array(data, order="C")  # 0-d stays 0-d (num_batches_tracked)

    def bind(self, rt):
        if self.runtime is rt and self.handle is not None and not rt.closed:
            return
        self.runtime = rt
        self.handle = rt.register(self.data, name=self.name)


@contextlib.contextmanager
def temporarily(objects, name, values):
    """Set attribute ``name`` of each of ``objects`` to its value in ``values`` for the
    block's duration, then put the previous values back."""
    objects = list(objects)
    before = [getattr(o, name) for o in objects]
    for o, v in zip(objects, values):
        setattr(o, name, v)
    try:
        yield
    finally:
        for o, v in zip(objects, before):
            setattr(o, name, v)


@contextlib.contextmanager
def evaluating(layer):
    """``layer.eval()`` for the duration of the block, then its previous mode back."""
    was_training = layer.training
    layer.eval()
    try:
        yield layer
    finally:
        layer.train(was_training)


@contextlib.contextmanager
def keeping_state(model):
    """Run the block, then put back ``model``'s buffers (running statistics) and its
    dropout step counts: passes that only measure time must not train the model."""
    buffers = {name: np.array(b.host(), copy=True) for name, b in model.named_buffers()}
    steps = [(layer, layer.steps) for layer in model.modules()
             if isinstance(getattr(layer, "steps", None), int)]
    try:
        yield model
    finally:
        for layer, count in steps:
            layer.steps = count
        if buffers:
            model.load_state_dict(buffers, strict=False)


class Layer:
    """Base class of every layer; see the module docstring.

    A layer remembers the arguments it was constructed with (``__new__`` keeps them),
    so a model can be recorded as data and rebuilt (:mod:`hetero_nn.layers.registry`).
    ``layer(x)`` runs the forward pass on a NumPy batch (:meth:`__call__`).
    """

    training = True  # train() / eval() set it per instance, as torch.nn.Module.training

    recomputing = False
    """True while a :class:`~hetero_nn.layers.Checkpoint` runs this layer's forward again
    for its backward: a layer with per-step state (a dropout step, running statistics)
    then repeats its first forward of the step without advancing that state."""

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._init_args = (args, kwargs)  # the outermost constructor call's, not super()'s
        return self

    def constructor_args(self) -> tuple[tuple, dict]:
        """``(args, kwargs)`` that rebuild this layer: those it was constructed with.
        Containers override it to give their current children."""
        return self._init_args

    step_inputs = None
    """While a step is captured, the handles of per-step data (a mask key, a momentum)
    each ``forward`` registered and its tasks read, in order; None otherwise. See
    :meth:`replayed` and :func:`note_step_input`."""

    @property
    def replayable(self) -> bool:
        """Whether this layer's tasks are the same every step, so a captured step graph
        may be replayed (see ``Runtime.capture``). Values that change per step go into
        a step input's data (:func:`note_step_input`), not into task parameters; a
        layer that cannot do so returns False."""
        return True

    batch_span = None
    """``(start, total)`` when the partitions ``forward`` gets are only part of the batch
    (a cluster worker's block: its first sample is sample ``start`` of ``total``), None
    when they are the whole batch. Read by layers whose results depend on a sample's
    place in the batch (Dropout's masks) or on the batch's size (BatchNorm2D)."""

    grads_per_partition = True
    """Whether each parameter gradient is a sum of one contribution per batch partition
    (what a cluster reduces across its workers); False where ``backward`` computes them
    once from statistics of the whole batch (BatchNorm2D)."""

    def replayed(self):
        """Advance the per-step state as ``forward`` would, for a step run by a replay, and
        return the data to write into the next of the captured ``step_inputs``."""
        raise NotImplementedError(f"{type(self).__name__} has no per-step data")

    def settings(self) -> tuple:
        """What this layer's captured tasks depend on besides data (hashable, part of the
        trainer's step key): :func:`settings_signature`. Extend it where a graph depends on
        an attribute not named like a constructor argument."""
        return settings_signature(self)

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

    def named_buffers(self):
        """Non-trainable state kept in the ``state_dict`` (``Buffer`` objects), by name."""
        return []

    def named_state(self):
        """Parameters then buffers, in ``torch.nn.Module.state_dict``'s order."""
        return self.named_parameters() + self.named_buffers()

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of the weights and buffers under PyTorch's names and shapes."""
        return OrderedDict((name, np.array(p.host(), copy=True)) for name, p in self.named_state())

    def load_state_dict(self, state, strict: bool = True):
        """Load arrays by name (shapes checked; values cast to each parameter's or buffer's
        dtype)."""
        params = dict(self.named_state())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise CheckpointError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            if name not in state:
                continue
            value = np.asarray(state[name])
            if value.shape != p.data.shape:
                raise ShapeError(f"load_state_dict: {name!r} has shape {value.shape}, the model "
                                 f"expects {p.data.shape}")
            p.host()  # make the host replica current before overwriting it
            p.data[...] = value
            rt = p.runtime
            p.unbind()  # other replicas are stale: a fresh handle whose host copy is valid
            if rt is not None and not rt.closed:
                p.bind(rt)  # a trainer bound to rt keeps training with the loaded values

    def named_children(self):
        """The layers this one is made of (Residual's body and shortcut), by name."""
        return []

    def _prefixed(self, method):
        """``getattr(child, method)()`` of every child, names prefixed ``"<child>."``."""
        return [(f"{name}.{key}", value) for name, child in self.named_children()
                for key, value in getattr(child, method)()]

    def named_modules(self, prefix=""):
        """``(path, layer)`` for this layer and every layer it is made of, depth first."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        """This layer and every layer it is made of (``torch.nn.Module.modules``)."""
        return [layer for _, layer in self.named_modules()]

    def train(self, mode: bool = True):
        """Training mode, or evaluation mode with ``mode=False`` (``torch.nn.Module.train``)."""
        self.training = bool(mode)
        for _, child in self.named_children():
            child.train(mode)
        return self

    def eval(self):
        """Evaluation mode: running statistics, no dropout (``torch.nn.Module.eval``)."""
        return self.train(False)

    def reset_parameters(self, rng=None):
        """Draw initial weights (PyTorch's default distributions)."""

    def bind(self, rt):
        for p in self._params.values():
            p.bind(rt)

    overwrites_grads = False
    """True where ``backward`` submits through :func:`contribution`: then the first
    contribution of a step overwrites each gradient and ``zero_grad`` needs no task."""

    def zero_grad(self, rt):
        """Zero the gradients: mark them fresh (no task) or submit ``fill_zero``."""
        for p in self._params.values():
            if self.overwrites_grads:
                p.fresh = True
            else:
                rt.submit(fill_zero, p.grad)
                p.fresh = False

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

    # ------------------------------------------------------------ inference
    def __call__(self, x) -> np.ndarray:
        """The outputs of a NumPy batch ``x`` of shape ``(N, *sample)``, as ``module(x)``.

        Runs this layer's forward pass in its current mode (``train()``: batch
        statistics, dropout, running statistics updated, as one partition; ``eval()``:
        none of it, split into a partition per CPU worker), on the runtime the layer's
        parameters are bound to (a trainer's),
        else on the package's default runtime (:mod:`hetero_nn.scheduler.default`).
        The first call of each batch shape and mode captures the forward tasks and later
        ones replay them (:mod:`hetero_nn.layers.forward_graphs`: the same bits).
        The layer is built for ``x``'s sample shape when it is not yet; ``x`` is cast to
        the layer's dtype (float32 for a layer not built, float64 when ``x`` is).
        """
        x = np.asarray(x)
        if x.ndim < 2:
            raise ShapeError(f"{type(self).__name__}(x): expected a batch (N, *sample), got an "
                             f"array of shape {x.shape}")
        if self.output_shape is not None:
            dtype = self.dtype
        else:
            dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
        if self.input_shape != tuple(x.shape[1:]) or self.output_shape is None:
            self.build(x.shape[1:], dtype)
        rt = self._bound_runtime()
        if rt is None:
            rt = default_runtime()
        self.bind(rt)
        graphs = self.__dict__.get("_forward_graphs")
        if graphs is None:
            graphs = self._forward_graphs = ForwardGraphs(self)
        return graphs.run(rt, np.array(x, dtype=dtype, order="C"))

    def _bound_runtime(self):
        """The open runtime this layer's parameters and buffers are bound to, or None."""
        for _, t in self.named_state():
            if t.runtime is not None and not t.runtime.closed:
                return t.runtime
        return None

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
    overwrites_grads = True
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
        params = self.parameters()
        grads = [p.grad for p in params]
        for x, dy in zip(self._xs, dys):
            rt.submit(contribution(self.bwd_params if self.bias else self.bwd_weight, params),
                      x, dy, *grads, **kw)
        if not need_input_grad:
            return None
        dxs = self.outputs(rt, dys, shape=self._xs[0].shape[1:])  # the input's own layout
        for dy, dx in zip(dys, dxs):
            rt.submit(self.bwd_input, dy, w.handle, dx, **kw)
        return dxs


def contribution(codelet, params):
    """The codelet to submit for a contribution to the gradients of ``params``:
    its ``overwriting`` twin when they are fresh (they no longer are after), else itself."""
    if all(p.fresh for p in params):
        for p in params:
            p.fresh = False
        return overwriting(codelet)
    for p in params:  # some fresh, some not: zero the fresh ones the REDUX adds into
        if p.fresh:
            p.runtime.submit(fill_zero, p.grad)
            p.fresh = False
    return codelet


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
