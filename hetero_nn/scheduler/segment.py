"""A graph's segment compiled for the replay engine: schedule, bound tasks, shares.

Policy
------
A segment (one recorded flush) is compiled in three steps (see
:mod:`~hetero_nn.scheduler.replay` for when): its tasks grouped in *units* (a task,
or a bundle's members, which stay together on one worker), a fixed schedule of the
units (:func:`_schedule`), then every task bound for its worker
(:mod:`~hetero_nn.scheduler.bound`) and each worker's *share* laid out as the arrays
of :func:`~hetero_nn.scheduler.dispatch.run_compiled`: its tasks in order, their
trampolines and argument blocks, the predecessors to wait for on other workers (per
other worker the latest in that worker's order: the others come before it) and
whether another worker waits for each task.

Schedules. ``heft``'s plan under ``heft``, else, on workers of one kind,
:func:`~hetero_nn.scheduler.schedule.plan` on the costs known (the engine's own
measurements, the model's predictions, or the capture run's times, each (codelet,
footprint)'s median standing for all, so a first run's compilation does not
count). Workers of several kinds (CPU and CUDA) are served under ``heft`` only
(:func:`~hetero_nn.scheduler.replay.unavailable`); should its ranks tie across an
edge, its placement at capture is kept, each worker's tasks in submission order.
With several memory nodes (CUDA workers, ``host_nodes``) every task is *dynamic*:
its operands are made coherent on its node (``Runtime.bind``: the transfers) each
run, in Python.

Shares. A CPU worker's share runs through the compiled loop, its Python tasks in
between (:meth:`CompiledSegment.run_share`). A CUDA worker's share is enqueued on its
stream at once (:meth:`CompiledSegment.run_stream_share`, the CUDA-graph idea; the
same code drives ``cuda-emu``'s emulated stream): per task, in order, it waits on the
host only for predecessors other workers run, binds the operands in the device's
context (copies in go on the stream), launches the variant and queues a callback that
stamps the end, releases the node's hold on the operands and publishes the task for
the workers waiting on it. The host waits for the stream once, at the share's end.

State
-----
``units``, ``tasks`` (bundles flattened, segment order), ``task_preds``, ``bound``,
``worker_of`` (per unit), ``share_tasks`` (per worker), ``shares``, ``waits_of`` /
``notify_of`` (per task), ``choices`` (tasks whose variant the model chooses), the
run arrays ``done``, ``times``, ``sleepers``, ``abort``, ``bytes_in``, and ``groups``
(the performance model's keys and their tasks).
"""

from __future__ import annotations

import statistics

import numpy as np

from ..codelets.prepared import WorkerBuffers
from .bound import bind_task
from .bundle import Bundle
from .dispatch import ABORTED, now_ns, publish, run_compiled, set_abort, wait_done
from .policies import UNKNOWN_COST
from .schedule import fixed_orders
from .variants import EXPLORE_SAMPLES


class Share:
    """One worker's part of a compiled segment: the arrays of ``run_compiled``."""

    __slots__ = ("worker", "order", "python", "entry_start", "trampolines", "blocks",
                 "wait_start", "waits", "notify")

    def __init__(self, worker, tasks, bound, waits_of, notify_of):
        self.worker = worker
        n = len(tasks)
        self.order = np.array(tasks, dtype=np.int64)
        self.python = np.array([bound[t].calls is None for t in tasks], dtype=np.uint8)
        entries = [c for t in tasks for c in (bound[t].calls or ())]
        counts = [len(bound[t].calls or ()) for t in tasks]
        self.entry_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=self.entry_start[1:])
        self.trampolines = np.array([c.trampoline.address for c in entries], dtype=np.int64)
        self.blocks = np.array([c.block.ctypes.data for c in entries], dtype=np.int64)
        waits = [waits_of[t] for t in tasks]
        self.wait_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(w) for w in waits], out=self.wait_start[1:])
        self.waits = np.array([p for w in waits for p in w], dtype=np.int64)
        self.notify = np.array([notify_of[t] for t in tasks], dtype=np.uint8)


