"""Layer classes by name, and models as data: the architecture a checkpoint records.

A model's *architecture* is a JSON document: every layer as ``{"class": name, "args":
[...], "kwargs": {...}}``, the arguments it was constructed with
(:meth:`Layer.constructor_args <hetero_nn.layers.base.Layer.constructor_args>`;
containers give their current children), nested where an argument is a layer.
Arguments are data only: ``None``, booleans, numbers, strings, lists, and the tagged
objects ``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}`` (insertion order kept,
an ``OrderedDict`` back) and ``{"dtype": "float32"}``; anything else (a function, an
array) cannot be recorded and says so, naming the layer and the argument. No pickle:
rebuilding calls the named classes with those arguments.

Names: a layer class is found by the name it is recorded under, among the classes
:func:`register` was given and the package's own layers (``hetero_nn.layers``, the
Keras aliases included). A class that is neither is recorded under its qualified
name, so that loading it without the class registered fails in one line naming it
(registered later, it is found by that name too).
"""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict

import numpy as np

from ..errors import ConfigError
from .base import Layer

FORMAT = "hetero_nn.architecture/1"

_registered: dict[str, type] = {}


def register(cls=None, *, name=None):
    """Register a custom :class:`Layer` subclass under ``name`` (default: its class name),
    so that models holding it can be recorded and rebuilt (:func:`hetero_nn.load_model`).

    Usable as a decorator, ``@hn.layers.register``, or called, ``hn.layers.register(Block)``.
    The class must be constructible again from the arguments it was given.
    """
    def apply(klass):
        if not (isinstance(klass, type) and issubclass(klass, Layer)):
            raise ConfigError(f"layers.register: expected a Layer subclass, got {klass!r}")
        key = name or klass.__name__
        known = _registered.get(key) or _builtins().get(key)
        if known is not None and known is not klass:
            raise ConfigError(f"layers.register: the name {key!r} is already "
                              f"{known.__module__}.{known.__qualname__}; give name=...")
        _registered[key] = klass
        return klass

    return apply if cls is None else apply(cls)


_BUILTINS: dict[str, type] = {}


def add_builtins(namespace) -> None:
    """Take the package's own layers from ``namespace`` (``hetero_nn.layers`` hands its
    own over once imported: the registry imports nothing from the package)."""
    _BUILTINS.update({key: value for key, value in namespace.items()
                      if isinstance(value, type) and issubclass(value, Layer)
                      and not key.startswith("_")})


def _builtins() -> dict:
    return _BUILTINS


def layer_class(name: str) -> type:
    """The class recorded as ``name``; ConfigError naming it when none is known."""
    cls = _registered.get(name) or _builtins().get(name) or next(
        (c for c in _registered.values() if f"{c.__module__}.{c.__qualname__}" == name), None)
    if cls is None:
        raise ConfigError(f"unknown layer class {name!r}: not a hetero_nn layer; register it "
                          f"with hn.layers.register({name.rsplit('.', 1)[-1]}) before loading")
    return cls


def class_name(cls) -> str:
    """The name ``cls`` is recorded under (its qualified name when that finds another class)."""
    for key, value in _registered.items():
        if value is cls:
            return key
    if _builtins().get(cls.__name__) is cls:
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------------------- recording

def to_spec(layer, where="model") -> dict:
    """``layer`` as data: its class name and constructor arguments, nested."""
    args, kwargs = layer.constructor_args()
    what = f"{where} ({type(layer).__name__})"
    return {"class": class_name(type(layer)),
            "args": [_encode(v, f"{what} argument {i}", f"{where}.{i}")
                     for i, v in enumerate(args)],
            "kwargs": {str(k): _encode(v, f"{what} argument {k!r}", f"{where}.{k}")
                       for k, v in kwargs.items()}}


def _encode(value, what, where):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise ConfigError(f"cannot record {what}: {value!r} is not a finite number")
        return float(value)
    if isinstance(value, Layer):
        return to_spec(value, where)
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, what, f"{where}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, what, f"{where}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _encode(v, what, f"{where}.{k}")] for k, v in value.items()]}
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return {"dtype": np.dtype(value).name}
    raise ConfigError(f"cannot record {what}: a {type(value).__name__} is not data (numbers, "
                      "strings, lists, tuples, dicts of str keys, dtypes and layers are)")


def from_spec(spec) -> Layer:
    """The layer ``spec`` describes, constructed anew (fresh weights: load a state after)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("class"), str):
        raise ConfigError(f"not a layer in an architecture: {str(spec)[:80]}")
    cls = layer_class(spec["class"])
    args = [_decode(v) for v in spec.get("args", [])]
    kwargs = {k: _decode(v) for k, v in spec.get("kwargs", {}).items()}
    try:
        return cls(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"cannot rebuild {spec['class']}: {exc}") from None


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "class" in value:
        return from_spec(value)
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "dict" in value:
        return OrderedDict((k, _decode(v)) for k, v in value["dict"])
    if "dtype" in value:
        return np.dtype(value["dtype"])
    raise ConfigError(f"not an architecture value: {str(value)[:80]}")


def architecture(model) -> dict:
    """The JSON-serialisable document that rebuilds ``model`` (:func:`build`)."""
    return {"format": FORMAT, "model": to_spec(model)}


def build(document) -> Layer:
    """The model an :func:`architecture` document describes (not built, fresh weights)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ConfigError(f"architecture format {found!r}, expected {FORMAT!r}")
    return from_spec(document["model"])
