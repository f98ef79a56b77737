"""Built-in models, by name: the networks the CLI trains and the acceptance runs use.

Every builder takes the per-sample input shape ``(C, H, W)`` and the number of
classes, and derives the sizes of its dense layers from them, so the same name
works for 28x28 grey images and 32x32 colour ones. The returned
:class:`~hetero_nn.layers.Sequential` is already built (shapes checked) for the
dtype asked for, and remembers how it was made (``model.spec``) so a checkpoint
can rebuild it.

>>> model = build_model("dahl-basic", (1, 28, 28), 10)
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '4.weight', '4.bias']
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError, ShapeError
from .layers import (BatchNorm2D, Conv2D, Dense, Flatten, GlobalAvgPool2D, MaxPool2D, RateEncode,
                     ReLU, ReLU6, Residual, Sequential)
from .layers.base import default_rng
from .snn_models import OPTIONS as SPIKING_OPTIONS, SPIKING_MODELS


def _features_out(layers, input_shape) -> int:
    """Number of features the convolutional part yields for ``input_shape`` (shapes checked)."""
    return math.prod(Sequential(*layers).build(input_shape))


def dahl_basic(input_shape, num_classes=10) -> list:
    """StarPU's reference network: Conv2D(C, 4, 3), ReLU, MaxPool2D(2), Flatten, Dense(., K)."""
    features = [Conv2D(input_shape[0], 4, 3), ReLU(), MaxPool2D(2)]
    return [*features, Flatten(), Dense(_features_out(features, input_shape), num_classes)]


def lenet5(input_shape, num_classes=10) -> list:
    """LeNet-5 with ReLU and max pooling (16*5*5 features for 28x28 input, 16*6*6 for 32x32)."""
    features = [Conv2D(input_shape[0], 6, 5, padding=2), ReLU(), MaxPool2D(2),
                Conv2D(6, 16, 5), ReLU(), MaxPool2D(2)]
    return [*features, Flatten(), Dense(_features_out(features, input_shape), 120), ReLU(),
            Dense(120, 84), ReLU(), Dense(84, num_classes)]


def cifar_small(input_shape, num_classes=10) -> list:
    """Two 3x3 convolutions (32 and 64 channels, padding 1) with pooling, then one Dense."""
    features = [Conv2D(input_shape[0], 32, 3, padding=1), ReLU(), MaxPool2D(2),
                Conv2D(32, 64, 3, padding=1), ReLU(), MaxPool2D(2)]
    return [*features, Flatten(), Dense(_features_out(features, input_shape), num_classes)]


