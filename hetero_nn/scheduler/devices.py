"""Device specs and workers: ``"cpu:2"``, ``"cpu:1,cuda:0"``, ``"cpu,cuda"``.

A worker is one thread that runs tasks on one device: a CPU core (kind
``"cpu"``) or a GPU (kind ``"cuda"``, with its own CUDA stream). Each worker
computes in one memory node; the host can be split into several nodes
(``host_nodes=2``), CPU workers being dealt to them in turn.
"""

from __future__ import annotations

import os
import threading
from collections import deque

from ..arena.memory import MemoryNode, host_nodes as make_host_nodes
from ..codelets.xp import cupy_or_none
from ..errors import DeviceError


def parse_devices(spec) -> tuple[int, list[int]]:
    """Return ``(cpu_workers, gpu_ids)`` for a spec such as ``"cpu:2,cuda:0"``.

    ``cpu`` alone means one worker per core; ``cuda`` alone means every GPU;
    ``cuda:0:1`` or ``cuda:0,cuda:1`` lists GPU ids.
    """
    if isinstance(spec, int):
        return spec, []
    ncpu, gpus = 0, []
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
                              "expected 'cpu[:N]' or 'cuda[:ID]'")
    if ncpu == 0 and not gpus:
        raise DeviceError(f"devices {spec!r}: no worker at all")
    return ncpu, gpus


class Worker:
    """One device's thread state: its queue and the policy's bookkeeping."""

    __slots__ = ("index", "name", "kind", "node", "queue", "cond", "idle", "thread", "stream",
                 "queued_work", "running_end", "busy")

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

    def __repr__(self):
        return f"Worker({self.name} on {self.node.name})"


def make_workers(devices, host_nodes: int, lock) -> tuple[list[Worker], list[MemoryNode]]:
    """Build the workers and memory nodes for a device spec."""
    ncpu, gpus = parse_devices(devices)
    if host_nodes < 1:
        raise DeviceError(f"host_nodes={host_nodes}: need at least one host memory node")
    nodes = make_host_nodes(host_nodes)
    workers = []
    for i in range(ncpu):
        workers.append(Worker(len(workers), f"cpu{i}", "cpu", nodes[i % host_nodes], lock))
    if gpus:
        cupy = cupy_or_none()
        if cupy is None:
            try:
                import cupy  # noqa: F401  (only to tell the two causes apart)
                why = "CuPy is installed but sees no GPU"
            except Exception:
                why = "CuPy is not installed (pip install 'hetero-nn[cuda]')"
            raise DeviceError(f"devices {devices!r} ask for CUDA, but {why}")
        count = cupy.cuda.runtime.getDeviceCount()
        ids = list(range(count)) if -1 in gpus else gpus
        for gid in ids:
            if not 0 <= gid < count:
                raise DeviceError(f"devices {devices!r}: no GPU {gid} (this machine has {count})")
            node = MemoryNode(len(nodes), "cuda", f"cuda{gid}", xp=cupy, device_id=gid)
            nodes.append(node)
            w = Worker(len(workers), f"cuda{gid}", "cuda", node, lock)
            with cupy.cuda.Device(gid):
                w.stream = cupy.cuda.Stream(non_blocking=True)
            workers.append(w)
    return workers, nodes
