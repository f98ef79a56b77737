"""Convolution codelets: 2-D forward pass, input gradient and parameter gradients.

This module owns five codelets and their NumPy reference and array-module variants
(the maths in one place); their geometry is ``conv_geometry.py``'s (re-exported here),
the Numba kernels sit beside it in ``conv_direct.py``, ``conv_im2col.py``,
``conv_gemm.py``, ``conv_unrolled.py`` and ``conv_winograd.py``:

===================  ==========================================
codelet              operands (access mode)
===================  ==========================================
conv2d_fwd           x (R), w (R), b (R), y (W)
conv2d_fwd_nobias    x (R), w (R), y (W)
conv2d_bwd_input     dy (R), w (R), dx (W)
conv2d_bwd_params    x (R), dy (R), dw (REDUX), db (REDUX)
conv2d_bwd_weight    x (R), dy (R), dw (REDUX)
===================  ==========================================

Parameters are ``torch.nn.functional.conv2d``'s plus the module's padding mode:
``stride=1``, ``padding=0`` (an int, an ``(h, w)`` pair, ``'same'`` or ``'valid'``),
``dilation=1``, ``groups=1`` and ``padding_mode='zeros'`` (``'reflect'``,
``'replicate'``, ``'circular'``: see ``padding.py``). Shapes are NCHW,
C-contiguous: ``x[N, C, H, W]``, ``w[O, C/groups, KH, KW]``, ``b[O]``,
``y[N, O, OH, OW]`` with ``OH = (H + pad_top + pad_bottom - DH*(KH-1) - 1) // SH + 1``.
Output channel ``o`` of group ``g = o // (O/groups)`` reads input channels
``[g*C/groups, (g+1)*C/groups)``. Every variant keeps the input dtype (float32
or float64) and accumulates in it, as PyTorch's CPU path does. Depthwise
convolutions (``groups == C``) have codelets of their own (``depthwise.py``).

Variants
--------
``ref``
    NumPy: a sliding-window view of the padded input contracted by ``tensordot``.
``cpu:direct``
    Numba loops, one kernel tap at a time over "wide" rows of a padded copy of each
    group's planes (``conv_direct.py``): no column buffer, long vectorised inner loops,
    the least memory; at best with few channels per group, where GEMMs are thin.
``cpu:im2col``
    A Numba kernel unfolds a chunk of samples into columns and BLAS runs one GEMM per
    sample and group, in one Numba call (``conv_im2col.py``). The fastest CPU variant on
    the small layers of ``benchmarks/bench_codelets_conv_pool.py``.
``cpu:gemm``
    One GEMM per chunk of the partition's samples (at least ``conv_gemm.GEMM_COLUMNS``
    columns wide), 1x1 convolutions as plain GEMMs on their operands (``conv_gemm.py``):
    run by ``cpu:unrolled`` where its kernels do not take the layer, 2-9x ``cpu:im2col``
    on ResNet-18's late layers. Groups, and images whose one sample makes a wide GEMM, go
    to ``cpu:im2col``.
``cpu:unrolled``: on images of at most KH*KW pixels (ResNet's 2x2 and 1x1), the filters
    unrolled into the matrix of the whole linear map and one GEMM per partition on the
    operands in place (``conv_unrolled.py``); ``cpu:gemm`` on the others.
``cpu:winograd`` (pinned): Winograd F(2x2, 3x3) on 3x3 stride-1 layers
    (``conv_winograd.py``; the weight gradient as 16 GEMMs of transformed gradient and
    input tiles), ``cpu:unrolled`` on the others.

The four BLAS variants (``cpu:im2col``, ``cpu:gemm``, ``cpu:unrolled``, ``cpu:winograd``)
share one table per pass (``_FWD``, ``_BWD_INPUT``, ``_BWD_PARAMS``): ``(variant, whether
its kernels take the layer, their calls)``, most specialised first; a variant runs the
first entry, from its own on, that takes the layer.
``cuda``
    The im2col/GEMM formulation written against the array module of its
    operands (CuPy on a GPU, NumPy in CI): slicing, batched ``matmul`` over
    the groups, no raw kernels, no scatter.

The REDUX operands (``dw``, ``db``) arrive as private partials already filled
by ``init``; every variant *adds* its contribution to them, never overwrites.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import conv_direct, conv_gemm, conv_im2col, conv_unrolled, conv_winograd
from ._checks import require_contiguous
from .codelet import REDUX, R, W, Codelet
from .conv_geometry import Conv2dGeometry, conv2d_geometry, conv2d_output_shape
from .gather import col2im_index, device_table, im2col_index
from .kernels_cuda_conv import col2im, grouped as _grouped, im2col
from .prepared import from_calls, prepares
from .padding import fold_xp, pad_xp
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = [
    "conv2d_fwd", "conv2d_fwd_nobias", "conv2d_bwd_input", "conv2d_bwd_params",
    "conv2d_bwd_weight", "conv2d_output_shape", "conv2d_geometry", "Conv2dGeometry",
]


# --------------------------------------------------------------------------- FLOPs

def _macs(dy_shape, w_shape):
    """Multiply-adds of one convolution: each output element sums C/G*KH*KW products."""
    return math.prod(dy_shape) * math.prod(w_shape[1:])


def _flops(out, weight, bias=False):
    """The FLOP count of a codelet whose operands ``out`` (``y`` or ``dy``) and ``weight`` (``w``
    or ``dw``) are at these indices; ``bias``: plus one addition per output element."""
    return lambda *shapes, **params: (2.0 * _macs(shapes[out], shapes[weight])
                                      + (math.prod(shapes[out]) if bias else 0))


_fwd_flops, _fwd_nobias_flops = _flops(3, 1, bias=True), _flops(2, 1)
_bwd_input_flops, _bwd_params_flops = _flops(0, 1), _flops(1, 2, bias=True)
_bwd_weight_flops = _flops(1, 2)


def _group_slices(geo, n_in, n_out):
    """``(input channels, output channels)`` slices of each group."""
    cg, og = n_in // geo.groups, n_out // geo.groups
    return [(slice(g * cg, (g + 1) * cg), slice(g * og, (g + 1) * og)) for g in range(geo.groups)]


def _taps(geo):
    """For each kernel tap ``(p, q)``: the slices of the padded input it reads over all outputs."""
    for p in range(geo.kh):
        for q in range(geo.kw):
            top, left = p * geo.dh, q * geo.dw
            yield p, q, (slice(None), slice(None),
                         slice(top, top + geo.sh * (geo.out_h - 1) + 1, geo.sh),
                         slice(left, left + geo.sw * (geo.out_w - 1) + 1, geo.sw))


# --------------------------------------------------------------------------- ref (NumPy)

def _windows_ref(x, geo):
    """View ``[N, C, OH, OW, KH, KW]`` of the padded input under each output (dilated taps)."""
    padded = pad_xp(np, x, geo.pads, geo.mode_name)
    extent = (geo.dh * (geo.kh - 1) + 1, geo.dw * (geo.kw - 1) + 1)
    windows = sliding_window_view(padded, extent, axis=(2, 3))[..., ::geo.dh, ::geo.dw]
    return windows[:, :, ::geo.sh, ::geo.sw][:, :, :geo.out_h, :geo.out_w]


def conv2d_fwd_ref(x, w, b, y, **params):
    """``y[n,o,i,j] = b[o] + sum_{c,p,q} w[o,c,p,q] * xpad[n, g*C/G + c, i*sh+p*dh, j*sw+q*dw]``."""
    conv2d_fwd_nobias_ref(x, w, y, **params)
    y += b.reshape(1, -1, 1, 1)


def conv2d_fwd_nobias_ref(x, w, y, **params):
    """``conv2d_fwd_ref`` without the bias term."""
    geo = conv2d_geometry(x.shape, w.shape, **params)
    windows = _windows_ref(x, geo)
    for cin, cout in _group_slices(geo, x.shape[1], w.shape[0]):
        # [N, C/G, OH, OW, KH, KW] x [O/G, C/G, KH, KW] -> [N, OH, OW, O/G]
        y[:, cout] = np.tensordot(windows[:, cin], w[cout],
                                  axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def conv2d_bwd_input_ref(dy, w, dx, **params):
    """``dx = d(sum y*dy)/dx``: every output scatters ``dy * w`` back onto its window of the
    padded input, which then folds onto the input (``padding.fold_xp``)."""
    geo = conv2d_geometry(dx.shape, w.shape, **params)
    n_batch, n_in, height, width = dx.shape
    padded = np.zeros((n_batch, n_in, geo.hp, geo.wp), dtype=dx.dtype)
    for cin, cout in _group_slices(geo, n_in, w.shape[0]):
        # [N, O/G, OH, OW] x [O/G, C/G, KH, KW] -> [N, OH, OW, C/G, KH, KW]
        contrib = np.tensordot(dy[:, cout], w[cout], axes=([1], [0]))
        group = padded[:, cin]
        for p, q, taps in _taps(geo):
            group[taps] += contrib[..., p, q].transpose(0, 3, 1, 2)
    dx[...] = fold_xp(np, padded, height, width, geo.pads, geo.mode_name)


def conv2d_bwd_weight_ref(x, dy, dw, **params):
    """``dw[o,c,p,q] += sum_{n,i,j} dy[n,o,i,j] * xpad[n, g*C/G + c, i*sh+p*dh, j*sw+q*dw]``
    (REDUX: accumulates)."""
    geo = conv2d_geometry(x.shape, dw.shape, **params)
    windows = _windows_ref(x, geo)
    for cin, cout in _group_slices(geo, x.shape[1], dw.shape[0]):
        # [N, O/G, OH, OW] x [N, C/G, OH, OW, KH, KW] -> [O/G, C/G, KH, KW]
        dw[cout] += np.tensordot(dy[:, cout], windows[:, cin], axes=([0, 2, 3], [0, 2, 3]))


def conv2d_bwd_params_ref(x, dy, dw, db, **params):
    """``conv2d_bwd_weight_ref`` plus ``db += sum_{n,i,j} dy[n,o,i,j]`` (REDUX)."""
    conv2d_bwd_weight_ref(x, dy, dw, **params)
    db += dy.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------- cpu:direct

_c = np.ascontiguousarray


@from_calls
def conv2d_fwd_cpu_direct(view, x, w, b, y, **params):
    """``conv2d_fwd`` by direct Numba loops."""
    geo = conv2d_geometry(x.shape, w.shape, **params)
    require_contiguous("conv2d_fwd", y=y)
    return [(conv_direct.conv2d_fwd_cpu, (view(x), view(w), view(b), True, y, geo))]


@from_calls
def conv2d_fwd_nobias_cpu_direct(view, x, w, y, **params):
    """``conv2d_fwd_nobias`` by direct Numba loops."""
    geo = conv2d_geometry(x.shape, w.shape, **params)
    require_contiguous("conv2d_fwd_nobias", y=y)
    return [(conv_direct.conv2d_fwd_cpu, (view(x), view(w), np.empty(0, dtype=y.dtype), False,
                                          y, geo))]


@from_calls
def conv2d_bwd_input_cpu_direct(view, dy, w, dx, **params):
    """``conv2d_bwd_input`` by direct Numba loops."""
    geo = conv2d_geometry(dx.shape, w.shape, **params)
    require_contiguous("conv2d_bwd_input", dx=dx)
    return [(conv_direct.conv2d_bwd_input_cpu, (view(dy), view(w), dx, geo))]


@from_calls
def conv2d_bwd_params_cpu_direct(view, x, dy, dw, db, **params):
    """``conv2d_bwd_params`` by direct Numba loops (adds into ``dw``, ``db``)."""
    geo = conv2d_geometry(x.shape, dw.shape, **params)
    require_contiguous("conv2d_bwd_params", dw=dw)
    return [(conv_direct.conv2d_bwd_params_cpu, (view(x), view(dy), dw, db, True, geo))]


@from_calls
def conv2d_bwd_weight_cpu_direct(view, x, dy, dw, **params):
    """``conv2d_bwd_weight`` by direct Numba loops (adds into ``dw``)."""
    geo = conv2d_geometry(x.shape, dw.shape, **params)
    require_contiguous("conv2d_bwd_weight", dw=dw)
    return [(conv_direct.conv2d_bwd_params_cpu, (view(x), view(dy), dw,
                                                 np.empty(0, dtype=dw.dtype), False, geo))]


# --------------------------------------------------------------------------- BLAS variants

def _fwd_im2col_calls(buffers, x, w, b, y, geo):
    """im2col then one GEMM per sample and group straight into ``y``, in one Numba call
    (and one packing ``[w | b]``: without groups, ``[w | b]`` multiplies the columns plus a
    row of ones): the calls (:mod:`~hetero_nn.codelets.prepared`)."""
    (x, w3, bias, cols, xpad, step), pack = conv_im2col.fwd_operands(x, w, b, y.dtype, geo,
                                                                     buffers)
    n_batch, n_out = y.shape[0], y.shape[1]
    return [pack] * (pack is not None) + [(conv_im2col.gemm_columns_cpu, (
        x, 0, n_batch, w3, bias, y.reshape(n_batch, n_out, -1), cols, xpad, geo, step))]


def _bwd_input_im2col_calls(buffers, dy, w, dx, geo):
    """One GEMM per sample and group (``w^T dy``) then col2im, in one Numba call. On narrow
    images (``conv_im2col._wide_rows``) ``dy`` is first widened to rows of ``WP`` (zeros
    past ``OW``): the GEMM does ``WP/OW`` times the work but col2im then adds one long row
    per tap instead of ``OH`` short ones."""
    return [(conv_im2col.bwd_input_im2col_cpu,
             (_c(dy), *conv_im2col.bwd_input_operands(w, dx, geo, buffers)))]


def _bwd_params_im2col_calls(buffers, x, dy, dw, db, geo):
    """im2col then one GEMM per sample and group, ``cols_n dy_n^T``, summed into ``dw`` (and
    ``db``; None: none), in one Numba call. Without groups the row of ones under the columns
    makes the GEMM's last row the bias gradient. ``cols_n dy_n^T`` ([C*KH*KW, O]) rather
    than ``dy_n cols_n^T``: OpenBLAS runs this orientation 10-40% faster on these shapes."""
    x = _c(x)
    dw_flat, db, bias = conv_im2col.params_operands(dw, db)
    return [(conv_im2col.bwd_params_im2col_cpu, (
        x, _c(dy), dw_flat, db, bias,
        *conv_im2col.bwd_params_operands(x, dw.shape, bias, dw.dtype, geo, buffers)))]


class _Pass(NamedTuple):
    """One pass as the BLAS variants run it. ``roles``: the indices, among the pass's
    operands, of the layer's input (``x`` or ``dx``), its weights (``w`` or ``dw``), its
    output (``y`` or ``dy``) and the operand written; ``chain``: ``(variant, takes(geo,
    x_shape, n_out, y_shape), calls(buffers, *operands, geo))``, most specialised first. A
    variant runs the first entry, from its own on, that takes the layer; the last takes
    every layer."""
    codelet: str
    written: str
    roles: tuple
    chain: tuple


def _chain(winograd_takes, kernels, im2col_calls):
    """The chain of a pass: Winograd where ``winograd_takes``, unrolled filters, partition
    GEMMs, im2col; ``kernels`` the name of the pass's calls in the first three modules."""
    return (("cpu:winograd", winograd_takes, getattr(conv_winograd, kernels)),
            ("cpu:unrolled", lambda geo, x, n_out, y: conv_unrolled.handles(geo, x, n_out),
             getattr(conv_unrolled, kernels)),
            ("cpu:gemm", lambda geo, x, n_out, y: conv_gemm.handles(geo, x),
             getattr(conv_gemm, kernels)),
            ("cpu:im2col", lambda geo, x, n_out, y: True, im2col_calls))


