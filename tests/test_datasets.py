"""Dataset loaders, format errors, synthetic data and downloads (hetero_nn.datasets).

The real files come from the shared folder (MNIST and Fashion-MNIST as published, a
CIFAR-10 subset); their expected counts are those of the folder's README. Corrupt
files are written small in ``tmp_path``; downloads use ``file://`` mirrors, never the
network.
"""

import gzip
import hashlib
import io
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn import datasets
from hetero_nn.datasets import (Dataset, DatasetNotFoundError, DownloadError, describe,
                                download, load, resolve_data_dir)
from hetero_nn.errors import ConfigError, DatasetFormatError

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(),
    reason=f"the shared datasets folder {SHARED} (real MNIST, Fashion-MNIST and the "
           f"CIFAR-10 subset) is not on this machine")

NEEDS_TORCH = "PyTorch is optional; the cross-checks against it need it"
CIFAR_TRAIN_COUNTS = [396, 366, 420, 384, 422, 393, 414, 385, 407, 413]
CIFAR_TEST_COUNTS = [103, 89, 100, 103, 90, 86, 112, 102, 106, 109]


@pytest.fixture(scope="module")
def real():
    """Every real split, loaded once for the module."""
    if not SHARED.is_dir():
        pytest.skip(f"the shared datasets folder {SHARED} is not on this machine")
    return {(name, split): load(name, split, data_dir=SHARED)
            for name in ("mnist", "fashion-mnist", "cifar10") for split in ("train", "test")}


# --------------------------------------------------------------------------- real files

@needs_shared
@pytest.mark.parametrize("name, split, count, shape", [
    ("mnist", "train", 60000, (1, 28, 28)), ("mnist", "test", 10000, (1, 28, 28)),
    ("fashion-mnist", "train", 60000, (1, 28, 28)),
    ("fashion-mnist", "test", 10000, (1, 28, 28)),
    ("cifar10", "train", 4000, (3, 32, 32)), ("cifar10", "test", 1000, (3, 32, 32)),
])
def test_real_counts_shapes_dtypes(real, name, split, count, shape):
    ds = real[name, split]
    assert len(ds) == count and ds.images.shape == (count,) + shape
    assert ds.images.dtype == np.uint8 and ds.labels.dtype == np.int64
    assert ds.labels.shape == (count,) and ds.input_shape == shape
    assert ds.num_classes == 10 and len(ds.classes) == 10
    assert ds.labels.min() >= 0 and ds.labels.max() <= 9
    assert (ds.name, ds.split) == (name, split)
    assert 0 < ds.images.mean() < 255 and ds.images.max() == 255


@needs_shared
def test_real_class_balance(real):
    assert np.bincount(real["fashion-mnist", "train"].labels).tolist() == [6000] * 10
    assert np.bincount(real["fashion-mnist", "test"].labels).tolist() == [1000] * 10
    assert np.bincount(real["cifar10", "train"].labels).tolist() == CIFAR_TRAIN_COUNTS
    assert np.bincount(real["cifar10", "test"].labels).tolist() == CIFAR_TEST_COUNTS
    # MNIST's well-known first labels pin the record order.
    assert real["mnist", "train"].labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert real["mnist", "test"].labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]


@needs_shared
def test_real_class_names(real):
    assert real["cifar10", "train"].classes == [
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
        "truck"]
    assert real["fashion-mnist", "test"].classes[0] == "T-shirt/top"
    assert real["fashion-mnist", "test"].classes[9] == "Ankle boot"
    assert real["mnist", "train"].classes == [str(d) for d in range(10)]


@needs_shared
def test_cifar_planes_match_raw_records(real):
    """Decode records by hand (label byte, then R, G, B planes, row-major) and compare."""
    ds = real["cifar10", "test"]
    raw = (SHARED / "cifar-10" / "test_batch.bin").read_bytes()
    for i in np.random.default_rng(1).integers(0, len(ds), 5):
        record = raw[i * 3073:(i + 1) * 3073]
        assert ds.labels[i] == record[0]
        for c in range(3):
            plane = record[1 + 1024 * c: 1 + 1024 * (c + 1)]
            for row, col in [(0, 0), (0, 31), (17, 5), (31, 31)]:
                assert ds.images[i, c, row, col] == plane[32 * row + col]


@needs_shared
@pytest.mark.parametrize("name, tol", [("mnist", 0.005), ("fashion-mnist", 0.005),
                                       ("cifar10", 0.03)])
