"""Layers: parameters as handles; forward and backward submit codelet tasks per batch partition."""

from .activation import ReLU
from .base import Layer, Parameter, manual_seed
from .conv import Conv2D
from .dense import Dense, Flatten
from .loss import LogSoftmax, SoftmaxCrossEntropy
from .pool import MaxPool2D
from .sequential import Sequential

__all__ = ["Conv2D", "Dense", "Flatten", "Layer", "LogSoftmax", "MaxPool2D", "Parameter", "ReLU", "Sequential",
           "SoftmaxCrossEntropy", "manual_seed"]
