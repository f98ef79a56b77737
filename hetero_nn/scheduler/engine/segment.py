"""A graph's segment compiled for the replay engine: schedule, bound tasks, shares.

Policy
------
A segment (one recorded flush) is compiled in three steps (see
:mod:`~hetero_nn.scheduler.engine.replay` for when): its tasks grouped in *units* (a task,
or a bundle's members, which stay together on one worker), a fixed schedule of the
units (:func:`~.planning.schedule`), then every task bound for its worker
(:mod:`~hetero_nn.scheduler.engine.bound`) and each worker's *share* laid out as the arrays
of :func:`~hetero_nn.scheduler.engine.dispatch.run_compiled`: its tasks in order, their
trampolines and argument blocks, the predecessors to wait for on other workers (per
other worker the latest in that worker's order: the others come before it) and
whether another worker waits for each task.

Schedules: :mod:`~hetero_nn.scheduler.engine.planning` (``heft``'s plan, or list
scheduling on the costs known; made again once on the engine's own measurements, and
taken only where it gains enough: :func:`replan`). Workers of several kinds (CPU and
CUDA) are served under ``heft`` only (:func:`~hetero_nn.scheduler.engine.replay.unavailable`).
With several memory nodes (CUDA workers, ``host_nodes``) the schedule fixes every
task's node, hence its copies: the segment's data plan
(:mod:`~hetero_nn.scheduler.engine.data_plan`, :func:`_plan_copies`) adds each planned copy
as a unit of its own (counter index ``n + k`` for copy ``k``), just before its first
reader in the workers' merged order, and every task binds to the replicas on its node
as on one node. Where no plan can be made (a node with a memory limit), every task is
*dynamic*: its operands are made coherent on its node (``Runtime.bind``) each run, in
Python. Before a planned replay its inputs are made valid where it reads them, after
it the roots get the coherence state it leaves (:meth:`CompiledSegment.run_copies`,
:meth:`CompiledSegment.copies_done`).

Shares. A CPU worker's share runs through the compiled loop, its Python tasks in
between (:meth:`CompiledSegment.run_share`); a copy between host nodes is one compiled
call there. A CUDA worker's share is enqueued on its stream at once
(:meth:`CompiledSegment.run_stream_share`, the CUDA-graph idea; the same code drives
``cuda-emu``'s emulated stream): per task or copy, in order, it waits on the host only
for predecessors other workers run, launches the variant on the plan's replicas (or
enqueues the copy into or out of the device; a dynamic task binds its operands in the
device's context first, copies in going on the stream, and the node holds them) and
queues a callback that stamps the end and publishes it for the workers waiting on it.
The host waits for the stream once, at the share's end.

State
-----
``units``, ``tasks`` (bundles flattened, segment order; ``n_tasks`` of them),
``planning`` (:class:`~.planning.Planning`), ``schedule`` and ``schedule_arrays``,
``task_preds``, ``bound``, ``data`` (the data plan or None) and ``moves`` (its copies,
bound), ``runs`` (``bound + moves``, by counter index), ``worker_of`` (per unit),
``share_tasks`` (per worker), ``shares``, ``waits_of`` / ``notify_of`` (per counter),
``choices`` (tasks whose variant the model chooses), ``roots`` (the replicas bound,
checked by :meth:`CompiledSegment.moved` before each replay), the run arrays ``done``,
``times``, ``sleepers``, ``abort``, ``wait_stats`` (per share, its waits this replay:
:data:`~.dispatch.STATS`), ``bytes_in`` (``planned_bytes``: each planned
copy's, at its first reader), and ``groups`` (the performance model's keys and their
tasks).
"""

from __future__ import annotations

import numpy as np

from ...codelets.prepared import WorkerBuffers
from .bound import BoundTransfer, bind_task, bound_roots, model_key, moved_to
from .data_plan import schedule_transfers
from .dispatch import (ABORTED, CUT, OPEN, STATS, now_ns, publish, run_compiled, set_abort,
                       spin_budget, wait_done, wake)
