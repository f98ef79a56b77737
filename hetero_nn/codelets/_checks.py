"""Operand and argument checks shared by the codelets' wrappers and the layers.

Argument checks raise :class:`~hetero_nn.errors.ConfigError` (a ``ValueError``),
whose message names the owner (a codelet or a layer) and the argument at fault.
"""

import numbers

from ..errors import ConfigError


def require_contiguous(codelet, **arrays):
    """Raise unless every output written through a flat view is C-contiguous.

    Inputs are made contiguous by the wrappers (a no-op for arena buffers); an
    output cannot be, as a copy would receive the results.
    """
    for name, a in arrays.items():
        if not a.flags.c_contiguous:
            raise ValueError(f"{codelet}: operand {name!r} must be C-contiguous "
                             f"(shape {a.shape}, strides {a.strides})")


def positive_int(value, arg, owner, minimum=1) -> int:
    """``value`` as an int if it is an integer >= ``minimum``, else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{owner}: {arg} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def pair(value, arg, owner, minimum=None) -> tuple[int, int]:
    """An int or a pair of ints as ``(h, w)``, as PyTorch's ``_pair``.

    Each must be an integer, and ``>= minimum`` when one is given (the codelets
    check their own bounds after, with the whole geometry in the message).

    >>> pair(3, "kernel_size", "Conv2D")
    (3, 3)
    """
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ConfigError(f"{owner}: {arg} must be an int or a pair, got {value!r}")
        return (_integer(value[0], arg, owner, minimum), _integer(value[1], arg, owner, minimum))
    v = _integer(value, arg, owner, minimum)
    return (v, v)


def _integer(value, arg, owner, minimum):
    if minimum is not None:
        return positive_int(value, arg, owner, minimum)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{owner}: {arg} must be an integer or a pair of integers, "
                          f"got {value!r}")
    return int(value)