def test_normalised_train_set_has_zero_mean_unit_std(real, name, tol):
    """The published mean/std are train-set statistics (CIFAR: of the full 50,000)."""
    ds = real[name, "train"]
    total = total_sq = 0.0
    for x, _ in ds.batches(8192, shuffle=False, dtype="float64"):
        total = total + x.sum(axis=(0, 2, 3))
        total_sq = total_sq + (x ** 2).sum(axis=(0, 2, 3))
    n = len(ds) * ds.input_shape[1] * ds.input_shape[2]
    mean = total / n
    std = np.sqrt(total_sq / n - mean ** 2)
    np.testing.assert_allclose(mean, 0.0, atol=tol)
    np.testing.assert_allclose(std, 1.0, atol=tol)


@needs_shared
@pytest.mark.parametrize("name", ["mnist", "cifar10"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_matches_torch_normalisation(real, name, dtype):
    """x = (pixel / 255 - mean) / std, as torchvision's ToTensor + Normalize compute it."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    torch_dtype = getattr(torch, dtype)
    ds = real[name, "train"]
    idx = np.random.default_rng(7).integers(0, len(ds), 37)
    x, y = ds.batch(idx, dtype=dtype)
    assert x.dtype == np.dtype(dtype) and x.flags.c_contiguous
    assert x.shape == (37,) + ds.input_shape
    t = torch.from_numpy(ds.images[idx].copy()).to(torch_dtype) / 255
    mean = torch.tensor(ds.mean, dtype=torch_dtype).view(1, -1, 1, 1)
    std = torch.tensor(ds.std, dtype=torch_dtype).view(1, -1, 1, 1)
    np.testing.assert_allclose(x, ((t - mean) / std).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, ds.labels[idx])
    assert y.dtype == np.int64


@needs_shared
def test_normalisation_constants(real):
    assert real["mnist", "train"].mean == (0.1307,) and real["mnist", "train"].std == (0.3081,)
    assert real["fashion-mnist", "test"].mean == (0.2860,)
    assert real["fashion-mnist", "test"].std == (0.3530,)
    assert real["cifar10", "test"].mean == (0.4914, 0.4822, 0.4465)
    assert real["cifar10", "test"].std == (0.2470, 0.2435, 0.2616)


@needs_shared
def test_limit_keeps_the_first_samples(real):
    ds = load("cifar10", "train", data_dir=SHARED, limit=100)
    assert len(ds) == 100
    np.testing.assert_array_equal(ds.images, real["cifar10", "train"].images[:100])
    np.testing.assert_array_equal(ds.labels, real["cifar10", "train"].labels[:100])
    assert len(load("cifar10", "test", data_dir=SHARED, limit=10**6)) == 1000


@needs_shared
def test_describe_shared_folder():
    rows = {row.name: row for row in describe(SHARED)}
    assert list(rows) == ["mnist", "fashion-mnist", "cifar10", "synthetic"]
    assert rows["mnist"].present and rows["mnist"].samples == {"train": 60000, "test": 10000}
    assert rows["fashion-mnist"].samples == {"train": 60000, "test": 10000}
    assert rows["cifar10"].samples == {"train": 4000, "test": 1000}
    assert "cifar-10/data_batch_1.bin" in rows["cifar10"].files
    assert "mnist/t10k-labels-idx1-ubyte.gz" in rows["mnist"].files


# ------------------------------------------------------------------ order and batching

def _tiny_dataset(n=23):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (n, 2, 3, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, n).astype(np.int64)
    return Dataset("tiny", "train", labels, ["a", "b", "c", "d"], (0.5, 0.25), (0.2, 0.4),
                   images=images)


def test_epoch_order_is_reproducible_and_changes_per_epoch():
    ds = _tiny_dataset()
    first = ds.epoch_order(seed=5, epoch=2)
    np.testing.assert_array_equal(first, ds.epoch_order(seed=5, epoch=2))
    np.testing.assert_array_equal(first, np.random.default_rng([5, 2]).permutation(len(ds)))
    assert sorted(first.tolist()) == list(range(len(ds)))
    assert not np.array_equal(first, ds.epoch_order(seed=5, epoch=3))
    assert not np.array_equal(first, ds.epoch_order(seed=6, epoch=2))


def test_batches_follow_the_epoch_order():
    ds = _tiny_dataset()
    got = list(ds.batches(5, seed=1, epoch=4))
    assert [len(y) for _, y in got] == [5, 5, 5, 5, 3] and ds.num_batches(5) == 5
    order = ds.epoch_order(1, 4)
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), ds.labels[order])
    x_all = np.concatenate([x for x, _ in got])
    np.testing.assert_array_equal(x_all, ds.batch(order)[0])
    again = list(ds.batches(5, seed=1, epoch=4))
    for (x1, y1), (x2, y2) in zip(got, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    dropped = list(ds.batches(5, seed=1, epoch=4, drop_last=True))
    assert [len(y) for _, y in dropped] == [5, 5, 5, 5] and ds.num_batches(5, True) == 4
    plain = np.concatenate([y for _, y in ds.batches(4, shuffle=False)])
    np.testing.assert_array_equal(plain, ds.labels)


def test_batch_normalises_per_channel():
    ds = _tiny_dataset()
    x, _ = ds.batch([3, 0, 3], dtype="float64")
    expected = (ds.images[[3, 0, 3]] / 255.0 - np.array([0.5, 0.25])[None, :, None, None]) \
        / np.array([0.2, 0.4])[None, :, None, None]
    np.testing.assert_allclose(x, expected, rtol=1e-15)
    with pytest.raises(ConfigError, match="floating"):
        ds.batch([0], dtype="int32")
    with pytest.raises(ConfigError, match="batch_size"):
        next(ds.batches(0))


def test_resolve_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("HETERO_NN_DATA", raising=False)
    monkeypatch.delenv("HETERO_NN_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir() == tmp_path / "home" / ".cache" / "hetero_nn" / "data"
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path / "cache"))
    assert resolve_data_dir() == tmp_path / "cache" / "data"
    monkeypatch.setenv("HETERO_NN_DATA", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"


def test_unknown_names_and_options():
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'"):
        load("imagenet")
    with pytest.raises(ConfigError, match="split"):
        load("synthetic", split="valid")
    with pytest.raises(ConfigError, match="colour"):
        load("synthetic", colour=3)
    with pytest.raises(ConfigError, match="synthetic"):
        load("mnist", image_size=32)
    with pytest.raises(ConfigError, match="limit"):
        load("synthetic", limit=0)
    with pytest.raises(ConfigError, match="image_size"):
        load("synthetic", image_size=(4, 4, 4))
    with pytest.raises(ConfigError, match="num_classes"):
        load("synthetic", num_classes=1)


# ---------------------------------------------------------------- IDX format errors

def _idx(array, magic, byteorder=">"):
    header = struct.pack(f"{byteorder}I", magic)
    header += struct.pack(f"{byteorder}{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _write(directory, stem, payload, gz):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (stem + ".gz" if gz else stem)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def _write_idx_dataset(root, gz, n=6, name="mnist"):
    """A valid tiny dataset (both splits) in ``root/<name>/``; returns the arrays and paths."""
    rng = np.random.default_rng(n)
    images = rng.integers(0, 256, (n, 5, 4), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    paths = {}
    for split, (image_stem, label_stem) in datasets.idx.IDX_FILES.items():
        paths[split] = (_write(root / name, image_stem, _idx(images, 2051), gz),
                        _write(root / name, label_stem, _idx(labels, 2049), gz))
    return images, labels, paths


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_tiny_idx_dataset_loads(tmp_path, gz):
    images, labels, _ = _write_idx_dataset(tmp_path, gz)
    for split in ("train", "test"):
        ds = load("mnist", split, data_dir=tmp_path)
        np.testing.assert_array_equal(ds.images, images[:, None])
        np.testing.assert_array_equal(ds.labels, labels)


def test_idx_content_decides_compression(tmp_path):
    """A ``.gz`` name on an already decompressed file (browsers do this) still reads."""
    images, labels, paths = _write_idx_dataset(tmp_path, gz=True)
    image_path, _ = paths["train"]
    image_path.write_bytes(gzip.decompress(image_path.read_bytes()))
    np.testing.assert_array_equal(load("mnist", data_dir=tmp_path).images, images[:, None])


def _corrupt_cases(images, labels):
    """(name, which file, images payload, labels payload, fragments the message must hold)."""
    bad_labels = labels.copy()
    bad_labels[2] = 10
    good_images, good_labels = _idx(images, 2051), _idx(labels, 2049)
    return [
        ("bad_image_magic", 0, _idx(images, 2049), good_labels,
         ["bad magic number 2049", "expected 2051"]),
        ("bad_label_magic", 1, good_images, _idx(labels, 2051),
         ["bad magic number 2051", "expected 2049"]),
        ("little_endian", 0, _idx(images, 2051, "<"), good_labels,
         ["bad magic number", "little-endian"]),
        ("truncated_images", 0, good_images[:-7], good_labels,
         ["truncated data", "6 x 5 x 4 = 120 bytes", "holds 113"]),
        ("truncated_header", 0, good_images[:10], good_labels, ["truncated header"]),
        ("trailing_bytes", 1, good_images, good_labels + b"\0\0\0",
         ["3 bytes more than the header declares"]),
        ("label_out_of_range", 1, good_images, _idx(bad_labels, 2049),
         ["label 10 at index 2", "expected labels 0..9"]),
        ("count_mismatch", 0, good_images, _idx(labels[:-1], 2049),
         ["6 images", "5 labels", "train-labels-idx1-ubyte"]),
    ]


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
@pytest.mark.parametrize("case", ["bad_image_magic", "bad_label_magic", "little_endian",
                                  "truncated_images", "truncated_header", "trailing_bytes",
                                  "label_out_of_range", "count_mismatch"])
def test_idx_corruption_names_file_and_expectation(tmp_path, gz, case):
    images, labels, paths = _write_idx_dataset(tmp_path, gz)
    _, which, image_payload, label_payload, fragments = next(
        c for c in _corrupt_cases(images, labels) if c[0] == case)
    image_path, label_path = paths["train"]
    for path, payload in ((image_path, image_payload), (label_path, label_payload)):
        path.write_bytes(gzip.compress(payload) if gz else payload)
    with pytest.raises(DatasetFormatError) as info:
        load("mnist", "train", data_dir=tmp_path)
    message = str(info.value)
    assert str((image_path, label_path)[which]) in message
    for fragment in fragments:
        assert fragment in message
    assert len(load("mnist", "test", data_dir=tmp_path)) == 6   # the other split is intact


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(0, 7), st.integers(1, 6), st.integers(1, 6)),
       gz=st.booleans(), cut=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_read_idx_round_trip_and_any_truncation(tmp_path_factory, shape, gz, cut, seed):
    """Random IDX images read back exactly; any cut shorter than the file is refused."""
    directory = tmp_path_factory.mktemp("idx")
    array = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    payload = _idx(array, 2051)
    path = _write(directory, "images", payload, gz)
    np.testing.assert_array_equal(datasets.read_idx(path, 2051), array)
    cut = min(cut, len(payload))
    path = _write(directory, "cut", payload[:-cut], gz)
    with pytest.raises(DatasetFormatError, match="truncated") as info:
        datasets.read_idx(path, 2051)
    assert str(path) in str(info.value)


def test_truncated_gzip_stream(tmp_path):
    _, _, paths = _write_idx_dataset(tmp_path, gz=True, n=400)
    image_path, _ = paths["train"]
    image_path.write_bytes(image_path.read_bytes()[:-100])
    with pytest.raises(DatasetFormatError, match="truncated gzip file") as info:
        load("mnist", data_dir=tmp_path)
    assert str(image_path) in str(info.value)
    # the cheap check (trailer against header) cannot trust a cut file's last 4 bytes:
    # it says the stream is cut, with no "uncompressed size" read from garbage
    (row,) = [r for r in describe(tmp_path) if r.name == "mnist"]
    assert str(image_path) in row.problem and "truncated gzip file" in row.problem
    assert "uncompressed size" not in row.problem and "8016 bytes for the 400 x 5 x 4" in row.problem


def test_missing_files_say_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load("fashion-mnist", "test", data_dir=tmp_path)
    message = str(info.value)
    assert isinstance(info.value, DatasetFormatError)
    assert isinstance(info.value, FileNotFoundError)
    for fragment in (str(tmp_path / "fashion-mnist"), "t10k-images-idx3-ubyte", "--data-dir",
                     "HETERO_NN_DATA", "hetero-nn datasets download fashion-mnist"):
        assert fragment in message
    _write_idx_dataset(tmp_path, gz=False)
    (tmp_path / "mnist" / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetNotFoundError, match="train-labels-idx1-ubyte"):
        load("mnist", data_dir=tmp_path)
    with pytest.raises(DatasetNotFoundError, match="cifar10"):
        load("cifar10", data_dir=tmp_path)


def test_data_dir_from_environment(tmp_path, monkeypatch):
    images, _, _ = _write_idx_dataset(tmp_path, gz=True, name="fashion-mnist")
    monkeypatch.setenv("HETERO_NN_DATA", str(tmp_path))
    np.testing.assert_array_equal(load("fashion_mnist", "test").images[:, 0], images)


# -------------------------------------------------------------- CIFAR-10 format errors

def _cifar_records(n, seed=0, labels=None):
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, n) if labels is None else labels
    return records


def test_cifar_any_number_of_records_and_batches(tmp_path):
    home = tmp_path / "cifar-10"
    home.mkdir()
    parts = {k: _cifar_records(n, seed=k) for k, n in ((1, 7), (3, 2), (10, 4))}
    for k, records in parts.items():
        (home / f"data_batch_{k}.bin").write_bytes(records.tobytes())
    (home / "test_batch.bin").write_bytes(_cifar_records(5, seed=99).tobytes())
    train = load("cifar10", data_dir=tmp_path)
    expected = np.concatenate([parts[1], parts[3], parts[10]])   # numeric, not text, order
    assert len(train) == 13 and [p.name for p in train.files] == [
        "data_batch_1.bin", "data_batch_3.bin", "data_batch_10.bin"]
    np.testing.assert_array_equal(train.labels, expected[:, 0])
    np.testing.assert_array_equal(train.images.reshape(13, -1), expected[:, 1:])
    assert train.classes[0] == "airplane"   # no batches.meta.txt: the standard names
    assert len(load("cifar10", "test", data_dir=tmp_path)) == 5


def test_cifar_in_extracted_archive_folder(tmp_path):
    inner = tmp_path / "cifar-10" / "cifar-10-batches-bin"
    inner.mkdir(parents=True)
    (inner / "test_batch.bin").write_bytes(_cifar_records(3).tobytes())
    assert len(load("cifar10", "test", data_dir=tmp_path)) == 3


@pytest.mark.parametrize("case, payload, fragments", [
    ("not_a_multiple", _cifar_records(2).tobytes()[:-5],
     ["6141 bytes", "multiple of 3073", "1 records and 3068 extra bytes"]),
    ("empty", b"", ["0 bytes", "multiple of 3073"]),
    ("label_out_of_range", _cifar_records(4, labels=[1, 2, 11, 3]).tobytes(),
     ["label 11 at index 2", "0..9"]),
], ids=["not_a_multiple", "empty", "label_out_of_range"])
def test_cifar_corruption_names_file_and_expectation(tmp_path, case, payload, fragments):
    home = tmp_path / "cifar-10"
    home.mkdir()
    (home / "data_batch_1.bin").write_bytes(_cifar_records(3).tobytes())
    bad = home / "data_batch_2.bin"
    bad.write_bytes(payload)
    with pytest.raises(DatasetFormatError) as info:
        load("cifar10", data_dir=tmp_path)
    assert str(bad) in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_cifar_meta_with_wrong_class_count(tmp_path):
    home = tmp_path / "cifar-10"
    home.mkdir()
    (home / "test_batch.bin").write_bytes(_cifar_records(3).tobytes())
    (home / "batches.meta.txt").write_text("cat\ndog\n")
    with pytest.raises(DatasetFormatError, match="batches.meta.txt: 2 class names; expected 10"):
        load("cifar10", "test", data_dir=tmp_path)


def test_cifar_missing_split(tmp_path):
    home = tmp_path / "cifar-10"
    home.mkdir()
    (home / "test_batch.bin").write_bytes(_cifar_records(3).tobytes())
    with pytest.raises(DatasetNotFoundError, match=r"data_batch_\*\.bin"):
        load("cifar10", "train", data_dir=tmp_path)


class _TouchOnUnpickle:
    """Unpickling this creates ``path``: proof that a loader unpickled something."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


@pytest.mark.parametrize("layout", ["cifar-10/data_batch_1", "cifar-10-batches-py/data_batch_1",
                                    "cifar-10/cifar-10-batches-py/test_batch",
                                    "cifar-10/data_batch_1.bin"])
def test_cifar_python_version_is_refused_never_unpickled(tmp_path, layout):
    sentinel = tmp_path / "unpickled"
    target = tmp_path / "data" / layout
    target.parent.mkdir(parents=True)
    target.write_bytes(pickle.dumps({b"data": _TouchOnUnpickle(sentinel)}, protocol=2))
    assert pickle.loads(target.read_bytes()) and sentinel.exists()   # the payload works...
    sentinel.unlink()
    renamed = layout.endswith(".bin")        # a pickle renamed to .bin: only train reads it
    for split in ("train",) if renamed else ("train", "test"):
        with pytest.raises(DatasetFormatError) as info:
            load("cifar10", split, data_dir=tmp_path / "data")
        message = str(info.value)
        assert ("pickle" if renamed else "python version") in message
        assert "binary version" in message and "cifar-10-binary.tar.gz" in message
    assert not sentinel.exists()                                      # ...and was never run


# ------------------------------------------------------------------------- synthetic

def test_synthetic_is_deterministic_and_seeded():
    a = load("synthetic", image_size=9, num_samples=40, seed=4)
    b = load("synthetic", image_size=9, num_samples=40, seed=4)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    c = load("synthetic", image_size=9, num_samples=40, seed=5)
    assert not np.array_equal(a.images, c.images)
    assert a.images.dtype == np.float32 and a.images.shape == (40, 1, 9, 9)
    assert a.labels.dtype == np.int64 and np.bincount(a.labels).tolist() == [4] * 10


def test_synthetic_splits_differ_and_prefixes_are_stable():
    train = load("synthetic", image_size=(6, 10), channels=2, num_samples=30)
    test = load("synthetic", "test", image_size=(6, 10), channels=2, num_samples=30)
    assert train.input_shape == (2, 6, 10)
    assert not np.array_equal(train.images, test.images)
    longer = load("synthetic", image_size=(6, 10), channels=2, num_samples=70)
    limited = load("synthetic", image_size=(6, 10), channels=2, num_samples=70, limit=30)
    for other in (longer, limited):
        np.testing.assert_array_equal(other.images[:30], train.images)
        np.testing.assert_array_equal(other.labels[:30], train.labels)


def _nearest_centroid_accuracy(train, test):
    x, y = train.batch(np.arange(len(train)))
    centroids = np.stack([x[y == k].mean(axis=0).ravel() for k in range(train.num_classes)])
    xt, yt = test.batch(np.arange(len(test)))
    distance = ((xt.reshape(len(xt), 1, -1) - centroids[None]) ** 2).sum(axis=2)
    return (distance.argmin(axis=1) == yt).mean()


def test_synthetic_is_learnable_with_templates_shared_across_splits():
    """Centroids learned on train classify test far above chance: the classes share templates."""
    options = dict(image_size=12, channels=3, num_classes=10, noise=3.0, seed=2)
    train = load("synthetic", num_samples=300, **options)
    test = load("synthetic", "test", num_samples=200, **options)
    assert _nearest_centroid_accuracy(train, test) > 0.8         # chance: 0.1
    other_seed = load("synthetic", "test", num_samples=200, **{**options, "seed": 3})
    assert _nearest_centroid_accuracy(train, other_seed) < 0.35  # other templates


def test_synthetic_softmax_regression_beats_chance():
    """A model that never sees the templates learns them from samples (torch, 60 steps)."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    options = dict(image_size=10, channels=1, num_classes=5, noise=2.0, seed=7)
    x, y = load("synthetic", num_samples=400, **options).batch(np.arange(400))
    xt, yt = load("synthetic", "test", num_samples=200, **options).batch(np.arange(200))
    torch.manual_seed(0)
    model = torch.nn.Linear(100, 5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, targets = torch.from_numpy(x.reshape(400, -1)), torch.from_numpy(y)
    for _ in range(60):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    predicted = model(torch.from_numpy(xt.reshape(200, -1))).argmax(dim=1).numpy()
    assert (predicted == yt).mean() > 0.6                         # chance: 0.2


def test_synthetic_samples_follow_their_definition():
    """Sample i = (a * template + noise * n) / sqrt(13/12 + noise^2), values ~ N(0, 1)."""
    ds = load("synthetic", image_size=16, channels=2, num_samples=8, noise=0.5, seed=1)
    generator = ds._generate
    for k in range(10):
        template = generator.template(k)
        np.testing.assert_allclose(template.mean(axis=(1, 2)), 0.0, atol=1e-12)
        np.testing.assert_allclose(template.std(axis=(1, 2)), 1.0, rtol=1e-12)
    i = 5
    rng = np.random.default_rng([1, datasets.synthetic._TAG_SAMPLE, 0, i])
    amplitude = rng.uniform(0.5, 1.5)
    noise = rng.standard_normal((2, 16, 16), dtype=np.float32)
    expected = (amplitude * generator.template(ds.labels[i]) + 0.5 * noise) \
        / np.sqrt(13 / 12 + 0.25)
    np.testing.assert_allclose(ds.images[i], expected, rtol=1e-5, atol=1e-5)
    x, _ = ds.batch([i])
    np.testing.assert_array_equal(x[0], ds.images[i])   # identity normalisation
    assert ds.mean == (0.0, 0.0) and ds.std == (1.0, 1.0)


def test_synthetic_large_images_are_generated_per_batch():
    """512 x 512 x 3: nothing generated at load, a batch costs its own samples only."""
    big = load("synthetic", image_size=512, channels=3, num_samples=100_000, seed=3)
    assert big._images is None and big.input_shape == (3, 512, 512)
    x, y = big.batch([99_999, 7])
    assert x.shape == (2, 3, 512, 512) and x.dtype == np.float32
    assert abs(float(x.mean())) < 0.1 and 0.8 < float(x.std()) < 1.25
    small = load("synthetic", image_size=512, channels=3, num_samples=8, seed=3)
    assert small._images is not None                         # 25 MiB: generated at load
    np.testing.assert_array_equal(x[1], small.images[7])      # same sample either way
    assert y[1] == small.labels[7]
    with pytest.raises(ConfigError, match="batch"):
        big.images                                            # 300 GiB: refused


def test_synthetic_tiny_images():
    ds = load("synthetic", image_size=1, num_classes=3, num_samples=30, noise=0.0)
    assert ds.images.shape == (30, 1, 1, 1) and np.isfinite(ds.images).all()
    levels = {k: ds.images[ds.labels == k] for k in range(3)}
    assert all(np.all(np.sign(v) == np.sign(v[0])) for v in levels.values())


# -------------------------------------------------------------------------- download

def _mirror(directory):
    return directory.as_uri() + "/"


@needs_shared
def test_download_verifies_and_skips_verified_files(tmp_path):
    target = download("mnist", tmp_path, mirrors=[_mirror(tmp_path / "absent"),
                                                  _mirror(SHARED / "mnist")])
    assert target == tmp_path / "mnist"
    assert sorted(p.name for p in target.iterdir()) == sorted(datasets.SOURCES["mnist"]["files"])
    assert len(load("mnist", "test", data_dir=tmp_path)) == 10000
    # Present and verified: nothing fetched, so an unreachable mirror is fine.
    download("mnist", tmp_path, mirrors=[_mirror(tmp_path / "absent")])
    # A damaged file fails its MD5 and is fetched again.
    (target / "t10k-labels-idx1-ubyte.gz").write_bytes(b"damaged")
    download("mnist", tmp_path, mirrors=[_mirror(SHARED / "mnist")])
    assert len(load("mnist", "test", data_dir=tmp_path)) == 10000
    # force: fetched again even when verified.
    with pytest.raises(DownloadError):
        download("mnist", tmp_path, force=True, mirrors=[_mirror(tmp_path / "absent")])


def test_download_checksum_mismatch_leaves_nothing(tmp_path):
    source = tmp_path / "fake-mirror"
    source.mkdir()
    for filename in datasets.SOURCES["fashion-mnist"]["files"]:
        (source / filename).write_bytes(gzip.compress(b"not the real thing"))
    with pytest.raises(DownloadError) as info:
        download("fashion-mnist", tmp_path / "data", mirrors=[_mirror(source)])
    message = str(info.value)
    expected_md5 = datasets.SOURCES["fashion-mnist"]["files"]["train-images-idx3-ubyte.gz"]
    assert "MD5 checksum mismatch" in message and expected_md5 in message
    assert list((tmp_path / "data" / "fashion-mnist").iterdir()) == []


def test_download_network_failure_is_clear(tmp_path):
    with pytest.raises(DownloadError) as info:
        download("mnist", tmp_path, mirrors=[_mirror(tmp_path / "nowhere"),
                                             "http://127.0.0.1:9/"])
    message = str(info.value)
    assert "train-images-idx3-ubyte.gz" in message and "127.0.0.1:9" in message
    assert str(tmp_path / "nowhere") in message
    assert list((tmp_path / "mnist").iterdir()) == []


@needs_shared
def test_interrupted_download_leaves_no_partial_file(tmp_path):
    class Interrupted(Exception):
        pass

    def interrupt(url, done, total):
        assert total is not None and done < total   # interrupted mid-file
        raise Interrupted

    with pytest.raises(Interrupted):
        download("mnist", tmp_path, mirrors=[_mirror(SHARED / "mnist")], progress=interrupt)
    assert list((tmp_path / "mnist").iterdir()) == []


def _cifar_archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_download_cifar_extracts_only_bin_and_txt(tmp_path, monkeypatch):
    source = tmp_path / "mirror"
    source.mkdir()
    train, test = _cifar_records(9, seed=1), _cifar_records(4, seed=2)
    meta = "\n".join(datasets.CIFAR10_CLASSES) + "\n"
    md5 = _cifar_archive(source / "cifar-10-binary.tar.gz", [
        ("cifar-10-batches-bin/data_batch_1.bin", train.tobytes()),
        ("cifar-10-batches-bin/test_batch.bin", test.tobytes()),
        ("cifar-10-batches-bin/batches.meta.txt", meta.encode()),
        ("cifar-10-batches-bin/readme.html", b"<html></html>"),
        ("cifar-10-batches-bin/data_batch_2.bin", None),             # a symlink: skipped
        ("../../outside.bin", b"x"),                                 # not an expected name
    ])
    data = tmp_path / "data"
    with pytest.raises(DownloadError, match="MD5 checksum mismatch"):   # the published MD5
        download("cifar10", data, mirrors=[_mirror(source)])
    assert list((data / "cifar-10").iterdir()) == []
    monkeypatch.setitem(datasets.SOURCES["cifar10"], "files", {"cifar-10-binary.tar.gz": md5})
    folder = download("cifar10", data, mirrors=[_mirror(source)])
    assert sorted(p.name for p in folder.iterdir()) == [
        "batches.meta.txt", "data_batch_1.bin", "test_batch.bin"]
    assert not (tmp_path / "outside.bin").exists() and not (data / "outside.bin").exists()
    ds = load("cifar10", data_dir=data)
    np.testing.assert_array_equal(ds.labels, train[:, 0])
    np.testing.assert_array_equal(ds.images.reshape(9, -1), train[:, 1:])


def test_download_refuses_synthetic_and_unknown(tmp_path):
    with pytest.raises(ConfigError, match="generated"):
        download("synthetic", tmp_path)
    with pytest.raises(ConfigError, match="unknown dataset"):
        download("svhn", tmp_path)


@needs_shared
def test_download_script(tmp_path):
    script = REPO / "datasets" / "download.py"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), "mnist", "--data-dir", str(tmp_path), "--quiet",
         "--mirror", _mirror(SHARED / "mnist")],
        capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").is_file()
    failed = subprocess.run(
        [sys.executable, str(script), "fashion-mnist", "--data-dir", str(tmp_path),
         "--quiet", "--mirror", _mirror(tmp_path / "nowhere")],
        capture_output=True, text=True, env=env, timeout=120)
    assert failed.returncode == 1 and "could not download" in failed.stderr


def test_describe_reports_missing_and_damaged(tmp_path):
    rows = {row.name: row for row in describe(tmp_path)}
    assert not rows["mnist"].present and rows["mnist"].samples is None
    assert not rows["cifar10"].present and rows["synthetic"].present
    _write_idx_dataset(tmp_path, gz=True, n=6)
    home = tmp_path / "cifar-10"
    home.mkdir()
    (home / "data_batch_1.bin").write_bytes(_cifar_records(3).tobytes())
    (home / "test_batch.bin").write_bytes(b"\0" * 100)
    rows = {row.name: row for row in describe(tmp_path)}
    assert rows["mnist"].present and rows["mnist"].samples == {"train": 6, "test": 6}
    assert not rows["cifar10"].present
    assert "cifar-10/test_batch.bin" in rows["cifar10"].files
    assert "test_batch.bin" in rows["cifar10"].problem and "3073" in rows["cifar10"].problem
    assert rows["mnist"].problem is None and rows["fashion-mnist"].problem is None  # absent


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_describe_refuses_a_truncated_idx_file(tmp_path, gz):
    _, _, paths = _write_idx_dataset(tmp_path, gz=gz, n=6)
    images = paths["train"][0]
    data = images.read_bytes()
    images.write_bytes(gzip.compress(gzip.decompress(data)[:-7]) if gz else data[:-7])
    row = describe(tmp_path)[0]
    assert row.name == "mnist" and not row.present and row.samples is None
    assert str(images) in row.problem and "truncated" in row.problem
    # a file with the header's size but cut short inside its gzip stream: only a read finds it
    if gz:
        images.write_bytes(data[:len(data) - 12] + data[-4:])
        assert describe(tmp_path)[0].present
        verified = describe(tmp_path, verify=True)[0]
        assert not verified.present and str(images) in verified.problem


@needs_shared
def test_describe_verify_compares_published_checksums(tmp_path):
    download("mnist", tmp_path, mirrors=[_mirror(SHARED / "mnist")])
    assert describe(tmp_path, verify=True)[0].present
    labels = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(labels.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, so the size check passes
    labels.write_bytes(bytes(data))
    assert describe(tmp_path)[0].present
    row = describe(tmp_path, verify=True)[0]
    assert not row.present and "MD5" in row.problem and str(labels) in row.problem


@needs_shared
def test_download_from_a_local_http_mirror_writes_world_readable_files(tmp_path):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(SHARED / "mnist"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        old = os.umask(0o077)  # the mode does not depend on the umask
        try:
            target = download("mnist", tmp_path, mirrors=[url], timeout=10)
        finally:
            os.umask(old)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    for name in datasets.SOURCES["mnist"]["files"]:
        assert (target / name).stat().st_mode & 0o777 == 0o644, name
    assert len(load("mnist", "test", data_dir=tmp_path)) == 10000
