"""Models from and to PyTorch: ``from_torch`` traces a ``torch.nn.Module`` with
``torch.fx`` into a hetero_nn model holding the same weights; ``to_torch`` builds the
``torch.nn`` module of a hetero_nn model.

Policy (torch.fx's ``Interpreter``/``Transformer`` are the model): one table maps
torch targets -- module types, functions, tensor methods -- to converters; one walk
over the traced graph applies them in order; the first node the table cannot map
raises :class:`~hetero_nn.errors.ConversionError` naming the node, its target and the
line of the model's source that made it. Converters give a layer, nothing (an
identity: ``x.contiguous()``, dropout traced with ``training=False``), a *join*
(``out + identity``), or a *static* value (``x.size(0)``, ``x.shape``: integers a
view's shape is made of).

The graph becomes nested ``Sequential`` and ``Residual`` layers: each tensor value
is a *path* (a fork point and the layers since it); a value used twice is a fork,
its users start new paths; an addition of two paths from one fork is a
``Residual`` (body: the longer operand, shortcut: the other, or the identity) and,
once a fork has a single path left, that path joins the one leading to the fork.
So ``out = self.bn2(self.conv2(...)); out += self.downsample(x)`` is
``Residual(body, shortcut)`` and stacks of blocks nest as they run. Other merges
(concatenation, a product of two tensors, a branch left unjoined) are refused.

Layers are named after their nodes (``layer1_0_conv1``: the torch module's path with
dots as underscores), so a converted model reads as its source. Weights, buffers and
each module's train/eval mode are copied after the model is built in the module's
dtype (float32 or float64). The model's ``state_dict`` keys are the module's
(``layer1.0.bn1.weight``: ``Sequential.state_names`` maps the model's paths to them), so
a torch checkpoint or pretrained weights load with ``strict=True``, and back. torch is imported only when these functions run.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import operator
import re
from collections import OrderedDict

import numpy as np

from .errors import ConversionError, HeteroNNError
from . import layers as L
from .torch_export import _torch, residual_module_class, to_torch  # noqa: F401 (re-exported)


# --------------------------------------------------------------------------- values of the walk

class _Path:
    """The layers applied since ``root`` (a fork node or the input), by node name."""

    __slots__ = ("root", "layers")

    def __init__(self, root, layers=()):
        self.root, self.layers = root, list(layers)


class _Static:
    """A value known when tracing: ``"batch"`` for the batch size, ints, tuples of them."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_IDENTITY = object()
_JOIN = object()


class _Unsupported(Exception):
    """A converter's reason for refusing a node (the walk adds the node and its line)."""


# --------------------------------------------------------------------------- the table

def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _conv(m):
    return L.Conv2d(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride,
                    padding=m.padding, dilation=m.dilation, groups=m.groups,
                    bias=m.bias is not None, padding_mode=m.padding_mode)


def _max_pool(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False):
    if return_indices:
        raise _Unsupported("MaxPool2d(return_indices=True): a layer has one output")
    return L.MaxPool2d(kernel_size, stride or None, padding, dilation, ceil_mode=ceil_mode)


