"""Depthwise convolution + batch norm (+ ReLU or ReLU6) in evaluation, folded: MobileNet's
``Conv2d(groups=C), BatchNorm2d, ReLU6`` as one task per partition.

This module owns three codelets, the depthwise twins of ``fused_blocks.py``'s:

===================================  =============================================
codelet                              operands (access mode)
===================================  =============================================
conv2d_depthwise_bn_eval_fwd         x, w, b, mean, var, weight, bias (R), y (W)
conv2d_depthwise_nobias_bn_eval_fwd  the same without the convolution's bias ``b``
conv2d_depthwise_folded_fwd          x, wf, bf (R), y (W): ``bn_fold_eval``'s output
===================================  =============================================

Parameters: ``conv2d_depthwise_fwd``'s, the batch norm's ``eps`` and ``activation``
(``"none"``, ``"relu"``, ``"relu6"``). Each task folds the running statistics into the
depthwise filters as ``fused_blocks.py`` does (``alpha = weight / sqrt(var + eps)``, ``w'
= w * alpha``, ``b' = (b - mean) * alpha + bias``, in float64, cast to the dtype), then
runs the depthwise forward with the activation applied as its outputs are written: one
pass over the output instead of three (convolution, batch norm, activation). The fold is
another rounding than the unfused chain's, within the float tolerance of PyTorch's
eval-mode result; it depends on the parameters only, so the bits are the same under
every policy and granularity.

Variants: ``ref`` (the fold in NumPy, ``conv2d_depthwise_fwd``'s ``ref``, the activation),
``cpu`` (``fused_blocks.fold_calls``: the fold into worker buffers, then
``depthwise_stacked.fwd_stacked`` with the activation: two prepared calls) and ``cuda``
(written against the array module).
"""

from __future__ import annotations

import numpy as np

from . import depthwise
from .codelet import R, W, Codelet
from .fused_blocks import _fold_xp, _split, eval_variants, fold_calls, folded_variants
from .xp import array_module

__all__ = ["conv2d_depthwise_bn_eval_fwd", "conv2d_depthwise_nobias_bn_eval_fwd",
           "conv2d_depthwise_folded_fwd"]


def _activate(xp, y, code):
    """ReLU (1) or ReLU6 (2) in place, as ``relu_fwd`` / ``relu6_fwd`` (NaN passes)."""
    if code == 1:
        y[...] = xp.where(y <= 0, y.dtype.type(0), y)
    elif code == 2:
        y[...] = xp.where(y < 0, y.dtype.type(0), xp.where(y > 6, y.dtype.type(6), y))


def _folded_ref(x, wf, bf, y, code, conv_params):
    depthwise.conv2d_depthwise_fwd.variants["ref"](x, wf, bf, y, **conv_params)
    _activate(np, y, code)


def _folded_cuda(x, wf, bf, y, code, conv_params):
    depthwise.conv2d_depthwise_fwd_cuda(x, wf, bf, y, **conv_params)
    _activate(array_module(x, wf, y), y, code)


def _folded_calls(buffers, x, wf, bf, y, code, conv_params):
    return depthwise.fwd_stacked_calls(buffers, x, wf, bf, y, conv_params, code)


def _ref(x, w, b, mean, var, weight, bias, y, **params):
    conv_params, eps, code = _split(params)
    wf, bf = _fold_xp(np, w, b, mean, var, weight, bias, eps, y.dtype)
    _folded_ref(x, wf, bf, y, code, conv_params)


def _cuda(x, w, b, mean, var, weight, bias, y, **params):
    conv_params, eps, code = _split(params)
    wf, bf = _fold_xp(array_module(x, w, y), w, b, mean, var, weight, bias, eps, y.dtype)
    _folded_cuda(x, wf, bf, y, code, conv_params)


def _calls(buffers, x, w, b, mean, var, weight, bias, y, params):
    """The fold, then the stacked forward with the activation: the calls
    (:mod:`~hetero_nn.codelets.prepared`)."""
    conv_params, eps, code = _split(params)
    wf, bf, calls = fold_calls(buffers, w, b, mean, var, weight, bias, eps, y.dtype)
    return calls + _folded_calls(buffers, x, wf, bf, y, code, conv_params)


def _flops(x, w, *rest, **params):
    geo = depthwise.geometry(x, w, _split(params)[0])
    outputs = x[0] * w[0] * geo.out_h * geo.out_w
    return 2.0 * outputs * w[2] * w[3] + 2.0 * outputs


def _variants(absent):
    return eval_variants(absent, _ref, _calls, _cuda, "Folded, then the stacked depthwise pass.")


conv2d_depthwise_bn_eval_fwd = Codelet(
    "conv2d_depthwise_bn_eval_fwd", modes=(R,) * 7 + (W,), variants=_variants(None),
    flops=_flops)
"""``y = act(bn_eval(conv2d(x, w, groups=C) + b))``, folded: operands ``(x, w, b, mean, var,
weight, bias R, y W)``."""

conv2d_depthwise_nobias_bn_eval_fwd = Codelet(
    "conv2d_depthwise_nobias_bn_eval_fwd", modes=(R,) * 6 + (W,), variants=_variants(2),
    flops=_flops)
"""``y = act(bn_eval(conv2d(x, w, groups=C)))``, folded: operands ``(x, w, mean, var, weight,
bias R, y W)``."""

conv2d_depthwise_folded_fwd = Codelet(
    "conv2d_depthwise_folded_fwd", modes=(R, R, R, W), variants=folded_variants(
        _folded_ref, _folded_calls, _folded_cuda, "The stacked depthwise pass on folded operands."),
    flops=_flops)
"""``y = act(conv2d(x, wf, groups=C) + bf)`` on ``bn_fold_eval``'s filters and bias: operands
``(x, wf, bf R, y W)``; ``conv2d_depthwise_bn_eval_fwd``'s parameters (``eps`` unused)."""
