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
from .recompute import Checkpoint
from .residual import Residual
from .sequential import Sequential

# PyTorch's names (the Keras spellings above are the same classes) and the layers added
# with them; ``register`` names a custom layer class for models rebuilt from data.
from .activation import Hardswish, ReLU6, SiLU, Softmax
from .dense import Identity, Linear
from .dropout import Dropout2d
from .layernorm import LayerNorm
from .normalization import BatchNorm1d, BatchNorm2d
from .registry import add_builtins, register

__all__ = ["AvgPool2D", "BatchNorm2D", "Buffer", "Checkpoint", "Conv2D", "Dense", "Dropout", "Flatten", "GELU",
           "GlobalAvgPool2D", "Layer", "LeakyReLU", "LogSoftmax", "MaxPool2D", "Parameter", "ReLU",
           "Residual", "Sequential", "Sigmoid", "SoftmaxCrossEntropy", "Tanh", "evaluating",
           "manual_seed", "AdaptiveAvgPool2d", "AvgPool2d", "Conv2d", "MaxPool2d"]
__all__ += ["BatchNorm1d", "BatchNorm2d", "Dropout2d", "Hardswish", "Identity", "LayerNorm",
            "Linear", "ReLU6", "SiLU", "Softmax", "register"]

# spiking networks: the time axis (layers/time.py) and the neuron (layers/lif.py)
from .lif import LIF  # noqa: E402
from .time import RateEncode, Repeat  # noqa: E402

__all__ += ["LIF", "RateEncode", "Repeat"]

add_builtins(vars())  # the classes above, found by name when a model is rebuilt from data
