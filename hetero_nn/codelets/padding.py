"""Padding of 2-D planes: ``torch.nn.Conv2d``'s four ``padding_mode``\\ s and their adjoints.

This module owns the padding rules the convolution codelets share: the modes,
the ``'same'``/``'valid'`` strings resolved to explicit sizes, the checks that
depend on the input size, the padding of one plane in a Numba kernel, and the
*fold* that is its adjoint (the input gradient of a padding).

A padded plane is ``HP x WP`` with the input at rows ``[pt, pt + H)`` and columns
``[pl, pl + W)``. Outside it, position ``(r, s)`` holds zero (``'zeros'``) or the
input at ``(source(r - pt, H), source(s - pl, W))``, where ``source`` maps a
coordinate outside ``[0, n)`` back inside, as ``torch.nn.functional.pad`` does:

==============  ==========================  ===================================
mode            ``source(i, n)``, i < 0      i >= n
==============  ==========================  ===================================
``reflect``     ``-i``                      ``2 (n - 1) - i`` (no edge repeat)
``replicate``   ``0``                       ``n - 1``
``circular``    ``i + n``                   ``i - n``
==============  ==========================  ===================================

PyTorch's limits hold: ``reflect`` needs each pad ``< n``, ``circular`` each pad
``<= n``. The fold adds each padded position's gradient onto the input position
it was copied from (the gradient of a gather is a scatter-add); with ``'zeros'``
it is the interior alone.

``'same'`` pads ``dilation * (kernel - 1)`` in total per axis, ``total // 2``
before and the rest after (the extra one at the bottom/right for even kernels),
and is refused with a stride above 1; ``'valid'`` is no padding. Both are
PyTorch's rules (``torch.nn.Conv2d`` and ``F.conv2d``).
"""

from __future__ import annotations

import numbers

from numba import uintp

from ._jit import jit_inline
from ._rows import gather_row

__all__ = ["MODES", "mode_code", "resolve_padding", "check_mode_fits", "pad_xp", "fold_xp"]

MODES = ("zeros", "reflect", "replicate", "circular")
"""``padding_mode`` names; a kernel takes a mode as its index here."""

ZEROS, REFLECT, REPLICATE, CIRCULAR = range(4)

_NUMPY_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge",
                "circular": "wrap"}


def mode_code(mode, owner="conv2d"):
    """The index of ``mode`` in :data:`MODES`, or a ``ValueError`` naming ``owner``."""
    if mode not in MODES:
        raise ValueError(f"{owner}: padding_mode must be one of {', '.join(map(repr, MODES))}, "
                         f"got {mode!r}")
    return MODES.index(mode)


def resolve_padding(padding, kernel, stride, dilation, owner="conv2d"):
    """``(top, bottom, left, right)`` for ``padding``: an int, an ``(h, w)`` pair, ``'same'``
    or ``'valid'``; ``kernel``, ``stride`` and ``dilation`` are pairs.

    >>> resolve_padding("same", (4, 3), (1, 1), (1, 2))
    (1, 2, 2, 2)
    >>> resolve_padding((2, 0), (3, 3), (2, 2), (1, 1))
    (2, 2, 0, 0)
    """
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"{owner}: padding must be an int, a pair, 'same' or 'valid', "
                             f"got {padding!r}")
        if stride != (1, 1):
            raise ValueError(f"{owner}: padding='same' is not supported with stride {stride} "
                             "(PyTorch refuses it for strided convolutions)")
        pads = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    if isinstance(padding, (tuple, list)):
        if len(padding) != 2:
            raise ValueError(f"{owner}: padding must be an int, a pair, 'same' or 'valid', "
                             f"got {padding!r}")
        ph, pw = padding
    else:
        ph = pw = padding
    for p in (ph, pw):
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 0:
            raise ValueError(f"{owner}: padding must be >= 0, got {padding!r}")
    return (int(ph), int(ph), int(pw), int(pw))


def check_mode_fits(mode, pads, height, width, owner="conv2d"):
    """Raise unless ``mode``'s padding ``(top, bottom, left, right)`` fits an ``height x width``
    plane (PyTorch's limits: reflect pads ``< size``, circular pads ``<= size``)."""
    pt, pb, pl, pr = pads
    for size, before, after, axis in ((height, pt, pb, "height"), (width, pl, pr, "width")):
        if mode == "reflect" and max(before, after) >= size:
            raise ValueError(f"{owner}: padding_mode='reflect' needs padding < the input's "
                             f"{axis} {size}, got {before}, {after}")
        if mode == "circular" and max(before, after) > size:
            raise ValueError(f"{owner}: padding_mode='circular' needs padding <= the input's "
                             f"{axis} {size}, got {before}, {after}")