def _basic_block(in_channels, out_channels, stride=1) -> list:
    """ResNet's basic block, then ReLU: two 3x3 conv + batch norm, a strided 1x1 conv +
    batch norm shortcut where the shape changes."""
    body = [Conv2D(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
            BatchNorm2D(out_channels), ReLU(),
            Conv2D(out_channels, out_channels, 3, padding=1, bias=False), BatchNorm2D(out_channels)]
    shortcut = None
    if stride != 1 or in_channels != out_channels:
        shortcut = [Conv2D(in_channels, out_channels, 1, stride=stride, bias=False),
                    BatchNorm2D(out_channels)]
    return [Residual(body, shortcut), ReLU()]


def resnet_small(input_shape, num_classes=10) -> list:
    """A small ResNet: a 3x3 conv + batch norm + ReLU stem (16 channels), three basic
    blocks (16, 32 and 64 channels; the last two stride 2 with 1x1 conv shortcuts),
    global average pooling and one Dense (about 78,000 parameters for 10 classes)."""
    return [Conv2D(input_shape[0], 16, 3, padding=1, bias=False), BatchNorm2D(16), ReLU(),
            *_basic_block(16, 16), *_basic_block(16, 32, 2), *_basic_block(32, 64, 2),
            GlobalAvgPool2D(), Flatten(), Dense(64, num_classes)]


def resnet18(input_shape, num_classes=10) -> list:
    """ResNet-18 in its CIFAR layout (He et al.; the layout of most CIFAR-10 recipes): a
    3x3 conv + batch norm + ReLU stem of 64 channels with no max pool, four stages of two
    basic blocks (64, 128, 256, 512 channels; stages 2-4 start at stride 2 with a 1x1 conv
    + batch norm shortcut), global average pooling, one Dense (11.2 M parameters)."""
    layers = [Conv2D(input_shape[0], 64, 3, padding=1, bias=False), BatchNorm2D(64), ReLU()]
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [*_basic_block(channels, width, stride), *_basic_block(width, width)]
        channels = width
    return [*layers, GlobalAvgPool2D(), Flatten(), Dense(512, num_classes)]


def _inverted_residual(in_channels, out_channels, stride, expand) -> list:
    """MobileNetV2's block: a 1x1 expansion (unless ``expand == 1``), a 3x3 depthwise conv
    and a linear 1x1 projection, each with batch norm (ReLU6 after the first two); an
    identity shortcut where the shape stays."""
    hidden = in_channels * expand
    body = [] if expand == 1 else [Conv2D(in_channels, hidden, 1, bias=False),
                                   BatchNorm2D(hidden), ReLU6()]
    body += [Conv2D(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
             BatchNorm2D(hidden), ReLU6(),
             Conv2D(hidden, out_channels, 1, bias=False), BatchNorm2D(out_channels)]
    return [Residual(body)] if stride == 1 and in_channels == out_channels else body


MOBILENETV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2),
                      (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
"""``(expansion, channels, blocks, stride of the first)`` per stage: torchvision's, with the
CIFAR strides (stem and second stage at stride 1, so 32x32 images end at 4x4)."""


def mobilenetv2(input_shape, num_classes=10) -> list:
    """MobileNetV2 (width 1.0) with CIFAR strides: a 3x3 conv stem of 32 channels at stride
    1, the inverted residual stages of ``MOBILENETV2_STAGES``, a 1x1 conv to 1280 channels,
    global average pooling and one Dense (no dropout; 2.2 M parameters for 10 classes)."""
    layers = [Conv2D(input_shape[0], 32, 3, padding=1, bias=False), BatchNorm2D(32), ReLU6()]
    channels = 32
    for expand, width, blocks, stride in MOBILENETV2_STAGES:
        for i in range(blocks):
            layers += _inverted_residual(channels, width, stride if i == 0 else 1, expand)
            channels = width
    return [*layers, Conv2D(channels, 1280, 1, bias=False), BatchNorm2D(1280), ReLU6(),
            GlobalAvgPool2D(), Flatten(), Dense(1280, num_classes)]


#: Model name -> builder ``(input_shape, num_classes) -> list of layers``.
MODELS = {"dahl-basic": dahl_basic, "lenet5": lenet5, "cifar-small": cifar_small,
          "resnet-small": resnet_small, "resnet18": resnet18, "mobilenetv2": mobilenetv2,
          **SPIKING_MODELS}


def build_model(name: str, input_shape, num_classes: int = 10, dtype="float32",
                seed: int | None = None, **options) -> Sequential:
    """Build the built-in model ``name`` for samples of ``input_shape``.

    Parameters
    ----------
    name : {"dahl-basic", "lenet5", "cifar-small", "resnet-small", "resnet18", "mobilenetv2"}
        (or a spiking model's, :mod:`hetero_nn.snn_models`)
    input_shape : tuple of int
        One sample's ``(C, H, W)``.
    num_classes : int
    dtype : {"float32", "float64"}
    seed : int, optional
        Draw the initial weights from ``numpy.random.default_rng(seed)``; without it
        they come from the generator :func:`hetero_nn.manual_seed` seeds. Either way
        they are drawn in ``dtype`` with PyTorch's default distributions.
    **options
        The spiking models' (:mod:`hetero_nn.snn_models`): ``time_steps`` (25),
        ``encoding`` (``"direct"`` or ``"rate"``) and ``rate_seed`` (the RateEncode's seed;
        derived from ``seed`` when absent).

    Returns
    -------
    Sequential
        Built for ``input_shape`` and ``dtype``; ``model.spec`` holds the arguments.

    Raises
    ------
    ConfigError
        Unknown name, or an input shape that is not ``(C, H, W)``.
    ShapeError
        The input is too small for the network (names the model and the layer).
    """
    builder = MODELS.get(name)
    if builder is None:
        raise ConfigError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"model {name!r}: input_shape must be (C, H, W), got {tuple(input_shape)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 2:
        raise ConfigError(f"model {name!r}: num_classes must be an integer >= 2, got {num_classes!r}")
    allowed = SPIKING_OPTIONS if name in SPIKING_MODELS else ()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"model {name!r} takes no option {unknown[0]!r}" + (
            f" (its options: {', '.join(allowed)})" if allowed else ""))
    if name in SPIKING_MODELS and options.get("rate_seed") is None and seed is not None:
        options["rate_seed"] = int(np.random.default_rng([seed, 1]).integers(2 ** 63))
    try:
        model = Sequential(*builder(shape, int(num_classes), **options))
        model.build(shape, dtype)
    except ShapeError as exc:
        raise ShapeError(f"model {name!r} does not fit input of shape {shape}: {exc}") from None
    model.reset_parameters(np.random.default_rng(seed) if seed is not None else default_rng())
    model.spec = {"name": name, "input_shape": list(shape), "num_classes": int(num_classes)}
    if name in SPIKING_MODELS:
        encoder = next(layer for layer in model if getattr(layer, "makes_time", False))
        rate = isinstance(encoder, RateEncode)
        model.spec.update(time_steps=encoder.time_steps, encoding="rate" if rate else "direct",
                          rate_seed=encoder.seed if rate else None)
    return model
