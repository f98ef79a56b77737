"""Layer-normalisation codelets: per-sample statistics, the normalisation and its backward.

This module owns these codelets and every variant of them (``x`` is one batch
partition; its trailing dimensions of ``weight``'s size, ``M`` values, form each
*row* normalised on its own, and ``mean``/``rstd`` hold one float64 value per row):

=====================  =========================================================  ======
codelet                operands (access mode)                                     params
=====================  =========================================================  ======
layer_norm_fwd         x, weight, bias (R), y, mean, rstd (W)                     eps
layer_norm_bwd_input   x, dy, mean, rstd, weight (R), dx (W)                      -
layer_norm_bwd_params  x, dy, mean, rstd (R), dweight, dbias (REDUX)              -
layer_norm_bwd_weight  x, dy, mean, rstd (R), dweight (REDUX)                     -
=====================  =========================================================  ======

Policy: the statistics are per row, so a partition needs nothing from the others;
only the parameter gradients are sums over the batch (REDUX, combined by the
runtime's fixed tree). The formulas are PyTorch's CPU kernel's
(``aten/src/ATen/native/cpu/layer_norm_kernel.cpp``), with the moments taken in
float64 whatever the dtype: ``rstd = 1 / sqrt(var + eps)`` with the biased variance,
``y = (x * rstd - mean * rstd) * weight + bias``; backward, per row,
``ds = sum(dy * weight * x)``, ``db = sum(dy * weight)``, ``b = (db * mean - ds) *
rstd^3 / M``, ``c = -b * mean - db * rstd / M``, ``dx = rstd * dy * weight + b * x + c``;
``dweight += dy * (x - mean) * rstd`` and ``dbias += dy`` over the rows. A layer
without ``elementwise_affine`` passes constant ones and zeros.

Variants: ``ref`` (NumPy), ``cpu`` (Numba loops over rows) and ``cuda`` (written
against the array module: CuPy on a GPU, NumPy in CI).
"""

from __future__ import annotations

import numpy as np

from ._checks import require_contiguous
from ._jit import jit
from .codelet import R, REDUX, W, Codelet
from .reduce import add_redux, zero_init
from .xp import by_xp

__all__ = ["layer_norm_fwd", "layer_norm_bwd_input", "layer_norm_bwd_params",
           "layer_norm_bwd_weight"]


def _rows(a, m):
    """``a`` seen as ``(rows, m)``."""
    return a.reshape(-1, m)


def _check(name, x, weight, mean):
    m = weight.size
    if x.size != mean.size * m:
        raise ValueError(f"{name}: an operand of shape {x.shape} is not rows of {m} values "
                         f"(weight {weight.shape}) for {mean.size} statistics")
    return m


# --------------------------------------------------------------------------- ref and cuda (xp)

def _fwd_xp(xp, x, weight, bias, y, mean, rstd, eps):
    m = _check("layer_norm_fwd", x, weight, mean)
    x2 = _rows(x, m).astype(xp.float64)
    mu = x2.mean(axis=1)
    d = x2 - mu[:, None]
    r = 1.0 / xp.sqrt((d * d).mean(axis=1) + eps)
    mean.reshape(-1)[...] = mu
    rstd.reshape(-1)[...] = r
    normed = x2 * r[:, None] + (-mu * r)[:, None]
    y.reshape(-1, m)[...] = normed * weight.reshape(-1) + bias.reshape(-1)


def _bwd_input_xp(xp, x, dy, mean, rstd, weight, dx):
    m = _check("layer_norm_bwd_input", x, weight, mean)
    x2, g = _rows(x, m).astype(xp.float64), _rows(dy, m).astype(xp.float64)
    mu, a = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    gw = g * weight.reshape(-1)
    ds = (gw * x2).sum(axis=1, keepdims=True)
    db = gw.sum(axis=1, keepdims=True)
    b = (db * mu - ds) * a * a * a / m
    c = -b * mu - db * a / m
    dx.reshape(-1, m)[...] = a * gw + b * x2 + c