def _avg_pool(kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    return L.AvgPool2d(kernel_size, stride or None, padding, ceil_mode, count_include_pad,
                       divisor_override)


def _adaptive_avg_pool(output_size):
    return L.AdaptiveAvgPool2d(output_size)


def _dropout(cls):
    def make(p=0.5, training=True, inplace=False):
        return cls(p) if training else _IDENTITY
    return make


def _flatten(start_dim=1, end_dim=-1):
    """``nn.Flatten``'s defaults; ``torch.flatten`` and ``x.flatten`` start at 0 (the batch
    axis, which no layer flattens: refused)."""
    return L.Flatten(start_dim, end_dim)


def _flatten_function(start_dim=0, end_dim=-1):
    return _flatten(start_dim, end_dim)


def _module_table(nn):
    """torch.nn module type -> ``module -> layer``."""
    return {
        nn.Linear: lambda m: L.Linear(m.in_features, m.out_features, bias=m.bias is not None),
        nn.Conv2d: _conv,
        nn.BatchNorm2d: lambda m: L.BatchNorm2d(m.num_features, m.eps, m.momentum, m.affine,
                                                m.track_running_stats),
        nn.BatchNorm1d: lambda m: L.BatchNorm1d(m.num_features, m.eps, m.momentum, m.affine,
                                                m.track_running_stats),
        nn.LayerNorm: lambda m: L.LayerNorm(m.normalized_shape, m.eps, m.elementwise_affine,
                                            getattr(m, "bias", None) is not None
                                            or not m.elementwise_affine),
        nn.MaxPool2d: lambda m: _max_pool(m.kernel_size, m.stride, m.padding, m.dilation,
                                          m.ceil_mode, m.return_indices),
        nn.AvgPool2d: lambda m: _avg_pool(m.kernel_size, m.stride, m.padding, m.ceil_mode,
                                          m.count_include_pad, m.divisor_override),
        nn.AdaptiveAvgPool2d: lambda m: _adaptive_avg_pool(m.output_size),
        nn.Flatten: lambda m: _flatten(m.start_dim, m.end_dim),
        nn.Identity: lambda m: _IDENTITY,
        nn.ReLU: lambda m: L.ReLU(), nn.ReLU6: lambda m: L.ReLU6(), nn.SiLU: lambda m: L.SiLU(),
        nn.Hardswish: lambda m: L.Hardswish(), nn.Sigmoid: lambda m: L.Sigmoid(),
        nn.Tanh: lambda m: L.Tanh(),
        nn.GELU: lambda m: _gelu(m.approximate),
        nn.LeakyReLU: lambda m: L.LeakyReLU(m.negative_slope),
        nn.Softmax: lambda m: L.Softmax(m.dim),
        nn.LogSoftmax: lambda m: _log_softmax(m.dim),
        nn.Dropout: lambda m: L.Dropout(m.p), nn.Dropout2d: lambda m: L.Dropout2d(m.p),
    }


def _gelu(approximate="none"):
    if approximate != "none":
        raise _Unsupported(f"GELU(approximate={approximate!r}): only the exact form converts")
    return L.GELU()


def _log_softmax(dim=None, *rest, **kw):
    if dim not in (1, -1):
        raise _Unsupported(f"LogSoftmax(dim={dim}): only dim=1 over (N, K) converts")
    return L.LogSoftmax()


def _function_table(torch):
    """torch function or tensor-method name -> ``(*args, **kwargs) -> layer | marker``;
    ``args`` are the node's arguments after the tensor operand, statics resolved."""
    F = torch.nn.functional
    relu = lambda inplace=False: L.ReLU()  # noqa: E731
    table = {
        F.relu: relu, torch.relu: relu, "relu": relu, "relu_": relu,
        F.relu6: lambda inplace=False: L.ReLU6(),
        F.silu: lambda inplace=False: L.SiLU(), F.hardswish: lambda inplace=False: L.Hardswish(),
        torch.sigmoid: lambda: L.Sigmoid(), F.sigmoid: lambda: L.Sigmoid(),
        "sigmoid": lambda: L.Sigmoid(),
        torch.tanh: lambda: L.Tanh(), F.tanh: lambda: L.Tanh(), "tanh": lambda: L.Tanh(),
        F.gelu: _gelu,
        F.leaky_relu: lambda negative_slope=0.01, inplace=False: L.LeakyReLU(negative_slope),
        F.softmax: lambda dim=None, _stacklevel=3, dtype=None: L.Softmax(dim),
        torch.softmax: lambda dim=None, dtype=None: L.Softmax(dim),
        "softmax": lambda dim=None, dtype=None: L.Softmax(dim),
        F.log_softmax: _log_softmax, torch.log_softmax: _log_softmax,
        "log_softmax": _log_softmax,
        torch.flatten: _flatten_function, "flatten": _flatten_function,
        F.max_pool2d: _max_pool, F.avg_pool2d: _avg_pool,
        F.adaptive_avg_pool2d: _adaptive_avg_pool,
        F.dropout: _dropout(L.Dropout), F.dropout2d: _dropout(L.Dropout2d),
        "contiguous": lambda *a, **k: _IDENTITY,
        operator.add: _JOIN, operator.iadd: _JOIN, torch.add: _JOIN, "add": _JOIN,
        "add_": _JOIN,
    }
    return table


# --------------------------------------------------------------------------- from_torch

def from_torch(module, input_shape, dtype=None):
    """The hetero_nn model of a ``torch.nn.Module``, with its weights, buffers and modes.

    Parameters
    ----------
    module : torch.nn.Module
        Traced with ``torch.fx`` (its own ``forward`` included), so it must be made of
        the supported modules, functions and residual additions (``docs/porting.md``).
    input_shape : tuple of int
        One sample's shape, ``(C, H, W)``, as ``build`` takes it.
    dtype : str, optional
        Default: the module's parameters' (float32 or float64).

    Returns
    -------
    Sequential
        Built for ``input_shape``; layers named after the module's nodes.

    Raises
    ------
    ConversionError
        One line naming the node, its target and the source line it came from, for the
        first operation that does not convert.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise ConversionError(f"from_torch: expected a torch.nn.Module, got "
                              f"{type(module).__name__}")
    shape = tuple(int(d) for d in input_shape)
    params = list(module.parameters())
    own = np.dtype(str(params[0].dtype).replace("torch.", "")) if params else np.dtype("float32")
    dtype = np.dtype(dtype if dtype is not None else own)
    if dtype not in (np.float32, np.float64):
        raise ConversionError(f"from_torch: dtype must be float32 or float64, got {dtype}")
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # fx's TraceError, or the module's own code failing on a Proxy
        raise ConversionError(f"from_torch: torch.fx cannot trace {type(module).__name__}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    _propagate_shapes(torch, module, graph, shape, own)
    walk = _Walk(torch, module, graph, shape)
    model = walk.run()
    try:
        model.build(shape, dtype)
    except HeteroNNError as exc:
        raise ConversionError(f"from_torch: the converted model does not build for inputs "
                              f"(N, {', '.join(map(str, shape))}): {exc}") from None
    model.train(module.training)
    for layer, source in walk.sources:
        state = {k: v.detach().cpu().numpy() for k, v in source.state_dict().items()}
        if state:
            layer.load_state_dict(state)
        layer.train(source.training)
    model.state_names = _torch_state_names(module, model, walk.sources)
    return model


def _torch_state_names(module, model, sources):
    """``{path in model: key in module.state_dict()}`` for every weight and buffer the
    converted layers took from ``module``'s submodules (``state_names``)."""
    torch_names = {id(m): name for name, m in module.named_modules()}
    paths = {id(layer): path for path, layer in model.named_modules()}
    names = {}
    for layer, source in sources:
        path, prefix = paths.get(id(layer)), torch_names.get(id(source))
        if path is None or prefix is None:
            continue
        for key, _ in layer.named_state():
            names[f"{path}.{key}"] = f"{prefix}.{key}" if prefix else key
    return names or None


def _propagate_shapes(torch, module, graph, shape, dtype):
    """Run the traced graph once on zeros of ``(2, *shape)`` in eval mode (nothing of the
    module changes) so that every node knows its output shape (``node.meta``)."""
    from torch.fx.passes.shape_prop import ShapeProp  # torch: optional (_torch() checked it)

    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints
            ShapeProp(torch.fx.GraphModule(module, graph)).propagate(
                torch.zeros((2, *shape), dtype=getattr(torch, dtype.name)))
    except Exception as exc:
        raise ConversionError(f"from_torch: {type(module).__name__} fails on inputs of shape "
                              f"(N, {', '.join(map(str, shape))}): {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        for m, training in modes.items():
            m.training = training


class _Walk:
    """One pass over a traced graph (see the module docstring)."""

    def __init__(self, torch, module, graph, shape):
        self.torch, self.module, self.graph, self.shape = torch, module, graph, shape
        self.modules = _module_table(torch.nn)
        self.functions = _function_table(torch)
        self.values: dict = {}   # node -> _Path or _Static
        self.live: dict = {}     # fork node -> paths from it not yet joined
        self.sources = []        # (layer, torch module) whose state and mode the layer takes
        self.called = {}         # id(torch module with parameters) -> node name

    # ---------------------------------------------------------------- the walk
    def run(self):
        inputs = [n for n in self.graph.nodes if n.op == "placeholder"]
        if len(inputs) != 1:
            raise ConversionError(f"from_torch: the module takes {len(inputs)} inputs; one "
                                  "tensor (N, *input_shape) converts")
        for node in self.graph.nodes:
            try:
                self.visit(node)
            except _Unsupported as exc:
                raise ConversionError(f"from_torch: node {node.name!r} ({_target(node)})"
                                      f"{_source_line(node)}: {exc}") from None
        return self.model

    def visit(self, node):
        if node.op == "placeholder":
            self.values[node] = _Path(node)
            self._fork(node)
        elif node.op == "output":
            self.finish(node)
        elif node.op == "get_attr":
            raise _Unsupported("a parameter or buffer used directly (a functional layer): "
                               "use the nn module instead")
        elif node.op == "call_module":
            submodule = self.module.get_submodule(node.target)
            make = self.modules.get(type(submodule))
            if make is None:
                raise _Unsupported(f"{type(submodule).__module__}.{type(submodule).__name__} "
                                   f"does not convert (modules that do: "
                                   f"{', '.join(sorted(t.__name__ for t in self.modules))})")
            self.tensor_op(node, node.args, node.kwargs, lambda: make(submodule), submodule)
        else:
            self.call(node)

    def call(self, node):
        target = node.target
        static = self.static_op(node)
        if static is not None:
            self.values[node] = _Static(static)
            return
        make = self.functions.get(target) if _hashable(target) else None
        if make is None and node.op == "call_method" and target in ("view", "reshape"):
            make = functools.partial(self.reshape, node)
        if make is None and target is self.torch.reshape:
            make = functools.partial(self.reshape, node)
        if make is None:
            raise _Unsupported("this operation does not convert (see docs/porting.md for what "
                               "does)")
        if make is _JOIN:
            return self.join(node)
        self.tensor_op(node, node.args, node.kwargs,
                       lambda: make(*self.resolve(node.args[1:]), **self.resolve(node.kwargs)))

    def tensor_op(self, node, args, kwargs, make, source=None):
        """``node`` applies one layer (or the identity) to its first argument."""
        if not args or args[0] not in self.values or not isinstance(self.values[args[0]], _Path):
            raise _Unsupported("expected a tensor from the model's input as first argument")
        if source is not None and len(args) + len(kwargs) != 1:
            raise _Unsupported("a module called with more than one argument")
        try:
            layer = make()
        except TypeError as exc:  # arguments the converter does not take
            raise _Unsupported(f"arguments not understood ({exc})") from None
        except HeteroNNError as exc:  # arguments the layer refuses (it says which)
            raise _Unsupported(str(exc)) from None
        base = self.take(args[0])
        path = _Path(base.root, base.layers)
        if layer is not _IDENTITY:
            if source is not None and any(True for _ in source.parameters(recurse=False)):
                first = self.called.setdefault(id(source), node.name)
                if first != node.name:
                    raise _Unsupported(f"module {node.target!r} is called twice (first as "
                                       f"{first!r}): shared weights do not convert")
            if source is not None:
                self.sources.append((layer, source))
            path.layers.append((node.name, layer))
        self.values[node] = path
        self._fork(node)

    # ---------------------------------------------------------------- paths and forks
    def _data_users(self, node):
        return [u for u in node.users if not self._is_static_user(u)]

    def _is_static_user(self, user):
        return (user.op == "call_method" and user.target in ("size", "dim")) or \
            (user.target is getattr and user.args[1] in ("shape", "ndim"))

    def _fork(self, node):
        """A value used by several operations starts a path for each of them."""
        users = len(self._data_users(node))
        if users > 1:
            self.live[node] = users

    def take(self, node) -> _Path:
        """The path a user of ``node`` extends (a new one where ``node`` is a fork)."""
        if node in self.live:
            return _Path(node)
        return self.values[node]

    def join(self, node):
        args = [a for a in node.args]
        alpha = node.kwargs.get("alpha", 1)
        if len(args) != 2 or alpha != 1 or set(node.kwargs) - {"alpha"} or \
                not all(isinstance(self.values.get(a), _Path) for a in args):
            raise _Unsupported("an addition converts only as two tensors from the model's "
                               "input added (a residual connection)")
        if args[0] is args[1]:
            raise _Unsupported("a tensor added to itself does not convert")
        a, b = (self.take(x) for x in args)
        if a.root is not b.root or a.root not in self.live:
            raise _Unsupported(f"the two operands branch from different points ({a.root.name!r} "
                               f"and {b.root.name!r}): only a residual connection around one "
                               "block converts")
        if not a.layers and not b.layers:
            raise _Unsupported("x + x does not convert")
        body, shortcut = (a, b) if a.layers else (b, a)
        residual = L.Residual(_sequential(body.layers),
                              _sequential(shortcut.layers) if shortcut.layers else None)
        root = a.root
        self.live[root] -= 1
        if self.live[root] == 1:  # the fork's other users are joined: one path again
            del self.live[root]
            prefix = self.values[root]
            path = _Path(prefix.root, prefix.layers)
        else:
            path = _Path(root)
        path.layers.append((_block_name(node, path.layers), residual))
        self.values[node] = path
        self._fork(node)

    def finish(self, node):
        (result,) = node.args if len(node.args) == 1 else (None,)
        value = self.values.get(result)
        if not isinstance(value, _Path):
            raise _Unsupported("the model must return one tensor")
        if self.live or value.root.op != "placeholder":
            forks = ", ".join(repr(n.name) for n in self.live) or repr(value.root.name)
            raise _Unsupported(f"the branches from {forks} are not all joined by additions")
        self.model = _sequential(value.layers)

    # ---------------------------------------------------------------- static values
    def static_op(self, node):
        """The value of a shape query (``x.size(0)``, ``x.shape[1]``, ``x.dim()``), or None."""
        source = node.args[0] if node.args else None
        tensor = isinstance(self.values.get(source), _Path)
        if node.op == "call_method" and node.target == "size" and tensor:
            dim = _arg(node.args, node.kwargs, 1, "dim")
            shape = self.shape_of(source)
            return shape if dim is None else shape[dim]
        if node.op == "call_method" and node.target == "dim" and tensor:
            return len(self.shape_of(source))
        if node.target is getattr and tensor and node.args[1] in ("shape", "ndim"):
            shape = self.shape_of(source)
            return shape if node.args[1] == "shape" else len(shape)
        if node.target is operator.getitem and isinstance(self.values.get(source), _Static):
            return self.values[source].value[node.args[1]]
        return None

    def shape_of(self, node):
        """``("batch", *sample shape)`` of a tensor node (from the shape propagation)."""
        meta = node.meta.get("tensor_meta")
        if meta is None:
            raise _Unsupported(f"the shape of {node.name!r} is not known")
        return ("batch", *(int(d) for d in meta.shape[1:]))

    def resolve(self, value):
        """Arguments with static nodes replaced by their values (tensors refused)."""
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.resolve(v) for v in value)
        if hasattr(value, "op"):  # a node
            v = self.values.get(value)
            if isinstance(v, _Static):
                return v.value
            raise _Unsupported(f"argument {value.name!r} is a tensor: only one tensor operand "
                               "converts")
        return value

    def reshape(self, node, *shape, **kwargs):
        """``x.view(n, -1)`` and its kin: a Flatten when they keep the batch and flatten the
        rest."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        sample = self.shape_of(node.args[0])[1:]
        size = math.prod(sample)
        if len(shape) == 2 and shape[0] in ("batch", -1) and shape[1] in (-1, size) and \
                not (shape[0] == -1 and shape[1] == -1):
            return L.Flatten()
        if tuple(shape[1:]) == tuple(sample) and shape[0] in ("batch", -1):
            return _IDENTITY
        target = ", ".join("N" if d == "batch" else str(d) for d in shape)
        raise _Unsupported(f"a reshape of samples {tuple(sample)} to ({target}): only keeping "
                           "the batch and flattening the rest, (N, -1), converts")


def _block_name(node, named):
    """A Residual's name: the module whose ``forward`` made the addition (``layer1_0``), or
    the node's where that name is taken or unknown."""
    stack = node.meta.get("nn_module_stack") or {}
    name = next(reversed(stack), "").replace(".", "_") if stack else ""
    return name if name and name not in {n for n, _ in named} else node.name


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _sequential(named):
    return L.Sequential(OrderedDict(named))


def _target(node):
    if node.op == "call_module":
        return f"call_module {node.target!r}"
    target = node.target if isinstance(node.target, str) else \
        f"{getattr(node.target, '__module__', None) or 'builtins'}." \
        f"{getattr(node.target, '__name__', repr(node.target))}"
    return f"{node.op} {target}"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in \S+'
                    r'(?:\n(?!\s*File ")\s*(?P<code>[^\n]*))?')


def _source_line(node) -> str:
    """`` at file:line `code` `` of the model's code that made ``node`` (torch's own frames
    skipped), or ``""``."""
    frames = [m for m in _FRAME.finditer(node.stack_trace or "")
              if "/torch/" not in m["file"].replace("\\", "/")]
    if not frames:
        return ""
    m = frames[-1]
    code = f" `{m['code'].strip()}`" if m["code"] else ""
    return f" at {m['file']}:{m['line']}{code}"
