"""Arena and ArenaPair: alignment, growth, allocation-free replay, limits, threads."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.arena.arena import Arena, ArenaPair, ArenaStats
from hetero_nn.codelets.xp import cupy_or_none
from hetero_nn.errors import ArenaError, HeteroNNError

_cupy = cupy_or_none()
XP = [np, pytest.param(_cupy, marks=[pytest.mark.cuda,
                                     pytest.mark.skipif(_cupy is None, reason="no CuPy/GPU"),
                                     ])]

DTYPES = ["float64", "float32", "float16", "int8", "int32", "int64", "uint16", "complex128", "bool"]


def address(a):
    """Absolute address of an array (NumPy or CuPy)."""
    if hasattr(a, "__cuda_array_interface__"):
        return a.__cuda_array_interface__["data"][0]
    return a.__array_interface__["data"][0]


def to_host(a):
    return a.get() if hasattr(a, "get") else a


def run_sequence(arena, requests):
    """Allocate ``requests`` in order; return the arrays."""
    return [arena.empty(shape, dtype) for shape, dtype in requests]


requests_strategy = st.lists(
    st.tuples(st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
              st.sampled_from(DTYPES)),
    min_size=1, max_size=40)


@pytest.mark.parametrize("xp", XP)
def test_empty_gives_aligned_contiguous_typed_views(xp):
    arena = Arena("host0", xp=xp, block_bytes=4096, alignment=64)
    for shape, dtype in [((3, 5), "float32"), ((7,), "int8"), ((2, 3, 4), "float64"),
                         ((1,), "complex128"), ((5, 5), "float16")]:
        a = arena.empty(shape, dtype)
        assert a.shape == shape
        assert a.dtype == np.dtype(dtype)
        assert a.flags.c_contiguous
        assert address(a) % 64 == 0


@given(requests=requests_strategy, alignment=st.sampled_from([1, 8, 64, 256]),
       block_bytes=st.sampled_from([64, 1000, 4096]))
@settings(max_examples=60, deadline=None)
def test_replay_after_reset_allocates_no_block_and_reuses_addresses(requests, alignment,
                                                                  block_bytes):
    arena = Arena("host0", block_bytes=block_bytes, alignment=alignment)
    first = run_sequence(arena, requests)
    grown = arena.stats
    assert grown.live_bytes == sum(a.nbytes for a in first)
    for _ in range(3):
        arena.reset()
        assert arena.stats.live_bytes == 0
        again = run_sequence(arena, requests)
        stats = arena.stats
        assert stats.block_allocations == grown.block_allocations
        assert stats.capacity == grown.capacity
        assert [address(a) for a in again if a.size] == [address(a) for a in first if a.size]
    assert stats.allocations == 4 * len(requests)
    assert stats.high_water == grown.live_bytes


@given(requests=requests_strategy, alignment=st.sampled_from([1, 16, 64]))
@settings(max_examples=60, deadline=None)
def test_live_arrays_are_aligned_and_do_not_overlap(requests, alignment):
    arena = Arena("host0", block_bytes=512, alignment=alignment)
    arrays = run_sequence(arena, requests)
    spans = sorted((address(a), address(a) + a.nbytes) for a in arrays if a.nbytes)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    for a in arrays:
        if a.nbytes:
            assert address(a) % alignment == 0
    # Writing every array then reading it back proves nobody shares bytes.
    for i, a in enumerate(arrays):
        a[...] = i % 2 if a.dtype == bool else i % 100
    for i, a in enumerate(arrays):
        expected = i % 2 if a.dtype == bool else i % 100
        assert np.all(a == expected)


def test_growth_first_pass_counts_blocks_and_large_requests():
    arena = Arena("host0", block_bytes=1024, alignment=64)
    arena.empty(100, "uint8")          # block 1 (1024 B)
    arena.empty(100, "uint8")          # same block, offset 128
    arena.empty(900, "uint8")          # does not fit: block 2
    big = arena.empty(5000, "uint8")   # larger than a block: a dedicated block of its size
    small = arena.empty(10, "uint8")   # the regular block 2 still has room after 900 B
    stats = arena.stats
    assert stats.block_allocations == 3
    assert stats.capacity == 1024 + 1024 + 5000
    assert stats.live_bytes == 100 + 100 + 900 + 5000 + 10
    assert stats.allocations == 5
    assert big.nbytes == 5000 and small.nbytes == 10


def test_mixed_dtypes_with_padding_replay_exactly():
    rng = np.random.default_rng(0)
    requests = [(tuple(rng.integers(0, 9, size=rng.integers(0, 4))), DTYPES[k % len(DTYPES)])
                for k in range(200)]
    arena = Arena("host0", block_bytes=2048, alignment=128)
    first = [address(a) for a in run_sequence(arena, requests) if a.size]
    blocks = arena.stats.block_allocations
    assert blocks > 1
    for _ in range(5):
        arena.reset()
        assert [address(a) for a in run_sequence(arena, requests) if a.size] == first
    assert arena.stats.block_allocations == blocks


def test_large_requests_replay_and_regrow_when_a_pass_needs_more():
    arena = Arena("host0", block_bytes=256)
    a = arena.empty(1000, "uint8")
    b = arena.empty(2000, "uint8")
    arena.reset()
    assert address(arena.empty(900, "uint8")) == address(a)   # fits the first large block
    assert address(arena.empty(2000, "uint8")) == address(b)
    assert arena.stats.block_allocations == 2
    arena.reset()
    arena.empty(3000, "uint8")                                 # first large block too small
    stats = arena.stats
    assert stats.block_allocations == 3
    assert stats.capacity == 3000 + 2000                       # the 1000 B block was dropped


@pytest.mark.parametrize("xp", XP)
def test_zeros_and_degenerate_shapes(xp):
    arena = Arena("host0", xp=xp, block_bytes=1024)
    dirty = arena.empty((16,), "float64")
    dirty[...] = 7.0
    arena.reset()
    z = arena.zeros((4, 4), "float64")
    assert address(z) == address(dirty)
    assert np.array_equal(to_host(z), np.zeros((4, 4)))
    scalar = arena.zeros((), "float32")
    assert scalar.shape == () and scalar.dtype == np.float32 and float(scalar) == 0.0
    scalar[...] = 3.5
    assert float(scalar) == 3.5
    for shape in [(0,), (0, 3), (5, 0, 2)]:
        e = arena.empty(shape, "float64")
        assert e.shape == shape and e.size == 0
    assert arena.stats.live_bytes == 16 * 8 + 4
    assert arena.empty(3, "int16").shape == (3,)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="power of two"):
        Arena("a", alignment=48)
    with pytest.raises(ValueError, match="block_bytes"):
        Arena("a", block_bytes=0)
    arena = Arena("a")
    with pytest.raises(ValueError, match="negative"):
        arena.empty((2, -1), "float32")
    with pytest.raises(TypeError, match="objects"):
        arena.empty(3, object)
    with pytest.raises(TypeError, match="shape"):
        arena.empty("abc", "float32")


def test_limit_raises_arena_error_with_the_numbers():
    arena = Arena("gpu0", block_bytes=1000, limit_bytes=2500)
    arena.empty(500, "uint8")
    arena.empty(600, "uint8")                     # second block: capacity 2000
    arena.empty(400, "uint8")                     # third block shrinks to the 500 B left
    assert arena.stats.capacity == 2500
    with pytest.raises(ArenaError) as info:
        arena.empty(200, "float64")               # 1600 B, no room left
    err = info.value
    assert isinstance(err, HeteroNNError) and isinstance(err, MemoryError)
    message = str(err)
    for fact in ["'gpu0'", "1600 bytes", "1500 bytes live", "capacity 2500", "limit 2500"]:
        assert fact in message, message
    assert (err.arena, err.requested, err.live_bytes, err.capacity, err.limit) == (
        "gpu0", 1600, 1500, 2500, 2500)
    with pytest.raises(ArenaError, match="limit 100 bytes"):
        Arena("host0", block_bytes=64, limit_bytes=100).empty(101, "uint8")
    # The arena stays usable after the error.
    arena.reset()
    assert arena.empty(600, "uint8").nbytes == 600


def test_threads_allocate_disjoint_buffers():
    arena = Arena("host0", block_bytes=4096, alignment=64)
    per_thread = 300
    results = {}
    barrier = threading.Barrier(4)

    def work(tid):
        barrier.wait()
        out = []
        for k in range(per_thread):
            a = arena.empty((k % 7 + 1,), "float64")
            a[...] = tid * 10_000 + k
            out.append(a)
        results[tid] = out

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    arrays = [a for out in results.values() for a in out]
    spans = sorted((address(a), address(a) + a.nbytes) for a in arrays)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for tid, out in results.items():
        for k, a in enumerate(out):
            assert np.all(a == tid * 10_000 + k)
    stats = arena.stats
    assert stats.allocations == 4 * per_thread
    assert stats.live_bytes == sum(a.nbytes for a in arrays)


def test_stats_and_repr():
    arena = Arena("host0", block_bytes=1 << 20)
    assert arena.stats == ArenaStats(capacity=0, high_water=0, live_bytes=0,
                                     block_allocations=0, allocations=0)
    arena.empty((256, 256), "float32")
    arena.reset()
    arena.empty((10,), "float32")
    stats = arena.stats
    assert stats.high_water == 256 * 256 * 4 and stats.live_bytes == 40
    text = repr(arena)
    assert "host0" in text and "1 arrays" in text and "40 B live" in text
    assert "high water 256.0 KiB" in text and "1.0 MiB" in text


@pytest.mark.parametrize("xp", XP)
def test_arena_pair_alternates_and_keeps_previous_step(xp):
    pair = ArenaPair("batch", xp=xp, block_bytes=4096, alignment=64)
    assert pair.current.name == "batch.0" and pair.previous.name == "batch.1"
    rng = np.random.default_rng(1)
    shapes = [tuple(rng.integers(1, 30, size=2)) for _ in range(25)]
    addresses = {}
    previous_step = None
    for step in range(40):
        arena = pair.current
        arrays = [arena.empty(shape, "float32") for shape in shapes]
        for a in arrays:
            a[...] = step
        seen = addresses.setdefault(arena.name, [address(a) for a in arrays])
        assert [address(a) for a in arrays] == seen
        if previous_step is not None:      # the step before is untouched by this one
            assert all(np.all(to_host(a) == step - 1) for a in previous_step)
        previous_step = arrays
        assert pair.swap() is pair.current
        assert pair.current.stats.live_bytes == 0
        if step == 1:
            blocks = [a.stats.block_allocations for a in pair.arenas]
    assert [a.stats.block_allocations for a in pair.arenas] == blocks
    assert "batch.0" in repr(pair) and "batch.1" in repr(pair)


def test_arena_pair_passes_limit_to_each_arena():
    pair = ArenaPair("batch", block_bytes=100, limit_bytes=150)
    assert all(a.limit_bytes == 150 for a in pair.arenas)
    pair.current.empty(150, "uint8")
    with pytest.raises(ArenaError, match="batch.0"):
        pair.current.empty(1, "uint8")
    pair.swap()
    assert pair.current.empty(150, "uint8").nbytes == 150
