"""Convolution geometry: the kernel, stride, dilation, padding and groups of a 2-D
convolution checked against its input and weights, and the output shape they give.

This module owns :class:`Conv2dGeometry` (what every convolution kernel takes besides the
operands) and the checks behind it, so that the kernel modules beside ``conv.py`` can use
it without importing the codelets; ``conv.py`` re-exports all three names.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ._checks import pair
from .padding import MODES, check_mode_fits, mode_code, resolve_padding

__all__ = ["Conv2dGeometry", "conv2d_geometry", "conv2d_output_shape"]

class Conv2dGeometry(NamedTuple):
    """Everything a convolution's kernels need besides the operands: kernel, stride,
    dilation, the padding ``(pt, pb, pl, pr)``, the padded plane ``hp x wp``, the output
    plane, the groups and the padding mode (its index in ``padding.MODES``). Numba
    kernels take it as one argument and read its fields by name."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pb: int
    pl: int
    pr: int
    hp: int
    wp: int
    out_h: int
    out_w: int
    groups: int
    mode: int

    @property
    def pads(self):
        return (self.pt, self.pb, self.pl, self.pr)

    @property
    def mode_name(self):
        return MODES[self.mode]


def conv2d_geometry(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1,
                    padding_mode="zeros"):
    """The :class:`Conv2dGeometry` of a convolution, after checking it is valid.

    >>> g = conv2d_geometry((8, 4, 9, 9), (6, 2, 4, 3), padding="same", dilation=(1, 2),
    ...                     groups=2)
    >>> (g.pt, g.pb, g.pl, g.pr, g.out_h, g.out_w)
    (1, 2, 2, 2, 9, 9)
    """
    def key(v):
        return tuple(v) if isinstance(v, list) else v
    return _geometry(tuple(x_shape), tuple(w_shape), key(stride), key(padding), key(dilation),
                     groups, padding_mode)


@functools.lru_cache(maxsize=1024)
def _geometry(x_shape, w_shape, stride, padding, dilation, groups, padding_mode):
    sh, sw = pair(stride, "stride", "conv2d")
    dh, dw = pair(dilation, "dilation", "conv2d")
    if min(sh, sw, dh, dw) < 1:
        raise ValueError(f"conv2d: stride and dilation must be >= 1, got stride={stride!r}, "
                         f"dilation={dilation!r}")
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"conv2d: groups must be an integer >= 1, got {groups!r}")
    _, n_in, height, width = x_shape
    n_out, w_in, kh, kw = w_shape
    if n_in % groups or n_out % groups:
        raise ValueError(f"conv2d: groups={groups} must divide the input's {n_in} and the "
                         f"output's {n_out} channels")
    if n_in != w_in * groups:
        raise ValueError(f"conv2d: input {x_shape} has {n_in} channels but the weights "
                         f"{w_shape} expect {w_in * groups} ({w_in} per group, {groups} groups)")
    pads = resolve_padding(padding, (kh, kw), (sh, sw), (dh, dw))
    code = mode_code(padding_mode)
    check_mode_fits(padding_mode, pads, height, width)
    pt, pb, pl, pr = pads
    hp, wp = height + pt + pb, width + pl + pr
    out_h = (hp - dh * (kh - 1) - 1) // sh + 1
    out_w = (wp - dw * (kw - 1) - 1) // sw + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"conv2d: kernel {kh}x{kw} (dilation {dh},{dw}) does not fit the "
                         f"padded input {height}x{width} (padding {pads})")
    return Conv2dGeometry(kh, kw, sh, sw, dh, dw, pt, pb, pl, pr, hp, wp, out_h, out_w,
                          int(groups), code)


def conv2d_output_shape(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1,
                        padding_mode="zeros"):
    """Shape ``(N, O, OH, OW)`` of ``conv2d_fwd``'s output.

    >>> conv2d_output_shape((64, 1, 28, 28), (6, 1, 5, 5), stride=1, padding=2)
    (64, 6, 28, 28)
    """
    g = conv2d_geometry(x_shape, w_shape, stride, padding, dilation, groups, padding_mode)
    return (int(x_shape[0]), int(w_shape[0]), g.out_h, g.out_w)
