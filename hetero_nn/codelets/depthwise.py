"""Depthwise convolution codelets: ``conv2d`` with ``groups == C`` (MobileNet's layers).

This module owns five codelets, the depthwise twins of ``conv.py``'s:

=============================  ==========================================
codelet                        operands (access mode)
=============================  ==========================================
conv2d_depthwise_fwd           x (R), w (R), b (R), y (W)
conv2d_depthwise_fwd_nobias    x (R), w (R), y (W)
conv2d_depthwise_bwd_input     dy (R), w (R), dx (W)
conv2d_depthwise_bwd_params    x (R), dy (R), dw (REDUX), db (REDUX)
conv2d_depthwise_bwd_weight    x (R), dy (R), dw (REDUX)
=============================  ==========================================

Shapes: ``x[N, C, H, W]``, ``w[O, 1, KH, KW]`` with ``O = m*C`` (a channel
multiplier ``m``; output channel ``o`` reads input channel ``o // m``),
``y[N, O, OH, OW]``. Parameters are ``conv2d_fwd``'s without ``groups``, which is
``C``: ``stride``, ``padding`` (int, pair, ``'same'``, ``'valid'``), ``dilation``,
``padding_mode``.

Why codelets of their own: with one input plane per group the im2col GEMMs of
``conv2d_*`` are ``[m, KH*KW]`` by ``[KH*KW, OH*OW]`` products, too thin for BLAS,
and the pinned variant table runs ``cpu:im2col`` for every convolution. Here the
``cpu`` variant is the direct kernels of ``conv_direct.py`` (one padded plane and
one output row buffer in the L1 cache, three taps per pass), which the table
runs for these names.

Variants: ``ref`` (``conv.py``'s reference with ``groups=C``: the maths is the
same), ``cpu`` (``conv_direct.py``), ``cpu:stacked``, a faster twin of ``cpu`` for small
images giving its bits (declared ``same_bits``, so the performance model chooses between
the two per shape; ``depthwise_stacked.py``: planes laid end to end, one channel of every
image or a block of one image's channels, so that each kernel tap is one long vectorised
pass), and ``cuda`` (one
multiply-add of strided slices per kernel tap over all channels at once, in the array
module: CuPy on a GPU, NumPy in CI; no GEMM, no scatter).
"""

from __future__ import annotations

import numpy as np

from . import conv, conv_direct, depthwise_stacked
from ._checks import require_contiguous
from .codelet import REDUX, R, W, Codelet
from .padding import fold_xp, pad_xp
from .prepared import calls_of
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["conv2d_depthwise_fwd", "conv2d_depthwise_fwd_nobias", "conv2d_depthwise_bwd_input",
           "conv2d_depthwise_bwd_params", "conv2d_depthwise_bwd_weight"]


def _params(x_shape, w_shape, params):
    """``params`` with ``groups = C``, after checking ``w`` is depthwise."""
    if "groups" in params:
        raise TypeError("depthwise convolution codelets take no 'groups': it is the input's "
                        "channel count")
    if w_shape[1] != 1 or w_shape[0] % x_shape[1]:
        raise ValueError(f"conv2d_depthwise: weights {tuple(w_shape)} are not depthwise for an "
                         f"input {tuple(x_shape)} (expected [m*C, 1, KH, KW])")
    return {**params, "groups": x_shape[1]}


def _variant(base, name, input_index, weight_index):
    """``base`` (a ``conv2d_*`` variant) with ``groups = C``, named ``name``; the input's
    shape is the operand at ``input_index`` (``dx`` for the input gradient)."""
    def variant(*arrays, **params):
        base(*arrays, **_params(arrays[input_index].shape, arrays[weight_index].shape, params))

    def prepare(buffers, *arrays, **params):  # base's calls, with groups = C
        return calls_of(base, buffers, arrays,
                        _params(arrays[input_index].shape, arrays[weight_index].shape, params))
    variant.prepare = prepare
    variant.__name__ = variant.__qualname__ = name
    variant.__doc__ = f"``{base.__name__}`` with ``groups`` the input's channel count."
    return variant


# --------------------------------------------------------------------------- cuda (array module)

def _expanded(xp, x, geo, n_out):
    """The padded input with each channel repeated for its ``m`` output channels."""
    padded = pad_xp(xp, x, geo.pads, geo.mode_name)
    multiplier = n_out // x.shape[1]
    return padded if multiplier == 1 else xp.repeat(padded, multiplier, axis=1)


def _tap_weights(w, p, q):
    return w[:, 0, p, q].reshape(1, -1, 1, 1)


