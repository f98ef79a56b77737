"""Datasets: MNIST, Fashion-MNIST and CIFAR-10 loaders, a synthetic generator, downloads.

This module owns everything between files on disk and the normalised mini-batches a
trainer feeds to a network:

- where the data lives (:func:`resolve_data_dir`) and its layout::

      <data dir>/mnist/          train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
                                 t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
      <data dir>/fashion-mnist/  (the same four names)
      <data dir>/cifar-10/       data_batch_1.bin ... data_batch_5.bin  test_batch.bin
                                 batches.meta.txt

  IDX files may be gzipped or not, whatever their name says (the content decides);
  CIFAR-10 must be the *binary* version, any number of records per file and any
  subset of the five training batches.
- strict readers of the two formats: every defect (bad magic number, truncated data,
  a size that is not a whole number of records, labels out of range, image and label
  counts that differ, missing files) raises :class:`~hetero_nn.errors.DatasetFormatError`
  naming the file and what was expected. Nothing is ever unpickled: the CIFAR-10
  "python version" is refused with a pointer to the binary one.
- :class:`Dataset`: images (``uint8`` ``(N, C, H, W)``), ``int64`` labels, class names,
  per-channel normalisation, and a reproducible per-epoch order
  (``np.random.default_rng([seed, epoch])``) so a resumed run sees the same batches.
- ``synthetic``: seeded, learnable images (a smooth random template per class plus
  noise), generated per sample from its index so even 512x512 images cost nothing
  until a batch asks for them.
- :func:`download`: the official files, checked against their published MD5s,
  written under a temporary name and renamed, so a failed download leaves nothing.

It depends on NumPy, the standard library and :mod:`hetero_nn.errors` only.

>>> train = load("synthetic", image_size=8, num_samples=64)
>>> x, y = train.batch([0, 1, 2])
>>> x.shape, x.dtype, y.dtype
((3, 1, 8, 8), dtype('float32'), dtype('int64'))
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import posixpath
import re
import struct
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .errors import ConfigError, DatasetFormatError, HeteroNNError

__all__ = [
    "DATASETS", "SPLITS", "SOURCES", "DATA_ENV", "Dataset", "DatasetInfo",
    "DatasetNotFoundError", "DownloadError", "load", "resolve_data_dir", "describe",
    "download", "read_idx", "read_cifar10_bin",
]

DATASETS = ("mnist", "fashion-mnist", "cifar10", "synthetic")
SPLITS = ("train", "test")
DATA_ENV = "HETERO_NN_DATA"
CACHE_ENV = "HETERO_NN_CACHE"

_ALIASES = {"fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist",
            "cifar-10": "cifar10", "cifar_10": "cifar10"}


class DatasetNotFoundError(DatasetFormatError, FileNotFoundError):
    """A dataset's files are not in the data directory (says where it looked and how to fix)."""


class DownloadError(HeteroNNError, OSError):
    """A download failed: network error on every mirror, or a checksum that does not match."""


# ---------------------------------------------------------------------------------------
# Where the data lives
# ---------------------------------------------------------------------------------------

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


def _canonical_name(name: str) -> str:
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return key


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected 'train' or 'test'")
    return split


def _not_found(name: str, directory: Path, looked_for: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"{name}: {looked_for} not found in {directory}. Pass --data-dir DIR (or "
        f"data_dir=...) or set {DATA_ENV} to the folder holding mnist/, fashion-mnist/ "
        f"and cifar-10/, or fetch it with `hetero-nn datasets download {name}` "
        f"(or `python datasets/download.py {name}`)")


# ---------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)
# ---------------------------------------------------------------------------------------

IDX_IMAGES_MAGIC = 2051   # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049   # 0x00000801: unsigned bytes, 1 dimension

_IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

_IDX_SPECS = {
    "mnist": dict(directory="mnist", classes=tuple(str(d) for d in range(10)),
                  mean=(0.1307,), std=(0.3081,)),
    "fashion-mnist": dict(directory="fashion-mnist",
                          classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
                          mean=(0.2860,), std=(0.3530,)),
}

_GZIP_MAGIC = b"\x1f\x8b"


def _read_maybe_gzip(path: Path) -> bytes:
    """The bytes of ``path``, decompressed when its content (not its name) is gzip."""
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetFormatError(
            f"{path}: corrupt gzip stream ({exc}); expected a complete gzip-compressed "
            f"IDX file. Download it again.") from exc


def _idx_kind(magic: int) -> str:
    return {IDX_IMAGES_MAGIC: "an IDX image file (unsigned bytes, 3 dimensions)",
            IDX_LABELS_MAGIC: "an IDX label file (unsigned bytes, 1 dimension)"}.get(
                magic, f"an IDX file with magic {magic}")


