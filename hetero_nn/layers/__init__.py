"""Layers: parameters as handles; forward and backward submit codelet tasks per batch partition."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, Tanh
from .avgpool import AvgPool2D, GlobalAvgPool2D
from .base import Buffer, Layer, Parameter, evaluating, manual_seed
from .conv import Conv2D
from .dense import Dense, Flatten
from .dropout import Dropout
from .loss import SoftmaxCrossEntropy
from .normalization import BatchNorm2D
from .pool import MaxPool2D
from .residual import Residual
from .sequential import Sequential

__all__ = ["AvgPool2D", "BatchNorm2D", "Buffer", "Conv2D", "Dense", "Dropout", "Flatten", "GELU",
           "GlobalAvgPool2D", "Layer", "LeakyReLU", "LogSoftmax", "MaxPool2D", "Parameter", "ReLU",
           "Residual", "Sequential", "Sigmoid", "SoftmaxCrossEntropy", "Tanh", "evaluating",
           "manual_seed"]

# spiking networks: the time axis (layers/time.py) and the neuron (layers/lif.py)
from .lif import LIF  # noqa: E402
from .time import RateEncode, Repeat  # noqa: E402

__all__ += ["LIF", "RateEncode", "Repeat"]
