"""Device specs and workers: ``"cpu:2"``, ``"cpu:1,cuda:0"``, ``"cpu,cuda"``, ``"cpu:1,cuda-emu:2"``.

A worker is one thread that runs tasks on one device: a CPU core (kind
``"cpu"``) or a GPU (kind ``"cuda"``, with its memory node's stream). Each
worker computes in one memory node; the host can be split into several nodes
(``host_nodes=2``), CPU workers being dealt to them in turn.

``cuda-emu:N`` adds ``N`` emulated CUDA devices: workers of kind ``"cuda"`` in
every respect (own memory node with distinct buffers, ``cuda`` variants, an
asynchronous stream, a memory limit) whose array module is NumPy and whose
stream is a thread (:mod:`hetero_nn.arena.stream`), so the CUDA path runs in CI.
They say what they are: workers and nodes are named ``cuda-emu0``, ...
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import deque

import numpy as np

from ..arena.memory import MemoryNode, host_nodes as make_host_nodes, parse_bytes
from ..codelets.xp import cupy_or_none
from ..errors import DeviceError


def parse_devices(spec) -> tuple[int, list[int], int]:
    """Return ``(cpu_workers, gpu_ids, emulated_gpus)`` for a spec such as ``"cpu:2,cuda:0"``.

    ``cpu`` alone means one worker per core; ``cuda`` alone means every GPU;
    ``cuda:0:1`` or ``cuda:0,cuda:1`` lists GPU ids; ``cuda-emu[:N]`` asks for
    ``N`` (default 1) emulated CUDA devices.
    """
    if isinstance(spec, int):
        return spec, [], 0
    ncpu, gpus, emulated = 0, [], 0
    text = str(spec).strip()
    if not text:
        raise DeviceError("devices: empty spec; expected e.g. 'cpu:2' or 'cpu:1,cuda:0'")
    for part in text.split(","):
        kind, _, rest = part.strip().partition(":")
        kind = kind.strip().lower()
        if kind == "cpu":
            if rest:
                try:
                    n = int(rest)
                except ValueError:
                    raise DeviceError(f"devices {spec!r}: 'cpu:{rest}' is not a worker count") from None
                if n < 0:
                    raise DeviceError(f"devices {spec!r}: negative CPU worker count")
            else:
                n = os.cpu_count() or 1
            ncpu += n
        elif kind == "cuda-emu":
            try:
                n = int(rest) if rest else 1
            except ValueError:
                raise DeviceError(f"devices {spec!r}: 'cuda-emu:{rest}' is not a device count") from None
            if n < 0:
                raise DeviceError(f"devices {spec!r}: negative cuda-emu device count")
            emulated += n
        elif kind in ("cuda", "gpu"):
            if rest:
                try:
                    gpus.extend(int(i) for i in rest.split(":"))
                except ValueError:
                    raise DeviceError(f"devices {spec!r}: 'cuda:{rest}' is not a GPU id") from None
            else:
                gpus.append(-1)  # all GPUs, resolved when CuPy is there
        else:
            raise DeviceError(f"devices {spec!r}: unknown device kind {kind!r}; "
                              "expected 'cpu[:N]', 'cuda[:ID]' or 'cuda-emu[:N]'")
    if ncpu == 0 and not gpus and not emulated:
        raise DeviceError(f"devices {spec!r}: no worker at all")
    return ncpu, gpus, emulated


class Worker:
    """One device's thread: what it is (kind, memory node, stream), the policy's queue
    and bookkeeping for it, and whether it sleeps (``idle``, read by policies).

    What the executor knows of its tasks (running, completed on its stream) is the
    executor's :class:`~hetero_nn.scheduler.executors.local.ExecutorState`."""

    __slots__ = ("index", "name", "kind", "node", "queue", "cond", "idle", "thread", "stream",
                 "queued_work", "running_end", "busy", "device", "last_end")

    def __init__(self, index, name, kind, node, lock):
        self.index = index
        self.name = name
        self.kind = kind
        self.node = node
        self.queue = deque()
        self.cond = threading.Condition(lock)
        self.idle = False
        self.thread = None
        self.stream = None
        self.queued_work = 0.0   # sum of predicted run times of queued tasks (dmda)
        self.running_end = 0.0   # predicted end of the running task (dmda)
        self.busy = 0.0          # seconds spent running tasks
        self.device = "cuda-emu" if node.emulated else kind  # what it is, for traces
        self.last_end = 0.0      # when its stream finished the last task

    def __repr__(self):
        return f"Worker({self.name} on {self.node.name})"


def make_workers(devices, host_nodes: int, lock, device_memory=None
                 ) -> tuple[list[Worker], list[MemoryNode]]:
    """Build the workers and memory nodes for a device spec.

    ``device_memory``: a byte count or size (``"2GiB"``) for every CUDA node, or a
    mapping from node name (``"cuda0"``, ``"cuda-emu1"``) to one; ``None``: no limit.
    """
    ncpu, gpus, emulated = parse_devices(devices)
    if host_nodes < 1:
        raise DeviceError(f"host_nodes={host_nodes}: need at least one host memory node")
    nodes = make_host_nodes(host_nodes)
    workers = []
    for i in range(ncpu):
        workers.append(Worker(len(workers), f"cpu{i}", "cpu", nodes[i % host_nodes], lock))
    devices_asked = []  # (name, device id, emulated)
    if gpus:
        cupy = cupy_or_none()
        if cupy is None:
            if importlib.util.find_spec("cupy") is not None:  # installed: no GPU, or no CUDA
                why = "CuPy is installed but sees no GPU"
            else:
                why = "CuPy is not installed (pip install 'hetero-nn[cuda]'); " \
                      "'cuda-emu' emulates a device"
            raise DeviceError(f"devices {devices!r} ask for CUDA, but {why}")
        count = cupy.cuda.runtime.getDeviceCount()
        ids = list(range(count)) if -1 in gpus else gpus
        for gid in ids:
            if not 0 <= gid < count:
                raise DeviceError(f"devices {devices!r}: no GPU {gid} (this machine has {count})")
            devices_asked.append((f"cuda{gid}", gid, False))
    devices_asked.extend((f"cuda-emu{i}", i, True) for i in range(emulated))
    limits = _limits(device_memory, [name for name, _, _ in devices_asked])
    for name, gid, is_emulated in devices_asked:
        xp = np if is_emulated else cupy
        node = MemoryNode(len(nodes), "cuda", name, xp=xp, device_id=gid,
                          emulated=is_emulated, limit=limits.get(name))
        nodes.append(node)
        w = Worker(len(workers), name, "cuda", node, lock)
        w.stream = node.stream
        workers.append(w)
    for node in nodes:
        node.peers = nodes
    return workers, nodes


def _limits(device_memory, names) -> dict:
    """``{node name: bytes}`` from ``device_memory`` (see :func:`make_workers`)."""
    if device_memory is None:
        return {}
    try:
        if hasattr(device_memory, "items"):
            unknown = sorted(set(device_memory) - set(names))
            if unknown:
                raise DeviceError(f"device_memory names {unknown}, but the CUDA nodes are {names}")
            return {name: parse_bytes(v) for name, v in device_memory.items()}
        size = parse_bytes(device_memory)
    except ValueError as exc:
        raise DeviceError(f"device_memory: {exc}") from None
    return dict.fromkeys(names, size)