def conv2d_depthwise_fwd_nobias_cuda(x, w, y, **params):
    """``y = sum_{p,q} w[:, 0, p, q] * xpad[taps(p, q)]``, one multiply-add per tap, in ``xp``."""
    xp = array_module(x, w, y)
    geo = conv.conv2d_geometry(x.shape, w.shape, **_params(x.shape, w.shape, params))
    padded = _expanded(xp, x, geo, w.shape[0])
    total = xp.zeros(y.shape, dtype=y.dtype)
    for p, q, taps in conv._taps(geo):
        total += _tap_weights(w, p, q) * padded[taps]
    y[...] = total


def conv2d_depthwise_fwd_cuda(x, w, b, y, **params):
    """``conv2d_depthwise_fwd_nobias_cuda`` plus the bias."""
    conv2d_depthwise_fwd_nobias_cuda(x, w, y, **params)
    y += b.reshape(1, -1, 1, 1)


def conv2d_depthwise_bwd_input_cuda(dy, w, dx, **params):
    """Each tap's ``w * dy`` added onto its slice of the padded input, the multiplier's
    channels summed, then the padding folded, in ``xp``."""
    xp = array_module(dy, w, dx)
    geo = conv.conv2d_geometry(dx.shape, w.shape, **_params(dx.shape, w.shape, params))
    n_batch, n_in, height, width = dx.shape
    padded = xp.zeros((n_batch, w.shape[0], geo.hp, geo.wp), dtype=dx.dtype)
    for p, q, taps in conv._taps(geo):
        padded[taps] += _tap_weights(w, p, q) * dy
    padded = padded.reshape(n_batch, n_in, -1, geo.hp, geo.wp).sum(axis=2)
    dx[...] = fold_xp(xp, padded, height, width, geo.pads, geo.mode_name)


def conv2d_depthwise_bwd_weight_cuda(x, dy, dw, **params):
    """``dw[:, 0, p, q] += sum_{n,i,j} dy * xpad[taps(p, q)]``, per tap, in ``xp``."""
    xp = array_module(x, dy, dw)
    geo = conv.conv2d_geometry(x.shape, dw.shape, **_params(x.shape, dw.shape, params))
    padded = _expanded(xp, x, geo, dw.shape[0])
    for p, q, taps in conv._taps(geo):
        dw[:, 0, p, q] += (dy * padded[taps]).sum(axis=(0, 2, 3))


def conv2d_depthwise_bwd_params_cuda(x, dy, dw, db, **params):
    """``conv2d_depthwise_bwd_weight_cuda`` plus ``db += sum(dy)``."""
    conv2d_depthwise_bwd_weight_cuda(x, dy, dw, **params)
    db += dy.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------- cpu:stacked

_c = np.ascontiguousarray


def geometry(x_shape, w_shape, params):
    """The :class:`~hetero_nn.codelets.conv.Conv2dGeometry` of a depthwise convolution."""
    return conv.conv2d_geometry(x_shape, w_shape, **_params(x_shape, w_shape, params))


def fwd_stacked_calls(buffers, x, w, b, y, params, activation=0):
    """The call of ``depthwise_stacked.fwd_stacked`` (``b`` None: no bias)."""
    require_contiguous("conv2d_depthwise_fwd", y=y)
    geo = geometry(x.shape, w.shape, params)
    x, w = _c(x, dtype=y.dtype), _c(w, dtype=y.dtype)  # themselves where prepared
    bias = np.empty(0, dtype=y.dtype) if b is None else _c(b, dtype=y.dtype)
    return [(depthwise_stacked.fwd_stacked,
             (x, w, bias, b is not None, activation, y, geo,
              *depthwise_stacked.fwd_buffers(buffers, geo, x.shape, y.dtype)))]


def _bwd_input_stacked_calls(buffers, dy, w, _, dx, params):
    require_contiguous("conv2d_depthwise_bwd_input", dx=dx)
    geo = geometry(dx.shape, w.shape, params)
    return [(depthwise_stacked.bwd_input_stacked,
             (_c(dy, dtype=dx.dtype), _c(w, dtype=dx.dtype), dx, geo, *depthwise_stacked.bwd_input_buffers(
                 buffers, geo, dx.shape, w.shape[0], dx.dtype)))]