_FWD = _Pass("conv2d_fwd", "y", (0, 1, 3, 3), _chain(
    lambda geo, x, n_out, y: conv_winograd.handles(geo, x), "fwd_calls", _fwd_im2col_calls))
"""``(x, w, b, y)``, ``b`` None for none."""

_BWD_INPUT = _Pass("conv2d_bwd_input", "dx", (2, 1, 0, 2), _chain(
    lambda geo, dx, n_out, dy: conv_winograd.handles_input(geo, dy), "bwd_input_calls",
    _bwd_input_im2col_calls))
"""``(dy, w, dx)``."""

_BWD_PARAMS = _Pass("conv2d_bwd_params", "dw", (0, 2, 1, 2), _chain(
    lambda geo, x, n_out, dy: conv_winograd.handles_weight(geo, x, n_out), "bwd_params_calls",
    _bwd_params_im2col_calls))
"""``(x, dy, dw, db)``, ``db`` None for none."""


def _chain_calls(layer_pass, variant):
    """``calls(buffers, *operands, params)`` of ``variant`` in ``layer_pass``: the calls of
    the first entry of its chain, from the variant's own on, that takes the layer."""
    chain = layer_pass.chain[[entry[0] for entry in layer_pass.chain].index(variant):]
    ix, iw, iy, iout = layer_pass.roles

    def calls(buffers, *args):
        *operands, params = args
        x, w, y = operands[ix].shape, operands[iw].shape, operands[iy].shape
        geo = conv2d_geometry(x, w, **params)
        require_contiguous(layer_pass.codelet, **{layer_pass.written: operands[iout]})
        for _, takes, kernels in chain:
            if takes(geo, x, w[0], y):
                return kernels(buffers, *operands, geo)
    return calls


