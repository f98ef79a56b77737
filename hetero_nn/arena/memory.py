"""Memory nodes: where replicas of handles live, and how bytes move between them.

A memory node is one address space a worker computes in: a host node (NumPy
arrays; the host may be split into several nodes, as StarPU does for NUMA
nodes, so transfers are real on a machine with no GPU) or a CUDA device (CuPy
arrays on one GPU, with a stream). The contract is small, as in tinygrad's
``Allocator``: ``empty`` allocates, ``copy`` moves a replica in. Each node owns
one :class:`~hetero_nn.arena.arena.Arena` for the temporaries of the task graph
in flight (REDUX partials, SCRATCH buffers, step activations).
"""

from __future__ import annotations

import numpy as np


class MemoryNode:
    """One address space: ``kind`` is ``"host"`` or ``"cuda"``; ``name`` e.g. ``"host1"``."""

    def __init__(self, index: int, kind: str, name: str, xp=np, device_id: int | None = None):
        from .arena import Arena

        self.index = index
        self.kind = kind
        self.name = name
        self.xp = xp
        self.device_id = device_id
        self.arena = Arena(f"{name}.temporaries", xp=xp)

    def empty(self, shape, dtype):
        """A plain (non-arena) allocation on this node, for long-lived replicas."""
        if self.kind == "cuda":
            with self.xp.cuda.Device(self.device_id):
                return self.xp.empty(shape, dtype=dtype)
        return np.empty(shape, dtype=dtype)

    def copy(self, dst, src) -> int:
        """Copy ``src`` (a replica on any node) into ``dst`` (a replica on this node).

        Returns the number of bytes moved.
        """
        if self.kind == "cuda":
            with self.xp.cuda.Device(self.device_id):
                dst[...] = self.xp.asarray(src)
        elif isinstance(src, np.ndarray):
            np.copyto(dst, src)
        else:  # a CuPy replica coming back to the host
            np.copyto(dst, src.get())
        return int(dst.nbytes)

    def __repr__(self):
        return f"MemoryNode({self.name})"


def host_nodes(count: int) -> list[MemoryNode]:
    """``count`` host memory nodes ``host0``, ``host1``, ..."""
    return [MemoryNode(i, "host", f"host{i}") for i in range(count)]
