"""Memory nodes: where replicas of handles live, and how bytes move between them.

A memory node is one address space a worker computes in: a host node (NumPy
arrays; the host may be split into several nodes, as StarPU does for NUMA
nodes, so transfers are real on a machine with no GPU) or a CUDA device: a GPU
(CuPy arrays) or an emulated one (``cuda-emu``: NumPy arrays in buffers of its
own, behind an emulated stream, so CI runs the CUDA path). The contract is
small, as in tinygrad's ``Allocator``: ``empty`` allocates, ``copy`` moves a
replica in. Each node owns one :class:`~hetero_nn.arena.arena.Arena` for the
temporaries of the task graph in flight (REDUX partials, SCRATCH buffers, step
activations).

Policy of a CUDA node
---------------------
- Every allocation (replicas, arena blocks) is made inside the node's device
  context, whichever thread asks (a worker binding, another worker prefetching).
- Every copy touching the node goes through a device stream (see
  :mod:`~hetero_nn.arena.stream`): host -> device is a host copy into a staging
  buffer (page-locked under CuPy) then an asynchronous copy on this node's
  stream; device -> device waits for an event of the source's stream then copies
  on this node's; device -> host is enqueued on the source's stream and waited
  for, since the host reads it next. Kernels of this node run on the same
  stream, after the copies they read, with no host synchronisation in between.
- With a ``limit`` (bytes), long-lived replicas and arena blocks together stay
  under it: an allocation that does not fit evicts the least recently used
  replicas not held by a task in flight, those valid elsewhere dropped, those
  valid only here written back to the host first (StarPU's
  ``STARPU_LIMIT_CUDA_MEM``); if still too little is free,
  :class:`~hetero_nn.errors.DeviceMemoryError` says how many bytes were asked
  for and what the node holds.
- Every copy is reported to ``on_copy(src, dst, nbytes, t0, t1)`` when set (the
  runtime's transfer log), timed where the copy actually runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np

from ..errors import DeviceMemoryError
from .arena import Arena
from .handle import drop_replicas
from .stream import CupyStream, EmulatedStream, emulated_device

_perf = time.perf_counter


class MemoryNode:
    """One address space: ``kind`` is ``"host"`` or ``"cuda"``; ``name`` e.g. ``"host1"``,
    ``"cuda0"``, ``"cuda-emu1"``. ``emulated`` tells a ``cuda-emu`` node (NumPy, emulated stream)."""

    def __init__(self, index: int, kind: str, name: str, xp=np, device_id: int | None = None,
                 *, emulated: bool = False, limit: int | None = None):
        self.index = index
        self.kind = kind
        self.name = name
        self.xp = xp
        self.device_id = device_id
        self.emulated = bool(emulated)
        self.limit = limit
        self.on_copy = None          # the runtime's transfer log, when it has one
        self.peers: list = [self]    # every node of the runtime, indexed by node index
        self.used = 0                # bytes of replicas and arena blocks (CUDA nodes)
        self._resident: OrderedDict = OrderedDict()  # root id -> (weakref, nbytes), LRU first
        self._held: dict = {}        # root id -> tasks in flight holding it
        self._mem_lock = threading.RLock()  # weakref callbacks may run inside it
        self._staging: dict = {}     # nbytes -> free staging buffers
        self.stream = None
        if kind == "cuda":
            self.stream = (EmulatedStream(name, device_id) if self.emulated
                           else CupyStream(xp, name, device_id))
            block = 16 << 20 if limit is None else max(64 << 10, min(16 << 20, limit // 16))
            self.arena = Arena(f"{name}.temporaries", xp=_DeviceAllocator(self),
                               block_bytes=block)
        else:
            self.arena = Arena(f"{name}.temporaries", xp=xp)

    # ------------------------------------------------------------------ context
    def context(self):
        """The node's device context (current device of this thread); nothing for a host."""
        if self.kind != "cuda":
            return contextlib.nullcontext()
        if self.emulated:
            return emulated_device(self.device_id)
        return self.xp.cuda.Device(self.device_id)

    # ------------------------------------------------------------------ allocation
    def empty(self, shape, dtype, owner=None):
        """A plain (non-arena) allocation on this node, for long-lived replicas.

        ``owner`` (a root handle) makes the replica evictable under a memory limit.
        """
        if self.kind != "cuda":
            return np.empty(shape, dtype=dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        arr = self._allocate(shape, dtype, nbytes)
        if owner is not None:
            with self._mem_lock:
                self._resident[owner.id] = (weakref.ref(owner, self._forget(owner.id, nbytes)),
                                            nbytes)
        return arr

    def _forget(self, root_id, nbytes):
        def gone(_ref):
            with self._mem_lock:
                if self._resident.pop(root_id, None) is not None:
                    self.used -= nbytes
        return gone

    def _allocate(self, shape, dtype, nbytes):
        """Allocate in the device context, evicting first when over the limit."""
        if self.limit is not None:
            self._make_room(nbytes)
        else:
            with self._mem_lock:
                self.used += nbytes
        with self.context():
            return self.xp.empty(shape, dtype=dtype)

    def _make_room(self, nbytes):
        """Reserve ``nbytes`` under the limit, evicting LRU replicas held by no task."""
        with self._mem_lock:
            if self.used + nbytes <= self.limit:
                self.used += nbytes
                return
            victims = [(rid, ref, size) for rid, (ref, size) in self._resident.items()
                       if not self._held.get(rid)]
        for rid, ref, size in victims:
            root = ref()
            if root is not None and self.evict(root):
                with self._mem_lock:
                    if self.used + nbytes <= self.limit:
                        self.used += nbytes
                        return
        with self._mem_lock:
            held = sum(s for rid, (_, s) in self._resident.items() if self._held.get(rid))
            raise DeviceMemoryError(
                f"{self.name}: cannot allocate {nbytes} bytes: limit {self.limit} bytes, "
                f"{self.used} in use ({held} held by tasks in flight, "
                f"{self.arena.stats.capacity} in temporaries of the graph in flight)")

    def evict(self, root) -> bool:
        """Drop ``root``'s replica here (written back to the host first if valid only
        here). False when its lock is busy or a task holds it."""
        if not root._lock.acquire(blocking=False):
            return False
        try:
            with self._mem_lock:
                if self._held.get(root.id) or root.id not in self._resident:
                    return False
            drop_replicas(root, self, self.peers)  # written back to the host first if needed
            with self._mem_lock:
                _, size = self._resident.pop(root.id)
                self.used -= size
            return True
        finally:
            root._lock.release()

    def hold(self, handles) -> None:
        """Pin the roots of ``handles`` here while a task uses them (no eviction)."""
        with self._mem_lock:
            for h in handles:
                rid = h.root.id
                self._held[rid] = self._held.get(rid, 0) + 1
                if rid in self._resident:
                    self._resident.move_to_end(rid)

    def release(self, handles) -> None:
        with self._mem_lock:
            for h in handles:
                rid = h.root.id
                left = self._held.get(rid, 0) - 1
                if left > 0:
                    self._held[rid] = left
                else:
                    self._held.pop(rid, None)

    def _staging_buffer(self, nbytes):
        """A host buffer of ``nbytes`` to copy from (page-locked under CuPy)."""
        with self._mem_lock:
            free = self._staging.get(nbytes)
            if free:
                return free.pop()
        if self.emulated:
            return np.empty(nbytes, dtype=np.uint8)
        import cupyx  # cupy: optional, only on a real CUDA node
        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)

    def _return_staging(self, buf):
        with self._mem_lock:
            self._staging.setdefault(buf.nbytes, []).append(buf)

    # ------------------------------------------------------------------ copies
    def copy(self, dst, src, src_node=None) -> int:
        """Copy ``src`` (a replica on ``src_node``) into ``dst`` (a replica on this node).

        Returns the number of bytes moved (see the module docstring for the streams).
        """
        nbytes = int(dst.nbytes)
        if src_node is None or src_node is self:
            src_node = _host_like(self)
        here_cuda = self.kind == "cuda"
        there_cuda = src_node.kind == "cuda"
        if not here_cuda and not there_cuda:
            t0 = _perf()
            np.copyto(dst, src)
            self._report(src_node, nbytes, t0)
        elif here_cuda and not there_cuda:
            self._copy_from_host(dst, src, src_node, nbytes)
        elif not here_cuda:
            self._copy_to_host(dst, src, src_node, nbytes)
        else:
            self._copy_between_devices(dst, src, src_node, nbytes)
        return nbytes

    def copy_from_device_async(self, dst, src, src_node) -> int:
        """Enqueue the copy of ``src`` (a replica on the device ``src_node``) into ``dst`` (a
        replica on this host node) on the device's stream, and return: ``dst`` holds it
        once the stream has passed it (a callback added after it runs then). Returns the
        bytes. Under CuPy the copy itself waits for the stream, as :meth:`copy` does."""
        nbytes = int(dst.nbytes)
        with src_node.context():
            if src_node.emulated:
                src_node.stream.launch(self._timed(_emu_copy, src_node, nbytes, dst, src, None))
            else:
                src_node.stream.launch(self._timed(_cupy_get, src_node, nbytes, dst, src,
                                                   src_node.stream))
        return nbytes

    def _copy_from_host(self, dst, src, src_node, nbytes):
        buf = self._staging_buffer(nbytes)
        staged = buf[:nbytes].view(dst.dtype).reshape(dst.shape)
        np.copyto(staged, src)  # pageable -> staging, on the host; the rest is asynchronous
        copy = _emu_copy if self.emulated else _cupy_copy
        with self.context():
            self.stream.launch(self._timed(copy, src_node, nbytes, dst, staged, self.stream))
            self.stream.add_callback(lambda: self._return_staging(buf))

    def _copy_to_host(self, dst, src, src_node, nbytes):
        with src_node.context():
            if src_node.emulated:
                src_node.stream.launch(self._timed(_emu_copy, src_node, nbytes, dst, src, None))
                src_node.stream.synchronize()  # the host reads it next
            else:
                self._timed(_cupy_get, src_node, nbytes, dst, src, src_node.stream)()

    def _copy_between_devices(self, dst, src, src_node, nbytes):
        ready = src_node.stream.record()
        copy = _emu_copy if self.emulated else _cupy_copy
        with self.context():
            self.stream.wait_event(ready)  # after the source's writes
            self.stream.launch(self._timed(copy, src_node, nbytes, dst, src, self.stream))

    def _timed(self, copy, src_node, nbytes, *args):
        """``copy(*args)`` as a call that reports itself to ``on_copy`` when it runs."""
        def run():
            t0 = _perf()
            copy(*args)
            self._report(src_node, nbytes, t0)
        return run

    def _report(self, src_node, nbytes, t0):
        log = self.on_copy
        if log is not None:
            log(src_node, self, nbytes, t0, _perf())

    def synchronize(self) -> None:
        """Wait for this node's stream (nothing for a host node)."""
        if self.stream is not None:
            self.stream.synchronize()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    def __repr__(self):
        return f"MemoryNode({self.name})"