class CompiledSegment:
    """One flushed segment of a graph, compiled for the engine (module docstring)."""

    def __init__(self, rt, segment, previous=None, buffers=None):
        """Compile ``segment``; ``previous``: its last compilation, whose measured times
        plan this one and whose bound tasks are kept where their worker is; ``buffers``:
        the workers' scratch buffers (worker index -> WorkerBuffers), the runtime's."""
        units, unit_preds, self.tasks, self.task_preds, self.unit_of_task = _units(segment)
        self.units = units
        self.rt = rt
        self.dynamic = len(rt.nodes) > 1  # operands made coherent at every run
        n = len(self.tasks)
        workers = self.workers = rt.workers
        costs_ns = None if previous is None else previous.times[:, 1] - previous.times[:, 0]
        self.worker_of, orders = _schedule(rt, segment, units, unit_preds, costs_ns,
                                           self.tasks)
        self.buffers = buffers if buffers is not None else {}
        self.bound = [None] * n
        first = [u[0] for u in units]  # task index of each unit's first member
        for w, order in enumerate(orders):
            worker = workers[w]
            buf = self.buffers.get(w)
            if buf is None:
                buf = self.buffers[w] = WorkerBuffers()
            for u in order:
                for t in units[u]:
                    kept = previous.bound[t] if previous is not None else None
                    self.bound[t] = kept if kept is not None and kept.worker is worker else \
                        bind_task(rt, self.tasks[t], worker, buf, self.dynamic)
        # cross-worker waits (per other worker, the latest predecessor in its order
        # is enough) and who publishes
        position = {}
        for w, order in enumerate(orders):
            for k, u in enumerate(order):
                position[u] = k
        waits_of = [()] * n
        notify_of = [False] * n
        for u, ps in enumerate(unit_preds):
            w = self.worker_of[u]
            latest: dict = {}
            for p in ps:
                wp = self.worker_of[p]
                if wp != w and (wp not in latest or position[p] > position[latest[wp]]):
                    latest[wp] = p
            if latest:
                waits_of[first[u]] = tuple(units[p][-1] for p in latest.values())
                for p in latest.values():
                    notify_of[units[p][-1]] = True
        self.waits_of, self.notify_of = waits_of, notify_of
        self.share_tasks = [[t for u in order for t in units[u]] for order in orders]
        self.build_shares()
        self.notify_tasks = np.array([t for t in range(n) if notify_of[t]], dtype=np.int64)
        # tasks whose variant the performance model chooses among several (deterministic=False)
        self.choices = [i for i, b in enumerate(self.bound)
                        if len(rt.candidates(b.task.codelet, b.worker.kind)) > 1]
        self.done = np.zeros(n, dtype=np.int32)
        self.times = np.zeros((n, 2), dtype=np.int64)
        self.bytes_in = np.zeros(n, dtype=np.int64)
        self.sleepers = np.zeros(1, dtype=np.int32)
        self.abort = np.zeros(1, dtype=np.int32)
        self.groups = _model_groups(self.bound)

    def run_stream_share(self, share, epoch):
        """Enqueue a CUDA worker's share on its stream, then wait for the stream once;
        returns None, or ``(task index, exception)``."""
        return _run_stream_share(self, share, epoch)

    def build_shares(self):
        """(Re)make the shares' arrays from the bound tasks (after a rebind)."""
        self.shares = [Share(w, tasks, self.bound, self.waits_of, self.notify_of)
                       for w, tasks in zip(self.workers, self.share_tasks)]

    @property
    def python_tasks(self) -> int:
        """Tasks of this segment that run as Python."""
        return sum(b.calls is None for b in self.bound)

    def run(self, share, epoch):
        """Run one share (any thread): a CUDA worker's on its stream, a CPU worker's
        through the compiled loop. Returns None, or ``(task index, exception)`` (``(None,
        exception)`` when the engine itself failed: the other shares are aborted too)."""
        try:
            if share.worker.stream is not None:
                return self.run_stream_share(share, epoch)
            return self.run_share(share, epoch)
        except BaseException as exc:  # noqa: BLE001 - the engine's own fault, not a task's
            set_abort(self.abort, self.done, self.notify_tasks)
            return None, exc

    def run_share(self, share, epoch):
        """Run a CPU worker's share; returns None, or ``(task index, exception)``."""
        n = len(share.order)
        k = 0
        done, times, sleepers, abort = self.done, self.times, self.sleepers, self.abort
        while True:
            r = run_compiled(k, share.order, share.python, share.entry_start, share.trampolines,
                             share.blocks, share.wait_start, share.waits, share.notify, done,
                             times, epoch, sleepers, abort)
            if r == n or r == ABORTED:
                return None
            if r >= 0:  # a Python task, its predecessors done
                t = int(share.order[r])
                b = self.bound[t]
                times[t, 0] = now_ns()
                try:
                    b.run_python()
                except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                    times[t, 1] = now_ns()
                    set_abort(abort, done, self.notify_tasks)
                    return t, exc
                times[t, 1] = now_ns()
                self.bytes_in[t] = b.task.bytes_in if b.arrays is None else 0
                if share.notify[r]:
                    publish(done, t, epoch, sleepers)
                k = r + 1
                continue
            t = int(share.order[-(r + 2)])
            set_abort(abort, done, self.notify_tasks)
            try:  # name the exception the compiled kernel could not carry out of the loop
                self.bound[t].run_python()
            except BaseException as exc:  # noqa: BLE001
                return t, exc
            return t, RuntimeError("its compiled kernel raised; run again from Python it "
                                   "did not")


