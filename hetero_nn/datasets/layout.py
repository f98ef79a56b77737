"""Dataset names, splits and where their files live (the data directory and its layout).

This module owns the vocabulary every other dataset module shares: the names
(:data:`DATASETS`, with aliases), the splits, the data directory
(:func:`resolve_data_dir`: ``data_dir``, else ``$HETERO_NN_DATA``, else the cache's
``data/``) and the one-line errors for files that are not there or hold labels out
of range. Layout under the data directory::

    <data dir>/mnist/          train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
                               t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
    <data dir>/fashion-mnist/  (the same four names)
    <data dir>/cifar-10/       data_batch_1.bin ... data_batch_5.bin  test_batch.bin
                               batches.meta.txt
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DatasetFormatError

DATASETS = ("mnist", "fashion-mnist", "cifar10", "synthetic")
SPLITS = ("train", "test")
DATA_ENV = "HETERO_NN_DATA"
CACHE_ENV = "HETERO_NN_CACHE"

_ALIASES = {"fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist",
            "cifar-10": "cifar10", "cifar_10": "cifar10"}


class DatasetNotFoundError(DatasetFormatError, FileNotFoundError):
    """A dataset's files are not in the data directory (says where it looked and how to fix)."""


def resolve_data_dir(data_dir=None) -> Path:
    """The data directory: ``data_dir``, else ``$HETERO_NN_DATA``, else the cache's ``data/``.

    The cache is ``$HETERO_NN_CACHE`` when set, ``~/.cache/hetero_nn`` otherwise.
    The directory is not created here.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get(CACHE_ENV)
    base = Path(cache).expanduser() if cache else Path.home() / ".cache" / "hetero_nn"
    return base / "data"


def canonical_name(name: str) -> str:
    """``name`` as one of :data:`DATASETS` (aliases such as ``cifar-10`` accepted)."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return key


def check_split(split: str) -> str:
    """``split`` if it is one of :data:`SPLITS`, else a ConfigError."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected 'train' or 'test'")
    return split


def not_found(name: str, directory: Path, looked_for: str) -> DatasetNotFoundError:
    """The error for ``name``'s files missing from ``directory`` (named once, with the fixes)."""
    return DatasetNotFoundError(
        f"{name}: {looked_for} not found in {directory}. Pass --data-dir DIR (or "
        f"data_dir=...) or set {DATA_ENV} to the parent of that folder, or fetch it with "
        f"`hetero-nn datasets download {name}`")


def check_labels(labels: np.ndarray, num_classes: int, path: Path, name: str) -> None:
    """Refuse labels outside ``0 .. num_classes - 1``, naming the file and the first one."""
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        first = int(bad[0])
        raise DatasetFormatError(
            f"{path}: label {int(labels[first])} at index {first} is out of range "
            f"({bad.size} labels out of range); expected labels 0..{num_classes - 1} for "
            f"the {num_classes} classes of {name}")


