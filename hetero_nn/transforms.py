"""Data transforms: per-channel normalisation and seeded augmentation of image batches.

This module owns what happens to a batch between the dataset and the step:

- :class:`Normalize` ``(x - mean) / std`` per channel, and :class:`NormalizedData`,
  a dataset view that applies it to every batch it serves (training, validation,
  evaluation alike); :func:`channel_stats` measures a dataset's per-channel mean
  and standard deviation;
- augmentation, for training batches only: :class:`RandomCrop` (zero padding
  then a random window, torchvision's ``RandomCrop(size, padding)``) and
  :class:`RandomHorizontalFlip`, chained by :class:`Compose`;
  :func:`standard_augmentation` is the CIFAR recipe's
  ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()``.

Policy. An augmentation is called as ``transform(x, indices, seed=, epoch=)`` on a
batch ``x`` (n, C, H, W) that it changes in place, ``indices`` being the
dataset indices of its samples. Its random choices for a sample are a hash of
(seed, epoch, sample index, the transform's position in its Compose) --
splitmix64, vectorised -- and of nothing else: not the batch the sample lands
in, not the thread, not the time. So a run resumed from a checkpoint sees the
same images, a different granularity or batch size crops each sample the
same, and the :class:`~hetero_nn.training.trainer.Trainer` can run the augmentation on its
loader thread while the previous step computes.

The datasets already serve ``(pixel / 255 - mean) / std`` (torchvision's
``ToTensor`` then ``Normalize``); cropping and flipping commute with that
per-channel map, so augmenting the normalised batch gives torchvision's
pixels provided the padding is the normalised value of a black pixel, which
:func:`standard_augmentation` computes from the dataset's ``mean`` and ``std``.
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError

__all__ = ["Normalize", "NormalizedData", "channel_stats", "RandomCrop", "RandomHorizontalFlip",
           "Compose", "standard_augmentation", "sample_hash"]

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(z):
    """One splitmix64 finalisation of a uint64 array (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_hash(seed, epoch, indices, salt=0) -> np.ndarray:
    """A uint64 per sample, a function of (seed, epoch, index, salt) only."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(idx.shape, np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)))
        for word in (int(epoch), int(salt)):
            h = _splitmix64(h ^ np.uint64(word & 0xFFFFFFFFFFFFFFFF))
        return _splitmix64(h ^ idx)


def _uniform_int(h, n):
    """Integers in ``[0, n)`` from hashes (the high bits; n is small, the bias negligible)."""
    return ((h >> np.uint64(11)) % np.uint64(n)).astype(np.int64)


def _per_channel(values, name, owner):
    try:
        v = tuple(float(x) for x in np.atleast_1d(values))
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}: {name} must be numbers, one per channel, got {values!r}") \
            from None
    if not v or not all(np.isfinite(v)):
        raise ConfigError(f"{owner}: {name} must be finite numbers, got {values!r}")
    return v


# ---------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------

class Normalize:
    """``x = (x - mean) / std`` per channel, in place, in the batch's dtype
    (torchvision's ``Normalize(mean, std)``)."""

    def __init__(self, mean, std):
        self.mean = _per_channel(mean, "mean", "Normalize")
        self.std = _per_channel(std, "std", "Normalize")
        if len(self.mean) != len(self.std):
            raise ConfigError(f"Normalize: {len(self.mean)} means but {len(self.std)} stds")
        if min(self.std) <= 0:
            raise ConfigError(f"Normalize: std must be positive, got {self.std}")

    def __call__(self, x):
        if x.ndim < 2 or x.shape[1] != len(self.mean):
            raise ConfigError(f"Normalize: {len(self.mean)} channels, but the batch has shape "
                              f"{x.shape}")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        x -= np.asarray(self.mean, dtype=x.dtype).reshape(shape)
        x /= np.asarray(self.std, dtype=x.dtype).reshape(shape)
        return x

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


def channel_stats(data, batch_size=1024):
    """Per-channel ``(mean, std)`` of the batches ``data`` serves, over all its samples.

    Computed in float64 in two passes (mean, then the mean squared deviation: the
    population standard deviation), in index order, so the result is the same
    on every run.
    """
    n = len(data)
    if n == 0:
        raise ConfigError("channel_stats: the dataset is empty")
    total, count = None, 0
    for start in range(0, n, batch_size):
        x, _ = data.batch(np.arange(start, min(start + batch_size, n)), dtype=np.float64)
        s = x.sum(axis=tuple(i for i in range(x.ndim) if i != 1))
        total = s if total is None else total + s
        count += x.size // x.shape[1]
    mean = total / count
    sq = None
    shape = (1, -1) + (1,) * (len(data.input_shape) - 1)
    for start in range(0, n, batch_size):
        x, _ = data.batch(np.arange(start, min(start + batch_size, n)), dtype=np.float64)
        d = x - mean.reshape(shape)
        s = (d * d).sum(axis=tuple(i for i in range(x.ndim) if i != 1))
        sq = s if sq is None else sq + s
    return tuple(mean.tolist()), tuple(np.sqrt(sq / count).tolist())


class NormalizedData:
    """A dataset view whose batches are normalised by ``normalize`` after loading.

    Everything else (length, ``epoch_order``, ``input_shape``, ``num_classes``...)
    is the wrapped dataset's, so it goes wherever a Dataset goes.
    """

    def __init__(self, data, normalize):
        self.data = data
        self.normalize = normalize

    def __getattr__(self, name):
        return getattr(self.data, name)

    def __len__(self):
        return len(self.data)

    def batch(self, indices, dtype="float32", out=None):
        x, y = self.data.batch(indices, dtype=dtype, out=out)
        self.normalize(x)
        return x, y

    def __repr__(self):
        return f"NormalizedData({self.data!r}, {self.normalize!r})"


# ---------------------------------------------------------------------------------------
# Augmentation
# ---------------------------------------------------------------------------------------

class _Augmentation:
    salt = 0  # set by Compose: the position in the chain

    def _check(self, x, indices):
        if x.ndim != 4 or len(indices) != x.shape[0]:
            raise ConfigError(f"{type(self).__name__}: expected a batch (n, C, H, W) and n "
                              f"indices, got shape {x.shape} and {len(indices)} indices")


class RandomCrop(_Augmentation):
    """torchvision's ``RandomCrop(size, padding)``: pad each side by ``padding`` with
    ``fill``, then keep a ``size`` window at a random offset, uniform over the
    ``H + 2 padding - size + 1`` rows and columns.

    ``fill`` is one value or one per channel, passed through the ``normalize``
    maps (in order, in the batch's dtype) so that it can be given in pixel units
    (torchvision pads before normalising); without them it is in the batch's units.
    """

    def __init__(self, size, padding=0, fill=0.0, normalize=()):
        size = (size, size) if np.isscalar(size) else tuple(size)
        if len(size) != 2 or any(int(s) != s or s < 1 for s in size):
            raise ConfigError(f"RandomCrop: size must be a positive int or (h, w), got {size!r}")
        if int(padding) != padding or padding < 0:
            raise ConfigError(f"RandomCrop: padding must be an integer >= 0, got {padding!r}")
        self.size = (int(size[0]), int(size[1]))
        self.padding = int(padding)
        self.fill = _per_channel(fill, "fill", "RandomCrop")
        self.normalize = tuple(normalize)

    def _fill(self, c, dtype):
        """The padding value per channel, mapped through ``normalize`` in the batch dtype."""
        if len(self.fill) not in (1, c):
            raise ConfigError(f"RandomCrop: {len(self.fill)} fill values for {c} channels")
        fill = np.empty((1, c, 1, 1), dtype)
        fill[...] = np.asarray(self.fill, dtype=dtype).reshape(1, -1, 1, 1)
        for normalize in self.normalize:
            normalize(fill)
        return fill

    def __call__(self, x, indices, *, seed, epoch):
        self._check(x, indices)
        n, c, h, w = x.shape
        p, (th, tw) = self.padding, self.size
        if (th, tw) != (h, w):
            raise ConfigError(f"RandomCrop: the batch is changed in place, so the window "
                              f"{th}x{tw} must be the image size {h}x{w}")
        key = sample_hash(seed, epoch, indices, self.salt)
        rows = _uniform_int(key, h + 2 * p - th + 1)
        cols = _uniform_int(_splitmix64(key), w + 2 * p - tw + 1)
        padded = np.empty((n, c, h + 2 * p, w + 2 * p), x.dtype)
        padded[...] = self._fill(c, x.dtype)
        padded[:, :, p:p + h, p:p + w] = x
        for i in range(n):
            x[i] = padded[i, :, rows[i]:rows[i] + th, cols[i]:cols[i] + tw]
        return x

    def __repr__(self):
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip(_Augmentation):
    """torchvision's ``RandomHorizontalFlip(p=0.5)``: mirror a sample left-right with
    probability ``p``."""

    def __init__(self, p=0.5):
        if not 0.0 <= float(p) <= 1.0:
            raise ConfigError(f"RandomHorizontalFlip: p must be in [0, 1], got {p!r}")
        self.p = float(p)

    def __call__(self, x, indices, *, seed, epoch):
        self._check(x, indices)
        u = (sample_hash(seed, epoch, indices, self.salt) >> np.uint64(11)).astype(np.float64)
        flip = u * 2.0 ** -53 < self.p
        if flip.any():
            x[flip] = x[flip][..., ::-1]
        return x

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"


class Compose:
    """Apply augmentations in order; each draws from its own stream (its position)."""

    def __init__(self, transforms):
        self.transforms = list(transforms)
        for i, t in enumerate(self.transforms):
            t.salt = i + 1

    def __call__(self, x, indices, *, seed, epoch):
        for t in self.transforms:
            t(x, indices, seed=seed, epoch=epoch)
        return x

    def __repr__(self):
        return "Compose([" + ", ".join(map(repr, self.transforms)) + "])"


def standard_augmentation(data, padding=4):
    """``RandomCrop(H, padding)`` then ``RandomHorizontalFlip()``, the padding black.

    torchvision pads with black pixels before ``ToTensor`` and ``Normalize``; here
    the batch is already normalised, so the black pixel goes through the same
    maps: the dataset's own ``(0 / 255 - mean) / std`` (from its ``mean`` and
    ``std``, in the batch's dtype as the dataset computes it) and, for a
    :class:`NormalizedData` view, its :class:`Normalize` too.
    """
    c, h, w = data.input_shape
    maps = []
    while isinstance(data, NormalizedData):
        maps.insert(0, data.normalize)
        data = data.data
    mean, std = getattr(data, "mean", None), getattr(data, "std", None)
    if mean is not None and std is not None:
        maps.insert(0, Normalize(mean, std))
    return Compose([RandomCrop((h, w), padding=padding, fill=0.0, normalize=maps),
                    RandomHorizontalFlip()])