def _gemm_variant(calls, absent, doc):
    """The variant running ``calls(buffers, *operands, params)``, None inserted
    at index ``absent`` of the operands (the missing ``b`` or ``db``; None: nothing
    missing), and its ``prepare``."""
    def operands(arrays):
        return arrays if absent is None else (*arrays[:absent], None, *arrays[absent:])

    def prepare(buffers, *arrays, **params):
        if not conv_im2col.views(arrays[-1].dtype, *arrays):
            return None
        return calls(buffers, *operands(arrays), params)

    @prepares(prepare)
    def variant(*arrays, **params):
        conv_im2col.run_calls(calls(conv_im2col.worker_buffer, *operands(arrays), params))
    variant.__doc__ = doc
    return variant


_BY = {"cpu:im2col": "im2col and one GEMM per sample",
       "cpu:gemm": "partition GEMMs, else im2col",
       "cpu:winograd": "Winograd, else unrolled filters, partition GEMMs or im2col",
       "cpu:unrolled": "unrolled filters, else partition GEMMs or im2col"}


def _blas_variants(codelet, layer_pass, absent=None):
    """``codelet``'s BLAS variants over ``layer_pass`` (``absent``: see ``_gemm_variant``)."""
    return {name: _gemm_variant(_chain_calls(layer_pass, name), absent,
                                f"``{codelet}`` by {how}.") for name, how in _BY.items()}