def _bwd_params_xp(xp, x, dy, mean, rstd, dweight, dbias=None):
    m = dweight.size
    x2, g = _rows(x, m).astype(xp.float64), _rows(dy, m).astype(xp.float64)
    xhat = (x2 - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    dweight += (g * xhat).sum(axis=0).reshape(dweight.shape).astype(dweight.dtype)
    if dbias is not None:
        dbias += g.sum(axis=0).reshape(dbias.shape).astype(dbias.dtype)


# --------------------------------------------------------------------------- cpu (Numba)

@jit
def _fwd_cpu(x, weight, bias, y, mean, rstd, eps):
    rows, m = x.shape
    for i in range(rows):
        acc = 0.0
        for j in range(m):
            acc += x[i, j]
        mu = acc / m
        acc = 0.0
        for j in range(m):
            d = x[i, j] - mu
            acc += d * d
        r = 1.0 / np.sqrt(acc / m + eps)
        shift = -mu * r
        for j in range(m):
            y[i, j] = (x[i, j] * r + shift) * weight[j] + bias[j]
        mean[i] = mu
        rstd[i] = r


@jit
def _bwd_input_cpu(x, dy, mean, rstd, weight, dx):
    rows, m = x.shape
    for i in range(rows):
        ds = 0.0
        db = 0.0
        for j in range(m):
            gw = np.float64(dy[i, j]) * weight[j]
            ds += gw * x[i, j]
            db += gw
        a = rstd[i]
        b = (db * mean[i] - ds) * a * a * a / m
        c = -b * mean[i] - db * a / m
        for j in range(m):
            dx[i, j] = a * (np.float64(dy[i, j]) * weight[j]) + b * x[i, j] + c


@jit
def _bwd_params_cpu(x, dy, mean, rstd, dweight, dbias, with_bias):
    rows, m = x.shape
    acc_w = np.zeros(m)
    acc_b = np.zeros(m)
    for i in range(rows):
        mu = mean[i]
        r = rstd[i]
        for j in range(m):
            g = np.float64(dy[i, j])
            acc_w[j] += g * ((x[i, j] - mu) * r)
            acc_b[j] += g
    for j in range(m):
        dweight[j] += acc_w[j]
        if with_bias:
            dbias[j] += acc_b[j]


def _fwd_cpu_wrapper(x, weight, bias, y, mean, rstd, *, eps):
    m = _check("layer_norm_fwd", x, weight, mean)
    require_contiguous("layer_norm_fwd", y=y, mean=mean, rstd=rstd)
    _fwd_cpu(np.ascontiguousarray(_rows(x, m)), weight.reshape(-1), bias.reshape(-1),
             y.reshape(-1, m), mean.reshape(-1), rstd.reshape(-1), float(eps))


def _bwd_input_cpu_wrapper(x, dy, mean, rstd, weight, dx):
    m = _check("layer_norm_bwd_input", x, weight, mean)
    require_contiguous("layer_norm_bwd_input", dx=dx)
    _bwd_input_cpu(np.ascontiguousarray(_rows(x, m)), np.ascontiguousarray(_rows(dy, m)),
                   mean.reshape(-1), rstd.reshape(-1), weight.reshape(-1), dx.reshape(-1, m))


def _bwd_params_cpu_wrapper(x, dy, mean, rstd, dweight, dbias=None):
    m = dweight.size
    require_contiguous("layer_norm_bwd_params", dweight=dweight)
    flat_b = dweight.reshape(-1) if dbias is None else dbias.reshape(-1)
    _bwd_params_cpu(np.ascontiguousarray(_rows(x, m)), np.ascontiguousarray(_rows(dy, m)),
                    mean.reshape(-1), rstd.reshape(-1), dweight.reshape(-1), flat_b,
                    dbias is not None)


# --------------------------------------------------------------------------- codelets

def _flops(x, *others, **params):
    n = 1
    for d in x:
        n *= d
    return float(n)


def _codelet(name, modes, fn, cpu, reduce=False):
    ref, cuda = by_xp(fn)
    extra = {"init": zero_init, "redux": add_redux} if reduce else {}
    return Codelet(name, modes=modes, variants={"ref": ref, "cpu": cpu, "cuda": cuda},
                   flops=_flops, **extra)


layer_norm_fwd = _codelet("layer_norm_fwd", (R, R, R, W, W, W), _fwd_xp, _fwd_cpu_wrapper)
"""``y = (x - mean) * rstd * weight + bias`` per row; writes the row statistics
(R x, weight, bias; W y, mean, rstd)."""
layer_norm_bwd_input = _codelet("layer_norm_bwd_input", (R, R, R, R, R, W), _bwd_input_xp,
                                _bwd_input_cpu_wrapper)
"""The input gradient through the row statistics (R x, dy, mean, rstd, weight; W dx)."""
layer_norm_bwd_params = _codelet("layer_norm_bwd_params", (R, R, R, R, REDUX, REDUX),
                                 _bwd_params_xp, _bwd_params_cpu_wrapper, reduce=True)
"""``dweight += sum(dy * xhat)``, ``dbias += sum(dy)`` over the rows (R x, dy, mean, rstd;
REDUX dweight, dbias)."""
layer_norm_bwd_weight = _codelet("layer_norm_bwd_weight", (R, R, R, R, REDUX), _bwd_params_xp,
                                 _bwd_params_cpu_wrapper, reduce=True)
"""``dweight += sum(dy * xhat)`` over the rows, for a layer without bias (R x, dy, mean,
rstd; REDUX dweight)."""