def _bwd_params_stacked_calls(buffers, x, dy, dw, db, params):
    require_contiguous("conv2d_depthwise_bwd_params", dw=dw)
    geo = geometry(x.shape, dw.shape, params)
    x, dy = _c(x, dtype=dw.dtype), _c(dy, dtype=dw.dtype)
    bias = np.empty(0, dtype=dw.dtype) if db is None else db
    if dw.shape[0] != x.shape[1]:  # a channel multiplier: cpu's kernel
        return [(conv_direct.conv2d_bwd_params_cpu, (x, dy, dw, bias, db is not None, geo))]
    return [(depthwise_stacked.bwd_params_stacked,
             (x, dy, dw, bias, db is not None, geo,
              *depthwise_stacked.params_buffers(buffers, geo, x.shape, dw.dtype)))]


_FAST = {
    "conv2d_depthwise_fwd": ("cpu:stacked", conv._gemm_variant(
        fwd_stacked_calls, None, "Depthwise forward, one long pass per tap over the stack.")),
    "conv2d_depthwise_fwd_nobias": ("cpu:stacked", conv._gemm_variant(
        fwd_stacked_calls, 2, "Depthwise forward, one long pass per tap over the stack.")),
    "conv2d_depthwise_bwd_input": ("cpu:stacked", conv._gemm_variant(
        _bwd_input_stacked_calls, 2, "Depthwise input gradient, one pass per tap over the "
        "stack.")),
    "conv2d_depthwise_bwd_params": ("cpu:stacked", conv._gemm_variant(
        _bwd_params_stacked_calls, None, "Depthwise parameter gradient, one pass per tap over "
        "a stack of channels.")),
    "conv2d_depthwise_bwd_weight": ("cpu:stacked", conv._gemm_variant(
        _bwd_params_stacked_calls, 3, "Depthwise weight gradient, one pass per tap over a "
        "stack of channels.")),
}
"""Per codelet, its variant giving ``cpu``'s bits faster on some shapes (``same_bits``)."""


# --------------------------------------------------------------------------- codelets

def _declare(name, modes, base, input_index, weight_index, cuda, flops, **redux):
    """A depthwise codelet whose ``ref`` and ``cpu`` variants are ``conv.py``'s ``base``
    reference and direct variants with ``groups = C`` (and the variant of ``_FAST`` giving
    ``cpu``'s bits, the performance model choosing between the two)."""
    ref, direct = base.variants["ref"], base.variants["cpu:direct"]
    variants = {"ref": _variant(ref, f"{name}_ref", input_index, weight_index),
                "cpu": _variant(direct, f"{name}_cpu", input_index, weight_index),
                "cuda": cuda}
    fast, variant = _FAST[name]
    variants[fast] = variant
    return Codelet(name, modes=modes, variants=variants, flops=flops, same_bits=("cpu", fast),
                   **redux)


_REDUX = {"init": zero_init, "redux": add_redux}

conv2d_depthwise_fwd = _declare(
    "conv2d_depthwise_fwd", (R, R, R, W), conv.conv2d_fwd, 0, 1,
    conv2d_depthwise_fwd_cuda, conv._fwd_flops)
"""``y = conv2d(x, w, groups=C) + b``: operands ``(x R, w R, b R, y W)``."""

conv2d_depthwise_fwd_nobias = _declare(
    "conv2d_depthwise_fwd_nobias", (R, R, W), conv.conv2d_fwd_nobias, 0, 1,
    conv2d_depthwise_fwd_nobias_cuda, conv._fwd_nobias_flops)
"""``y = conv2d(x, w, groups=C)``: operands ``(x R, w R, y W)``."""

conv2d_depthwise_bwd_input = _declare(
    "conv2d_depthwise_bwd_input", (R, R, W), conv.conv2d_bwd_input, 2, 1,
    conv2d_depthwise_bwd_input_cuda, conv._bwd_input_flops)
"""``dx = conv2d^T(dy, w, groups=C)``: operands ``(dy R, w R, dx W)``."""

conv2d_depthwise_bwd_params = _declare(
    "conv2d_depthwise_bwd_params", (R, R, REDUX, REDUX), conv.conv2d_bwd_params, 0, 2,
    conv2d_depthwise_bwd_params_cuda, conv._bwd_params_flops, **_REDUX)
"""``dw += dL/dw, db += dL/db``: operands ``(x R, dy R, dw REDUX, db REDUX)``."""

conv2d_depthwise_bwd_weight = _declare(
    "conv2d_depthwise_bwd_weight", (R, R, REDUX), conv.conv2d_bwd_weight, 0, 2,
    conv2d_depthwise_bwd_weight_cuda, conv._bwd_weight_flops, **_REDUX)
"""``dw += dL/dw`` without bias: operands ``(x R, dy R, dw REDUX)``."""
