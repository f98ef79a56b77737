"""Bound tasks: a captured task resolved once for the replays of its graph.

A submitted task is resolved every time it runs: the runtime picks its variant
(``choose_variant``), acquires its operands (``bind``, ``Handle.replica``, the
root's lock), the variant's wrapper computes its geometry and looks up its
buffers. In a replayed graph all of that gives the same answer every step, so
:func:`bind_task` does it once, for the worker the task's fixed schedule puts
it on:

- the variant (``Runtime.choose_variant`` on that worker's kind: the pinned one,
  or the model's choice at binding time, bound again while the model explores);
- the operand arrays: the replicas of its handles on the worker's memory node
  (graph-owned or registered buffers, stable across replays), a ``SCRATCH``
  operand as one of the worker's buffers;
- its calls (:func:`~hetero_nn.codelets.prepared.calls_of`): the ``init`` of each
  ``REDUX`` partial, then the variant's own, each a
  :class:`~hetero_nn.scheduler.engine.trampoline.CompiledCall`. A task whose variant or
  ``init`` has no calls (NumPy code), or whose arguments no trampoline can
  carry, keeps ``calls = None`` and runs as Python (:meth:`BoundTask.run_python`);
- the performance model's key (codelet, variant, kind, footprint, size).

Before each replay the engine checks that the roots' replicas are still the ones bound
(:func:`bound_roots`): one evicted or dropped since (a new buffer at its next use) makes
the segment bind again, so a replay never writes through a stale address.

A replay then runs a compiled task by its calls' trampolines alone; parameters
declared as step parameters (:mod:`~hetero_nn.scheduler.engine.replay`) are the only
thing that may change, and :meth:`BoundTask.rebind` prepares the task again
when they do.

On a runtime with several memory nodes the segment's data plan
(:mod:`~hetero_nn.scheduler.engine.data_plan`) fixes the copies between nodes, so a task
binds to the replicas on its worker's node as on one node (a device worker's replicas
and ``SCRATCH`` buffers allocated on its device, its tasks launched on its stream by
:meth:`~hetero_nn.scheduler.engine.segment.CompiledSegment.run_stream_share`), and each
planned copy is a :class:`BoundTransfer`. Where no plan can be made, a task is bound
*dynamic*: its variant only, its operands acquired on its node at every run
(``Runtime.bind``), so it runs as Python.
"""

from __future__ import annotations

import warnings

from ...codelets.codelet import REDUX, SCRATCH
from ...codelets.prepared import calls_of
from ...codelets.reduce import _copy_calls
from .trampoline import CompiledCall


class BoundTask:
    """A task resolved for one worker (see the module docstring).

    Attributes
    ----------
    task : Task
        The captured task.
    worker : Worker
    variant : str
    fn : callable
        The variant.
    arrays : list of arrays
        Its operands, in order.
    calls : list of CompiledCall, or None
        Its compiled work, or None when it runs as Python.
    why : str
        Why it runs as Python ("" when compiled).
    model_key : tuple
        ``(codelet, variant, kind, footprint, size)`` for the performance model (the
        codelet itself, as the runtime's warm-up set keys it).
    """

    __slots__ = ("task", "worker", "variant", "fn", "arrays", "redux", "calls", "why",
                 "model_key", "buffers", "binder", "private")

    def __init__(self, task, worker, variant, arrays, buffers, binder=None):
        self.task = task
        self.worker = worker
        self.variant = variant
        self.fn = task.codelet.variants[variant]
        self.arrays = arrays
        self.redux = [i for i, m in enumerate(task.modes) if m is REDUX]
        self.buffers = buffers
        self.binder = binder  # the runtime, for a dynamic task (arrays None)
        self.calls = None
        self.why = ""
        self.model_key = None
        self.rebind()

    def rebind(self) -> bool:
        """Prepare the calls again from the task's current parameters; returns whether
        the shares must be laid out again (False where the new calls took the old ones'
        argument blocks, written in place: the same kernels and argument types)."""
        self.private = True  # holds something of its worker's (moved_to)
        if self.arrays is None:
            self.calls, self.why = None, "dynamic: operands made coherent at every run"
            return True
        if self.worker.stream is not None:
            self.calls, self.why = None, "launched on its device's stream"
            return True
        watched = _Watched(self.buffers)
        old = self.calls
        self.calls, self.why = _compiled_calls(self.task, self.fn, self.arrays, self.redux,
                                               watched)
        self.private = watched.used or any(m is SCRATCH for m in self.task.modes)
        if old is not None and self.calls is not None and len(old) == len(self.calls) and \
                all(o.trampoline is c.trampoline and o.entry == c.entry
                    for o, c in zip(old, self.calls)):
            for o, c in zip(old, self.calls):  # a step parameter's new value, in place
                o.block[:] = c.block
                o.args = c.args
            self.calls = old
            return False
        return True

    def run_python(self):
        """Run the task as the executor would: bind a dynamic task's operands, ``init``
        its REDUX partials (``bind`` does for a dynamic one), call the variant."""
        if self.arrays is None:
            self.fn(*self.binder.bind(self.task, self.worker), **self.task.params)
            return
        init = self.task.codelet.init
        for i in self.redux:
            init(self.arrays[i])
        self.fn(*self.arrays, **self.task.params)

    def __repr__(self):
        how = f"{len(self.calls)} calls" if self.calls is not None else f"Python: {self.why}"
        return f"BoundTask({self.task.codelet.name}#{self.task.id}, {self.variant!r}, " \
               f"{self.worker.name}, {how})"


