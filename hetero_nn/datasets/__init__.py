"""Datasets: MNIST, Fashion-MNIST and CIFAR-10 loaders, a synthetic generator, downloads.

This package owns everything between files on disk and the normalised mini-batches a
trainer feeds to a network, one module per concern:

- :mod:`.layout`: the names, the splits, where the data lives
  (:func:`resolve_data_dir`) and the folder of each dataset under it.
- :mod:`.idx` and :mod:`.cifar`: strict readers of the two formats. Every defect
  (bad magic number, truncated data, a size that is not a whole number of records,
  labels out of range, image and label counts that differ, missing files) raises
  :class:`~hetero_nn.errors.DatasetFormatError` naming the file and what was
  expected. Nothing is ever unpickled.
- :mod:`.synthetic`: seeded, learnable images generated per sample from its index.
- :mod:`.dataset`: :class:`Dataset`, images and labels of one split with per-channel
  normalisation and a reproducible per-epoch order.
- :mod:`.downloads`: :func:`download` from the official sources or ``mirrors``,
  checked against the published MD5s, written under a temporary name and renamed.
- :mod:`.catalog`: :func:`load` (a name to its reader) and :func:`describe` (what
  the data directory holds, sizes checked, checksums with ``verify``).

It depends on NumPy, the standard library and :mod:`hetero_nn.errors` only; the
imports go catalog -> readers and downloads -> layout.

>>> train = load("synthetic", image_size=8, num_samples=64)
>>> x, y = train.batch([0, 1, 2])
>>> x.shape, x.dtype, y.dtype
((3, 1, 8, 8), dtype('float32'), dtype('int64'))
"""

from .catalog import DatasetInfo, describe, load
from .cifar import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_RECORD_BYTES, CIFAR10_STD, read_cifar10_bin
from .dataset import Dataset
from .downloads import SOURCES, DownloadError, download
from .idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_idx
from .layout import CACHE_ENV, DATA_ENV, DATASETS, SPLITS, DatasetNotFoundError, resolve_data_dir

__all__ = [
    "DATASETS", "SPLITS", "SOURCES", "DATA_ENV", "CACHE_ENV", "Dataset", "DatasetInfo",
    "DatasetNotFoundError", "DownloadError", "load", "resolve_data_dir", "describe",
    "download", "read_idx", "read_cifar10_bin", "CIFAR10_CLASSES", "CIFAR10_MEAN",
    "CIFAR10_STD", "CIFAR10_RECORD_BYTES", "IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC",
]
