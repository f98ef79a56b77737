"""Fused codelets of real models' blocks: convolution + batch norm (+ ReLU or ReLU6) with
the batch norm folded into the convolution (evaluation), and the residual join + ReLU.

This module owns six codelets:

========================  ========================================================  ============
codelet                   operands (access mode)                                    composes
========================  ========================================================  ============
conv2d_bn_eval_fwd        x, w, b, mean, var, weight, bias (R), y (W)               conv2d_fwd,
                                                                                    bn_fwd,
                                                                                    relu/relu6
conv2d_nobias_bn_eval_fwd the same without the convolution's bias ``b``
bn_fold_eval              w, b, mean, var, weight, bias (R), wf, bf (W)             the fold
bn_nobias_fold_eval       the same without ``b``
conv2d_folded_fwd         x, wf, bf (R), y (W)                                      conv2d_fwd,
                                                                                    relu/relu6
add2_relu                 a (R), b (R), y (W)                                       add2, relu_fwd
========================  ========================================================  ============

The convolution codelets take ``conv2d_fwd``'s parameters and the batch norm's ``eps``
and ``activation`` (``"none"``, ``"relu"`` or ``"relu6"``). ``mean`` and ``var`` are the
running statistics, so these are evaluation-mode codelets: each task first folds the
batch norm into the convolution, as inference engines do,

    ``alpha = weight / sqrt(var + eps)``, ``w' = w * alpha``, ``b' = (b - mean) * alpha
    + bias``

(per output channel, in float64, then cast to the dtype), runs ``conv2d_fwd(x, w', b')``
and applies the activation in place: one pass over the output instead of three. The
fold is a different rounding from the unfused chain's (``bn_fwd`` after the
convolution), within the float tolerance of PyTorch's eval-mode result; it depends on
nothing but the parameters, so results stay bit-identical across policies and
granularities. ``add2_relu`` is ``relu(a + b)`` with ``add2``'s and ``relu_fwd``'s
roundings: bit-identical to the unfused pair.

The fold as a task of its own (``bn_[nobias_]fold_eval``, parameter ``eps``) writes ``w'``
and ``b'`` into handles that ``conv2d_folded_fwd`` (the activation's parameter, the
convolution's) reads: one fold per layer and forward pass instead of one per partition,
the same kernel, so the same bits as the fold inside each task.

Variants: ``ref`` (the fold in NumPy, then ``conv2d_fwd``'s ``ref``), ``cpu`` (the fold
in one Numba kernel into worker buffers, then the calls of ``conv2d_fwd``'s pinned
``cpu:winograd`` variant, Winograd, unrolled filters or partition GEMMs, then ReLU's kernel in place
(on the partition GEMMs, in their epilogue: ``conv_gemm.with_activation``): all prepared
calls, so a replayed task is two or three kernel calls), and ``cuda`` (written against
the array module).
"""

from __future__ import annotations

import math

import numpy as np

from . import conv, conv_gemm
from ._checks import require_contiguous
from ._jit import jit, jit_inline
from .activation import _relu6_fwd_cpu, _relu_fwd_cpu
from .codelet import R, W, Codelet
from .prepared import from_calls
from .xp import array_module

__all__ = ["conv2d_bn_eval_fwd", "conv2d_nobias_bn_eval_fwd", "bn_fold_eval", "bn_nobias_fold_eval",
           "conv2d_folded_fwd", "add2_relu", "ACTIVATIONS"]

ACTIVATIONS = ("none", "relu", "relu6")


def _activation_code(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"conv2d_bn_eval_fwd: activation must be one of {ACTIVATIONS}, "
                         f"got {activation!r}")
    return ACTIVATIONS.index(activation)


# --------------------------------------------------------------------------- fold

