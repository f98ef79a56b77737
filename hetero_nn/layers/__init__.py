"""Layers: parameters as handles; forward and backward submit codelet tasks per batch partition."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, Tanh
from .avgpool import AdaptiveAvgPool2d, AvgPool2d, AvgPool2D, GlobalAvgPool2D
from .base import Buffer, Layer, Parameter, evaluating, manual_seed
from .conv import Conv2d, Conv2D
from .dense import Dense, Flatten
from .dropout import Dropout
from .loss import SoftmaxCrossEntropy
from .normalization import BatchNorm2D
from .pool import MaxPool2d, MaxPool2D
from .residual import Residual
from .sequential import Sequential

__all__ = ["AvgPool2D", "BatchNorm2D", "Buffer", "Conv2D", "Dense", "Dropout", "Flatten", "GELU",
           "GlobalAvgPool2D", "Layer", "LeakyReLU", "LogSoftmax", "MaxPool2D", "Parameter", "ReLU",
           "Residual", "Sequential", "Sigmoid", "SoftmaxCrossEntropy", "Tanh", "evaluating",
           "manual_seed", "AdaptiveAvgPool2d", "AvgPool2d", "Conv2d", "MaxPool2d"]
