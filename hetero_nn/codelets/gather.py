"""Index tables for whole-operation gathers in the ``cuda`` variants, memoized per device.

A ``cuda`` variant that loops over kernel taps issues a few small kernels per tap (25
slice copies for a 5x5 im2col, two per tap for col2im). The same data movement is one
gather (``a[..., table]``) with a table of flat indices that depends on the geometry
only: it is built once on the host with NumPy, copied to the device once, and kept
(per array module, device and geometry). A scatter with repeated targets (col2im: one
input pixel under several taps) becomes a gather too, by the inverse table: for each
target, the sources that land there, padded with a sentinel that points at an added
zero: no atomics, the same sums in the same order on every run.

Owns: :func:`device_table`, :func:`im2col_index`, :func:`col2im_index`.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

_tables: dict = {}
_lock = threading.Lock()


def _device_of(xp):
    cuda = getattr(xp, "cuda", None)
    return cuda.Device().id if cuda is not None and hasattr(cuda, "Device") else None


def device_table(xp, key, build):
    """``xp.asarray(build())`` for ``key``, made once per array module and device."""
    full = (id(xp), _device_of(xp), key)
    table = _tables.get(full)
    if table is None:
        host = build()
        with _lock:
            table = _tables.get(full)
            if table is None:
                table = _tables[full] = host if xp is np else xp.asarray(host)
    return table


@functools.lru_cache(maxsize=256)
def im2col_index(hp, wp, kh, kw, sh, sw, dh, dw, out_h, out_w) -> np.ndarray:
    """Flat indices into an ``hp x wp`` plane of every ``(tap p, tap q, out i, out j)``,
    in that order: ``plane[..., index]`` is im2col's ``[KH, KW, OH, OW]`` columns."""
    p = np.arange(kh).reshape(-1, 1, 1, 1) * dh
    q = np.arange(kw).reshape(1, -1, 1, 1) * dw
    i = np.arange(out_h).reshape(1, 1, -1, 1) * sh
    j = np.arange(out_w).reshape(1, 1, 1, -1) * sw
    return ((p + i) * wp + (q + j)).reshape(-1).astype(np.int64)


@functools.lru_cache(maxsize=256)
def col2im_index(hp, wp, kh, kw, sh, sw, dh, dw, out_h, out_w) -> np.ndarray:
    """``[hp * wp, M]``: for each plane position, the column entries (flat, in tap order)
    that im2col read from it, padded with ``kh*kw*out_h*out_w`` (an added zero entry);
    ``M`` is the most taps any position is under."""
    index = im2col_index(hp, wp, kh, kw, sh, sw, dh, dw, out_h, out_w)
    order = np.argsort(index, kind="stable")
    counts = np.bincount(index, minlength=hp * wp)
    width = max(int(counts.max(initial=0)), 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(index.size) - starts[index[order]]
    table = np.full((hp * wp, width), index.size, dtype=np.int64)
    table[index[order], rank] = order
    return table