def _fold_xp(xp, w, b, mean, var, weight, bias, eps, dtype):
    """``(w', b')`` of the module docstring, computed in float64 and cast to ``dtype``."""
    f8 = np.float64
    alpha = weight.astype(f8) / xp.sqrt(var.astype(f8) + eps)
    shift = -mean.astype(f8) if b is None else b.astype(f8) - mean.astype(f8)
    wf = (w.astype(f8) * alpha.reshape(-1, *(1,) * (w.ndim - 1))).astype(dtype)
    return wf, (shift * alpha + bias.astype(f8)).astype(dtype)


@jit_inline
def fold_channel(o, b, mean, var, weight, bias, eps, bf):
    """Output channel ``o``'s ``alpha``, after writing ``bf[o] = (b - mean) * alpha + bias``
    (``b`` empty: no bias), float64 arithmetic as ``_fold_xp``."""
    alpha = np.float64(weight[o]) / np.sqrt(np.float64(var[o]) + eps)
    shift = -np.float64(mean[o])
    if b.shape[0]:
        shift = np.float64(b[o]) - np.float64(mean[o])
    bf[o] = shift * alpha + np.float64(bias[o])
    return alpha


@jit
def fold_bn_cpu(w2, b, mean, var, weight, bias, eps, wf2, bf):
    """``wf2 = w2 * alpha`` per row, ``bf = (b - mean) * alpha + bias`` (``b`` empty: no
    bias), float64 arithmetic as ``_fold_xp``."""
    for o in range(w2.shape[0]):
        alpha = fold_channel(o, b, mean, var, weight, bias, eps, bf)
        for k in range(w2.shape[1]):
            wf2[o, k] = np.float64(w2[o, k]) * alpha


def _split(params):
    """``(conv2d_fwd's parameters, eps, activation code)``."""
    params = dict(params)
    eps = float(params.pop("eps", 1e-5))
    return params, eps, _activation_code(params.pop("activation", "none"))


# --------------------------------------------------------------------------- variants

def fold_call(w, b, mean, var, weight, bias, eps, wf, bf):
    """The call of ``fold_bn_cpu`` filling ``wf`` and ``bf`` (``b`` None: no bias)."""
    n_out = w.shape[0]
    w2 = np.ascontiguousarray(w).reshape(n_out, -1)
    b = w2[0, :0] if b is None else np.ascontiguousarray(b)
    return (fold_bn_cpu, (w2, b, *(np.ascontiguousarray(a) for a in (mean, var, weight, bias)),
                          float(eps), wf.reshape(n_out, -1), bf))


def fold_calls(buffers, w, b, mean, var, weight, bias, eps, dtype):
    """``(wf, bf, calls)``: worker buffers for the folded filters and bias, and the call of
    ``fold_bn_cpu`` filling them."""
    wf = buffers("bn_fold:w", w.shape, dtype)
    bf = buffers("bn_fold:b", (w.shape[0],), dtype)
    return wf, bf, [fold_call(w, b, mean, var, weight, bias, eps, wf, bf)]


def activation_calls(y, code):
    """``relu_fwd``'s or ``relu6_fwd``'s kernel on ``y`` in place (``code`` 0: none)."""
    flat = y.reshape(-1)
    return [((_relu_fwd_cpu, _relu6_fwd_cpu)[code - 1], (flat, flat))] if code else []


def _folded_ref(x, wf, bf, y, code, conv_params):
    conv.conv2d_fwd.variants["ref"](x, wf, bf, y, **conv_params)
    if code == 1:
        np.maximum(y, np.zeros((), y.dtype), out=y)
    elif code == 2:
        np.copyto(y, np.where(y < 0, y.dtype.type(0), np.where(y > 6, y.dtype.type(6), y)))


def _folded_cuda(x, wf, bf, y, code, conv_params):
    conv.conv2d_fwd.variants["cuda"](x, wf, bf, y, **conv_params)
    if code:
        array_module(x, wf, y).clip(y, 0, 6 if code == 2 else None, out=y)


