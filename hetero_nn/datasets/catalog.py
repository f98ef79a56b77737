"""The catalogue: load a split by name, and say which datasets are in the data directory.

This is the one place that maps a dataset name to its reader (:mod:`.idx`,
:mod:`.cifar`, :mod:`.synthetic`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError, DatasetFormatError
from . import cifar, idx
from .dataset import Dataset
from .layout import DATASETS, canonical_name, check_split, resolve_data_dir
from .downloads import SOURCES, md5sum
from .synthetic import EAGER_BYTES, load_synthetic


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
    name = canonical_name(name)
    split = check_split(split)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ConfigError(f"limit={limit!r}: expected a positive integer or None")
        limit = int(limit)
    if name == "synthetic":
        generator, labels, classes, shape = load_synthetic(split, synthetic_options)
        labels = labels[:limit]
        channels = shape[0]
        dataset = Dataset(name, split, labels, classes, (0.0,) * channels, (1.0,) * channels,
                          input_shape=shape, generate=generator)
        if len(labels) * math.prod(shape) * 4 <= EAGER_BYTES:
            dataset.images  # generate now: small enough, and batches become plain slicing
        return dataset
    if synthetic_options:
        raise ConfigError(f"options {', '.join(sorted(synthetic_options))} apply to the "
                          f"synthetic dataset only, not {name}")
    data_dir = resolve_data_dir(data_dir)
    loader = cifar.load_cifar10 if name == "cifar10" else (lambda s, d: idx.load_idx(name, s, d))
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
    present: bool            # both splits there, and every file passed the checks
    files: list              # file names found, relative to the data directory
    samples: dict | None     # {"train": n, "test": n}, None when absent or generated
    problem: str | None = None  # why a dataset with files there is not present (one line)


def _check_file(name: str, path: Path, verify: bool) -> int:
    """Samples in one file, after its size check (and its checksum or full read with ``verify``)."""
    published = SOURCES.get(name, {}).get("files", {}).get(path.name)
    if verify and published is not None and md5sum(path) != published:
        raise DatasetFormatError(f"{path}: MD5 checksum differs from the published {published}; "
                                 f"download it again")
    if name == "cifar10":
        return cifar.cifar_file_records(path, verify=verify)
    return idx.idx_file_count(path, verify=verify)


def _split_files(name: str, data_dir: Path) -> dict[str, list[Path | str]]:
    """Per split, the files that should be there: a path when found, else the missing name."""
    if name == "cifar10":
        directory = cifar.cifar_directory(data_dir)
        train = sorted((p for p in directory.glob("data_batch_*.bin")
                        if cifar.TRAIN_FILE.fullmatch(p.name) and p.is_file()),
                       key=lambda p: int(cifar.TRAIN_FILE.fullmatch(p.name).group(1)))
        test = directory / "test_batch.bin"
        return {"train": train or ["data_batch_*.bin"],
                "test": [test if test.is_file() else test.name]}
    directory = data_dir / idx.IDX_SPECS[name]["directory"]
    return {split: [idx.find_idx(directory, stem) or f"{stem}.gz" for stem in stems]
            for split, stems in idx.IDX_FILES.items()}


def describe(data_dir=None, verify: bool = False) -> list[DatasetInfo]:
    """One :class:`DatasetInfo` per dataset name: is it there, which files, how many samples.

    Cheap by default: reads the IDX headers and checks every file's size against what
    its header (or the CIFAR-10 record size) implies, so a truncated file is damaged,
    not present. ``verify`` also compares the files that have a published MD5 with it
    and reads every file whole (labels in range, gzip CRCs). Never raises for a
    missing or damaged dataset: ``problem`` says what is wrong.
    """
    data_dir = resolve_data_dir(data_dir)
    rows = []
    for name in DATASETS:
        if name == "synthetic":
            rows.append(DatasetInfo(name, True, [], None))
            continue
        files, samples = [], {}
        try:
            expected = _split_files(name, data_dir)
            found = [p for paths in expected.values() for p in paths if isinstance(p, Path)]
            files = [str(p.relative_to(data_dir)) for p in found]
            if not found:
                rows.append(DatasetInfo(name, False, [], None))
                continue
            for split, paths in expected.items():
                missing = [p for p in paths if not isinstance(p, Path)]
                if missing:
                    raise DatasetFormatError(f"{split} file {missing[0]} missing")
                counts = [_check_file(name, p, verify) for p in paths]
                if name != "cifar10" and counts[0] != counts[1]:
                    raise DatasetFormatError(f"{paths[0].name} holds {counts[0]} images but "
                                             f"{paths[1].name} {counts[1]} labels")
                samples[split] = sum(counts) if name == "cifar10" else counts[0]
            rows.append(DatasetInfo(name, True, files, samples))
        except (DatasetFormatError, OSError) as exc:
            rows.append(DatasetInfo(name, False, files, None, " ".join(str(exc).split())))
    return rows