def read_idx(path, expected_magic: int | None = None) -> np.ndarray:
    """Read one IDX file of unsigned bytes (gzipped or not) into a read-only ``uint8`` array.

    Parameters
    ----------
    path : path-like
        The file. Its content decides whether it is gzip-compressed, so a ``.gz`` name
        on an already decompressed file (as some browsers leave it) still reads.
    expected_magic : int, optional
        ``2051`` for images, ``2049`` for labels; any other magic number is refused.

    Returns
    -------
    numpy.ndarray
        ``uint8``, with the dimensions the header declares (big-endian ``uint32``).

    Raises
    ------
    DatasetFormatError
        Bad magic number, a header cut short, or a body that is shorter or longer
        than the header declares; the message names the file and what was expected.
    """
    path = Path(path)
    data = _read_maybe_gzip(path)
    expected = _idx_kind(expected_magic) if expected_magic else "an IDX file"
    if len(data) < 4:
        raise DatasetFormatError(
            f"{path}: truncated header: {len(data)} bytes, expected at least the 4-byte "
            f"magic number of {expected}")
    (magic,) = struct.unpack(">I", data[:4])
    if expected_magic is not None and magic != expected_magic:
        hint = ""
        if struct.unpack("<I", data[:4])[0] == expected_magic:
            hint = " (the header is little-endian; IDX headers are big-endian)"
        raise DatasetFormatError(
            f"{path}: bad magic number {magic} (0x{magic:08x}); expected {expected_magic} "
            f"(0x{expected_magic:08x}), the magic number of {expected}{hint}")
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DatasetFormatError(
            f"{path}: bad magic number {magic} (0x{magic:08x}); expected an IDX file of "
            f"unsigned bytes (0x000008NN, NN = number of dimensions)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetFormatError(
            f"{path}: truncated header: {len(data)} bytes, expected {header} "
            f"(magic + {ndim} big-endian dimension sizes)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    count = math.prod(dims)
    body = len(data) - header
    if body != count:
        shape = " x ".join(str(d) for d in dims)
        problem = ("truncated data" if body < count
                   else f"{body - count} bytes more than the header declares")
        raise DatasetFormatError(
            f"{path}: {problem}: the header declares {shape} = {count} bytes after the "
            f"{header}-byte header, the file holds {body}")
    array = np.frombuffer(data, dtype=np.uint8, count=count, offset=header)
    return array.reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path | None:
    """The IDX file ``stem`` in ``directory``: ``stem.gz`` or ``stem``, whichever is there."""
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def _check_labels(labels: np.ndarray, num_classes: int, path: Path, name: str) -> None:
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        first = int(bad[0])
        raise DatasetFormatError(
            f"{path}: label {int(labels[first])} at index {first} is out of range "
            f"({bad.size} labels out of range); expected labels 0..{num_classes - 1} for "
            f"the {num_classes} classes of {name}")


def _load_idx(name: str, split: str, data_dir: Path):
    spec = _IDX_SPECS[name]
    directory = data_dir / spec["directory"]
    image_stem, label_stem = _IDX_FILES[split]
    image_path = _find_idx(directory, image_stem)
    label_path = _find_idx(directory, label_stem)
    for path, stem in ((image_path, image_stem), (label_path, label_stem)):
        if path is None:
            raise _not_found(name, directory, f"{split} file {stem}.gz (or {stem})")
    images = read_idx(image_path, IDX_IMAGES_MAGIC)
    labels = read_idx(label_path, IDX_LABELS_MAGIC)
    if len(images) != len(labels):
        raise DatasetFormatError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} "
            f"labels; expected the same count in both files of the {split} split")
    _check_labels(labels, len(spec["classes"]), label_path, name)
    n, height, width = images.shape
    return (images.reshape(n, 1, height, width), labels.astype(np.int64), spec["classes"],
            spec["mean"], spec["std"], [image_path, label_path])


# ---------------------------------------------------------------------------------------
# CIFAR-10 binary version
# ---------------------------------------------------------------------------------------

CIFAR10_RECORD_BYTES = 3073   # 1 label byte + 3 planes (R, G, B) of 32 x 32 bytes
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_CIFAR_TRAIN = re.compile(r"data_batch_(\d+)\.bin")
_CIFAR_PICKLED = ("data_batch_1", "test_batch", "batches.meta", "cifar-10-batches-py",
                  "cifar-10-python.tar.gz")
_CIFAR_BINARY_HINT = (
    "Use the CIFAR-10 binary version instead (cifar-10-binary.tar.gz from "
    "https://www.cs.toronto.edu/~kriz/cifar.html), its .bin files placed in {directory}, "
    "or run `hetero-nn datasets download cifar10`.")


