"""BatchNorm2d (alias ``BatchNorm2D``) and BatchNorm1d: batch statistics over the whole
batch, combined across partitions by REDUX.

Both are one layer, :class:`_BatchNorm`, that differ only in the sample shapes they
accept (``(C, H, W)``; ``(C,)`` or ``(C, L)``): the codelets see ``(n, C, *spatial)``.

A training-mode forward pass over one partition is one task, ``bn_train_fwd``
(statistics, running statistics, normalisation), and its backward pass another,
``bn_train_bwd`` (:mod:`hetero_nn.codelets.batchnorm_step`). Over several partitions
(or a cluster rank's share of the batch) it submits the chain a cluster reproduces: per
partition, its per-channel sum (REDUX), then one task for the mean; per partition, the
squared deviations from it (REDUX), then one task for the variance, one for the running
statistics; then the normalisation per partition. The backward pass sums ``dy`` and
``(x - mean) * dy`` the same way, then computes the parameter and input gradients (see
:mod:`hetero_nn.codelets.batchnorm` for the formulas); those sums are zeroed by
``fill_zero`` first. Outside a cluster a fresh ``dweight``/``dbias`` is written in place
(``overwriting``), not zeroed by a task. In eval mode the running statistics replace the
batch's, as in PyTorch.

``num_batches_tracked`` is counted on the host when a training step is submitted; the
momentum of that step (``1 / num_batches_tracked`` with ``momentum=None``) reaches
the running-statistics task as the data of a small handle (a step input), so a
captured step replays every step: :meth:`_BatchNorm.replayed` counts the batch and
returns the next momentum for the trainer to write into the captured handle.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..codelets.batchnorm import (bn_bwd_input, bn_bwd_sums, bn_fwd, bn_mean, bn_param_grads,
                                  bn_running, bn_sqdev, bn_sum, bn_var)
from ..codelets.batchnorm_act import bn_act_bwd_input, bn_act_bwd_sums, bn_act_fwd
from ..codelets.batchnorm_step import bn_train_bwd, bn_train_fwd
from ..codelets.reduce import fill_zero, overwriting
from ..errors import ConfigError, ShapeError
from .base import Buffer, Layer, contribution, note_step_input
from ..codelets._checks import positive_int


class _BatchNorm(Layer):
    """Batch normalisation over the channel axis of samples ``(C, *spatial)``.

    ``state_dict`` keys: ``weight``, ``bias`` (with ``affine``), ``running_mean``,
    ``running_var``, ``num_batches_tracked`` (with ``track_running_stats``).
    ``momentum=None`` averages cumulatively, as PyTorch.
    """

    grads_per_partition = False  # dweight, dbias: once per step, from the batch's sums
    sample_dims: tuple[int, ...] = ()  # the lengths of a sample's shape the layer accepts
    expected = ""  # that shape in words, for the error

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__()
        name = type(self).__name__
        self.num_features = positive_int(num_features, "num_features", name)
        if not isinstance(eps, numbers.Real) or not eps > 0:
            raise ConfigError(f"{name}: eps must be a positive number, got {eps!r}")
        if momentum is not None and (not isinstance(momentum, numbers.Real)
                                     or not 0 <= momentum <= 1):
            raise ConfigError(f"{name}: momentum must be in [0, 1] or None, got {momentum!r}")
        self.eps = float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        c = self.num_features
        if self.affine:
            self.add_parameter("weight", np.ones(c, self.dtype))
            self.add_parameter("bias", np.zeros(c, self.dtype))
        self._buffers = {}
        if self.track_running_stats:
            for key, value in (("running_mean", np.zeros(c, self.dtype)),
                               ("running_var", np.ones(c, self.dtype)),
                               ("num_batches_tracked", np.zeros((), np.int64))):
                self._buffers[key] = Buffer(key, value)
        self._constants = None  # (runtime, ones, zeros) standing for weight and bias without affine

    def named_buffers(self):
        return list(self._buffers.items())

    def reset_parameters(self, rng=None):
        """PyTorch's: weight 1, bias 0, running statistics reset."""
        for p in self.parameters():
            p.data[...] = 1 if p.name == "weight" else 0
        for b in self._buffers.values():
            b.data[...] = 1 if b.name == "running_var" else 0

    def build(self, input_shape, dtype):
        dtype = np.dtype(dtype)
        if dtype != self.dtype:
            for b in self._buffers.values():
                if b.data.dtype.kind == "f":
                    b.data = b.data.astype(dtype)
                    b.unbind()
            self._constants = None
        return super().build(input_shape, dtype)

    def infer_shape(self, input_shape):
        if len(input_shape) not in self.sample_dims or input_shape[0] != self.num_features:
            raise ShapeError(f"expects input of shape {self.expected.format(self.num_features)}"
                             f" per sample, got {tuple(input_shape)}")
        return input_shape

    def bind(self, rt):
        super().bind(rt)
        for b in self._buffers.values():
            if b.data.dtype.kind == "f":
                b.bind(rt)

    def _affine_handles(self, rt):
        """``(weight, bias)`` handles: the parameters, or constants 1 and 0 without ``affine``."""
        if self.affine:
            return self._params["weight"].handle, self._params["bias"].handle
        if self._constants is None or self._constants[0] is not rt or rt.closed:
            c = self.num_features
            self._constants = (rt, rt.register(np.ones(c, self.dtype), name="bn.ones"),
                               rt.register(np.zeros(c, self.dtype), name="bn.zeros"))
        return self._constants[1], self._constants[2]

    @property
    def overwrites_grads(self):
        """Outside a cluster the first contribution writes ``dweight``/``dbias`` in place."""
        return self.batch_span is None

    def _temporary(self, rt, name):
        return rt.temporary((self.num_features,), self.dtype, name=f"bn.{name}")

    def _adding(self, rt, codelet, index, partitions, *sums):
        """``codelet`` for partition ``index``'s contribution to ``sums``: one partition
        writes them in place (``overwriting``); several add into zeroed sums, the
        arithmetic a cluster's ranks reproduce (``0 + tree(partials)``, bit for bit)."""
        if partitions == 1 and self.batch_span is None:
            return overwriting(codelet)
        if index == 0:
            for h in sums:
                rt.submit(fill_zero, h)
        return codelet

    def _whole(self, *partitioned):
        """The one handle of each list, where the batch is one partition and all of the
        batch (not a cluster rank's share); else None (the tasks run per partition).

        Several partitions keep the chain: their sums are added by a tree in partition
        order, which a cluster of ranks reproduces bit for bit; a one-task sum over the
        whole batch it could not."""
        if self.batch_span is not None or any(len(parts) != 1 for parts in partitioned):
            return None
        return [parts[0] for parts in partitioned]

    def replayed(self):
        """Count a training batch run by a replay; the data of its momentum handle."""
        tracked = self._buffers["num_batches_tracked"].data
        tracked += 1
        momentum = 1.0 / int(tracked) if self.momentum is None else self.momentum
        return np.array([momentum], np.float64)

    def forward(self, rt, xs, activation=None):
        """The tasks of the forward pass; with ``activation`` (``"relu"``, ``"relu6"``: a
        fused run's, ``layers/bn_activation.py``) the outputs are the activation's, from
        ``bn_act_fwd``, after the chain (one partition too)."""
        batch_stats = self.training or not self.track_running_stats
        samples = self.batch_span[1] if self.batch_span else sum(x.shape[0] for x in xs)
        count = samples * math.prod(self.input_shape[1:])  # over the whole batch
        ys = None
        if batch_stats:
            if count <= 1:
                n = sum(x.shape[0] for x in xs)
                raise ShapeError(f"{type(self).__name__}: expected more than 1 value per "
                                 f"channel when training, got input of shape "
                                 f"{(n, *self.input_shape)}")
            mean, var = self._temporary(rt, "mean"), self._temporary(rt, "var")
            running = self.training and self.track_running_stats and not self.recomputing
            if running:
                momentum = note_step_input(self, rt.register(self.replayed(), name="bn.momentum"))
                running = (self._buffers["running_mean"].handle,
                           self._buffers["running_var"].handle, momentum)
            ys = self.outputs(rt, xs)
            whole = self._whole(xs, ys)
            if running and whole and not activation:
                rt.submit(bn_train_fwd, whole[0], *self._affine_handles(rt), *running, mean,
                          var, whole[1], count=count, eps=self.eps)
                self._saved = (xs, mean, var, batch_stats, count)
                return ys
            total = self._temporary(rt, "sum")
            for i, x in enumerate(xs):
                rt.submit(self._adding(rt, bn_sum, i, len(xs), total), x, total)
            rt.submit(bn_mean, total, mean, count=count)
            sqdev = self._temporary(rt, "sqdev")
            for i, x in enumerate(xs):
                rt.submit(self._adding(rt, bn_sqdev, i, len(xs), sqdev), x, mean, sqdev)
            rt.submit(bn_var, sqdev, var, count=count)
            if running:
                rt.submit(bn_running, mean, sqdev, *running, count=count)
        else:
            mean = self._buffers["running_mean"].handle
            var = self._buffers["running_var"].handle
        weight, bias = self._affine_handles(rt)
        ys = ys or self.outputs(rt, xs)
        for x, y in zip(xs, ys):
            if activation:
                rt.submit(bn_act_fwd, x, mean, var, weight, bias, y, eps=self.eps,
                          activation=activation)
            else:
                rt.submit(bn_fwd, x, mean, var, weight, bias, y, eps=self.eps)
        self._saved = (xs, mean, var, batch_stats, count)
        return ys

    def backward(self, rt, dys, need_input_grad=True, activation=None):
        """The tasks of the backward pass; with ``activation``, ``dys`` is the gradient of
        that activation's output (the forward pass was given it too)."""
        xs, mean, var, batch_stats, count = self._saved
        if not (self.affine or need_input_grad):
            return None
        params = [self._params[k] for k in ("weight", "bias")] if self.affine else []
        dxs = self.outputs(rt, dys, shape=self.input_shape) if need_input_grad else None
        whole = (self._whole(xs, dys, dxs) if params and dxs and batch_stats and not activation
                 else None)
        if activation:
            return self._act_backward(rt, xs, dys, dxs, mean, var, count, params, activation)
        if whole:
            rt.submit(contribution(bn_train_bwd, params), *whole[:2], mean, var,
                      params[0].handle, whole[2], *(p.grad for p in params), count=count,
                      eps=self.eps)
            return dxs
        sum_dy, dotp = self._temporary(rt, "sum_dy"), self._temporary(rt, "dotp")
        for i, (x, dy) in enumerate(zip(xs, dys)):
            rt.submit(self._adding(rt, bn_bwd_sums, i, len(xs), sum_dy, dotp), x, dy, mean,
                      sum_dy, dotp)
        if params:
            rt.submit(contribution(bn_param_grads, params), sum_dy, dotp, var,
                      *(p.grad for p in params), eps=self.eps)
        if not need_input_grad:
            return None
        weight, _ = self._affine_handles(rt)
        for x, dy, dx in zip(xs, dys, dxs):
            rt.submit(bn_bwd_input, x, dy, mean, var, weight, sum_dy, dotp, dx, count=count,
                      eps=self.eps, batch_stats=batch_stats)
        return dxs

    def _act_backward(self, rt, xs, dys, dxs, mean, var, count, params, activation):
        """``backward``'s chain through ``bn_act_bwd_sums`` and ``bn_act_bwd_input``."""
        weight, bias = self._affine_handles(rt)
        kw = {"eps": self.eps, "activation": activation}
        sum_dy, dotp = self._temporary(rt, "sum_dy"), self._temporary(rt, "dotp")
        for i, (x, dy) in enumerate(zip(xs, dys)):
            rt.submit(self._adding(rt, bn_act_bwd_sums, i, len(xs), sum_dy, dotp), x, dy, mean,
                      var, weight, bias, sum_dy, dotp, **kw)
        if params:
            rt.submit(contribution(bn_param_grads, params), sum_dy, dotp, var,
                      *(p.grad for p in params), eps=self.eps)
        for x, dy, dx in zip(xs, dys, dxs or ()):
            rt.submit(bn_act_bwd_input, x, dy, mean, var, weight, bias, sum_dy, dotp, dx,
                      count=count, **kw)
        return dxs

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm2d(_BatchNorm):
    """``torch.nn.BatchNorm2d`` with the same arguments, parameters and buffers, over
    samples ``(C, H, W)``; ``BatchNorm2D`` is the same class.

    >>> BatchNorm2d(16)
    BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
    """

    sample_dims, expected = (3,), "({}, H, W)"


class BatchNorm1d(_BatchNorm):
    """``torch.nn.BatchNorm1d`` over samples ``(C,)`` (statistics over the batch) or
    ``(C, L)`` (over the batch and ``L``), as PyTorch's 2-D and 3-D inputs.

    >>> BatchNorm1d(8, momentum=None)
    BatchNorm1d(8, eps=1e-05, momentum=None, affine=True, track_running_stats=True)
    """

    sample_dims, expected = (1, 2), "({0},) or ({0}, L)"


BatchNorm2D = BatchNorm2d
