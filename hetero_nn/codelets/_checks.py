"""Operand checks shared by the CPU variants' wrappers."""


def require_contiguous(codelet, **arrays):
    """Raise unless every output written through a flat view is C-contiguous.

    Inputs are made contiguous by the wrappers (a no-op for arena buffers); an
    output cannot be, as a copy would receive the results.
    """
    for name, a in arrays.items():
        if not a.flags.c_contiguous:
            raise ValueError(f"{codelet}: operand {name!r} must be C-contiguous "
                             f"(shape {a.shape}, strides {a.strides})")


def pair(value, name):
    """Normalise an int or an ``(h, w)`` pair to a pair of ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)
