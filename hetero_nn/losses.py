"""Loss functions: ``SoftmaxCrossEntropy`` (``CrossEntropyLoss``), ``NLLLoss``, ``MSELoss``."""

from .layers.loss import CrossEntropyLoss, MSELoss, NLLLoss, SoftmaxCrossEntropy

__all__ = ["CrossEntropyLoss", "MSELoss", "NLLLoss", "SoftmaxCrossEntropy"]