from .intrinsics import clock_offset
from .contention import WATCHDOG, Contention, serial_order
from .planning import Planning, better_schedule, schedule_arrays
from .planning import schedule as plan_schedule
from ..executors.stalls import timeout_ns
from ..policies.list_scheduling import check_orders
from ..variants import EXPLORE_SAMPLES


class Share:
    """One worker's part of a compiled segment: the arrays of ``run_compiled``."""

    __slots__ = ("worker", "row", "order", "python", "entry_start", "trampolines", "blocks",
                 "wait_start", "waits", "notify")

    def __init__(self, worker, tasks, bound, waits_of, notify_of, row=0):
        self.worker = worker
        self.row = row  # its row of the segment's wait_stats
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

    def __init__(self, rt, segment, previous=None, buffers=None, schedule=None):
        """Compile ``segment``; ``previous``: its last compilation, whose measured times
        plan this one and whose bound tasks are kept where their worker is (or moved to
        another of its node and kind, :func:`~.bound.moved_to`); ``buffers``:
        the workers' scratch buffers (worker index -> WorkerBuffers), the runtime's;
        ``schedule``: ``(worker_of, orders)`` when already made (:func:`replan`)."""
        self.unit_graph = _units(segment) if previous is None else previous.unit_graph
        units, unit_preds, self.tasks, self.task_preds, self.unit_of_task = self.unit_graph
        self.planning = Planning(rt, segment, units, unit_preds, self.tasks) \
            if previous is None else previous.planning
        self.rt = rt
        self.multinode = len(rt.nodes) > 1
        n = self.n_tasks = len(self.tasks)
        workers = self.workers = rt.workers
        self.spin_ns = spin_budget(len(workers))  # one thread per worker's share
        self.timeout_ns = timeout_ns(rt.wait_timeout)
        if schedule is None:
            schedule = plan_schedule(rt, segment, units, unit_preds, None if previous is None
                                     else self.planning.measured_costs(previous.times),
                                     self.tasks, self.planning)
        self.worker_of, orders = self.schedule = schedule
        self.schedule_arrays = None if self.multinode or not self.planning.single_kind \
            else schedule_arrays(schedule)  # what a re-plan compares with (planning.py)
        self.data, self.moves = None, []
        if self.multinode:  # the copies between nodes, fixed by the schedule (data_plan.py)
            planned = _plan_copies(self, rt, units, unit_preds, orders)
            if planned is not None:
                self.data, units, unit_preds, orders, self.worker_of = planned
                self.moves = [None] * len(self.data.transfers)
        self.dynamic = self.multinode and self.data is None  # operands acquired at every run
        self.units = units
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
                    if t >= n:
                        self.moves[t - n] = BoundTransfer(self.data.transfers[t - n], worker)
                        continue
                    kept = previous.bound[t] if previous is not None and \
                        previous.dynamic == self.dynamic else None
                    self.bound[t] = moved_to(kept, worker, buf) or \
                        bind_task(rt, self.tasks[t], worker, buf, self.dynamic)
        self.roots = [] if self.dynamic else bound_roots(self.bound)  # moved() checks them
        n = n + len(self.moves)  # counters, stamps: the tasks, then the planned copies
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
        if previous is None and self.schedule_arrays is not None:  # the re-plan's compiled
            self.planning.makespan(self.planning.measured_costs(self.times),  # passes loaded
                                   self.schedule_arrays)  # now, not inside the 2nd replay
        self.bytes_in = np.zeros(n, dtype=np.int64)
        self.planned_bytes = np.zeros(n, dtype=np.int64)  # each copy's, at its first reader
        for x in self.data.transfers if self.data is not None else ():
            self.planned_bytes[x.first] += x.nbytes
        self.sleepers = np.zeros(1, dtype=np.int32)
        self.abort = np.zeros(1, dtype=np.int32)
        self.wait_stats = np.zeros((len(workers), len(STATS)), dtype=np.int64)  # per share
        self.groups = _model_groups(self.bound)
        one_thread_serves = len(self.shares) > 1 and not self.multinode and \
            all(w.stream is None for w in workers)
        engine = getattr(rt, "_engine", None)  # its last segment's mode starts this one's
        self.contention = Contention(getattr(engine, "mode", "parallel")) \
            if one_thread_serves else None

    def rekey(self):
        """The bound tasks' performance-model keys made again: the runtime's model is
        another than at binding (a capture inside ``Runtime.measuring(None)``)."""
        for b in self.bound:
            b.model_key = model_key(self.rt, b)
        self.groups = _model_groups(self.bound)

    def serial_share(self):
        """Every task in one share of the first worker (contention.py's serial mode)."""
        if self._serial is None:
            n = len(self.runs)
            self._serial = Share(self.workers[0], serial_order(self), self.runs, [()] * n,
                                 [False] * n)
        return self._serial

    def jobs(self, shares, epoch, cut_ns=0):
        """The calls that run ``shares`` at replay ``epoch``, for ``EngineThreads.run``:
        the first on the calling thread, under the :data:`~.contention.WATCHDOG` (a CPU
        worker's share, where the runtime has a deadline), each other on an engine thread.
        ``cut_ns``: a try's cutoff, where the first share's waits stop it once it has lost
        (:data:`~.dispatch.CUT`; 0: none)."""
        self.running = shares  # what executors.stalls.engine_state reports
        jobs = [lambda s=s: self.run(s, epoch) for s in shares]
        first = shares[0]
        jobs[0] = lambda: self.run(first, epoch, cut_ns=cut_ns)
        if first.worker.stream is None and self.rt.wait_timeout is not None:
            jobs[0] = lambda: WATCHDOG.watch(self, epoch,
                                             lambda: self.run(first, epoch, cut_ns=cut_ns))
        return jobs

    def run_stream_share(self, share, epoch):
        """Enqueue a CUDA worker's share on its stream, then wait for the stream once;
        returns None, or ``(task index, exception)``."""
        return _run_stream_share(self, share, epoch)

    def build_shares(self):
        """(Re)make the shares' arrays from the bound tasks (after a rebind)."""
        self.runs = self.bound + self.moves  # by counter index
        self.layout = None  # what its replays' trace records read (replay.record_layout)
        self._serial = None  # the serial share (contention.py), made when first used
        self.running = None  # the shares of the replay under way (jobs)
        self.shares = [Share(w, tasks, self.runs, self.waits_of, self.notify_of, i)
                       for i, (w, tasks) in enumerate(zip(self.workers, self.share_tasks))]

    @property
    def python_tasks(self) -> int:
        """Tasks of this segment that run as Python."""
        return sum(b.calls is None for b in self.bound)

    def moved(self) -> bool:
        """Whether a root's replica bound here was dropped or replaced since (evicted,
        unregistered): the segment must bind again before it replays."""
        for root, i, arr in self.roots:
            if root._replicas.get(i) is not arr:
                return True
        return False

    def run_copies(self):
        """Before a replay: the inputs made valid where the data plan reads them."""
        self.bytes_in[:] = self.planned_bytes
        self.data.prologue(self.rt.nodes, self.bytes_in)

    def copies_done(self, failed):
        """After a replay: the roots' coherence state as the plan leaves it (after a
        failure, as what ran left it), and the compiled host copies reported (traced, fed
        to the transfer model)."""
        n = self.n_tasks
        self.data.epilogue(None if not failed else np.concatenate(
            [self.times[:n, 0] != 0, self.times[n:, 1] != 0]))
        copied = self.rt._binder.copied
        offset = clock_offset()
        for i, b in enumerate(self.moves, start=self.n_tasks):
            t0, t1 = self.times[i]
            if b.calls is not None and t0:
                x = b.transfer
                copied(x.src, x.dst, x.nbytes, t0 * 1e-9 + offset, t1 * 1e-9 + offset)

    def run(self, share, epoch, gate=OPEN, cut_ns=0):
        """Run one share (any thread): a CUDA worker's on its stream, a CPU worker's
        through the compiled loop (``gate``: an early replay's, :mod:`~.early`). Returns
        None, or ``(task index, exception)`` (``(None, exception)`` when the engine itself
        failed: the other shares are aborted too)."""
        try:
            if share.worker.stream is not None:
                return self.run_stream_share(share, epoch)
            return self.run_share(share, epoch, gate, cut_ns)
        except BaseException as exc:  # noqa: BLE001 - the engine's own fault, not a task's
            set_abort(self.abort, self.done, self.notify_tasks)
            if isinstance(exc, KeyboardInterrupt):
                raise  # the other shares stop; EngineThreads.run waits for them
            return None, exc

    def run_share(self, share, epoch, gate=OPEN, cut_ns=0):
        """Run a CPU worker's share; returns None, or ``(task index, exception)``. Behind a
        ``gate`` its waits have no deadline (a program's pause while it submits is no
        stall): the early replay's join has it (:mod:`~.early`). ``cut_ns``: a try's
        cutoff (:func:`~.dispatch.run_compiled`; the caller finishes a cut replay)."""
        n = len(share.order)
        k = 0
        done, times, sleepers, abort = self.done, self.times, self.sleepers, self.abort
        deadline = self.timeout_ns if gate is OPEN else timeout_ns(None)
        while True:
            r = run_compiled(k, share.order, share.python, share.entry_start, share.trampolines,
                             share.blocks, share.wait_start, share.waits, share.notify, done,
                             times, epoch, sleepers, abort, self.spin_ns, deadline, gate,
                             self.wait_stats[share.row], cut_ns)
            if r == n:
                return None
            if r == ABORTED:
                if abort[0] == CUT:  # the other shares' sleepers see it now
                    wake(done, self.notify_tasks)
                return None
            if r >= 0:  # a Python task, its predecessors done
                t = int(share.order[r])
                b = self.runs[t]
                times[t, 0] = now_ns()
                try:
                    b.run_python()
                except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                    times[t, 1] = now_ns()
                    set_abort(abort, done, self.notify_tasks)
                    return t, exc
                times[t, 1] = now_ns()
                if self.dynamic:
                    self.bytes_in[t] = b.task.bytes_in
                if share.notify[r]:
                    publish(done, t, epoch, sleepers)
                k = r + 1
                continue
            t = int(share.order[-(r + 2)])
            set_abort(abort, done, self.notify_tasks)
            try:  # name the exception the compiled kernel could not carry out of the loop
                self.runs[t].run_python()
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
        """The kernel as the stream runs it (a launch into CuPy's stream on a GPU);
        ``arrays`` None: the task's own (bound to the plan's replicas)."""
        seg = self.seg
        try:
            start = now_ns()
            if start > seg.times[t, 0]:
                seg.times[t, 0] = start
            b = seg.bound[t]
            if arrays is None:
                b.run_python()
            else:
                b.fn(*arrays, **b.task.params)
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
            if self.failure is None:
                self.failure = (t, exc)
            set_abort(seg.abort, seg.done, seg.notify_tasks)

    def completed(self, t, notify):
        """Stream callback: task (or copy) ``t`` is done; publish it (not if it raised).
        A fault here fails the replay (the waiters see the abort): nothing escapes."""
        seg = self.seg
        try:
            end = now_ns()
            if seg.dynamic:
                self.worker.node.release(seg.bound[t].task.handles)
            if self.last_end > seg.times[t, 0]:
                seg.times[t, 0] = self.last_end  # it waited for the task before on the stream
            seg.times[t, 1] = self.last_end = end
            if notify and (self.failure is None or self.failure[0] != t):
                publish(seg.done, t, self.epoch, seg.sleepers)
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
            if self.failure is None:
                self.failure = (t, exc)
            set_abort(seg.abort, seg.done, seg.notify_tasks)


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
                if not wait_done(done, share.waits[j], epoch, sleepers, abort, seg.spin_ns,
                                 seg.timeout_ns, seg.wait_stats[share.row]):
                    return None  # another share failed: its error is the flush's
            try:
                if t >= seg.n_tasks:  # a planned copy into or out of this device
                    times[t, 0] = now_ns()
                    seg.runs[t].enqueue()
                elif not seg.dynamic:  # bound to the plan's replicas
                    times[t, 0] = now_ns()
                    with node.context():
                        stream.launch(run.on_stream, t, None)
                else:
                    _launch_dynamic(rt, seg, run, t, w)
            except BaseException as exc:  # noqa: BLE001 - binding failed: the flush's error
                times[t, 1] = now_ns()
                set_abort(abort, done, seg.notify_tasks)
                return t, exc
            stream.add_callback(lambda t=t, notify=bool(share.notify[k]):
                                run.completed(t, notify))
    finally:
        stream.synchronize()
    return run.failure


