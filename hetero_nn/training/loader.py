"""The batch loader: training data as batches, the next one loaded while a step runs.

This module owns what :meth:`~hetero_nn.training.trainer.Trainer.fit` reads its
samples through: a hetero_nn Dataset, or ``(images, labels)`` arrays seen through the
part of the Dataset interface ``fit`` uses (:class:`ArrayData`), and
:func:`prefetched_batches`, the loader thread.

Policy: one loader thread per epoch; batch ``b`` lives in one arena of an
:class:`~hetero_nn.arena.arena.ArenaPair` while the thread fills batch ``b + 1``
into the other, and an arena is reset only once the step that read it has
returned, so a reset never waits for the step in flight.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import ConfigError

__all__ = ["ArrayData", "as_data", "prefetched_batches"]


class ArrayData:
    """``(x, y)`` arrays seen through the part of the Dataset interface ``fit`` uses."""

    def __init__(self, x, y):
        self.x = np.asarray(x)
        self.y = np.asarray(y)
        if self.x.ndim < 2 or self.y.shape != (len(self.x),):
            raise ConfigError(f"fit: expected images (N, ...) and labels (N,), got shapes "
                              f"{self.x.shape} and {self.y.shape}")
        self.input_shape = tuple(self.x.shape[1:])

    def __len__(self):
        return len(self.y)

    def epoch_order(self, seed=0, epoch=0):
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self))

    def batch(self, indices, dtype="float32", out=None):
        x, y = self.x[indices], self.y[indices]
        if out is None:
            return np.ascontiguousarray(x, dtype=dtype), np.asarray(y, dtype=np.int64)
        xb, yb = out(x.shape, dtype), out(y.shape, np.int64)
        xb[...] = x
        yb[...] = y
        return xb, yb


def as_data(data, what):
    """``data`` as something with ``epoch_order`` and ``batch``: a Dataset as it is, an
    ``(images, labels)`` pair as :class:`ArrayData`; ``what`` names the caller in errors."""
    if hasattr(data, "epoch_order") and hasattr(data, "batch"):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return ArrayData(*data)
    raise ConfigError(f"{what}: expected a hetero_nn Dataset or an (images, labels) pair, "
                      f"got {type(data).__name__}")


def prefetched_batches(data, order, batch_size, start, stop, dtype, pair, transform=None):
    """Yield batches ``start..stop-1`` of ``order``, loading the next while a step runs.

    Batch ``b`` lives in one arena of ``pair`` while a loader thread fills
    batch ``b + 1`` into the other; the arena is reset only once the step that
    used it has returned, so no reset ever waits for the step in flight.
    ``transform(x, indices)``, if given, changes each batch in place on the
    loader thread (the augmentation).
    """
    if start >= stop:
        return

    def load(b):
        indices = order[b * batch_size:(b + 1) * batch_size]
        x, y = data.batch(indices, dtype=dtype, out=pair.current.empty)
        if transform is not None:
            transform(x, indices)
        return x, y

    with ThreadPoolExecutor(1, thread_name_prefix="hetero_nn-loader") as loader:
        pair.swap()
        pending = loader.submit(load, start)
        for b in range(start, stop):
            x, y = pending.result()
            if b + 1 < stop:
                pair.swap()  # the arena of batch b - 1, whose step has returned
                pending = loader.submit(load, b + 1)
            yield x, y
