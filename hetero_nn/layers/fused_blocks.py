"""Fused runs of real models' blocks (``codelets/fused_blocks.py``), planned by
``layers/fused.py`` beside its chains.

Policy:

- ``Conv2d, BatchNorm2d[, ReLU | ReLU6]`` with the batch norm in evaluation mode on its
  running statistics (``eval()`` and ``track_running_stats``): the batch norm folded
  into the convolution. One partition: one ``conv2d_[nobias_]bn_eval_fwd`` task, the
  fold inside it. Several: one ``bn_[nobias_]fold_eval`` task folds into a temporary
  that every partition's ``conv2d_folded_fwd`` task reads (the fold once per pass, not
  per partition; the same bits); where ``conv2d_fwd`` would unroll the filters (images of
  at most ``KH*KW`` pixels), the fold writes them unrolled (``bn_[nobias_]fold_unrolled_eval``)
  and each partition's ``conv2d_unrolled_fwd`` is a GEMM (``codelets/conv_unrolled_eval.py``:
  the same bits again). In training mode the batch norm needs the batch's
  statistics, so the layers run unfused. Any convolution (``Conv2d.fusable``); a
  depthwise one (MobileNet's) as ``conv2d_depthwise_[nobias_]bn_eval_fwd`` or
  ``conv2d_depthwise_folded_fwd`` (``codelets/depthwise_fused.py``).
- ``Residual, ReLU`` (ResNet's join), in both modes: the residual's body and shortcut
  as usual, then one ``add2_relu`` task per partition instead of ``add2`` and
  ``relu_fwd``; the backward pass is the ReLU's and the residual's own.

A fused run owns no parameters (``state_dict`` is the same fused or not). A gradient
through an evaluation-mode convolution run (an input gradient of a model in ``eval()``)
recomputes its layers' forward pass unfused, then runs their backward passes: the
fused forward keeps no intermediate.
"""

from __future__ import annotations

from ..codelets import conv_unrolled_eval as unrolled
from ..codelets.depthwise_fused import (conv2d_depthwise_bn_eval_fwd,
                                        conv2d_depthwise_folded_fwd,
                                        conv2d_depthwise_nobias_bn_eval_fwd)
from ..codelets.fused_blocks import (add2_relu, bn_fold_eval, bn_nobias_fold_eval,
                                     conv2d_bn_eval_fwd, conv2d_folded_fwd,
                                     conv2d_nobias_bn_eval_fwd)
from .activation import ReLU, ReLU6
from .conv import Conv2d
from .normalization import BatchNorm2d

_ACTIVATION = {ReLU: "relu", ReLU6: "relu6"}


class ConvBNEval:
    """``Conv2d``, ``BatchNorm2d`` (evaluation mode) and an optional ``ReLU``/``ReLU6``,
    the batch norm folded (module docstring)."""

    def __init__(self, layers):
        self.layers = layers
        self.conv, self.bn = layers[0], layers[1]
        self.activation = _ACTIVATION[type(layers[2])] if len(layers) == 3 else "none"

    @staticmethod
    def match(layers, i):
        """The length of the run starting at ``layers[i]`` (0: none)."""
        window = layers[i:i + 3]
        if (len(window) < 2 or type(window[0]) is not Conv2d
                or not (window[0].fusable or window[0].depthwise)
                or type(window[1]) is not BatchNorm2d or window[1].training
                or not window[1].track_running_stats):
            return 0
        return 3 if len(window) == 3 and type(window[2]) in _ACTIVATION else 2

    def forward(self, rt, xs):
        self._xs = xs
        conv, bn = self.conv, self.bn
        ys = bn.outputs(rt, xs)
        p = conv._params
        w = [p["weight"].handle] + ([p["bias"].handle] if conv.bias else [])
        stats = (bn._buffers["running_mean"].handle, bn._buffers["running_var"].handle,
                 *bn._affine_handles(rt))
        kw = dict(conv._kw, activation=self.activation)
        if len(xs) == 1:  # the fold inside the one task
            codelet = ((conv2d_depthwise_bn_eval_fwd, conv2d_depthwise_nobias_bn_eval_fwd)
                       if conv.depthwise else (conv2d_bn_eval_fwd, conv2d_nobias_bn_eval_fwd))[
                           0 if conv.bias else 1]
            rt.submit(codelet, xs[0], *w, *stats, ys[0], **kw, eps=bn.eps)
            return ys
        name = type(conv).__name__
        bf = rt.temporary((w[0].shape[0],), conv.dtype, name=f"{name}.folded_b")
        if not conv.depthwise and unrolled.takes(xs[0].shape, w[0].shape, **conv._kw):
            u = rt.temporary(unrolled.unrolled_shape(xs[0].shape, w[0].shape, **conv._kw),
                             conv.dtype, name=f"{name}.unrolled_w")
            rt.submit(unrolled.bn_fold_unrolled_eval if conv.bias
                      else unrolled.bn_nobias_fold_unrolled_eval, *w, *stats, u, bf,
                      **conv._kw, input_size=tuple(xs[0].shape[2:]), eps=bn.eps)
            for x, y in zip(xs, ys):
                rt.submit(unrolled.conv2d_unrolled_fwd, x, u, bf, y, activation=self.activation)
            rt.release(u, bf)
            return ys
        wf = rt.temporary(w[0].shape, conv.dtype, name=f"{name}.folded_w")
        rt.submit(bn_fold_eval if conv.bias else bn_nobias_fold_eval, *w, *stats, wf, bf,
                  eps=bn.eps)
        codelet = conv2d_depthwise_folded_fwd if conv.depthwise else conv2d_folded_fwd
        for x, y in zip(xs, ys):
            rt.submit(codelet, x, wf, bf, y, **kw)
        rt.release(wf, bf)
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        xs = self._xs
        for layer in self.layers:
            xs = layer.forward(rt, xs)
        for k, layer in reversed(list(enumerate(self.layers))):
            dys = layer.backward(rt, dys, need_input_grad=need_input_grad or k > 0)
        return dys

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.layers))})"


class ResidualReLU:
    """``Residual`` then ``ReLU``: the join and the ReLU as one ``add2_relu`` task per
    partition."""

    def __init__(self, layers):
        self.layers = layers
        self.residual, self.relu = layers

    @staticmethod
    def match(layers, i):
        window = layers[i:i + 2]  # Residual's class says so (its module imports this one's)
        return 2 if (len(window) == 2 and getattr(type(window[0]), "join_fusable", False)
                     and type(window[1]) is ReLU) else 0

    def forward(self, rt, xs):
        ys = self.residual.forward(rt, xs, join=add2_relu)
        self.relu._saved = ys  # what ReLU's backward reads: its output
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        dzs = self.relu.backward(rt, dys)
        dxs = self.residual.backward(rt, dzs, need_input_grad=need_input_grad)
        rt.release(dzs[0].root)  # read by no later task: as Sequential releases it unfused
        return dxs

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.layers))})"


RUNS = (ConvBNEval, ResidualReLU)
"""The runs of this module, longest first where two could start at one layer."""