_warned: set = set()  # (codelet, variant, exception type) whose prepare raised, warned once


def _compiled_calls(task, fn, arrays, redux, buffers):
    """``(calls, why)``: the task's CompiledCalls, or ``(None, reason)``."""
    prepared = []
    init = task.codelet.init
    try:
        for i in redux:
            c = calls_of(init, buffers, [arrays[i]], {})
            if c is None:
                return None, f"the REDUX init {getattr(init, '__name__', init)!r} has no prepare"
            prepared += c
        c = calls_of(fn, buffers, arrays, task.params)
        if c is None:
            return None, f"variant {getattr(fn, '__name__', fn)!r} has no prepare"
        prepared += c
        return [CompiledCall(kernel, args) for kernel, args in prepared], ""
    except Exception as exc:  # noqa: BLE001 - a check that fails, an argument no slot
        # carries: the task runs as Python, where the variant raises (a TaskError) or runs
        why = f"prepare raised {type(exc).__name__}: {exc}"
        key = (task.codelet.name, getattr(fn, "__name__", fn), type(exc).__name__)
        if key not in _warned:  # once per codelet, variant and kind of failure
            _warned.add(key)
            warnings.warn(f"replay: codelet {key[0]!r}, variant {key[1]!r}: {why}; its "
                          "tasks run as Python", RuntimeWarning, stacklevel=2)
        return None, why


def bind_task(rt, task, worker, buffers, dynamic=False) -> BoundTask:
    """Resolve ``task`` for ``worker``: its replicas on the worker's node are its arrays
    (a device's allocated in its context); ``dynamic``, its operands are acquired at
    every run."""
    node = worker.node
    variant = rt.choose_variant(task, worker.kind)
    arrays = None
    if not dynamic:
        arrays = []
        with node.context():
            for i, (h, m) in enumerate(zip(task.handles, task.modes)):
                if m is not SCRATCH:
                    arrays.append(h.replica(node))
                elif worker.stream is not None:
                    arrays.append(node.empty(h.shape, h.dtype))
                else:
                    arrays.append(buffers(("scratch", i), h.shape, h.dtype))
    bound = BoundTask(task, worker, variant, arrays, buffers, rt if dynamic else None)
    bound.model_key = model_key(rt, bound)
    return bound


def model_key(rt, b):
    """``b``'s key in ``rt``'s performance model (None without one: nothing learns)."""
    if rt.perfmodel is None:
        return None
    fp, size = rt.footprint(b.task)
    return b.task.codelet, b.variant, b.worker.kind, fp, size


