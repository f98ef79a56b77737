"""Arenas: bump allocators of typed arrays over large aligned blocks of one memory node.

An :class:`Arena` owns every buffer the runtime hands to tasks on one memory
node (host memory through NumPy, a GPU through CuPy). It asks the node's array
module ``xp`` for a few large blocks (``xp.empty(nbytes, dtype=xp.uint8)``) and
serves each request as an aligned slice of a block, viewed with the requested
dtype and shape. Nothing is freed one array at a time: :meth:`Arena.reset`
releases every allocation at once and keeps the blocks.

Growth and replay
    The first pass over a training step grows the arena: a request that does not
    fit in the blocks left after the cursor gets a new block of
    ``max(block_bytes, request)`` bytes. Placement depends only on the sequence of
    requests, so after :meth:`~Arena.reset` the same sequence lands at the same
    addresses in the same blocks with no new block allocation. Requests larger
    than ``block_bytes`` get a dedicated block of their own, matched by their rank
    among the large requests of the pass, so they never strand the tail of a
    regular block.

State (all guarded by one lock, since worker threads allocate concurrently)
    ``_blocks``: the regular blocks, in cursor order; ``_cursor_block`` and
    ``_cursor_offset``: where the next regular request starts; ``_large`` and
    ``_large_index``: the dedicated blocks and how many this pass has used;
    counters behind :attr:`Arena.stats`.

:class:`ArenaPair` holds two arenas that alternate between steps, so resetting
the arena of the next step never overwrites buffers the step in flight still reads.

>>> arena = Arena("host0", block_bytes=1 << 20)
>>> x = arena.empty((4, 3), "float32")
>>> x.shape, x.dtype.name, x.ctypes.data % 64
((4, 3), 'float32', 0)
>>> arena.reset(); arena.empty((4, 3), "float32").ctypes.data == x.ctypes.data
True
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass

import numpy

from ..errors import ArenaError

__all__ = ["Arena", "ArenaPair", "ArenaStats"]


@dataclass(frozen=True)
class ArenaStats:
    """What an arena holds, in bytes and counts (a snapshot).

    Attributes
    ----------
    capacity : int
        Usable bytes of all blocks the arena holds.
    high_water : int
        Largest ``live_bytes`` seen since the arena was created.
    live_bytes : int
        Bytes of the arrays handed out since the last reset (alignment padding
        not counted).
    block_allocations : int
        Real allocations made on the memory node (calls to ``xp.empty`` for a block).
    allocations : int
        Calls to :meth:`Arena.empty` (and :meth:`Arena.zeros`) since creation.
    """

    capacity: int
    high_water: int
    live_bytes: int
    block_allocations: int
    allocations: int


def _address(array) -> int:
    """Absolute address of an array's first byte, for NumPy and CuPy arrays alike."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        interface = array.__array_interface__
    return interface["data"][0]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _normalise_shape(shape) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints (an int means a 1-d shape)."""
    if isinstance(shape, (int, numpy.integer)):
        shape = (shape,)
    try:
        dims = tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if dims and min(dims) < 0:
        raise ValueError(f"negative dimension in shape {dims}")
    return dims


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Arena:
    """Bump allocator of typed arrays over large aligned blocks of one memory node.

    Parameters
    ----------
    name : str
        The arena's name in messages and traces (e.g. ``"host0"``).
    xp : module, default numpy
        The node's array module: ``numpy`` for host memory, ``cupy`` for a GPU.
    block_bytes : int, default 16 MiB
        Size of a regular block; larger requests get a block of their own size.
    alignment : int, default 64
        Every array starts at an address that is a multiple of this (a power of two).
    limit_bytes : int, optional
        Most bytes the arena may hold in blocks; a request that would need more
        raises :class:`~hetero_nn.errors.ArenaError`.

    Notes
    -----
    Arrays are C-contiguous views of a block and stay valid memory after
    :meth:`reset`, but their contents belong to whoever is allocated there next.
    Zero-size arrays take no space in a block: they are made directly with
    ``xp.empty``, which owns no memory for them.
    """

    def __init__(self, name: str, xp=numpy, block_bytes: int = 16 << 20, alignment: int = 64,
                 limit_bytes: int | None = None):
        block_bytes = operator.index(block_bytes)
        alignment = operator.index(alignment)
        if block_bytes <= 0:
            raise ValueError(f"arena {name!r}: block_bytes must be positive, got {block_bytes}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"arena {name!r}: alignment must be a power of two, got {alignment}")
        if limit_bytes is not None:
            limit_bytes = operator.index(limit_bytes)
            if limit_bytes < 0:
                raise ValueError(f"arena {name!r}: limit_bytes must be >= 0, got {limit_bytes}")
        self.name = str(name)
        self.xp = xp
        self.block_bytes = block_bytes
        self.alignment = alignment
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._blocks: list = []
        self._cursor_block = 0
        self._cursor_offset = 0
        self._large: list = []
        self._large_index = 0
        self._capacity = 0
        self._live_bytes = 0
        self._live_arrays = 0
        self._high_water = 0
        self._block_allocations = 0
        self._allocations = 0

    # -- allocation -------------------------------------------------------------------------

    def empty(self, shape, dtype=numpy.float64):
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` from the arena.

        Thread-safe. Raises :class:`~hetero_nn.errors.ArenaError` when serving it
        would take the arena past ``limit_bytes``.
        """
        shape = _normalise_shape(shape)
        if not isinstance(dtype, numpy.dtype):
            dtype = numpy.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"arena {self.name!r}: cannot hold Python objects (dtype {dtype})")
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            self._allocations += 1
            if nbytes == 0:
                block = None
            else:
                block, start = self._reserve(nbytes, shape, dtype)
                self._live_bytes += nbytes
                self._live_arrays += 1
                self._high_water = max(self._high_water, self._live_bytes)
        if block is None:
            return self.xp.empty(shape, dtype=dtype)
        return block[start:start + nbytes].view(dtype).reshape(shape)

    def zeros(self, shape, dtype=numpy.float64):
        """Like :meth:`empty`, filled with zeros."""
        out = self.empty(shape, dtype)
        out[...] = 0
        return out

    def reset(self) -> None:
        """Release every allocation at once; the blocks stay for the next pass."""
        with self._lock:
            self._cursor_block = 0
            self._cursor_offset = 0
            self._large_index = 0
            self._live_bytes = 0
            self._live_arrays = 0

    def _reserve(self, nbytes: int, shape, dtype):
        """Find room for ``nbytes``: (block, offset). Caller holds the lock."""
        if nbytes > self.block_bytes:
            return self._reserve_large(nbytes, shape, dtype), 0
        while self._cursor_block < len(self._blocks):
            block = self._blocks[self._cursor_block]
            start = _round_up(self._cursor_offset, self.alignment)
            if start + nbytes <= block.size:
                self._cursor_offset = start + nbytes
                return block, start
            self._cursor_block += 1
            self._cursor_offset = 0
        room = self.block_bytes
        if self.limit_bytes is not None:
            room = min(room, self.limit_bytes - self._capacity)
        block = self._new_block(max(room, nbytes), nbytes, shape, dtype)
        self._blocks.append(block)
        self._cursor_block = len(self._blocks) - 1
        self._cursor_offset = nbytes
        return block, 0

    def _reserve_large(self, nbytes: int, shape, dtype):
        """The dedicated block of this pass's next large request, grown if too small."""
        index = self._large_index
        block = self._large[index] if index < len(self._large) else None
        if block is not None and block.size >= nbytes:
            self._large_index += 1
            return block
        if block is not None:  # too small for this pass: drop it, make a bigger one
            self._capacity -= block.size
            self._large[index] = None
        block = self._new_block(nbytes, nbytes, shape, dtype)
        if index < len(self._large):
            self._large[index] = block
        else:
            self._large.append(block)
        self._large_index += 1
        return block

    def _new_block(self, size: int, nbytes: int, shape, dtype):
        """Allocate an aligned block of ``size`` bytes on the node, or raise ArenaError."""
        if self.limit_bytes is not None and self._capacity + size > self.limit_bytes:
            error = ArenaError(
                f"arena {self.name!r}: cannot allocate {nbytes} bytes for an array of shape "
                f"{shape} and dtype {dtype}: {self._live_bytes} bytes live in "
                f"{self._live_arrays} arrays, capacity {self._capacity} bytes in "
                f"{len(self._blocks) + len(self._large)} blocks, limit {self.limit_bytes} bytes")
            error.arena = self.name
            error.requested = nbytes
            error.live_bytes = self._live_bytes
            error.capacity = self._capacity
            error.limit = self.limit_bytes
            raise error
        raw = self.xp.empty(size + self.alignment - 1, dtype=self.xp.uint8)
        self._block_allocations += 1
        shift = -_address(raw) % self.alignment
        self._capacity += size
        return raw[shift:shift + size]

    # -- introspection ----------------------------------------------------------------------

    @property
    def stats(self) -> ArenaStats:
        """A snapshot of capacity, high-water mark, live bytes and allocation counts."""
        with self._lock:
            return ArenaStats(capacity=self._capacity, high_water=self._high_water,
                              live_bytes=self._live_bytes,
                              block_allocations=self._block_allocations,
                              allocations=self._allocations)

    def __repr__(self):
        with self._lock:
            nblocks = len(self._blocks) + sum(b is not None for b in self._large)
            limit = "none" if self.limit_bytes is None else _format_bytes(self.limit_bytes)
            return (f"Arena({self.name!r}, {self.xp.__name__}: {self._live_arrays} arrays, "
                    f"{_format_bytes(self._live_bytes)} live, high water "
                    f"{_format_bytes(self._high_water)}, {nblocks} blocks holding "
                    f"{_format_bytes(self._capacity)}, limit {limit})")


