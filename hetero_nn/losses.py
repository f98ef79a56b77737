"""Loss functions: ``SoftmaxCrossEntropy`` (``CrossEntropyLoss``), ``NLLLoss``, ``MSELoss``;
for spiking networks ``MembraneCrossEntropy`` and ``SpikeCountCrossEntropy``."""

from .layers.loss import CrossEntropyLoss, MSELoss, NLLLoss, SoftmaxCrossEntropy
from .layers.spike_loss import MembraneCrossEntropy, SpikeCountCrossEntropy

__all__ = ["CrossEntropyLoss", "MSELoss", "MembraneCrossEntropy", "NLLLoss",
           "SoftmaxCrossEntropy", "SpikeCountCrossEntropy"]
