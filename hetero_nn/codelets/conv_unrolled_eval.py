"""Evaluation-mode convolutions on tiny images, the batch norm folded straight into the
unrolled filters: the fold once per layer and pass, each partition a GEMM.

On images of at most ``KH*KW`` pixels (``conv_unrolled.py``: torchvision ResNet-18's
layer3 and layer4 at 32x32 input) ``conv2d_folded_fwd``'s ``cpu`` variant unrolls the
folded filters into ``U[O*OH*OW, C*H*W]`` in every task, then runs one GEMM: in a pass
of two partitions the same 1-4 MB matrix was written twice per layer, after the fold
task had written the folded filters once. Here the fold task writes ``U`` itself and
each partition's task is the GEMM, the bias and the activation:

=============================  ===========================================================
codelet                        operands (access mode)
=============================  ===========================================================
bn_fold_unrolled_eval          w, b, mean, var, weight, bias (R), u, bf (W)
bn_nobias_fold_unrolled_eval   the same without ``b``
conv2d_unrolled_fwd            x, u, bf (R), y (W)
=============================  ===========================================================

The fold codelets take ``conv2d_fwd``'s parameters, ``input_size`` (the input image's
``(H, W)``, which with them gives ``U``'s taps) and the batch norm's ``eps``;
``conv2d_unrolled_fwd`` takes ``activation`` (``"none"``, ``"relu"``, ``"relu6"``). ``U``'s
entries are the folded filters' (``fold_bn_cpu``'s float64 arithmetic, then the dtype),
placed as ``conv_unrolled.unroll_filters`` places ``w``'s; the GEMM and the bias are
``conv_unrolled.unrolled_gemm``'s, the activation ``conv2d_folded_fwd``'s: so the bits
of ``bn_[nobias_]fold_eval`` then ``conv2d_folded_fwd`` (and of the one-task
``conv2d_[nobias_]bn_eval_fwd``), whatever the partitions. ``takes`` says which layers
the evaluation fold sends here: the ones ``conv2d_fwd``'s ``cpu:winograd`` variant runs
with unrolled filters, so the pair replaces exactly the tasks that unrolled per
partition (ResNet-18 tv at 32 / 64 images: the three 256-channel 2x2 layers, the
256->512 stride-2 one and the three 512-channel 1x1 ones; docs/benchmarks.md, branch
``tvinf``).

Variants: ``ref`` (NumPy), ``cpu`` (Numba + BLAS, prepared calls) and ``cuda`` (written
against the array module).
"""

from __future__ import annotations

import math

import numpy as np

from . import conv_unrolled, conv_winograd
from ._checks import require_contiguous
from ._jit import as_dtype_of, jit
from .codelet import R, W, Codelet
from .conv_geometry import conv2d_geometry
from .fused_blocks import _activation_code, _fold_xp, activation_calls, fold_channel
from .padding import ZEROS
from .prepared import from_calls
from .xp import array_module

__all__ = ["bn_fold_unrolled_eval", "bn_nobias_fold_unrolled_eval", "conv2d_unrolled_fwd",
           "takes", "unrolled_shape"]


def takes(x_shape, w_shape, **conv_params) -> bool:
    """Whether ``conv2d_fwd``'s ``cpu:winograd`` variant runs this layer with unrolled
    filters (not Winograd, and ``conv_unrolled.handles``)."""
    geo = conv2d_geometry(x_shape, w_shape, **conv_params)
    return (not conv_winograd.handles(geo, x_shape)
            and conv_unrolled.handles(geo, x_shape, w_shape[0]))


def unrolled_shape(x_shape, w_shape, **conv_params) -> tuple:
    """``U``'s shape, ``[O*OH*OW, C*H*W]``."""
    geo = conv2d_geometry(x_shape, w_shape, **conv_params)
    return conv_unrolled._shape(geo, x_shape, w_shape[0])


def _split(w, params):
    """``(geometry, tap table, eps)`` of a fold task's parameters."""
    params = dict(params)
    eps = float(params.pop("eps", 1e-5))
    height, width = params.pop("input_size")
    geo = conv2d_geometry((1, w.shape[1], height, width), w.shape, **params)
    return geo, conv_unrolled.tap_table(geo, height, width), eps


def _check_u(owner, geo, w, u):
    want = conv_unrolled._shape(geo, (1, w.shape[1], *u_input(geo)), w.shape[0])
    if tuple(u.shape) != want:
        raise ValueError(f"{owner}: u must have shape {want} (the unrolled filters of w "
                         f"{tuple(w.shape)}), got {tuple(u.shape)}")


def u_input(geo):
    """The input image's ``(H, W)`` of a geometry (its padded size less the padding)."""
    return geo.hp - geo.pt - geo.pb, geo.wp - geo.pl - geo.pr


# --------------------------------------------------------------------------- the fold

@jit
def fold_unrolled_cpu(w3, b, mean, var, weight, bias, eps, taps, zeros, u, bf):
    """``u`` = the unrolled folded filters, ``bf`` the folded bias (``b`` empty: none):
    ``fold_bn_cpu``'s arithmetic, ``unroll_filters``' placement (with zero padding only the
    taps' entries are written, the others zeroed first unless the taps reach every one)."""
    n_out, n_in = w3.shape[0], w3.shape[1]
    area_out, area_in = u.shape[0] // n_out, u.shape[1] // n_in
    if not zeros or taps.shape[0] < area_out * area_in:
        u[:, :] = 0
    for o in range(n_out):
        alpha = fold_channel(o, b, mean, var, weight, bias, eps, bf)
        for e in range(taps.shape[0]):
            row, col, tap = o * area_out + taps[e, 0], taps[e, 1], taps[e, 2]
            if zeros:
                for c in range(n_in):
                    u[row, c * area_in + col] = np.float64(w3[o, c, tap]) * alpha
            else:
                for c in range(n_in):
                    u[row, c * area_in + col] += as_dtype_of(u, np.float64(w3[o, c, tap]) * alpha)