class ArenaPair:
    """Two arenas of one memory node that alternate between training steps.

    :attr:`current` serves the step being built; :meth:`swap` moves to the other
    arena and resets it, while the arena just left keeps its data intact until
    the swap after (the step in flight may still be reading it).

    Parameters
    ----------
    name : str
        Base name; the arenas are named ``name + ".0"`` and ``name + ".1"``.
    xp : module, default numpy
        The node's array module.
    **arena_kwargs
        Passed to both :class:`Arena` (``block_bytes``, ``alignment``,
        ``limit_bytes``: the limit applies to each arena).
    """

    def __init__(self, name: str, xp=numpy, **arena_kwargs):
        self.name = str(name)
        self.arenas = (Arena(f"{self.name}.0", xp, **arena_kwargs),
                       Arena(f"{self.name}.1", xp, **arena_kwargs))
        self._current = 0

    @property
    def current(self) -> Arena:
        """The arena of the step being built."""
        return self.arenas[self._current]

    @property
    def previous(self) -> Arena:
        """The arena of the step before; valid until the next :meth:`swap`."""
        return self.arenas[1 - self._current]

    def swap(self) -> Arena:
        """Start the next step: the other arena, reset, becomes :attr:`current`."""
        self._current = 1 - self._current
        arena = self.arenas[self._current]
        arena.reset()
        return arena

    def __repr__(self):
        return f"ArenaPair({self.name!r}, current={self.current!r}, previous={self.previous!r})"
