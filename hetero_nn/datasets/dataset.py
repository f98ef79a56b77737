"""The :class:`Dataset`: images and labels of one split, normalisation, a reproducible order.

Images are ``uint8`` ``(N, C, H, W)`` (or ``float32`` generated on demand for
``synthetic``), labels ``int64``; :meth:`Dataset.batch` normalises per channel and
the order of epoch ``e`` is ``np.random.default_rng([seed, e])``, so a resumed run
sees the same batches.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import ConfigError

#: ``images`` of a lazily generated dataset are materialised up to this many bytes.
MAX_MATERIALIZE = 2 << 30


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
            if nbytes > MAX_MATERIALIZE:
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


