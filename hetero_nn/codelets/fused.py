"""Fused codelets: the layer chains every CNN has, each run as one task.

This module owns the three codelets of the convolution chain; the dense chain's
three live in :mod:`.fused_dense` and are re-exported here, so ``fused`` names all
six. Each is the composition of existing codelets, built from their kernels
(nothing is re-derived here), so one task does the work of three or four and the
intermediate never leaves the worker:

=============================  ===================================================  ==============
codelet                        operands (access mode)                               composes
=============================  ===================================================  ==============
conv2d_relu_pool_fwd           x (R), w (R), b (R), y (W), argmax (W)                conv2d_fwd,
                                                                                    relu_fwd,
                                                                                    maxpool2d_fwd
conv2d_relu_pool_bwd           x (R), w (R), y (R), argmax (R), dy (R),              maxpool2d_bwd,
                               dx (W), dw (REDUX), db (REDUX)                       relu_bwd,
                                                                                    conv2d_bwd_*
conv2d_relu_pool_bwd_params    the same without w and dx (a first layer)
dense_relu_*                   in :mod:`.fused_dense`
=============================  ===================================================  ==============

The convolution codelets take the convolution's parameters (``stride``,
``padding``, ``dilation``, ``groups``, ``padding_mode``: ``conv2d_fwd``'s) and the
pooling's as ``pool_size``, ``pool_stride``, ``pool_padding``, ``pool_dilation``
and ``pool_ceil_mode`` (``maxpool2d_fwd``'s). ``y`` is the pooled output and
``argmax`` its window indices into the convolution's output plane, exactly
``maxpool2d_fwd``'s on ``relu(conv2d(x) + b)``.

Why the backward pass needs neither the convolution's output nor its ReLU:
the pooling routes each gradient to one position of the ReLU output, whose
value *is* the pooled value ``y``; ReLU's backward there passes the gradient
iff ``y > 0`` (PyTorch's ``threshold_backward``). So the backward chain masks
``dy`` by ``y > 0``, routes it through ``argmax`` into the convolution's output
gradient ``dz`` (a worker-private buffer) and runs the convolution's parameter
and input gradients on ``dz``: results equal to the unfused chain's, with
``relu_bwd`` on a quarter of the elements and no activation kept but ``y``.

Variants
--------
``ref``
    The composition of the reference variants: the maths in one place, and
    what the other variants are checked against.
``cpu:direct``
    The Numba kernels of the composed codelets, called in turn on
    worker-private buffers (``_scratch``); the forward convolution
    runs chunk by chunk of samples, so ReLU and pooling read its output while
    it is still in cache.
``cpu:im2col``, the pinned one
    One Numba kernel per task that calls the composed kernels and BLAS
    (Numba's ``np.dot``) itself, chunk by chunk as above: the task crosses
    the interpreter lock once, so two workers' tasks do not wait for each
    other (``benchmarks/bench_gil.py``).
``cuda``
    The composition of the ``cuda`` variants, written against the array module.

REDUX operands (``dw``, ``db``) are added into, as in the codelets composed.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import conv, conv_im2col, dense, kernels_cuda_layers, pool
from ._checks import require_contiguous
from ._jit import jit
from .activation import _relu_bwd_cpu, _relu_bwd_ref, _relu_fwd_cpu
from .conv_im2col import gemm_columns_cpu
from .codelet import REDUX, R, W, Codelet
from .prepared import prepares
from .reduce import add_redux, zero_init
from .xp import array_module

from .fused_dense import dense_relu_bwd, dense_relu_bwd_params, dense_relu_fwd

__all__ = ["conv2d_relu_pool_fwd", "conv2d_relu_pool_bwd", "conv2d_relu_pool_bwd_params",
           "dense_relu_fwd", "dense_relu_bwd", "dense_relu_bwd_params"]


CHUNK_BYTES = 1 << 22
"""Most bytes of the convolution's output (``z``) one forward chunk keeps, for ReLU and
pooling to read it from cache. Chunks much smaller cost more Python calls of the
convolution than they save: with ~100 KiB chunks LeNet-5's first layer ran its chain
about 30% slower than the three unfused kernels; from 1 MiB up the fused chain and the
unfused kernels take the same time to within the noise of a shared machine."""


_thread = threading.local()


def _scratch(tag, shape, dtype):
    """A C-contiguous ``shape`` array over the calling thread's one buffer for ``(tag, dtype)``.

    The buffer grows to the largest request and is then reused by every layer and
    partition size (the last partition is often one sample shorter): keyed by exact
    shape, as ``conv_im2col.worker_buffer`` is, the fused chains' scratch arrays would
    double its entries and push the convolutions' own out, reallocated every step.
    The rules are ``conv_im2col.worker_buffer``'s: valid until the variant returns.
    """
    buffers = getattr(_thread, "buffers", None)
    if buffers is None:
        buffers = _thread.buffers = {}
    key = (tag, np.dtype(dtype).str)
    size = math.prod(shape)
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = np.empty(size, dtype=dtype)
    return buf[:size].reshape(shape)


# --------------------------------------------------------------------------- convolution chain

_POOL = {"pool_size": "kernel_size", "pool_stride": "stride", "pool_padding": "padding",
         "pool_dilation": "dilation", "pool_ceil_mode": "ceil_mode"}


def _split(params):
    """``(convolution parameters, pooling parameters)`` of a chain task's parameters: the
    ``pool_*`` ones (``pool_size`` defaults to 2) go to the pooling, the others to the
    convolution."""
    conv_kw = {k: v for k, v in params.items() if k not in _POOL}
    pool_kw = {_POOL[k]: v for k, v in params.items() if k in _POOL}
    pool_kw.setdefault("kernel_size", 2)
    return conv_kw, pool_kw


def _conv_shape(x_shape, w_shape, conv_kw):
    return conv.conv2d_output_shape(x_shape, w_shape, **conv_kw)


def _pool_geometry(name, z_shape, y_shape, pool_kw):
    """The pooling geometry, checking that it pools ``z_shape`` to ``y_shape``."""
    geo = pool.pool2d_geometry(z_shape, **pool_kw)
    expected = (*z_shape[:2], geo.out_h, geo.out_w)
    if tuple(y_shape) != expected:
        raise ValueError(f"{name}: convolution output {tuple(z_shape)} pools to {expected}, "
                         f"the output is {tuple(y_shape)}")
    return geo


def conv2d_relu_pool_fwd_ref(x, w, b, y, argmax, **params):
    """``y, argmax = max_pool2d(relu(conv2d(x, w) + b))``."""
    conv_kw, pool_kw = _split(params)
    z = np.empty(_conv_shape(x.shape, w.shape, conv_kw), dtype=y.dtype)
    _pool_geometry("conv2d_relu_pool_fwd", z.shape, y.shape, pool_kw)
    conv.conv2d_fwd_ref(x, w, b, z, **conv_kw)
    np.maximum(z, np.zeros((), z.dtype), out=z)
    pool.maxpool2d_fwd_ref(z, y, argmax, **pool_kw)


def _masked_dz_ref(y, argmax, dy, z_shape):
    """The convolution's output gradient: ``dy`` where ``y > 0``, routed through ``argmax``."""
    masked = np.empty_like(dy)
    _relu_bwd_ref(y, dy, masked)
    dz = np.empty(z_shape, dtype=dy.dtype)
    pool.maxpool2d_bwd_ref(masked, argmax, dz)
    return dz