def _fold_xp_unrolled(xp, w, b, mean, var, weight, bias, u, bf, params):
    """``ref``/``cuda``: ``_fold_xp``, then the folded filters placed tap by tap."""
    geo, taps, eps = _split(w, params)
    _check_u("bn_fold_unrolled_eval", geo, w, u)
    wf, bf[...] = _fold_xp(xp, w, b, mean, var, weight, bias, eps, u.dtype)
    n_out, n_in = w.shape[0], w.shape[1]
    wf3 = wf.reshape(n_out, n_in, -1)
    u4 = u.reshape(n_out, u.shape[0] // n_out, n_in, u.shape[1] // n_in)
    u[...] = 0
    for row, col, tap in taps.tolist():
        if geo.mode == ZEROS:
            u4[:, row, :, col] = wf3[:, :, tap]
        else:
            u4[:, row, :, col] += wf3[:, :, tap]


def _fold_operands(absent, arrays):
    """``(w, b, mean, var, weight, bias, u, bf)``, None for the absent ``b``."""
    return arrays if absent is None else (*arrays[:1], None, *arrays[1:])


def _fold_variants(absent):
    def ref(*arrays, **params):
        _fold_xp_unrolled(np, *_fold_operands(absent, arrays), params)

    @from_calls
    def cpu(view, *arrays, **params):
        """``fold_unrolled_cpu`` into the handles ``u``, ``bf``."""
        w, b, mean, var, weight, bias, u, bf = _fold_operands(absent, arrays)
        geo, taps, eps = _split(w, params)
        _check_u("bn_fold_unrolled_eval", geo, w, u)
        require_contiguous("bn_fold_unrolled_eval", u=u, bf=bf)
        w3 = view(w).reshape(w.shape[0], w.shape[1], -1)
        b = w3[0, 0, :0] if b is None else view(b)
        return [(fold_unrolled_cpu, (w3, b, *(view(a) for a in (mean, var, weight, bias)),
                                     eps, taps, geo.mode == ZEROS, u, bf))]

    def cuda(*arrays, **params):
        ops = _fold_operands(absent, arrays)
        _fold_xp_unrolled(array_module(ops[-2]), *ops, params)

    return {"ref": ref, "cpu": cpu, "cuda": cuda}


def _fold_flops(w, *rest, **params):
    return 2.0 * math.prod(w)


bn_fold_unrolled_eval = Codelet("bn_fold_unrolled_eval", modes=(R,) * 6 + (W, W),
                                variants=_fold_variants(None), flops=_fold_flops)
"""``u, bf`` = the batch norm folded into a convolution's filters, unrolled, and its bias:
operands ``(w, b, mean, var, weight, bias R, u, bf W)``."""

bn_nobias_fold_unrolled_eval = Codelet("bn_nobias_fold_unrolled_eval", modes=(R,) * 5 + (W, W),
                                       variants=_fold_variants(1), flops=_fold_flops)
"""The same without the convolution's bias: operands ``(w, mean, var, weight, bias R, u, bf
W)``."""


# --------------------------------------------------------------------------- the GEMM

def _check(x, u, bf, y):
    n_out = y.shape[1]
    if (y.shape[0] != x.shape[0] or bf.shape != (n_out,)
            or tuple(u.shape) != (math.prod(y.shape[1:]), math.prod(x.shape[1:]))):
        raise ValueError(f"conv2d_unrolled_fwd: u {tuple(u.shape)} and bf {tuple(bf.shape)} do "
                         f"not map x {tuple(x.shape)} to y {tuple(y.shape)}")


def _unrolled_xp(xp, x, u, bf, y, code):
    _check(x, u, bf, y)
    n = x.shape[0]
    y2 = xp.matmul(x.reshape(n, -1), u.T).reshape(y.shape)
    y[...] = y2 + bf.reshape(1, -1, 1, 1)
    if code:
        xp.clip(y, 0, 6 if code == 2 else None, out=y)


@from_calls
def _unrolled_cpu(view, x, u, bf, y, activation="none"):
    """``conv_unrolled.unrolled_gemm``, then the activation in place."""
    code = _activation_code(activation)
    _check(x, u, bf, y)
    require_contiguous("conv2d_unrolled_fwd", y=y)
    n = x.shape[0]
    return [(conv_unrolled.unrolled_gemm, (view(x).reshape(n, -1), view(bf),
                                           y.reshape(n, -1), view(u), y.shape[1]))
            ] + activation_calls(y, code)


conv2d_unrolled_fwd = Codelet(
    "conv2d_unrolled_fwd", modes=(R, R, R, W),
    variants={"ref": lambda x, u, bf, y, activation="none": _unrolled_xp(
                  np, x, u, bf, y, _activation_code(activation)),
              "cpu": _unrolled_cpu,
              "cuda": lambda x, u, bf, y, activation="none": _unrolled_xp(
                  array_module(x, u, y), x, u, bf, y, _activation_code(activation))},
    flops=lambda x, u, bf, y, **params: 2.0 * x[0] * math.prod(u) + 2.0 * math.prod(y))
"""``y = act(x @ u^T + bf)`` per sample on ``bn_[nobias_]fold_unrolled_eval``'s outputs:
operands ``(x, u, bf R, y W)``, parameter ``activation``."""
