"""``hetero-nn models``: the built-in models with their parameter counts, or one's
layer summary (``--summary MODEL``)."""

from __future__ import annotations

import argparse

from . import options
from ..models import MODELS, build_model


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``models`` to the subcommands ``sub``."""
    models = sub.add_parser("models", help="list the built-in models, or one's layer summary")
    models.add_argument("--summary", choices=list(MODELS), metavar="MODEL",
                        help="print MODEL's layers: output shapes and parameter counts")
    models.add_argument("--input-shape", type=options.input_shape, default=(3, 32, 32), metavar="CxHxW",
                        help="one sample's shape for --summary (default: 3x32x32)")
    return models


def command(args) -> int:
    """``hetero-nn models``: each built-in model with its parameter count for MNIST and
    CIFAR-10 inputs; with ``--summary MODEL``, that model's layer table."""
    if args.summary:
        model = build_model(args.summary, args.input_shape, 10, seed=0)
        print(f"{args.summary} for input {'x'.join(map(str, args.input_shape))}, 10 classes")
        print(model.summary())
        return 0
    for name in MODELS:
        for shape in ((1, 28, 28), (3, 32, 32)):
            model = build_model(name, shape, 10, seed=0)
            count = sum(p.data.size for p in model.parameters())
            print(f"{name:12s} input {'x'.join(map(str, shape)):8s} {count:>9,d} parameters")
    return 0
