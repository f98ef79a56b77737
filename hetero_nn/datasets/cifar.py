"""CIFAR-10, binary version: a strict reader of batch files and the loader of one split.

Any number of 3073-byte records per file and any subset of the five training
batches. Nothing is ever unpickled: the CIFAR-10 "python version" is refused with
a pointer to the binary one.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import DatasetFormatError
from .idx import GZIP_MAGIC
from .layout import check_labels, not_found

CIFAR10_RECORD_BYTES = 3073   # 1 label byte + 3 planes (R, G, B) of 32 x 32 bytes
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
TRAIN_FILE = re.compile(r"data_batch_(\d+)\.bin")
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
    elif head == GZIP_MAGIC:
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
    check_labels(labels, num_classes, path, "cifar10")
    images = np.ascontiguousarray(records[:, 1:]).reshape(-1, 3, 32, 32)
    return images, labels.astype(np.int64)


def cifar_directory(data_dir: Path) -> Path:
    """The folder holding the ``.bin`` files, or a refusal if only the python version is there."""
    home = data_dir / "cifar-10"
    candidates = (home, home / "cifar-10-batches-bin", data_dir / "cifar-10-batches-bin")
    for directory in candidates:
        if directory.is_dir() and ((directory / "test_batch.bin").is_file()
                                   or any(TRAIN_FILE.fullmatch(p.name)
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
        raise not_found("cifar10", home, "extracted .bin files (the archive "
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


def load_cifar10(split: str, data_dir: Path):
    """``(images, labels, classes, mean, std, files)`` of one CIFAR-10 split."""
    directory = cifar_directory(data_dir)
    if split == "train":
        paths = sorted((p for p in directory.glob("data_batch_*.bin")
                        if TRAIN_FILE.fullmatch(p.name)),
                       key=lambda p: int(TRAIN_FILE.fullmatch(p.name).group(1)))
        if not paths:
            raise not_found("cifar10", directory, "training files data_batch_*.bin")
    else:
        paths = [directory / "test_batch.bin"]
        if not paths[0].is_file():
            raise not_found("cifar10", directory, "test file test_batch.bin")
    parts = [read_cifar10_bin(p) for p in paths]
    images = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
    labels = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
    return images, labels, _cifar_classes(directory), CIFAR10_MEAN, CIFAR10_STD, paths


def cifar_file_records(path: Path, verify: bool = False) -> int:
    """Records in one CIFAR-10 batch file, from its size; ``verify`` reads it whole."""
    if verify:
        return len(read_cifar10_bin(path)[1])
    size = Path(path).stat().st_size
    if size == 0 or size % CIFAR10_RECORD_BYTES:
        raise DatasetFormatError(f"{path}: {size} bytes is not a whole, non-zero number of "
                                 f"{CIFAR10_RECORD_BYTES}-byte CIFAR-10 records")
    return size // CIFAR10_RECORD_BYTES