def conv2d_relu_pool_bwd_ref(x, w, y, argmax, dy, dx, dw, db, **params):
    """Gradients of the chain: ``dx`` (written), ``dw`` and ``db`` (added into)."""
    conv_kw, _ = _split(params)
    dz = _masked_dz_ref(y, argmax, dy, _conv_shape(x.shape, w.shape, conv_kw))
    conv.conv2d_bwd_params_ref(x, dz, dw, db, **conv_kw)
    conv.conv2d_bwd_input_ref(dz, w, dx, **conv_kw)


def conv2d_relu_pool_bwd_params_ref(x, y, argmax, dy, dw, db, **params):
    """``conv2d_relu_pool_bwd_ref`` without the input gradient."""
    conv_kw, _ = _split(params)
    dz = _masked_dz_ref(y, argmax, dy, _conv_shape(x.shape, dw.shape, conv_kw))
    conv.conv2d_bwd_params_ref(x, dz, dw, db, **conv_kw)


def _conv_relu_pool_fwd_cpu(conv_fwd):
    """The Numba forward chain over chunks of samples, convolving with ``conv_fwd``."""
    def variant(x, w, b, y, argmax, **params):
        conv_kw, pool_kw = _split(params)
        n_batch, n_out, out_h, out_w = _conv_shape(x.shape, w.shape, conv_kw)
        pool_geo = _pool_geometry("conv2d_relu_pool_fwd", (n_batch, n_out, out_h, out_w),
                                  y.shape, pool_kw)
        require_contiguous("conv2d_relu_pool_fwd", y=y, argmax=argmax)
        x = np.ascontiguousarray(x)
        step = max(1, min(n_batch, CHUNK_BYTES // (n_out * out_h * out_w * y.itemsize)))
        z = _scratch("z", (step, n_out, out_h, out_w), y.dtype)
        for start in range(0, n_batch, step):
            stop = min(start + step, n_batch)
            zc = z[:stop - start]
            conv_fwd(x[start:stop], w, b, zc, **conv_kw)
            flat = zc.reshape(-1)
            _relu_fwd_cpu(flat, flat)
            pool.maxpool2d_fwd_cpu_kernel(zc, y[start:stop], argmax[start:stop], pool_geo)
    variant.__name__ = f"conv2d_relu_pool_fwd_{conv_fwd.__name__}"
    return variant


def _masked_dz_cpu(y, argmax, dy, z_shape):
    """``_masked_dz_ref`` by the ReLU and pooling kernels, into worker buffers."""
    masked = _scratch("masked", dy.shape, dy.dtype)
    _relu_bwd_cpu(np.ascontiguousarray(y).reshape(-1), np.ascontiguousarray(dy).reshape(-1),
                  masked.reshape(-1))
    dz = _scratch("dz", z_shape, dy.dtype)
    pool.maxpool2d_bwd_cpu_kernel(masked, np.ascontiguousarray(argmax), dz)
    return dz


def _conv_relu_pool_bwd_cpu(bwd_params, bwd_input):
    """The Numba backward chain; the input gradient is skipped when ``bwd_input`` is None."""
    def run(x, w_shape, y, argmax, dy, dw, db, conv_kw):
        dz = _masked_dz_cpu(y, argmax, dy, _conv_shape(x.shape, w_shape, conv_kw))
        bwd_params(x, dz, dw, db, **conv_kw)
        return dz

    if bwd_input is None:
        def variant(x, y, argmax, dy, dw, db, **params):
            run(x, dw.shape, y, argmax, dy, dw, db, _split(params)[0])
    else:
        def variant(x, w, y, argmax, dy, dx, dw, db, **params):
            conv_kw = _split(params)[0]
            dz = run(x, w.shape, y, argmax, dy, dw, db, conv_kw)
            bwd_input(dz, w, dx, **conv_kw)
    variant.__name__ = f"conv2d_relu_pool_bwd_{bwd_params.__name__}"
    return variant


@jit
def _conv_relu_pool_fwd_im2col_cpu(x, w3, bias, z, y, argmax, cols, xpad, geo, conv_step,
                                   pool_geo):
    """The forward chain in one call: per chunk of ``z``'s samples, im2col + GEMM into
    ``z``, ReLU in place, pooling into ``y`` and ``argmax``."""
    n_batch, n_out = y.shape[0], y.shape[1]
    step = z.shape[0]
    for start in range(0, n_batch, step):
        stop = min(start + step, n_batch)
        zc = z[:stop - start]
        gemm_columns_cpu(x, start, stop, w3, bias, zc, cols, xpad, geo, conv_step)
        flat = zc.reshape(-1)
        _relu_fwd_cpu(flat, flat)
        pool.maxpool2d_fwd_cpu_kernel(zc.reshape(stop - start, n_out, geo.out_h, geo.out_w),
                                      y[start:stop], argmax[start:stop], pool_geo)


def _fwd_im2col_calls(buffers, scratch, x, w, b, y, argmax, params):
    """The forward chain's calls: pack ``[w | b]``, then the chain in one kernel.
    ``buffers``: the convolution's scratch arrays, ``scratch``: the chain's ``z``."""
    conv_kw, pool_kw = _split(params)
    geo = conv.conv2d_geometry(x.shape, w.shape, **conv_kw)
    n_batch, n_out = x.shape[0], w.shape[0]
    pool_geo = _pool_geometry("conv2d_relu_pool_fwd", (n_batch, n_out, geo.out_h, geo.out_w),
                              y.shape, pool_kw)
    require_contiguous("conv2d_relu_pool_fwd", y=y, argmax=argmax)
    (x, w3, bias, cols, xpad, conv_step), pack = conv_im2col.fwd_operands(x, w, b, y.dtype,
                                                                          geo, buffers)
    area = geo.out_h * geo.out_w
    step = max(1, min(n_batch, CHUNK_BYTES // (n_out * area * y.itemsize)))
    z = scratch("z", (step, n_out, area), y.dtype)
    return [pack] * (pack is not None) + [(_conv_relu_pool_fwd_im2col_cpu, (
        x, w3, bias, z, y, argmax, cols, xpad, geo, conv_step, pool_geo))]


def _prepare_fwd_im2col(buffers, x, w, b, y, argmax, **params):
    if not (conv_im2col.views(y.dtype, x, w, b, y) and argmax.flags.c_contiguous):
        return None
    return _fwd_im2col_calls(buffers, buffers, x, w, b, y, argmax, params)


@prepares(_prepare_fwd_im2col)
def conv2d_relu_pool_fwd_cpu_im2col(x, w, b, y, argmax, **params):
    """The forward chain by the im2col kernels, one Numba call (one round trip through
    the interpreter lock; and one more packing ``[w | b]``); ``z`` is computed a chunk
    of samples at a time, so ReLU and pooling read it from cache."""
    conv_im2col.run_calls(_fwd_im2col_calls(conv_im2col.worker_buffer, _scratch, x, w, b, y,
                                            argmax, params))


@jit
def _masked_dz_params_cpu(x, y, argmax, dy, masked, dz, dw, db, bias, params):
    """``dz`` = ``dy`` masked by ``y > 0`` and routed through ``argmax``; then the
    convolution's parameter gradients of ``dz`` added into ``dw`` (flat) and ``db``."""
    _relu_bwd_cpu(y.reshape(-1), dy.reshape(-1), masked.reshape(-1))
    pool.maxpool2d_bwd_cpu_kernel(masked, argmax, dz)
    total, cols, products, xpad, geo, step = params
    conv_im2col.bwd_params_im2col_cpu(x, dz, dw, db, bias, total, cols, products, xpad, geo,
                                      step)


@jit
def _conv_relu_pool_bwd_im2col_cpu(x, y, argmax, dy, masked, dz, dw, db, bias, params,
                                   w3, dx, bufs, geo, wide, step):
    """``_masked_dz_params_cpu``, then the input gradient ``dx`` of ``dz``, in one call."""
    _masked_dz_params_cpu(x, y, argmax, dy, masked, dz, dw, db, bias, params)
    cols, plane, dy_wide = bufs
    conv_im2col.bwd_input_im2col_cpu(dz, w3, dx, cols, plane, dy_wide, geo, wide, step)


def _bwd_chain_operands(x, y, argmax, dy, dw, db, geo, buffers, scratch):
    """The arguments of ``_masked_dz_params_cpu`` (contiguous inputs, the worker's
    buffers for ``masked`` and ``dz``, the parameter kernel's buffers)."""
    require_contiguous("conv2d_relu_pool_bwd", dw=dw)
    x = np.ascontiguousarray(x)
    dy = np.ascontiguousarray(dy)
    masked = scratch("masked", dy.shape, dy.dtype)
    dz = scratch("dz", (x.shape[0], dw.shape[0], geo.out_h, geo.out_w), dy.dtype)
    dw_flat, db, bias = conv_im2col.params_operands(dw, db)
    params = conv_im2col.bwd_params_operands(x, dw.shape, bias, dw.dtype, geo, buffers)
    return (x, np.ascontiguousarray(y), np.ascontiguousarray(argmax), dy, masked, dz, dw_flat,
            db, bias, params)


def _bwd_im2col_calls(buffers, scratch, x, w, y, argmax, dy, dx, dw, db, params):
    """The backward chain's call (the parameter gradients only when ``w`` is None)."""
    geo = conv.conv2d_geometry(x.shape, (w if w is not None else dw).shape,
                               **_split(params)[0])
    chain = _bwd_chain_operands(x, y, argmax, dy, dw, db, geo, buffers, scratch)
    if w is None:
        return [(_masked_dz_params_cpu, chain)]
    require_contiguous("conv2d_relu_pool_bwd", dx=dx)
    w3, dx, cols, plane, dy_wide, geo, wide, step = conv_im2col.bwd_input_operands(
        w, dx, geo, buffers)
    return [(_conv_relu_pool_bwd_im2col_cpu, (*chain, w3, dx, (cols, plane, dy_wide), geo,
                                              wide, step))]


def _prepare_bwd_im2col(buffers, x, w, y, argmax, dy, dx, dw, db, **params):
    if not (conv_im2col.views(dy.dtype, x, w, y, dy, dx, dw, db)
            and argmax.flags.c_contiguous):
        return None
    return _bwd_im2col_calls(buffers, buffers, x, w, y, argmax, dy, dx, dw, db, params)


def _prepare_bwd_params_im2col(buffers, x, y, argmax, dy, dw, db, **params):
    return _prepare_bwd_im2col(buffers, x, None, y, argmax, dy, None, dw, db, **params)


@prepares(_prepare_bwd_im2col)
def conv2d_relu_pool_bwd_cpu_im2col(x, w, y, argmax, dy, dx, dw, db, **params):
    """The backward chain by the im2col kernels, one Numba call."""
    conv_im2col.run_calls(_bwd_im2col_calls(conv_im2col.worker_buffer, _scratch, x, w, y,
                                            argmax, dy, dx, dw, db, params))


@prepares(_prepare_bwd_params_im2col)
def conv2d_relu_pool_bwd_params_cpu_im2col(x, y, argmax, dy, dw, db, **params):
    """The parameter gradients of the chain by the im2col kernels, one Numba call."""
    conv_im2col.run_calls(_bwd_im2col_calls(conv_im2col.worker_buffer, _scratch, x, None, y,
                                            argmax, dy, None, dw, db, params))


def _geometries(name, x, w_shape, y, params):
    conv_kw, pool_kw = _split(params)
    geo = conv.conv2d_geometry(x.shape, w_shape, **conv_kw)
    return geo, _pool_geometry(name, (x.shape[0], w_shape[0], geo.out_h, geo.out_w), y.shape,
                               pool_kw)


def conv2d_relu_pool_fwd_cuda(x, w, b, y, argmax, **params):
    """The forward chain by one kernel (:mod:`.kernels_cuda_layers`), else in ``xp``."""
    xp = array_module(x, w, b, y)
    if not kernels_cuda_layers.conv_relu_pool_fwd(
            xp, x, w, b, y, argmax, *_geometries("conv2d_relu_pool_fwd", x, w.shape, y, params),
            _conv2d_relu_pool_fwd_xp, x, w, b, y, argmax, **params):
        _conv2d_relu_pool_fwd_xp(x, w, b, y, argmax, **params)


def _conv2d_relu_pool_fwd_xp(x, w, b, y, argmax, **params):
    """The forward chain by the ``cuda`` variants, in ``xp`` (the kernel's twin)."""
    conv_kw, pool_kw = _split(params)
    xp = array_module(x, w, b, y)
    z = xp.empty(_conv_shape(x.shape, w.shape, conv_kw), dtype=y.dtype)
    _pool_geometry("conv2d_relu_pool_fwd", z.shape, y.shape, pool_kw)
    conv.conv2d_fwd_cuda(x, w, b, z, **conv_kw)
    xp.maximum(z, xp.zeros((), z.dtype), out=z)
    pool.maxpool2d_fwd_cuda(z, y, argmax, **pool_kw)


def _masked_dz_cuda(y, argmax, dy, z_shape, pool_kw):
    xp = array_module(y, argmax, dy)
    masked = xp.where(y <= 0, xp.zeros((), dy.dtype), dy)
    dz = xp.empty(z_shape, dtype=dy.dtype)
    pool.maxpool2d_bwd_cuda(masked, argmax, dz, **pool_kw)
    return dz


def conv2d_relu_pool_bwd_cuda(x, w, y, argmax, dy, dx, dw, db, **params):
    """The backward chain by two kernels (:mod:`.kernels_cuda_layers`), else in ``xp``."""
    if not kernels_cuda_layers.conv_relu_pool_bwd(
            array_module(x, w, y, dy), x, w, y, argmax, dy, dx, dw, db,
            *_geometries("conv2d_relu_pool_bwd", x, w.shape, y, params),
            _conv2d_relu_pool_bwd_xp, x, w, y, argmax, dy, dx, dw, db, **params):
        _conv2d_relu_pool_bwd_xp(x, w, y, argmax, dy, dx, dw, db, **params)


def _conv2d_relu_pool_bwd_xp(x, w, y, argmax, dy, dx, dw, db, **params):
    """The backward chain by the ``cuda`` variants, in ``xp`` (the kernels' twin)."""
    conv_kw, pool_kw = _split(params)
    dz = _masked_dz_cuda(y, argmax, dy, _conv_shape(x.shape, w.shape, conv_kw), pool_kw)
    conv.conv2d_bwd_params_cuda(x, dz, dw, db, **conv_kw)
    conv.conv2d_bwd_input_cuda(dz, w, dx, **conv_kw)


def conv2d_relu_pool_bwd_params_cuda(x, y, argmax, dy, dw, db, **params):
    """``conv2d_relu_pool_bwd_cuda`` without the input gradient."""
    if not kernels_cuda_layers.conv_relu_pool_bwd(
            array_module(x, y, dy), x, None, y, argmax, dy, None, dw, db,
            *_geometries("conv2d_relu_pool_bwd_params", x, dw.shape, y, params),
            _conv2d_relu_pool_bwd_params_xp, x, y, argmax, dy, dw, db, **params):
        _conv2d_relu_pool_bwd_params_xp(x, y, argmax, dy, dw, db, **params)


def _conv2d_relu_pool_bwd_params_xp(x, y, argmax, dy, dw, db, **params):
    conv_kw, pool_kw = _split(params)
    dz = _masked_dz_cuda(y, argmax, dy, _conv_shape(x.shape, dw.shape, conv_kw), pool_kw)
    conv.conv2d_bwd_params_cuda(x, dz, dw, db, **conv_kw)


def _fwd_flops(x, w, b, y, argmax, **params):
    conv_kw, pool_kw = _split(params)
    z = _conv_shape(x, w, conv_kw)
    return (conv._fwd_flops(x, w, b, z) + math.prod(z)
            + pool._fwd_flops(z, y, argmax, **pool_kw))


def _bwd_flops(x, w, y, argmax, dy, dx, dw, db, **params):
    z = _conv_shape(x, w, _split(params)[0])
    return (math.prod(dy) + pool._bwd_flops(dy, argmax, z)
            + conv._bwd_params_flops(x, z, dw, db) + conv._bwd_input_flops(z, w, dx))


def _bwd_params_flops(x, y, argmax, dy, dw, db, **params):
    z = _conv_shape(x, dw, _split(params)[0])
    return math.prod(dy) + pool._bwd_flops(dy, argmax, z) + conv._bwd_params_flops(x, z, dw, db)


conv2d_relu_pool_fwd = Codelet(
    "conv2d_relu_pool_fwd", modes=(R, R, R, W, W),
    variants={"ref": conv2d_relu_pool_fwd_ref,
              "cpu:direct": _conv_relu_pool_fwd_cpu(conv.conv2d_fwd_cpu_direct),
              "cpu:im2col": conv2d_relu_pool_fwd_cpu_im2col,
              "cuda": conv2d_relu_pool_fwd_cuda},
    flops=_fwd_flops)
"""``y, argmax = max_pool2d(relu(conv2d(x, w) + b))``: ``(x R, w R, b R, y W, argmax W)``."""

conv2d_relu_pool_bwd = Codelet(
    "conv2d_relu_pool_bwd", modes=(R, R, R, R, R, W, REDUX, REDUX),
    variants={"ref": conv2d_relu_pool_bwd_ref,
              "cpu:direct": _conv_relu_pool_bwd_cpu(conv.conv2d_bwd_params_cpu_direct,
                                                    conv.conv2d_bwd_input_cpu_direct),
              "cpu:im2col": conv2d_relu_pool_bwd_cpu_im2col,
              "cuda": conv2d_relu_pool_bwd_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_flops)
"""The chain's gradients: ``(x R, w R, y R, argmax R, dy R, dx W, dw REDUX, db REDUX)``."""

conv2d_relu_pool_bwd_params = Codelet(
    "conv2d_relu_pool_bwd_params", modes=(R, R, R, R, REDUX, REDUX),
    variants={"ref": conv2d_relu_pool_bwd_params_ref,
              "cpu:direct": _conv_relu_pool_bwd_cpu(conv.conv2d_bwd_params_cpu_direct, None),
              "cpu:im2col": conv2d_relu_pool_bwd_params_cpu_im2col,
              "cuda": conv2d_relu_pool_bwd_params_cuda},
    init=zero_init, redux=add_redux, flops=_bwd_params_flops)
"""The chain's parameter gradients only: ``(x R, y R, argmax R, dy R, dw REDUX, db REDUX)``."""