def _folded_calls(buffers, x, wf, bf, y, code, conv_params):
    require_contiguous("conv2d_bn_eval_fwd", y=y)
    calls = conv._fwd_winograd_calls(buffers, x, wf, bf, y, conv_params)
    return conv_gemm.with_activation(calls, code) or calls + activation_calls(y, code)


def _bn_eval_ref(x, w, b, mean, var, weight, bias, y, **params):
    conv_params, eps, code = _split(params)
    wf, bf = _fold_xp(np, w, b, mean, var, weight, bias, eps, y.dtype)
    _folded_ref(x, wf, bf, y, code, conv_params)


def _bn_eval_calls(buffers, x, w, b, mean, var, weight, bias, y, params):
    """The fold, ``conv2d_fwd``'s ``cpu:winograd`` calls on the folded operands, the
    activation: the calls (:mod:`~hetero_nn.codelets.prepared`)."""
    conv_params, eps, code = _split(params)
    wf, bf, calls = fold_calls(buffers, w, b, mean, var, weight, bias, eps, y.dtype)
    return calls + _folded_calls(buffers, x, wf, bf, y, code, conv_params)


def _bn_eval_cuda(x, w, b, mean, var, weight, bias, y, **params):
    conv_params, eps, code = _split(params)
    wf, bf = _fold_xp(array_module(x, w, y), w, b, mean, var, weight, bias, eps, y.dtype)
    _folded_cuda(x, wf, bf, y, code, conv_params)


def eval_variants(absent, ref, calls, cuda, doc):
    """The ``ref``, ``cpu`` (``calls``, described by ``doc``) and ``cuda`` variants of a
    folded evaluation codelet with (``absent`` None) or without (2) the bias ``b``: the
    variants' operands then get None at that position."""
    def operands(arrays):
        return arrays if absent is None else (*arrays[:absent], None, *arrays[absent:])

    return {"ref": lambda *a, **p: ref(*operands(a), **p),
            "cpu": conv._gemm_variant(calls, absent, doc),
            "cuda": lambda *a, **p: cuda(*operands(a), **p)}


def _variants(absent):
    return eval_variants(absent, _bn_eval_ref, _bn_eval_calls, _bn_eval_cuda,
                         "Folded, then the convolution.")


def _bn_eval_flops(x, w, *rest, **params):
    y = conv.conv2d_output_shape(x, w, **_split(params)[0])
    return 2.0 * math.prod(y) * math.prod(w[1:]) + 2.0 * math.prod(y)


conv2d_bn_eval_fwd = Codelet("conv2d_bn_eval_fwd", modes=(R,) * 7 + (W,),
                             variants=_variants(None), flops=_bn_eval_flops)
"""``y = act(bn_eval(conv2d(x, w) + b))``, folded: operands ``(x, w, b, mean, var, weight,
bias R, y W)``."""

conv2d_nobias_bn_eval_fwd = Codelet("conv2d_nobias_bn_eval_fwd", modes=(R,) * 6 + (W,),
                                    variants=_variants(2), flops=_bn_eval_flops)
"""``y = act(bn_eval(conv2d(x, w)))``, folded: operands ``(x, w, mean, var, weight, bias R,
y W)``."""


# --------------------------------------------------------------------------- fold as a task

def _fold_operands(absent, arrays):
    """``(w, b, mean, var, weight, bias, wf, bf)``, None for the absent ``b``."""
    return arrays if absent is None else (*arrays[:1], None, *arrays[1:])


def _fold_variants(absent):
    def ref(*arrays, eps=1e-5):
        *ins, wf, bf = _fold_operands(absent, arrays)
        wf[...], bf[...] = _fold_xp(np, *ins, eps, wf.dtype)

    @from_calls
    def cpu(view, *arrays, eps=1e-5):
        """``fold_bn_cpu`` into the handles ``wf``, ``bf``."""
        *ins, wf, bf = _fold_operands(absent, arrays)
        require_contiguous("bn_fold_eval", wf=wf, bf=bf)
        return [fold_call(*(None if a is None else view(a) for a in ins), eps, wf, bf)]

    def cuda(*arrays, eps=1e-5):
        *ins, wf, bf = _fold_operands(absent, arrays)
        wf[...], bf[...] = _fold_xp(array_module(wf), *ins, eps, wf.dtype)

    return {"ref": ref, "cpu": cpu, "cuda": cuda}


