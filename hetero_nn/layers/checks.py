"""Argument checks for layer constructors: messages name the layer and the argument.

They raise :class:`~hetero_nn.errors.ConfigError` (a ``ValueError``), so
``except hn.HeteroNNError`` catches them as every other error the library raises.
"""

from __future__ import annotations

import numbers

from ..errors import ConfigError


def positive_int(value, arg, layer, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{layer}: {arg} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def pair(value, arg, layer, minimum=1):
    """An int or a pair of ints, as PyTorch's ``_pair``."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ConfigError(f"{layer}: {arg} must be an int or a pair, got {value!r}")
        return (positive_int(value[0], arg, layer, minimum), positive_int(value[1], arg, layer, minimum))
    v = positive_int(value, arg, layer, minimum)
    return (v, v)
