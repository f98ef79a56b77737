"""IDX files (MNIST, Fashion-MNIST): a strict reader and the loader of one split.

IDX files may be gzipped or not, whatever their name says (the content decides).
Every defect (bad magic number, truncated header or data, a body longer than the
header declares, labels out of range, image and label counts that differ, missing
files) raises :class:`~hetero_nn.errors.DatasetFormatError` naming the file and
what was expected.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from ..errors import DatasetFormatError
from .layout import check_labels, not_found

IDX_IMAGES_MAGIC = 2051   # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049   # 0x00000801: unsigned bytes, 1 dimension

IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

IDX_SPECS = {
    "mnist": dict(directory="mnist", classes=tuple(str(d) for d in range(10)),
                  mean=(0.1307,), std=(0.3081,)),
    "fashion-mnist": dict(directory="fashion-mnist",
                          classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
                          mean=(0.2860,), std=(0.3530,)),
}

GZIP_MAGIC = b"\x1f\x8b"


def _read_maybe_gzip(path: Path) -> bytes:
    """The bytes of ``path``, decompressed when its content (not its name) is gzip."""
    raw = path.read_bytes()
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except EOFError:
        raise _truncated_gzip(path, "a complete gzip-compressed IDX file") from None
    except (OSError, zlib.error) as exc:
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


def find_idx(directory: Path, stem: str) -> Path | None:
    """The IDX file ``stem`` in ``directory``: ``stem.gz`` or ``stem``, whichever is there."""
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def load_idx(name: str, split: str, data_dir: Path):
    """``(images, labels, classes, mean, std, files)`` of one split of an IDX dataset."""
    spec = IDX_SPECS[name]
    directory = data_dir / spec["directory"]
    image_stem, label_stem = IDX_FILES[split]
    image_path = find_idx(directory, image_stem)
    label_path = find_idx(directory, label_stem)
    for path, stem in ((image_path, image_stem), (label_path, label_stem)):
        if path is None:
            raise not_found(name, directory, f"{split} file {stem}.gz (or {stem})")
    images = read_idx(image_path, IDX_IMAGES_MAGIC)
    labels = read_idx(label_path, IDX_LABELS_MAGIC)
    if len(images) != len(labels):
        raise DatasetFormatError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} "
            f"labels; expected the same count in both files of the {split} split")
    check_labels(labels, len(spec["classes"]), label_path, name)
    n, height, width = images.shape
    return (images.reshape(n, 1, height, width), labels.astype(np.int64), spec["classes"],
            spec["mean"], spec["std"], [image_path, label_path])


def idx_file_count(path: Path, verify: bool = False) -> int:
    """The first dimension of an IDX file, after checking its size against its header.

    Reads only the header and, for a gzipped file, the trailer's uncompressed size
    (ISIZE, modulo 2**32), so a truncated file is caught without decompressing it;
    ``verify`` reads the whole file (:func:`read_idx`, gzip CRC included).
    """
    if verify:
        return len(read_idx(path))
    with open(path, "rb") as f:
        compressed = f.read(2) == GZIP_MAGIC
        if compressed:
            f.seek(-4, 2)
            stored_size = struct.unpack("<I", f.read(4))[0]
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as f:
            header = f.read(4)
            ndim = header[3] if len(header) == 4 else 0
            header += f.read(4 * ndim)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetFormatError(f"{path}: corrupt gzip stream ({exc})") from exc
    if len(header) < 8 or header[:3] != b"\x00\x00\x08" or len(header) < 4 + 4 * ndim:
        raise DatasetFormatError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", header[4:])
    size = len(header) + math.prod(dims)
    actual = stored_size if compressed else Path(path).stat().st_size
    if actual != (size % 2**32 if compressed else size):
        declared = f"{size} bytes for the {' x '.join(map(str, dims))} its header declares"
        if compressed:  # the trailer is only a size when the stream is whole: read it to know
            actual = _gzip_size(path)
            if actual is None:
                raise _truncated_gzip(path, declared)
        raise DatasetFormatError(
            f"{path}: {'uncompressed ' if compressed else ''}size {actual} bytes, expected "
            f"{declared} (truncated or damaged)")
    return dims[0]


def _truncated_gzip(path, expected: str) -> DatasetFormatError:
    return DatasetFormatError(f"{path}: truncated gzip file: the compressed stream ends before "
                              f"its end marker; expected {expected}. Download it again.")


def _gzip_size(path) -> int | None:
    """The uncompressed size of a gzip file, read through; ``None`` when the stream is cut
    short. Only for a file already known to be damaged: it reads the whole file."""
    size = 0
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                size += len(chunk)
    except EOFError:
        return None
    except (OSError, zlib.error) as exc:
        raise DatasetFormatError(f"{path}: corrupt gzip stream ({exc})") from exc
    return size