def _emu_copy(dst, src, stream):
    """A copy on an emulated stream's thread: between NumPy buffers."""
    np.copyto(dst, src)


def _cupy_copy(dst, src, stream):
    """Asynchronous copy into a CuPy array on ``stream`` (from pinned host memory or a
    CuPy array of another device)."""
    if isinstance(src, np.ndarray):
        if dst.flags.c_contiguous:
            dst.set(src, stream=stream._stream)
            return
        staged, src = src, stream.cupy.empty(src.shape, src.dtype)  # a strided view: via a
        src.set(staged, stream=stream._stream)                        # contiguous one
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        dst.data.copy_from_device_async(src.data, dst.nbytes, stream._stream)
    else:
        with stream.activate():
            dst[...] = src


def _cupy_get(dst, src, stream):
    """Copy a CuPy array into a host array, waiting for ``stream`` (the host reads it next)."""
    np.copyto(dst, src.get(stream=stream._stream, blocking=True))


def _host_like(node):
    """The host node a copy without a named source comes from."""
    return node.peers[0]


class _DeviceAllocator:
    """What a CUDA node's arena sees as its array module: blocks allocated in the
    device context and counted against the node's limit."""

    def __init__(self, node):
        self._node = node
        self.uint8 = np.uint8
        self.__name__ = f"{'numpy' if node.emulated else 'cupy'} on {node.name}"

    def empty(self, shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self._node._allocate(shape, dtype, nbytes)


def parse_bytes(text) -> int:
    """``"2GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"4096"`` or an int, in bytes."""
    if isinstance(text, (int, np.integer)):
        value = int(text)
    else:
        s = str(text).strip()
        units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
                 "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12, "b": 1, "": 1}
        number = s.rstrip("KMGTBikmgtb ")
        unit = s[len(number):].strip().lower()
        if unit not in units:
            raise ValueError(f"memory size {text!r}: unknown unit {unit!r}")
        try:
            value = int(float(number) * units[unit])
        except ValueError:
            raise ValueError(f"memory size {text!r}: not a number of bytes") from None
    if value <= 0:
        raise ValueError(f"memory size {text!r}: must be positive")
    return value


def host_nodes(count: int) -> list[MemoryNode]:
    """``count`` host memory nodes ``host0``, ``host1``, ..."""
    return [MemoryNode(i, "host", f"host{i}") for i in range(count)]