def _launch_dynamic(rt, seg, run, t, w):
    """Launch task ``t`` on ``w``'s stream, its operands acquired on the device now (the
    copies in go on the stream first); the node holds them until the task's callback."""
    node, stream, task = w.node, w.stream, seg.bound[t].task
    node.hold(task.handles)
    try:
        with node.context(), stream.activate():
            arrays = rt.bind(task, w)
            seg.bytes_in[t] = task.bytes_in
            seg.times[t, 0] = now_ns()  # launched; the stream stamps the real start
            stream.launch(run.on_stream, t, arrays)
    except BaseException:
        node.release(task.handles)
        raise


def replan(rt, segment, previous, buffers):
    """``segment`` planned again on the times ``previous`` (its compilation) measured:
    ``previous`` itself unless the new plan gains enough (nothing bound, laid out or
    measured is made again: :func:`~.planning.better_schedule`), else compiled again on
    that plan, its bound tasks kept where they keep their worker (:class:`CompiledSegment`)."""
    schedule = better_schedule(previous)
    if schedule is None:
        return previous
    return CompiledSegment(rt, segment, previous, buffers, schedule)


def _plan_copies(seg, rt, units, unit_preds, orders):
    """``(data plan, units, unit preds, orders, worker of each unit)`` with the plan's
    transfers as units of their own (task ``n + k`` for transfer ``k``), each placed just
    before its first reader's unit in the merged order and given to the worker that runs
    it (module docstring of :mod:`~hetero_nn.scheduler.engine.data_plan`); None when the segment
    cannot be planned (its tasks then acquire their operands at every run)."""
    workers, unit_of, n = rt.workers, seg.unit_of_task, seg.n_tasks
    merged = check_orders(orders, unit_preds)
    node_of = [workers[seg.worker_of[unit_of[t]]].node for t in range(n)]
    data = schedule_transfers(rt.nodes, seg.tasks, node_of, [t for u in merged for t in units[u]])
    if data is None:
        return None
    first_unit = len(units)
    units = units + [[n + k] for k in range(len(data.transfers))]
    preds = [list(ps) for ps in unit_preds]
    worker_of = list(seg.worker_of)
    position = {u: i for i, u in enumerate(merged)}
    before: dict = {}
    for k, x in enumerate(data.transfers):
        u = unit_of[x.first]
        ps = {unit_of[w] for w in x.writers} | {first_unit + j for j in x.after}
        if u in ps:  # written inside the reader's own bundle: no place between them
            return None
        preds.append(sorted(ps))
        before.setdefault(u, []).append(first_unit + k)
        if x.src.kind == "cuda" and x.dst.kind != "cuda":  # out of a device: its stream
            on_src = [unit_of[w] for w in x.writers]
            worker_of.append(worker_of[max(on_src, key=position.get)] if on_src else
                             next(i for i, w in enumerate(workers) if w.node is x.src))
        else:  # host to host, or into a device: its first reader's worker
            worker_of.append(worker_of[u])
    for t, through in data.waits.items():
        preds[unit_of[t]] = sorted(set(preds[unit_of[t]]) | {first_unit + k for k in through})
    placed = [v for u in merged for v in (*before.get(u, ()), u)]
    orders = [[] for _ in workers]
    for u in placed:
        orders[worker_of[u]].append(u)
    check_orders(orders, preds)  # one topological order by construction
    return data, units, preds, orders, worker_of


def _units(segment):
    """``(units, unit preds, tasks, task preds, unit of task)`` of a segment: bundles
    flattened into their members (module docstring of :mod:`schedule`)."""
    unit_of = {}
    units, tasks, task_preds, unit_of_task = [], [], [], []
    for t, _, _ in segment:
        members = t.members or (t,)
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