class _StreamRun:
    """One CUDA worker's share on its stream, for one replay (see the module docstring):
    what the launches and the stream's callbacks share."""

    __slots__ = ("seg", "worker", "epoch", "failure", "last_end")

    def __init__(self, seg, worker, epoch):
        self.seg, self.worker, self.epoch = seg, worker, epoch
        self.failure = None   # (task index, exception) of the first kernel that raised
        self.last_end = 0     # when the stream finished its last task (ns)

    def on_stream(self, t, arrays):
        """The kernel as the stream runs it (a launch into CuPy's stream on a GPU)."""
        seg = self.seg
        start = now_ns()
        if start > seg.times[t, 0]:
            seg.times[t, 0] = start
        b = seg.bound[t]
        try:
            b.fn(*arrays, **b.task.params)
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
            if self.failure is None:
                self.failure = (t, exc)
            set_abort(seg.abort, seg.done, seg.notify_tasks)

    def completed(self, t, notify):
        """Stream callback: task ``t``'s kernels are done; publish it (not if it raised)."""
        seg = self.seg
        end = now_ns()
        self.worker.node.release(seg.bound[t].task.handles)
        if self.last_end > seg.times[t, 0]:
            seg.times[t, 0] = self.last_end  # it waited for the task before on the stream
        seg.times[t, 1] = self.last_end = end
        if notify and (self.failure is None or self.failure[0] != t):
            publish(seg.done, t, self.epoch, seg.sleepers)


def _run_stream_share(seg, share, epoch):
    """:meth:`CompiledSegment.run_stream_share` (module docstring)."""
    rt, w = seg.rt, share.worker
    node, stream = w.node, w.stream
    run = _StreamRun(seg, w, epoch)
    done, times, sleepers, abort = seg.done, seg.times, seg.sleepers, seg.abort
    try:
        for k in range(len(share.order)):
            t = int(share.order[k])
            for j in range(share.wait_start[k], share.wait_start[k + 1]):
                if not wait_done(done, share.waits[j], epoch, sleepers, abort):
                    return None  # another share failed: its error is the flush's
            task = seg.bound[t].task
            try:
                node.hold(task.handles)
                try:
                    with node.context(), stream.activate():
                        arrays = rt.bind(task, w)
                        seg.bytes_in[t] = task.bytes_in
                        times[t, 0] = now_ns()  # launched; the stream stamps the real start
                        stream.launch(run.on_stream, t, arrays)
                except BaseException:
                    node.release(task.handles)
                    raise
            except BaseException as exc:  # noqa: BLE001 - binding failed: the flush's error
                times[t, 1] = now_ns()
                set_abort(abort, done, seg.notify_tasks)
                return t, exc
            stream.add_callback(lambda t=t, notify=bool(share.notify[k]):
                                run.completed(t, notify))
    finally:
        stream.synchronize()
    return run.failure


