"""Loss functions (``hetero_nn.losses.SoftmaxCrossEntropy``)."""

from .layers.loss import SoftmaxCrossEntropy

__all__ = ["SoftmaxCrossEntropy"]