class _Watched:
    """A worker's buffers, noting whether a prepare took any (its calls then point into
    them: the bound task is that worker's alone)."""

    __slots__ = ("buffers", "used")

    def __init__(self, buffers):
        self.buffers, self.used = buffers, False

    def __call__(self, *args, **kwargs):
        self.used = True
        return self.buffers(*args, **kwargs)

    def __getattr__(self, name):
        self.used = True
        return getattr(self.buffers, name)


def moved_to(b, worker, buffers):
    """The bound task ``b`` (of an earlier compilation) for ``worker``: ``b`` itself on its
    own worker, a copy on another worker of its node and kind where nothing it holds is
    its worker's (no ``SCRATCH``, no worker buffer, no stream), else None (bind again).
    Either way only while the replicas it was bound to are still its handles'."""
    if b is None or not replicas_current(b):
        return None
    if b.worker is worker:
        return b
    if b.private or worker.stream is not None or worker.node is not b.worker.node or \
            worker.kind != b.worker.kind:
        return None
    c = BoundTask.__new__(BoundTask)
    for name in BoundTask.__slots__:
        setattr(c, name, getattr(b, name))
    c.worker, c.buffers = worker, buffers
    return c


def operand_replicas(b) -> list:
    """``(handle, node index, array)`` for each operand ``b`` was bound to on its node's
    replica (none for a dynamic task; a ``SCRATCH`` operand is the worker's buffer)."""
    if b.arrays is None:
        return []
    idx = b.worker.node.index
    return [(h, idx, a) for h, m, a in zip(b.task.handles, b.task.modes, b.arrays)
            if m is not SCRATCH]


def replicas_current(b) -> bool:
    """Whether every replica ``b`` was bound to is still its handle's (an eviction, an
    ``unregister`` drops them: a new one is allocated at the next use)."""
    return all(h._replicas.get(i) is a for h, i, a in operand_replicas(b))


def bound_roots(bound) -> list:
    """``(root, node index, root's replica)`` for each root (not a temporary: its bytes
    are the graph's layout) that the bound tasks read through a replica: what
    :meth:`~hetero_nn.scheduler.engine.segment.CompiledSegment.moved` compares."""
    seen = {}
    for b in bound:
        for h, i, _ in operand_replicas(b):
            root = h.root
            if not root.temporary and (root.id, i) not in seen:
                seen[root.id, i] = (root, i, root._replicas.get(i))
    return list(seen.values())


class BoundTransfer:
    """A planned copy between memory nodes (:class:`~hetero_nn.scheduler.engine.data_plan.Transfer`)
    bound for the worker that runs it: host to host, one compiled copy per pair (its
    ``calls``); to or from a device, enqueued on the device's stream (:meth:`enqueue`,
    by the device worker's share). Shares the attributes the engine reads of a
    :class:`BoundTask`."""

    __slots__ = ("transfer", "worker", "calls", "why", "model_key", "arrays")

    def __init__(self, transfer, worker):
        self.transfer = transfer
        self.worker = worker
        self.model_key = None
        self.arrays = ()
        self.calls, self.why = None, "a copy on a device's stream"
        if transfer.src.kind != "cuda" and transfer.dst.kind != "cuda":
            try:
                calls = [c for d, s in transfer.pairs for c in _copy_calls(None, s, d)]
                self.calls, self.why = [CompiledCall(k, a) for k, a in calls], ""
            except Exception as exc:  # noqa: BLE001 - a dtype no slot carries: np.copyto
                self.calls, self.why = None, f"{type(exc).__name__}: {exc}"

    def run_python(self):
        """The copies from Python (a host copy no kernel could take)."""
        x = self.transfer
        for d, s in x.pairs:
            x.dst.copy(d, s, x.src)

    def enqueue(self):
        """Enqueue the copies on the device's stream: into a device, as the node copies
        in; out of one, asynchronously on its stream."""
        x = self.transfer
        if x.dst.kind == "cuda":
            with x.dst.context():
                for d, s in x.pairs:
                    x.dst.copy(d, s, x.src)
        else:
            for d, s in x.pairs:
                x.dst.copy_from_device_async(d, s, x.src)

    def __repr__(self):
        how = f"{len(self.calls)} calls" if self.calls is not None else self.why
        return f"BoundTransfer({self.transfer.name}, {self.worker.name}, {how})"
