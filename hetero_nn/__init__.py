"""hetero_nn: a task-based heterogeneous CNN training runtime."""

from .codelets import R, RW, REDUX, SCRATCH, W, AccessMode, Codelet
from .errors import (ArenaError, CheckpointError, ConfigError, DatasetFormatError, DeviceError,
                     DeviceMemoryError,
                     HeteroNNError, PolicyError, ShapeError, SubmitError, TaskError,
                     TrainingDiverged)

__version__ = "0.1.0"
from .arena import Arena, ArenaPair, Handle
from .scheduler import POLICIES, PerfModel, Runtime, StudyOptions, Trace
from . import losses, optim
from .layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU, Sequential, manual_seed
from .layers import (GELU, AvgPool2D, BatchNorm2D, Dropout, GlobalAvgPool2D, LeakyReLU, Residual,
                     Sigmoid, Tanh)
from .layers import LogSoftmax
from .layers import (BatchNorm1d, BatchNorm2d, Dropout2d, Hardswish, Identity, LayerNorm, Linear,
                     ReLU6, SiLU, Softmax)
from .scheduler.default import close_default_runtime, default_runtime, set_default_runtime
from .errors import ConversionError
from .torch_interop import from_torch, to_torch
from .layers import AdaptiveAvgPool2d, AvgPool2d, Conv2d, MaxPool2d
from .training import Trainer, checkpoint, load_model, save_model
from . import datasets, models, transforms
from .models import MODELS, build_model
from .training import HISTORY_KEYS