def source(i, n, mode):
    """The input coordinate padded position ``i`` (relative to the input's first) copies, or
    -1 for a zero; see the module docstring. Plain Python, also inlined into kernels."""
    if 0 <= i < n:
        return i
    if mode == ZEROS:
        return -1
    if mode == REFLECT:
        return -i if i < 0 else 2 * (n - 1) - i
    if mode == REPLICATE:
        return 0 if i < 0 else n - 1
    return i + n if i < 0 else i - n


_source = jit_inline(source)


# --------------------------------------------------------------------------- array module

def pad_xp(xp, x, pads, mode):
    """``x[..., H, W]`` padded by ``(top, bottom, left, right)`` in ``mode`` (NumPy or CuPy)."""
    pt, pb, pl, pr = pads
    if not (pt or pb or pl or pr):
        return x
    width = ((0, 0),) * (x.ndim - 2) + ((pt, pb), (pl, pr))
    return xp.pad(x, width, mode=_NUMPY_MODES[mode])


def fold_xp(xp, g, height, width, pads, mode):
    """The adjoint of :func:`pad_xp`: ``g[..., HP, WP]`` folded onto ``[..., H, W]``.

    Separable, one axis at a time: the interior columns, plus each border column
    added onto the column it copies; then the same for rows. One strided add per
    border row or column: no scatter, so the same sums on every device and run.
    """
    pt, _, pl, _ = pads
    code = mode_code(mode)
    if code == ZEROS:
        return g[..., pt:pt + height, pl:pl + width].copy()
    cols = g[..., pl:pl + width].copy()
    for s in range(g.shape[-1]):
        j = s - pl
        if not 0 <= j < width:
            cols[..., source(j, width, code)] += g[..., s]
    out = cols[..., pt:pt + height, :].copy()
    for r in range(g.shape[-2]):
        i = r - pt
        if not 0 <= i < height:
            out[..., source(i, height, code), :] += cols[..., r, :]
    return out


# --------------------------------------------------------------------------- Numba

@jit_inline
def pad_plane(src, s0, height, width, dst, d0, pt, pl, hp, wp, mode):
    """Copy the ``height x width`` plane ``src[s0:]`` into the ``hp x wp`` plane ``dst[d0:]``
    padded in ``mode`` (a code). With ``ZEROS`` only the interior is written: the caller
    keeps the borders zero (a buffer made zero once)."""
    for r in range(hp):
        i = r - pt
        if mode == ZEROS:
            if 0 <= i < height:
                gather_row(dst, d0 + r * wp + pl, src, s0 + i * width, 1, width)
            continue
        i = _source(i, height, mode)
        row, s_row = uintp(d0 + r * wp), uintp(s0 + i * width)
        gather_row(dst, row + uintp(pl), src, s_row, 1, width)
        for s in range(pl):
            dst[row + uintp(s)] = src[s_row + uintp(_source(s - pl, width, mode))]
        for s in range(pl + width, wp):
            dst[row + uintp(s)] = src[s_row + uintp(_source(s - pl, width, mode))]


@jit_inline
def pad_planes(src, s0, n_planes, height, width, dst, d0, geo):
    """:func:`pad_plane` for ``n_planes`` consecutive planes of ``src[s0:]`` into ``dst[d0:]``;
    ``geo`` has the fields ``pt, pl, hp, wp, mode`` (a convolution's geometry)."""
    area, padded = height * width, geo.hp * geo.wp
    for c in range(n_planes):
        pad_plane(src, s0 + c * area, height, width, dst, d0 + c * padded,
                  geo.pt, geo.pl, geo.hp, geo.wp, geo.mode)


@jit_inline
def fold_plane(src, s0, hp, wp, dst, d0, height, width, pt, pl, mode):
    """Write into ``dst[d0:]`` (``height x width``) the fold of the padded gradient plane
    ``src[s0:]`` (``hp x wp``): its interior, plus in a mode other than ``ZEROS`` each
    border position added onto the position it copies (row-major order)."""
    for i in range(height):
        gather_row(dst, d0 + i * width, src, s0 + (i + pt) * wp + pl, 1, width)
    if mode == ZEROS:
        return
    for r in range(hp):
        i = _source(r - pt, height, mode)
        inner = pt <= r < pt + height
        row, d_row = uintp(s0 + r * wp), uintp(d0 + i * width)
        for s in range(wp):
            if inner and pl <= s < pl + width:
                continue
            dst[d_row + uintp(_source(s - pl, width, mode))] += src[row + uintp(s)]
