"""Layer fusion: runs of layers a Sequential submits as one fused task per partition.

Policy: :func:`choose_fusion` scans a model's layers for the chains of
``codelets/fused.py`` -- ``Conv2d`` (with bias), ``ReLU``, ``MaxPool2d`` and
``Dense`` (with bias), ``ReLU`` -- then for the runs of ``layers/fused_blocks.py``
(convolution + batch norm in evaluation, residual + ReLU) and ``layers/bn_activation.py``
(batch norm + ReLU or ReLU6 in training), and returns the blocks to
run: a fused run where a chain occurs, the layer itself elsewhere. ``ReLU`` means exactly that
class (not a subclass with another slope or function). Every option of the
convolution (stride, padding strings and modes, dilation, groups) and of the
pooling (padding, dilation, ceil mode) goes through the fused chain, except a
depthwise convolution (``Conv2d.fusable`` is False: it has codelets of its own). A fused run owns no
parameters: it submits the fused codelets on its layers' parameters, so
``state_dict``, checkpoints and optimizers see the same model fused or not.

The fused forward keeps only what the backward needs: the pooled output and
its argmax (the convolution's and the ReLU's outputs never become handles),
or the dense chain's ReLU output. Gradients follow the layers' rule (first
contribution of a step overwrites, the others are REDUX; see ``base.py``).
"""

from __future__ import annotations

import numpy as np

from ..codelets.fused import (conv2d_relu_pool_bwd, conv2d_relu_pool_bwd_params,
                              conv2d_relu_pool_fwd, dense_relu_bwd, dense_relu_bwd_params,
                              dense_relu_fwd)
from .activation import ReLU
from .base import contribution
from .bn_activation import BNActivation
from .conv import Conv2d
from .dense import Dense
from .fused_blocks import RUNS
from .pool import MaxPool2d


class _FusedRun:
    """Layers ``first..last`` of a Sequential, forward and backward as fused tasks."""

    def __init__(self, layers):
        self.layers = layers
        self.affine = layers[0]

    def _params(self):
        p = self.affine._params
        return p["weight"], p["bias"]

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.layers))})"


class ConvReLUPool(_FusedRun):
    """``Conv2d`` (bias), ``ReLU``, ``MaxPool2d`` as ``conv2d_relu_pool_fwd``/``_bwd``."""

    def _kw(self):
        pool = self.layers[2]._kw  # kernel_size, stride and the options that are not default
        return {**self.affine._kw, "pool_size": pool.pop("kernel_size"),
                **{f"pool_{k}": v for k, v in pool.items()}}

    def forward(self, rt, xs):
        pool = self.layers[2]
        self._xs = xs
        ys = pool.outputs(rt, xs)
        self._argmax = pool.outputs(rt, xs, dtype=np.int64)
        w, b = self._params()
        kw = self._kw()
        for x, y, a in zip(xs, ys, self._argmax):
            rt.submit(conv2d_relu_pool_fwd, x, w.handle, b.handle, y, a, **kw)
        self._ys = ys
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        w, b = self._params()
        kw = self._kw()
        if not need_input_grad:
            for x, y, a, dy in zip(self._xs, self._ys, self._argmax, dys):
                rt.submit(contribution(conv2d_relu_pool_bwd_params, (w, b)),
                          x, y, a, dy, w.grad, b.grad, **kw)
            return None
        dxs = self.affine.outputs(rt, dys, shape=self.affine.input_shape)
        for x, y, a, dy, dx in zip(self._xs, self._ys, self._argmax, dys, dxs):
            rt.submit(contribution(conv2d_relu_pool_bwd, (w, b)),
                      x, w.handle, y, a, dy, dx, w.grad, b.grad, **kw)
        return dxs


class DenseReLU(_FusedRun):
    """``Dense`` (bias), ``ReLU`` as ``dense_relu_fwd``/``_bwd``."""

    def forward(self, rt, xs):
        self._xs = xs
        ys = self.affine.outputs(rt, xs)
        w, b = self._params()
        for x, y in zip(xs, ys):
            rt.submit(dense_relu_fwd, x, w.handle, b.handle, y)
        self._ys = ys
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        w, b = self._params()
        if not need_input_grad:
            for x, y, dy in zip(self._xs, self._ys, dys):
                rt.submit(contribution(dense_relu_bwd_params, (w, b)), x, y, dy, w.grad, b.grad)
            return None
        dxs = self.affine.outputs(rt, dys, shape=self._xs[0].shape[1:])  # the input's layout
        for x, y, dy, dx in zip(self._xs, self._ys, dys, dxs):
            rt.submit(contribution(dense_relu_bwd, (w, b)),
                      x, w.handle, y, dy, dx, w.grad, b.grad)
        return dxs


_CHAINS = ((ConvReLUPool, (Conv2d, ReLU, MaxPool2d)), (DenseReLU, (Dense, ReLU)))


def choose_fusion(layers):
    """``[(index of the block's first layer, block)]``: fused runs where a chain occurs
    (this module's, then ``fused_blocks.RUNS``; the *fusion choice*, formerly ``plan``, a
    name the glossary keeps for partition plans).

    >>> from hetero_nn.layers import Flatten
    >>> [type(b).__name__ for _, b in choose_fusion([Conv2d(1, 2, 3), ReLU(), MaxPool2d(2),
    ...                                              Flatten(), Dense(8, 4), ReLU(), Dense(4, 2)])]
    ['ConvReLUPool', 'Flatten', 'DenseReLU', 'Linear']
    """
    blocks, i = [], 0
    while i < len(layers):
        for run, chain in _CHAINS:
            window = layers[i:i + len(chain)]
            if (len(window) == len(chain) and all(type(l) is t for l, t in zip(window, chain))
                    and window[0].bias and getattr(window[0], "fusable", True)):
                blocks.append((i, run(window)))
                i += len(chain)
                break
        else:
            run, length = next(((r, n) for r in (*RUNS, BNActivation)
                                if (n := r.match(layers, i))), (None, 1))
            blocks.append((i, run(layers[i:i + length]) if run else layers[i]))
            i += length
    return blocks


plan = choose_fusion  # the former name, kept for code that imported it
