"""Normalisation and augmentation: torchvision's semantics, and random choices that
depend on (seed, epoch, sample index) only."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import transforms as T
from hetero_nn.errors import ConfigError


def cifar_like(n=24, seed=0):
    """A uint8 image dataset with CIFAR's per-channel mean and std."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    return hn.datasets.Dataset("toy", "train", labels, [str(i) for i in range(10)],
                               (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), images=images)


def windows(padded, size):
    """Every ``size`` window of a padded (C, H, W) image, and their mirror images."""
    h, w = size
    for i in range(padded.shape[1] - h + 1):
        for j in range(padded.shape[2] - w + 1):
            win = padded[:, i:i + h, j:j + w]
            yield (i, j, False), win
            yield (i, j, True), win[..., ::-1]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_augmented_images_are_torchvisions_crops_and_flips(dtype):
    """Each augmented sample is a window of the image padded with black pixels (before
    normalisation, as torchvision pads), possibly mirrored; the dataset's pipeline then
    normalises it with the same operations."""
    data = cifar_like()
    aug = T.standard_augmentation(data, padding=2)
    idx = np.arange(len(data))
    x, _ = data.batch(idx, dtype=dtype)
    aug(x, idx, seed=5, epoch=1)
    chosen = []
    for k in idx:
        raw = np.pad(data.images[k], ((0, 0), (2, 2), (2, 2)))  # black padding, uint8
        padded = hn.datasets.Dataset("p", "train", np.zeros(1, np.int64), ["0"], data.mean,
                                     data.std, images=raw[None]).batch([0], dtype=dtype)[0][0]
        match = [key for key, win in windows(padded, (8, 8)) if np.array_equal(win, x[k])]
        assert match, f"sample {k} is no crop of its padded image"
        chosen.append(match[0])
    assert len({c[:2] for c in chosen}) > 5 and any(c[2] for c in chosen)  # varied choices


def test_choices_depend_on_seed_epoch_and_index_only():
    data = cifar_like(40)
    aug = T.standard_augmentation(data)
    whole, _ = data.batch(np.arange(40))
    aug(whole, np.arange(40), seed=1, epoch=2)
    order = np.random.default_rng(0).permutation(40)
    for batch in np.array_split(order, 5):  # other batches, other order: same images
        x, _ = data.batch(batch)
        aug(x, batch, seed=1, epoch=2)
        np.testing.assert_array_equal(x, whole[batch])
    other_epoch, _ = data.batch(np.arange(40))
    aug(other_epoch, np.arange(40), seed=1, epoch=3)
    other_seed, _ = data.batch(np.arange(40))
    aug(other_seed, np.arange(40), seed=2, epoch=2)
    assert not np.array_equal(other_epoch, whole) and not np.array_equal(other_seed, whole)


def test_offsets_and_flips_are_uniform():
    keys = T.sample_hash(0, 0, np.arange(20000), salt=1)
    rows = T._uniform_int(keys, 9)
    counts = np.bincount(rows, minlength=9)
    assert counts.min() > 0.9 * 20000 / 9 and counts.max() < 1.1 * 20000 / 9
    x = np.zeros((20000, 1, 1, 2))
    x[..., 1] = 1.0
    T.RandomHorizontalFlip(0.25)(x, np.arange(20000), seed=0, epoch=0)
    assert 0.23 < (x[:, 0, 0, 0] == 1.0).mean() < 0.27


def test_normalize_and_channel_stats():
    data = cifar_like(30)
    mean, std = T.channel_stats(data, batch_size=7)
    x, _ = data.batch(np.arange(30), dtype="float64")
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(std, x.std(axis=(0, 2, 3)), rtol=1e-12)
    view = T.NormalizedData(data, T.Normalize(mean, std))
    xn, y = view.batch(np.arange(30), dtype="float64")
    np.testing.assert_allclose(xn.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(xn.std(axis=(0, 2, 3)), 1, rtol=1e-12)
    assert len(view) == 30 and view.num_classes == 10 and view.input_shape == (3, 8, 8)
    np.testing.assert_array_equal(y, data.labels)
    # the augmentation of a normalised view pads with a black pixel normalised twice
    aug = T.standard_augmentation(view, padding=8)
    xs, _ = view.batch(np.arange(30), dtype="float64")
    aug(xs, np.arange(30), seed=0, epoch=0)
    black = T.Normalize(mean, std)(T.Normalize(data.mean, data.std)(np.zeros((1, 3, 1, 1))))
    corner = xs[:, :, 0, 0]
    assert any(np.array_equal(c, black[0, :, 0, 0]) for c in corner)


@pytest.mark.parametrize("make, message", [
    (lambda: T.Normalize((0.5, 0.5), (1.0,)), "2 means but 1 stds"),
    (lambda: T.Normalize((0.5,), (0.0,)), "std must be positive"),
    (lambda: T.RandomCrop(0), "size"),
    (lambda: T.RandomCrop(8, padding=-1), "padding"),
    (lambda: T.RandomHorizontalFlip(1.5), "p must be"),
])
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_crop_other_than_the_image_size_is_refused():
    with pytest.raises(ConfigError, match="must be the image size"):
        T.RandomCrop(4, padding=1)(np.zeros((2, 1, 8, 8)), [0, 1], seed=0, epoch=0)