def folded_variants(ref, calls, cuda, doc):
    """The ``ref``, ``cpu`` (``calls``, described by ``doc``) and ``cuda`` variants of a
    convolution on folded operands ``(x, wf, bf, y)``, each given ``(..., activation code,
    the convolution's parameters)``."""
    def split(params):
        conv_params, _, code = _split(params)
        return code, conv_params

    return {"ref": lambda x, wf, bf, y, **p: ref(x, wf, bf, y, *split(p)),
            "cpu": conv._gemm_variant(lambda buffers, x, wf, bf, y, p: calls(
                buffers, x, wf, bf, y, *split(p)), None, doc),
            "cuda": lambda x, wf, bf, y, **p: cuda(x, wf, bf, y, *split(p))}


bn_fold_eval = Codelet("bn_fold_eval", modes=(R,) * 6 + (W, W), variants=_fold_variants(None),
                       flops=lambda w, *rest, **params: 2.0 * math.prod(w))
"""``wf, bf`` = the batch norm folded into a convolution's filters and bias (``eps``):
operands ``(w, b, mean, var, weight, bias R, wf, bf W)``, what ``conv2d_bn_eval_fwd``
computes inside each task, as a task of its own."""

bn_nobias_fold_eval = Codelet("bn_nobias_fold_eval", modes=(R,) * 5 + (W, W),
                              variants=_fold_variants(1),
                              flops=lambda w, *rest, **params: 2.0 * math.prod(w))
"""The same without the convolution's bias: operands ``(w, mean, var, weight, bias R, wf, bf
W)``."""

conv2d_folded_fwd = Codelet("conv2d_folded_fwd", modes=(R, R, R, W),
                            variants=folded_variants(_folded_ref, _folded_calls, _folded_cuda,
                                                     "The convolution on folded operands."),
                            flops=_bn_eval_flops)
"""``y = act(conv2d(x, wf) + bf)`` on ``bn_fold_eval``'s filters and bias: operands ``(x,
wf, bf R, y W)``; ``conv2d_bn_eval_fwd``'s parameters (``eps`` unused)."""


# --------------------------------------------------------------------------- add2_relu

def _check(a, b, y):
    if not a.shape == b.shape == y.shape:
        raise ValueError(f"add2_relu: operands must have one shape, got {a.shape}, {b.shape}, "
                         f"{y.shape}")


def _add2_relu_ref(a, b, y):
    _check(a, b, y)
    np.add(a, b, out=y)
    np.maximum(y, np.zeros((), y.dtype), out=y)


@jit
def _add2_relu_cpu(a, b, y):
    for i in range(y.shape[0]):
        v = a[i] + b[i]
        y[i] = 0 if v <= 0 else v


@from_calls
def _add2_relu_cpu_wrapper(view, a, b, y):
    _check(a, b, y)
    require_contiguous("add2_relu", y=y)
    return [(_add2_relu_cpu, (view(a).reshape(-1), view(b).reshape(-1), y.reshape(-1)))]


def _add2_relu_cuda(a, b, y):
    _check(a, b, y)
    xp = array_module(a, b, y)
    xp.add(a, b, out=y)
    xp.maximum(y, xp.zeros((), y.dtype), out=y)


add2_relu = Codelet(
    "add2_relu", modes=(R, R, W),
    variants={"ref": _add2_relu_ref, "cpu": _add2_relu_cpu_wrapper, "cuda": _add2_relu_cuda},
    flops=lambda a, b, y, **params: 2.0 * math.prod(y))
"""``y = relu(a + b)`` (R a, R b, W y)."""