def _units(segment):
    """``(units, unit preds, tasks, task preds, unit of task)`` of a segment: bundles
    flattened into their members (module docstring of :mod:`schedule`)."""
    unit_of = {}
    units, tasks, task_preds, unit_of_task = [], [], [], []
    for t, _, _ in segment:
        members = t.members if t.__class__ is Bundle else (t,)
        unit_of[t] = len(units)
        units.append(list(range(len(tasks), len(tasks) + len(members))))
        tasks.extend(members)
        unit_of_task.extend([len(units) - 1] * len(members))
    unit_preds = []
    for t, preds, _ in segment:
        ps = list(dict.fromkeys(unit_of[p] for p in preds if p in unit_of))
        unit_preds.append(ps)
        first = units[unit_of[t]]
        task_preds.append([units[p][-1] for p in ps])
        task_preds.extend([m - 1] for m in first[1:])
    return units, unit_preds, tasks, task_preds, unit_of_task


def _schedule(rt, segment, units, unit_preds, costs_ns, tasks):
    """``(worker_of per unit, orders)``: heft's plan, or :func:`plan` on known costs; with
    several memory nodes, heft's plan or the capture run's placement (module docstring)."""
    index = {w: i for i, w in enumerate(rt.workers)}
    heads = [t for t, _, _ in segment]
    planned = costs_ns is None and rt.policy_name == "heft" and all(
        t.assigned is not None for t in heads)
    if len({w.kind for w in rt.workers}) > 1:  # heft's plan (or, if its ranks tie across
        placed = [index.get(t.worker, index[t.eligible[0]]) for t in heads]  # an edge, its
        return fixed_orders(unit_preds, len(rt.workers), None,  # placement at capture)
                            [index[t.assigned] for t in heads] if planned else placed,
                            [t.priority for t in heads] if planned else
                            [-u for u in range(len(heads))],
                            fallback=(placed, [-u for u in range(len(heads))]))
    return fixed_orders(unit_preds, len(rt.workers),
                        lambda: _unit_costs(rt, units, tasks, costs_ns),
                        [index[t.assigned] for t in heads] if planned else None,
                        [t.priority for t in heads])


def _unit_costs(rt, units, tasks, costs_ns):
    """Seconds per unit: measured by the engine, else predicted, else the capture run's
    median per (codelet, footprint)."""
    if costs_ns is not None:
        return [float(sum(costs_ns[t] for t in u)) * 1e-9 for u in units]
    kind = rt.workers[0].kind
    per_task = []
    medians: dict = {}
    for t in tasks:
        p = None
        if rt.perfmodel is not None:
            p = rt.predict(t, kind)[1]
        if p is None and t.t_start and t.t_end >= t.t_start:
            medians.setdefault((t.codelet.name, rt.footprint(t)[0]), []).append(
                t.t_end - t.t_start)
        per_task.append(p)
    medians = {k: statistics.median(v) for k, v in medians.items()}
    out = []
    for u in units:
        total = 0.0
        for i in u:
            p = per_task[i]
            if p is None:
                t = tasks[i]
                p = medians.get((t.codelet.name, rt.footprint(t)[0]), UNKNOWN_COST)
            total += p
        out.append(total)
    return out


def _model_groups(bound):
    """``[(model key, task indices)]`` of the bound tasks the performance model learns from."""
    groups: dict = {}
    for i, b in enumerate(bound):
        if b.model_key is not None:
            groups.setdefault(b.model_key, []).append(i)
    return [(key, np.array(idx, dtype=np.int64)) for key, idx in groups.items()]


# ----------------------------------------------------------------------------- graphs

def explore(rt, seg) -> bool:
    """While the performance model still explores (``deterministic=False``): bind again
    the tasks whose chosen variant changed since they were bound; returns whether some
    choice may still change (a candidate with fewer runs than exploration asks)."""
    pm = rt.perfmodel
    if not seg.choices or pm is None:
        return False
    need = rt.calibrate_samples if rt.calibrate else EXPLORE_SAMPLES
    changed, open_ = False, False
    for i in seg.choices:
        b = seg.bound[i]
        task, kind = b.task, b.worker.kind
        if rt.choose_variant(task, kind) != b.variant:
            seg.bound[i] = bind_task(rt, task, b.worker, b.buffers, seg.dynamic)
            changed = True
        fp = rt.footprint(task)[0]
        open_ = open_ or any(pm.count(task.codelet.name, v, kind, fp) < need
                             for v in rt.candidates(task.codelet, kind))
    if changed:
        seg.groups = _model_groups(seg.bound)
        seg.build_shares()
    return open_
