"""Batch norm and the ReLU or ReLU6 after it, in training, as one fused run
(``codelets/batchnorm_act.py``), planned by ``layers/fused.py`` beside its chains.

Policy: ``BatchNorm2d, ReLU | ReLU6`` with the batch norm in training mode: the batch
norm's tasks with ``bn_act_fwd`` instead of ``bn_fwd`` (and no activation task), and in
the backward pass ``bn_act_bwd_sums`` and ``bn_act_bwd_input`` on the activation's output
gradient instead of the activation's backward task, ``bn_bwd_sums`` and ``bn_bwd_input``.
The batch norm's output before the activation is never stored. The same bits as the two
layers unfused. A one-partition batch runs the two layers unfused: ``bn_train_fwd`` /
``bn_train_bwd`` (one task each, issue 29's launch counts) and the activation's task,
where the fused chain would be nine tasks. In evaluation mode a convolution
before folds the batch norm (``fused_blocks.ConvBNEval``), and a batch norm alone runs
unfused. A fused run owns no parameters (``state_dict`` is the same fused or not).
"""

from __future__ import annotations

from .activation import ReLU, ReLU6
from .normalization import BatchNorm2d

_ACTIVATION = {ReLU: "relu", ReLU6: "relu6"}


class BNActivation:
    """``BatchNorm2d`` (training mode), ``ReLU`` or ``ReLU6``: the batch norm's tasks with the
    activation inside."""

    def __init__(self, layers):
        self.layers = layers
        self.bn = layers[0]
        self.activation = _ACTIVATION[type(layers[1])]

    @staticmethod
    def match(layers, i):
        """The length of the run starting at ``layers[i]`` (0: none)."""
        window = layers[i:i + 2]
        return 2 if (len(window) == 2 and type(window[0]) is BatchNorm2d
                     and window[0].training and type(window[1]) in _ACTIVATION) else 0

    def forward(self, rt, xs):
        if len(xs) == 1:  # one partition: unfused (module docstring)
            return self.layers[1].forward(rt, self.bn.forward(rt, xs))
        return self.bn.forward(rt, xs, activation=self.activation)

    def backward(self, rt, dys, need_input_grad=True):
        if len(dys) == 1:  # as the forward pass chose: the same partitions
            return self.bn.backward(rt, self.layers[1].backward(rt, dys),
                                    need_input_grad=need_input_grad)
        return self.bn.backward(rt, dys, need_input_grad=need_input_grad,
                                activation=self.activation)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.layers))})"
