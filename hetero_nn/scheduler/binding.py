"""Binding: a task's operands made coherent on the memory node of the worker that runs it.

Policy
------
When a worker starts a task, each operand is acquired on the worker's memory node:
a read copies in what the node lacks (coherence per cell, see
:mod:`hetero_nn.arena.handle`), a write leaves the node the only valid one, a
``SCRATCH`` operand is a fresh buffer of the worker's arena and a ``REDUX``
partial is initialised by the codelet's ``init``. With one memory node (every CPU
worker on the host) nothing moves: a replica is the array. ``dmda`` prefetches a
task's inputs to the node chosen for it, from the releasing worker's thread,
inside that node's device context, so the copies go on its stream ahead of the
task's kernels. Every copy between nodes is traced per link and fed to the
transfer model, from the thread where it ran (a stream's thread for a device).

Copies go to the runtime's trace (``rt._trace``, a bounded
:class:`~hetero_nn.scheduler.trace.buffer.TraceBuffer`) as ``TransferRecord``.
"""

from __future__ import annotations

from ..arena.handle import acquire
from ..codelets.codelet import R, REDUX, SCRATCH
from .trace.records import TransferRecord


class Binder:
    """Acquires tasks' operands on memory nodes for one runtime."""

    def __init__(self, runtime):
        self.rt = runtime
        self.nodes = runtime.nodes
        self.single_node = len(self.nodes) == 1
        for node in self.nodes:
            node.on_copy = self.copied

    def bind(self, task, worker):
        """Acquire the task's operands on ``worker``'s memory node; returns the arrays."""
        node = worker.node
        arrays = []
        moved = 0
        single = self.single_node
        for h, m in zip(task.handles, task.modes):
            if m is SCRATCH:
                arr = node.arena.empty(h.shape, h.dtype)
            elif single:  # the host node's index 0; h.replica() makes it (no call if made)
                replicas = h._replicas
                arr = replicas[0] if 0 in replicas else h.replica(node)
            else:
                arr, b = acquire(h, node, self.nodes, m.reads, m is not R)
                moved += b
            if m is REDUX:
                task.codelet.init(arr)
            arrays.append(arr)
        task.bytes_in = moved
        return arrays

    def copied(self, src, dst, nbytes, t0, t1):
        """Every copy between memory nodes (called where it ran, e.g. a stream's thread):
        traced per link, and fed to the transfer model."""
        rt = self.rt
        if rt.tracing:
            rt._trace.add_transfer(TransferRecord(src.name, dst.name, nbytes, t0, t1))
        if rt.perfmodel is not None:
            rt.perfmodel.record_transfer(src.name, dst.name, nbytes, t1 - t0)

    def prefetch(self, task, node):
        """Bring the task's read operands to ``node`` ahead of its start (dmda)."""
        if self.single_node:
            return
        with node.context():
            for h, m in zip(task.handles, task.modes):
                if m.reads and node.index not in h.valid:
                    acquire(h, node, self.nodes, True, False)

    def host_replica(self, handle):
        """``handle``'s replica on the host node, made coherent (no wait)."""
        if self.single_node:
            return handle.replica(self.nodes[0])
        return acquire(handle, self.nodes[0], self.nodes, True, False)[0]