_fwd_winograd_calls = _chain_calls(_FWD, "cpu:winograd")  # the fused blocks' convolution


# --------------------------------------------------------------------------- cuda (array module)

def _plane_key(geo):
    return (geo.hp, geo.wp, geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw, geo.out_h, geo.out_w)


def _im2col_xp(xp, x, geo):
    """Columns ``[N, C, KH, KW, OH, OW]`` of ``x``: one kernel (:mod:`.kernels_cuda_conv`),
    else a gather from the padded input by a memoized index table (:mod:`.gather`)."""
    cols = im2col(xp, x, geo)
    if cols is not None:
        return cols
    padded = pad_xp(xp, x, geo.pads, geo.mode_name)
    key = _plane_key(geo)
    index = device_table(xp, ("im2col", key), lambda: im2col_index(*key))
    cols = padded.reshape(*x.shape[:2], geo.hp * geo.wp)[:, :, index]
    return cols.reshape(*x.shape[:2], geo.kh, geo.kw, geo.out_h, geo.out_w)


def conv2d_fwd_nobias_cuda(x, w, y, **params):
    """``conv2d_fwd_nobias`` as im2col + one GEMM batched over samples and groups, in ``xp``."""
    xp = array_module(x, w, y)
    geo = conv2d_geometry(x.shape, w.shape, **params)
    cols = _im2col_xp(xp, x, geo).reshape(x.shape[0], geo.groups, -1, geo.out_h * geo.out_w)
    # [G, O/G, C/G*KH*KW] @ [N, G, C/G*KH*KW, OH*OW] -> [N, G, O/G, OH*OW]
    wg = w.reshape(geo.groups, w.shape[0] // geo.groups, -1)
    if y.flags.c_contiguous:
        xp.matmul(wg, cols, out=_grouped(y, geo.groups))  # the GEMM writes y: no copy
    else:
        y[...] = xp.matmul(wg, cols).reshape(y.shape)


def conv2d_fwd_cuda(x, w, b, y, **params):
    """``conv2d_fwd`` as im2col + batched GEMM + bias, in ``xp``."""
    conv2d_fwd_nobias_cuda(x, w, y, **params)
    y += b.reshape(1, -1, 1, 1)


def conv2d_bwd_input_cuda(dy, w, dx, **params):
    """``conv2d_bwd_input`` as a batched GEMM ``w^T dy`` per group, then col2im, in ``xp``."""
    xp = array_module(dy, w, dx)
    geo = conv2d_geometry(dx.shape, w.shape, **params)
    n_batch, n_in, height, width = dx.shape
    wg = w.reshape(geo.groups, w.shape[0] // geo.groups, -1)
    cols = xp.matmul(wg.transpose(0, 2, 1), _grouped(dy, geo.groups))
    if col2im(xp, cols, dx, geo):  # one kernel; else a gather: each padded position sums
        return                     # the column entries read from it
    key = _plane_key(geo)
    index = device_table(xp, ("col2im", key), lambda: col2im_index(*key))
    cols = xp.concatenate([cols.reshape(n_batch, n_in, -1),
                           xp.zeros((n_batch, n_in, 1), dtype=dx.dtype)], axis=2)
    padded = cols[:, :, index].sum(axis=-1).reshape(n_batch, n_in, geo.hp, geo.wp)
    dx[...] = fold_xp(xp, padded, height, width, geo.pads, geo.mode_name)


def conv2d_bwd_weight_cuda(x, dy, dw, **params):
    """``conv2d_bwd_weight`` as im2col + one GEMM per group over batch and pixels, in ``xp``."""
    xp = array_module(x, dy, dw)
    geo = conv2d_geometry(x.shape, dw.shape, **params)
    groups, n_batch, area = geo.groups, x.shape[0], geo.out_h * geo.out_w
    cols = _im2col_xp(xp, x, geo).reshape(n_batch, groups, -1, area).transpose(1, 0, 3, 2)
    grads = _grouped(dy, groups).transpose(1, 2, 0, 3)                     # [G, O/G, N, OH*OW]
    dw += xp.matmul(grads.reshape(groups, grads.shape[1], -1),
                    cols.reshape(groups, n_batch * area, -1)).reshape(dw.shape)


def conv2d_bwd_params_cuda(x, dy, dw, db, **params):
    """``conv2d_bwd_params`` in ``xp``: the weight GEMMs plus a bias sum."""
    conv2d_bwd_weight_cuda(x, dy, dw, **params)
    db += dy.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------- codelets

conv2d_fwd = Codelet(
    "conv2d_fwd", modes=(R, R, R, W),
    variants={"ref": conv2d_fwd_ref, "cpu:direct": conv2d_fwd_cpu_direct,
              **_blas_variants("conv2d_fwd", _FWD), "cuda": conv2d_fwd_cuda},
    flops=_fwd_flops)
"""``y = conv2d(x, w) + b``: operands ``(x R, w R, b R, y W)``."""

conv2d_fwd_nobias = Codelet(
    "conv2d_fwd_nobias", modes=(R, R, W),
    variants={"ref": conv2d_fwd_nobias_ref, "cpu:direct": conv2d_fwd_nobias_cpu_direct,
              **_blas_variants("conv2d_fwd_nobias", _FWD, 2),
              "cuda": conv2d_fwd_nobias_cuda},
    flops=_fwd_nobias_flops)
"""``y = conv2d(x, w)``: operands ``(x R, w R, y W)``."""

conv2d_bwd_input = Codelet(
    "conv2d_bwd_input", modes=(R, R, W),
    variants={"ref": conv2d_bwd_input_ref, "cpu:direct": conv2d_bwd_input_cpu_direct,
              **_blas_variants("conv2d_bwd_input", _BWD_INPUT),
              "cuda": conv2d_bwd_input_cuda},
    flops=_bwd_input_flops)
"""``dx = conv2d^T(dy, w)``: operands ``(dy R, w R, dx W)``."""

conv2d_bwd_params = Codelet(
    "conv2d_bwd_params", modes=(R, R, REDUX, REDUX),
    variants={"ref": conv2d_bwd_params_ref, "cpu:direct": conv2d_bwd_params_cpu_direct,
              **_blas_variants("conv2d_bwd_params", _BWD_PARAMS),
              "cuda": conv2d_bwd_params_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_params_flops)
"""``dw += dL/dw, db += dL/db``: operands ``(x R, dy R, dw REDUX, db REDUX)``."""

conv2d_bwd_weight = Codelet(
    "conv2d_bwd_weight", modes=(R, R, REDUX),
    variants={"ref": conv2d_bwd_weight_ref, "cpu:direct": conv2d_bwd_weight_cpu_direct,
              **_blas_variants("conv2d_bwd_weight", _BWD_PARAMS, 3),
              "cuda": conv2d_bwd_weight_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_weight_flops)
"""``dw += dL/dw`` for a convolution without bias: operands ``(x R, dy R, dw REDUX)``."""