def read_cifar10_bin(path, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch file: any whole number of 3073-byte records.

    Returns
    -------
    images : numpy.ndarray
        ``uint8`` ``(N, 3, 32, 32)``, planes R, G, B, each row-major.
    labels : numpy.ndarray
        ``int64`` ``(N,)``.

    Raises
    ------
    DatasetFormatError
        An empty file, a size that is not a multiple of 3073 bytes, or a label outside
        ``0 .. num_classes - 1``.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(2)
    hint = ""
    if head[:1] == b"\x80":
        hint = (" The file looks like a Python pickle (the CIFAR-10 python version), "
                "which is never unpickled. " + _CIFAR_BINARY_HINT.format(directory=path.parent))
    elif head == _GZIP_MAGIC:
        hint = " The file is gzip-compressed: extract cifar-10-binary.tar.gz first."
    if size == 0 or size % CIFAR10_RECORD_BYTES:
        raise DatasetFormatError(
            f"{path}: {size} bytes is not a whole, non-zero number of CIFAR-10 records; "
            f"expected a multiple of {CIFAR10_RECORD_BYTES} bytes (1 label byte + 3 x 1024 "
            f"pixel bytes per record), found {size // CIFAR10_RECORD_BYTES} records and "
            f"{size % CIFAR10_RECORD_BYTES} extra bytes.{hint}")
    records = np.fromfile(path, dtype=np.uint8).reshape(-1, CIFAR10_RECORD_BYTES)
    labels = records[:, 0]
    if hint and np.any(labels >= num_classes):
        raise DatasetFormatError(f"{path}: not a CIFAR-10 binary batch.{hint}")
    _check_labels(labels, num_classes, path, "cifar10")
    images = np.ascontiguousarray(records[:, 1:]).reshape(-1, 3, 32, 32)
    return images, labels.astype(np.int64)


def _cifar_directory(data_dir: Path) -> Path:
    """The folder holding the ``.bin`` files, or a refusal if only the python version is there."""
    home = data_dir / "cifar-10"
    candidates = (home, home / "cifar-10-batches-bin", data_dir / "cifar-10-batches-bin")
    for directory in candidates:
        if directory.is_dir() and ((directory / "test_batch.bin").is_file()
                                   or any(_CIFAR_TRAIN.fullmatch(p.name)
                                          for p in directory.iterdir())):
            return directory
    for parent in (home, data_dir):
        for entry in _CIFAR_PICKLED:
            found = parent / entry
            if found.exists():
                raise DatasetFormatError(
                    f"{found}: this is the CIFAR-10 python version (pickled batches); "
                    f"hetero_nn never unpickles files. "
                    + _CIFAR_BINARY_HINT.format(directory=home))
    if (home / "cifar-10-binary.tar.gz").is_file():
        raise _not_found("cifar10", home, "extracted .bin files (the archive "
                         "cifar-10-binary.tar.gz is there but not extracted)")
    return home


def _cifar_classes(directory: Path) -> tuple[str, ...]:
    meta = directory / "batches.meta.txt"
    if not meta.is_file():
        return CIFAR10_CLASSES
    names = tuple(line.strip() for line in meta.read_text("ascii", "replace").splitlines()
                  if line.strip())
    if len(names) != 10:
        raise DatasetFormatError(
            f"{meta}: {len(names)} class names; expected 10, one per line")
    return names


def _load_cifar10(split: str, data_dir: Path):
    directory = _cifar_directory(data_dir)
    if split == "train":
        paths = sorted((p for p in directory.glob("data_batch_*.bin")
                        if _CIFAR_TRAIN.fullmatch(p.name)),
                       key=lambda p: int(_CIFAR_TRAIN.fullmatch(p.name).group(1)))
        if not paths:
            raise _not_found("cifar10", directory, "training files data_batch_*.bin")
    else:
        paths = [directory / "test_batch.bin"]
        if not paths[0].is_file():
            raise _not_found("cifar10", directory, "test file test_batch.bin")
    parts = [read_cifar10_bin(p) for p in paths]
    images = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
    labels = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
    return images, labels, _cifar_classes(directory), CIFAR10_MEAN, CIFAR10_STD, paths


# ---------------------------------------------------------------------------------------
# Synthetic: a smooth random template per class, plus noise, generated per sample
# ---------------------------------------------------------------------------------------

_SYNTHETIC_DEFAULTS = dict(image_size=28, channels=1, num_classes=10, num_samples=None,
                           seed=0, noise=1.0)
_SYNTHETIC_SAMPLES = {"train": 2048, "test": 512}
_SYNTHETIC_EAGER_BYTES = 64 << 20     # generate at load time up to this many bytes
_SYNTHETIC_MAX_MATERIALIZE = 2 << 30  # ``images`` of a lazy dataset up to this many bytes
_SYNTHETIC_GRID = 6                   # templates are bilinear upsamplings of 6 x 6 grids
# Seed-sequence tags: the entropy lists differ in their second word, never only by length
# (SeedSequence pads with zeros, so [a, b] and [a, b, 0] would collide).
_TAG_TEMPLATE, _TAG_LABEL, _TAG_SAMPLE = 0x7E3B1A7E, 0x1ABE1, 0x5A3B1E
_SPLIT_KEY = {"train": 0, "test": 1}


def _interp_matrix(n_out: int, n_in: int) -> np.ndarray:
    """``(n_out, n_in)`` bilinear (corner-aligned) interpolation weights."""
    if n_in == 1:
        return np.ones((n_out, 1))
    position = np.linspace(0.0, n_in - 1, n_out)
    low = np.minimum(np.floor(position).astype(np.int64), n_in - 2)
    frac = position - low
    weights = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    weights[rows, low] = 1.0 - frac
    weights[rows, low + 1] += frac
    return weights


class _SyntheticImages:
    """Generator of synthetic samples: ``sample i`` is a pure function of (seed, split, i).

    Class ``k``'s template in channel ``c`` is ``A @ G[k, c] @ B.T`` (a random 6 x 6 grid
    ``G`` bilinearly upsampled), shifted and scaled to zero mean and unit variance; the
    grids depend on the seed only, so both splits share them. Sample ``i`` draws from
    ``default_rng([seed, tag, split, i])`` an amplitude ``a ~ U(0.5, 1.5)`` and Gaussian
    noise ``n``, and is ``(a * template + noise * n) / sqrt(13/12 + noise**2)``: values of
    about zero mean and unit variance, which is why the normalisation is the identity.
    """

    def __init__(self, seed, split, channels, height, width, num_classes, noise):
        self.seed, self.split_key = seed, _SPLIT_KEY[split]
        self.shape = (channels, height, width)
        self.noise = float(noise)
        grid_h, grid_w = min(_SYNTHETIC_GRID, height), min(_SYNTHETIC_GRID, width)
        self.rows = _interp_matrix(height, grid_h)
        self.cols = _interp_matrix(width, grid_w)
        rng = np.random.default_rng([seed, _TAG_TEMPLATE])
        self.grids = rng.standard_normal((num_classes, channels, grid_h, grid_w))
        # Mean and variance of each upsampled template, in closed form (no H x W pass):
        # mean = a.G.b with a, b the column means; E[T^2] = tr(G BtB G^T AtA) / (H W).
        a_mean, b_mean = self.rows.mean(axis=0), self.cols.mean(axis=0)
        ata, btb = self.rows.T @ self.rows, self.cols.T @ self.cols
        mean = np.einsum("i,kcij,j->kc", a_mean, self.grids, b_mean)
        second = np.einsum("kcij,jl,kcml,mi->kc", self.grids, btb, self.grids, ata)
        second /= height * width
        var = second - mean ** 2
        flat = var <= 1e-12 * np.maximum(second, 1e-300)   # e.g. 1 x 1 images
        self.center = np.where(flat, 0.0, mean)
        self.scale = np.where(flat, np.sqrt(np.maximum(second, 1e-300)), np.sqrt(np.abs(var)))
        self.norm = math.sqrt(13.0 / 12.0 + self.noise ** 2)

    def template(self, label: int) -> np.ndarray:
        """Class ``label``'s template, ``float64`` ``(C, H, W)``."""
        raw = self.rows @ self.grids[label] @ self.cols.T
        return (raw - self.center[label][:, None, None]) / self.scale[label][:, None, None]

    def __call__(self, indices: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The samples ``indices`` (of classes ``labels``), ``float32`` ``(n, C, H, W)``."""
        out = np.empty((len(indices),) + self.shape, dtype=np.float32)
        rows, cols_t = self.rows.astype(np.float32), self.cols.T.astype(np.float32)
        for row, (index, label) in enumerate(zip(indices, labels)):
            rng = np.random.default_rng([self.seed, _TAG_SAMPLE, self.split_key, int(index)])
            amplitude = rng.uniform(0.5, 1.5)
            noise = rng.standard_normal(self.shape, dtype=np.float32)
            # amplitude * template / norm, folded into the small grid: one float32 matmul.
            gain = amplitude / self.norm / self.scale[int(label)]
            grid = (self.grids[int(label)] * gain[:, None, None]).astype(np.float32)
            height_rows = (rows @ grid).reshape(-1, grid.shape[-1])        # (C * H, grid)
            np.matmul(height_rows, cols_t, out=out[row].reshape(height_rows.shape[0], -1))
            out[row] -= (self.center[int(label)] * gain).astype(np.float32)[:, None, None]
            noise *= np.float32(self.noise / self.norm)
            out[row] += noise
        return out


def _synthetic_labels(seed: int, split: str, count: int, num_classes: int) -> np.ndarray:
    """Balanced labels: each block of ``num_classes`` samples holds every class once.

    The keys come from one generator's stream, so the first ``n`` labels do not depend
    on ``count``: a smaller ``num_samples`` (or ``limit``) keeps a prefix.
    """
    blocks = -(-count // num_classes)
    keys = np.random.default_rng([seed, _TAG_LABEL, _SPLIT_KEY[split]]).random(
        blocks * num_classes)
    return keys.reshape(blocks, num_classes).argsort(axis=1).ravel()[:count].astype(np.int64)


def _positive_int(option: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ConfigError(f"synthetic option {option}={value!r}: expected a positive integer")
    return int(value)


def _load_synthetic(split: str, options: dict):
    unknown = sorted(set(options) - set(_SYNTHETIC_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown synthetic option(s) {', '.join(unknown)}; expected "
                          f"{', '.join(_SYNTHETIC_DEFAULTS)}")
    opts = {**_SYNTHETIC_DEFAULTS, **options}
    size = opts["image_size"]
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ConfigError(f"synthetic option image_size={size!r}: expected an int or "
                              f"(height, width)")
        height, width = size
    else:
        height, width = size, size
    height = _positive_int("image_size", height)
    width = _positive_int("image_size", width)
    channels = _positive_int("channels", opts["channels"])
    num_classes = _positive_int("num_classes", opts["num_classes"])
    if num_classes < 2:
        raise ConfigError(f"synthetic option num_classes={num_classes}: expected at least 2")
    count = opts["num_samples"]
    count = _SYNTHETIC_SAMPLES[split] if count is None else _positive_int("num_samples", count)
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"synthetic option seed={seed!r}: expected an integer >= 0")
    try:
        noise = float(opts["noise"])
    except (TypeError, ValueError):
        noise = math.nan
    if not noise >= 0.0 or math.isinf(noise):
        raise ConfigError(f"synthetic option noise={opts['noise']!r}: expected a finite "
                          f"number >= 0")
    generator = _SyntheticImages(int(seed), split, channels, height, width, num_classes, noise)
    labels = _synthetic_labels(int(seed), split, count, num_classes)
    classes = tuple(f"class_{k}" for k in range(num_classes))
    return generator, labels, classes, (channels, height, width)


# ---------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------

class Dataset:
    """Images and labels of one split, with normalisation and a reproducible order.

    Attributes
    ----------
    name, split : str
    images : numpy.ndarray
        ``uint8`` ``(N, C, H, W)`` pixels (read-only for IDX files), or ``float32`` for
        ``synthetic`` (already in normalised units). A large synthetic dataset is
        generated on demand: reading ``images`` materialises it (refused above 2 GiB);
        :meth:`batch` and :meth:`batches` never do.
    labels : numpy.ndarray
        ``int64`` ``(N,)`` in ``0 .. num_classes - 1``.
    classes : list of str
    mean, std : tuple of float
        Per channel, in units of ``pixel / 255``; :meth:`batch` returns
        ``(pixel / 255 - mean) / std``.
    files : list of pathlib.Path
        The files read (empty for ``synthetic``).
    """

    def __init__(self, name, split, labels, classes, mean, std, *, images=None,
                 input_shape=None, generate=None, files=()):
        self.name, self.split = name, split
        self.labels = labels
        self.classes = list(classes)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self._images = images
        self._generate = generate
        self.input_shape = tuple(int(d) for d in (input_shape or images.shape[1:]))
        self.files = [Path(p) for p in files]
        if images is not None and len(images) != len(labels):
            raise ValueError(f"{len(images)} images for {len(labels)} labels")
        if len(self.mean) != self.input_shape[0] or len(self.std) != self.input_shape[0]:
            raise ValueError(f"mean/std need one value per channel ({self.input_shape[0]})")

    @property
    def images(self) -> np.ndarray:
        if self._images is None:
            nbytes = len(self) * math.prod(self.input_shape) * 4
            if nbytes > _SYNTHETIC_MAX_MATERIALIZE:
                raise ConfigError(
                    f"{self.name}/{self.split}: {len(self)} images of "
                    f"{'x'.join(map(str, self.input_shape))} float32 would take "
                    f"{nbytes / 2**30:.1f} GiB; read it with batch() or batches(), "
                    f"which generate each mini-batch on demand")
            self._images = self._generate(np.arange(len(self)), self.labels)
        return self._images

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.input_shape))
        return (f"Dataset({self.name!r}, split={self.split!r}, samples={len(self)}, "
                f"input_shape={shape}, classes={self.num_classes})")

    def _pixels(self, indices) -> np.ndarray:
        if self._images is not None:
            return self._images[indices]
        chosen = np.arange(len(self))[indices]
        return self._generate(chosen, self.labels[chosen])

    def batch(self, indices, dtype="float32", out=None) -> tuple[np.ndarray, np.ndarray]:
        """The samples at ``indices``, normalised: ``(x, y)``.

        Parameters
        ----------
        indices : array-like of int or slice
        dtype : str or numpy.dtype
            A floating type for ``x``.
        out : callable(shape, dtype) -> array, optional
            Allocator for ``x`` and ``y`` (e.g. ``Arena.empty``, so the trainer
            fills a batch arena); fresh arrays by default.

        Returns
        -------
        x : numpy.ndarray
            ``(n, C, H, W)`` C-contiguous, ``(pixel / 255 - mean) / std`` per channel,
            computed in ``dtype`` in that order (as torchvision's ``ToTensor`` then
            ``Normalize``).
        y : numpy.ndarray
            ``int64`` ``(n,)``.
        """
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ConfigError(f"batch dtype {dtype}: expected a floating type "
                              f"(float32 or float64)")
        if not isinstance(indices, slice):
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        pixels = self._pixels(indices)
        if out is None:
            x = np.array(pixels, dtype=dtype, order="C", copy=True)
        else:
            x = out(pixels.shape, dtype)
            x[...] = pixels
        if pixels.dtype == np.uint8:
            x /= dtype.type(255)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        x -= np.asarray(self.mean, dtype=dtype).reshape(shape)
        x /= np.asarray(self.std, dtype=dtype).reshape(shape)
        if out is None:
            return x, np.array(self.labels[indices], dtype=np.int64)
        labels = self.labels[indices]
        y = out(labels.shape, np.int64)
        y[...] = labels
        return x, y

    def epoch_order(self, seed: int = 0, epoch: int = 0) -> np.ndarray:
        """The sample order of ``epoch``: ``np.random.default_rng([seed, epoch]).permutation(N)``.

        A function of (seed, epoch) only, so a run resumed at epoch ``e`` replays it.
        """
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self))

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """How many mini-batches :meth:`batches` yields."""
        batch_size = _batch_size(batch_size)
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    def batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                drop_last: bool = False, dtype="float32") -> Iterator[tuple[np.ndarray,
                                                                            np.ndarray]]:
        """Yield ``(x, y)`` mini-batches of one epoch, in :meth:`epoch_order` when shuffled.

        The last, smaller batch is yielded unless ``drop_last``.
        """
        batch_size = _batch_size(batch_size)
        order = self.epoch_order(seed, epoch) if shuffle else np.arange(len(self))
        stop = len(self) - len(self) % batch_size if drop_last else len(self)
        for start in range(0, stop, batch_size):
            yield self.batch(order[start:start + batch_size], dtype=dtype)


def _batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: expected a positive integer")
    return int(batch_size)


def load(name: str, split: str = "train", data_dir=None, limit: int | None = None,
         **synthetic_options) -> Dataset:
    """Load one split of a dataset.

    Parameters
    ----------
    name : {"mnist", "fashion-mnist", "cifar10", "synthetic"}
    split : {"train", "test"}
    data_dir : path-like, optional
        See :func:`resolve_data_dir`; unused by ``synthetic``.
    limit : int, optional
        Keep only the first ``limit`` samples (all when there are fewer).
    **synthetic_options
        ``synthetic`` only: ``image_size`` (int or (H, W), default 28), ``channels`` (1),
        ``num_classes`` (10), ``num_samples`` (2048 train / 512 test), ``seed`` (0),
        ``noise`` (1.0, the noise-to-signal ratio). Datasets of up to 64 MiB are
        generated at load time, larger ones per batch.

    Raises
    ------
    DatasetNotFoundError
        The files are not there (the message says where it looked and how to get them).
    DatasetFormatError
        A file is not what its format promises.
    ConfigError
        Unknown name, split or option.
    """
    name = _canonical_name(name)
    split = _check_split(split)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ConfigError(f"limit={limit!r}: expected a positive integer or None")
        limit = int(limit)
    if name == "synthetic":
        generator, labels, classes, shape = _load_synthetic(split, synthetic_options)
        labels = labels[:limit]
        channels = shape[0]
        dataset = Dataset(name, split, labels, classes, (0.0,) * channels, (1.0,) * channels,
                          input_shape=shape, generate=generator)
        if len(labels) * math.prod(shape) * 4 <= _SYNTHETIC_EAGER_BYTES:
            dataset.images  # generate now: small enough, and batches become plain slicing
        return dataset
    if synthetic_options:
        raise ConfigError(f"options {', '.join(sorted(synthetic_options))} apply to the "
                          f"synthetic dataset only, not {name}")
    data_dir = resolve_data_dir(data_dir)
    loader = _load_cifar10 if name == "cifar10" else (lambda s, d: _load_idx(name, s, d))
    images, labels, classes, mean, std, files = loader(split, data_dir)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return Dataset(name, split, labels, classes, mean, std, images=images, files=files)


# ---------------------------------------------------------------------------------------
# What is there (for `hetero-nn datasets list`)
# ---------------------------------------------------------------------------------------

class DatasetInfo(NamedTuple):
    """One row of :func:`describe`."""

    name: str
    present: bool            # both splits load (headers and sizes checked, not every label)
    files: list              # file names found, relative to the data directory
    samples: dict | None     # {"train": n, "test": n}, None when absent or generated


def _idx_count(path: Path) -> int:
    """The first dimension in an IDX header, reading only the header (gzipped or not)."""
    with open(path, "rb") as f:
        compressed = f.read(2) == _GZIP_MAGIC
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as f:
            header = f.read(8)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetFormatError(f"{path}: corrupt gzip stream ({exc})") from exc
    if len(header) < 8 or header[:3] != b"\x00\x00\x08":
        raise DatasetFormatError(f"{path}: not an IDX file of unsigned bytes")
    return struct.unpack(">I", header[4:8])[0]


def describe(data_dir=None) -> list[DatasetInfo]:
    """One :class:`DatasetInfo` per dataset name: is it there, which files, how many samples.

    Cheap: reads IDX headers and CIFAR file sizes, not the data. Never raises for a
    missing or damaged dataset; it is reported as not present.
    """
    data_dir = resolve_data_dir(data_dir)
    rows = []
    for name in DATASETS:
        if name == "synthetic":
            rows.append(DatasetInfo(name, True, [], None))
            continue
        files, samples = [], {}
        try:
            if name == "cifar10":
                directory = _cifar_directory(data_dir)
                found = sorted(p for p in directory.glob("*")
                               if p.suffix in (".bin", ".txt") and p.is_file())
                files = [str(p.relative_to(data_dir)) for p in found]
                train = [p for p in found if _CIFAR_TRAIN.fullmatch(p.name)]
                test = [p for p in found if p.name == "test_batch.bin"]
                for split, paths in (("train", train), ("test", test)):
                    sizes = [p.stat().st_size for p in paths]
                    if not paths or any(s == 0 or s % CIFAR10_RECORD_BYTES for s in sizes):
                        raise DatasetFormatError(f"cifar10 {split} missing or damaged")
                    samples[split] = sum(sizes) // CIFAR10_RECORD_BYTES
            else:
                directory = data_dir / _IDX_SPECS[name]["directory"]
                for split, stems in _IDX_FILES.items():
                    paths = [_find_idx(directory, stem) for stem in stems]
                    files += [str(p.relative_to(data_dir)) for p in paths if p is not None]
                    if None in paths:
                        raise DatasetFormatError(f"{name} {split} missing")
                    counts = {_idx_count(p) for p in paths}
                    if len(counts) != 1:
                        raise DatasetFormatError(f"{name} {split} counts differ")
                    samples[split] = counts.pop()
            rows.append(DatasetInfo(name, True, files, samples))
        except (DatasetFormatError, OSError):
            rows.append(DatasetInfo(name, False, files, None))
    return rows


# ---------------------------------------------------------------------------------------
# Download
# ---------------------------------------------------------------------------------------

_MNIST_FILES = {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
                "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
                "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}
_FASHION_FILES = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                  "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                  "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                  "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}

#: Per dataset: the folder under the data directory, the mirrors (base URLs, tried in
#: order), the files with their published MD5s, and for archives the members to keep.
SOURCES = {
    "mnist": dict(directory="mnist",
                  mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                           "https://storage.googleapis.com/cvdf-datasets/mnist/"),
                  files=_MNIST_FILES),
    "fashion-mnist": dict(directory="fashion-mnist",
                          mirrors=("http://fashion-mnist.s3-website.eu-central-1"
                                   ".amazonaws.com/",),
                          files=_FASHION_FILES),
    "cifar10": dict(directory="cifar-10",
                    mirrors=("https://www.cs.toronto.edu/~kriz/",),
                    files={"cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"},
                    archive_members=tuple(f"data_batch_{i}.bin" for i in range(1, 6))
                    + ("test_batch.bin", "batches.meta.txt")),
}

_USER_AGENT = "hetero-nn/0.1 (+python urllib)"
_CHUNK = 1 << 20


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _join(base: str, filename: str) -> str:
    return base + filename if base.endswith("/") else f"{base}/{filename}"


def _temporary(directory: Path, filename: str) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".{filename}.", suffix=".part")
    os.close(fd)
    return Path(name)


def _fetch(url: str, target: Path, md5: str, timeout: float, progress) -> None:
    """Stream ``url`` into ``target`` and check its MD5; raise ``DownloadError`` if it differs."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    digest = hashlib.md5(usedforsecurity=False)
    done = 0
    with urllib.request.urlopen(request, timeout=timeout) as response, open(target, "wb") as out:
        total = response.headers.get("Content-Length")
        total = int(total) if total and total.isdigit() else None
        for chunk in iter(lambda: response.read(_CHUNK), b""):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(url, done, total)
    got = digest.hexdigest()
    if got != md5:
        raise DownloadError(f"MD5 checksum mismatch for {url}: got {got}, expected {md5} "
                            f"({done} bytes received)")


def _download_file(filename, md5, directory, mirrors, timeout, progress) -> Path:
    """Fetch ``filename`` from the first mirror that serves it with the right MD5."""
    failures = []
    for base in mirrors:
        url = _join(base, filename)
        part = _temporary(directory, filename)
        try:
            _fetch(url, part, md5, timeout, progress)
            final = directory / filename
            os.replace(part, final)
            return final
        except DownloadError as exc:
            failures.append(str(exc))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            failures.append(f"{url}: {type(exc).__name__}: {reason}")
        finally:
            part.unlink(missing_ok=True)
    raise DownloadError(
        f"could not download {filename} (MD5 {md5}) into {directory}: "
        + "; ".join(failures)
        + ". Check the network, or fetch the file by hand, check its MD5 and put it there.")


def _extract_members(archive: Path, directory: Path, wanted: Sequence[str]) -> list[Path]:
    """Copy the archive's regular files named in ``wanted`` (by base name) into ``directory``.

    Only base names are used, so no member can write outside ``directory``; links,
    folders and every other member are skipped. Each file is written under a temporary
    name and renamed.
    """
    written = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            base = posixpath.basename(member.name)
            if not member.isfile() or base not in wanted:
                continue
            source = tar.extractfile(member)
            part = _temporary(directory, base)
            try:
                with source, open(part, "wb") as out:
                    for chunk in iter(lambda: source.read(_CHUNK), b""):
                        out.write(chunk)
                os.replace(part, directory / base)
            finally:
                part.unlink(missing_ok=True)
            written.append(directory / base)
    return written


def download(name: str, data_dir=None, force: bool = False, *,
             mirrors: Sequence[str] | None = None, timeout: float = 60.0,
             progress: Callable[[str, int, int | None], None] | None = None) -> Path:
    """Download a dataset from its official source into ``<data dir>/<folder>/``.

    Every file is checked against its published MD5, written under a temporary name in
    the target folder and renamed only once verified, so an interrupted or corrupt
    download leaves no partial file. CIFAR-10 comes as ``cifar-10-binary.tar.gz``, of
    which only the ``.bin`` and ``.txt`` members are kept (the archive is deleted).

    Parameters
    ----------
    name : {"mnist", "fashion-mnist", "cifar10"}
    data_dir : path-like, optional
        See :func:`resolve_data_dir`; created if needed.
    force : bool
        Download again even files that are there and verify.
    mirrors : sequence of str, optional
        Base URLs to use instead of the official ones (any scheme urllib opens,
        ``file://`` included), tried in order.
    timeout : float
        Seconds to wait on the network before trying the next mirror.
    progress : callable, optional
        Called as ``progress(url, bytes_done, bytes_total_or_None)`` while fetching.

    Returns
    -------
    pathlib.Path
        The dataset's folder.

    Raises
    ------
    DownloadError
        No mirror served a file with the expected MD5 (network failures and mismatches
        are listed per mirror), or the archive lacks the expected members.
    """
    name = _canonical_name(name)
    if name not in SOURCES:
        raise ConfigError(f"{name} is generated, not downloaded; downloadable: "
                          f"{', '.join(SOURCES)}")
    source = SOURCES[name]
    directory = resolve_data_dir(data_dir) / source["directory"]
    directory.mkdir(parents=True, exist_ok=True)
    mirrors = tuple(mirrors) if mirrors else source["mirrors"]
    members = source.get("archive_members")
    if members is not None:
        if not force and all((directory / m).is_file() for m in members):
            return directory
        ((archive_name, md5),) = source["files"].items()
        archive = _download_file(archive_name, md5, directory, mirrors, timeout, progress)
        try:
            written = _extract_members(archive, directory, members)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DownloadError(f"{archive}: cannot extract ({exc})") from exc
        finally:
            archive.unlink(missing_ok=True)
        names = {p.name for p in written}
        if "test_batch.bin" not in names or not names & set(members[:5]):
            raise DownloadError(
                f"{archive_name} held {sorted(names) or 'no'} expected members; expected the "
                f"CIFAR-10 binary version's data_batch_N.bin and test_batch.bin")
        return directory
    for filename, md5 in source["files"].items():
        target = directory / filename
        if not force and target.is_file() and _md5(target) == md5:
            continue
        _download_file(filename, md5, directory, mirrors, timeout, progress)
    return directory
