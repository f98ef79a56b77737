"""The replay engine: a captured graph run through bound tasks, fixed schedules and a
compiled dispatch loop.

Policy
------
``graph.replay()`` on a runtime the engine serves (:func:`unavailable` says which)
runs each recorded flush (*segment*) as follows. At the first replay, and once
more after the first one measured its own tasks, the segment is *compiled*:

1. a fixed schedule (:mod:`~hetero_nn.scheduler.schedule`): ``heft``'s plan when
   the policy is ``heft``, else list scheduling on the costs known (the last
   compiled run's times; before one, the performance model's predictions, or the
   capture run's times with each (codelet, footprint)'s median standing for all of
   them, so a first run's compilation does not count);
2. every task bound for its worker (:mod:`~hetero_nn.scheduler.bound`);
3. per worker a *share*: its tasks in order, with their trampolines, argument
   blocks, the predecessors to wait for on other workers and whether another
   worker waits for them (:mod:`~hetero_nn.scheduler.dispatch`).

With ``deterministic=False`` a task's variant is the performance model's choice: while
the model still explores (a candidate with fewer runs than exploration asks), each
replay first binds again the tasks whose choice changed; once every choice is settled
no replay looks at variants again.

A replay then resets the node arenas, runs the shares at once (the calling
thread runs worker 0's, one engine thread per other worker runs the others),
each through :func:`~hetero_nn.scheduler.dispatch.run_compiled` without the
interpreter lock, Python tasks in between, and ends the flush as ``wait()``
does. No task object, policy hook, variant choice, handle lock or dependency
count is touched per task.

Measurement: the loop stamps each task's start and end into the segment's
``times``. After the run, the performance model gets one batch per model key
(the first run of a key in the process is a warm-up and is dropped, as
``Runtime`` does), each worker's ``busy`` time grows, and the trace gets one
:class:`ReplayRecords`: the records are made from the stamps when the trace is
read.

Failures: a task that raises (in its kernel or in Python) stops its share and
sets ``abort``, which every other share sees at its next wait (a futex sleep
lasts at most ``WAIT_NS``); the first failure is raised as the flush's
``TaskError`` naming the task, codelet, variant and worker. A compiled kernel's
exception cannot cross the loop, so the task is run once more in Python to name
it. The runtime and the graph stay usable.

Step parameters
---------------
``graph.param(name, value)`` (while capturing) gives a number that is a plain
``float``/``int`` to every task that receives it; ``graph.replay(name=new)`` then
sets that parameter of those tasks (and prepares them again) without a handle per
value. Names are declared once per graph.

State
-----
:class:`CompiledGraph` (``graph._compiled``): its segments, the replay count
(``epoch``, what the counters compare to), the step parameters' uses.
:class:`CompiledSegment`: ``units`` (tasks or a bundle's members), ``tasks`` (in
segment order, bundles flattened), ``bound``, ``worker_of``, ``shares``, and
the arrays ``done``, ``times``, ``sleepers``, ``abort``.
:class:`EngineThreads` (``runtime._engine``): one thread per worker but the first.
"""

from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time

import numpy as np

from ..codelets.prepared import WorkerBuffers
from ..errors import SubmitError, TaskError
from .bound import bind_task
from .bundle import Bundle
from .dispatch import ABORTED, now_ns, publish, run_compiled, set_abort
from .intrinsics import HAVE_CLOCK, clock_offset
from .local import LocalExecutor
from .policies import UNKNOWN_COST
from .schedule import fixed_orders
from .trace import TaskRecord
from .variants import EXPLORE_SAMPLES

_perf = time.perf_counter
ENGINE_FUSES = ("the compiled replay engine runs each task by one indirect call: no dispatch "
                "left for a bundle to save")


def unavailable(rt) -> str | None:
    """Why ``rt``'s replays cannot use the engine, or None when they can."""
    if getattr(rt, "replay_engine", "compiled") != "compiled":
        return f"replay_engine={rt.replay_engine!r}"
    if rt.executor_name != "local":
        return f"the {rt.executor_name!r} executor runs graphs as Dask graphs"
    if type(rt.executor) is not LocalExecutor:
        return f"the executor was replaced ({type(rt.executor).__name__})"
    if any(w.kind != "cpu" for w in rt.workers):
        return "CUDA workers replay through the executor (their streams)"
    if len(rt.nodes) != 1:
        return "more than one memory node (transfers replay through the executor)"
    if not HAVE_CLOCK:
        return "no clock_gettime on this platform"
    return None


# ----------------------------------------------------------------------------- step parameters

class FloatParam(float):
    """A step parameter's value at capture, a ``float`` to the tasks that get it."""

    __slots__ = ("param_name",)


class IntParam(int):
    """A step parameter's value at capture, an ``int`` to the tasks that get it."""


def step_param(name, value):
    """The placeholder ``Graph.param`` returns: ``value`` carrying its parameter name."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"step parameter {name!r}: expected an int or a float, "
                        f"got {type(value).__name__}")
    p = (IntParam if isinstance(value, (int, np.integer)) else FloatParam)(value)
    p.param_name = name
    return p


def param_uses(segments) -> dict:
    """``{name: [(task, key), ...]}``: where the step parameters reach the tasks."""
    uses: dict = {}
    for segment in segments:
        for t, _, _ in segment:
            for member in (t.members if t.__class__ is Bundle else (t,)):
                for key, value in member.params.items():
                    if isinstance(value, (FloatParam, IntParam)):
                        uses.setdefault(value.param_name, []).append((member, key))
    return uses


# ----------------------------------------------------------------------------- threads

class EngineThreads:
    """One thread per worker but the first, each running the shares given to it."""

    def __init__(self, count):
        self._queues = [queue.SimpleQueue() for _ in range(count)]
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True,
                                          name=f"hetero_nn-replay{i + 1}")
                         for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _loop(q):
        while True:
            job = q.get()
            if job is None:
                return
            job()

    def run(self, jobs):
        """Run ``jobs[0]`` here and ``jobs[i]`` on thread ``i - 1``; return their results."""
        results = [None] * len(jobs)
        finished = threading.Semaphore(0)

        def wrap(i, job):
            def run():
                try:
                    results[i] = job()
                finally:
                    finished.release()
            return run
        for i in range(1, len(jobs)):
            self._queues[i - 1].put(wrap(i, jobs[i]))
        try:
            results[0] = jobs[0]()
        finally:
            for _ in range(1, len(jobs)):
                finished.acquire()
        return results

    def close(self):
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()


# ----------------------------------------------------------------------------- segments

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

    def __init__(self, rt, segment, previous=None):
        """Compile ``segment``; ``previous``: its last compilation, whose measured times
        plan this one and whose bound tasks are kept where their worker is."""
        units, unit_preds, self.tasks, self.task_preds, self.unit_of_task = _units(segment)
        self.units = units
        n = len(self.tasks)
        workers = self.workers = rt.workers
        costs_ns = None if previous is None else previous.times[:, 1] - previous.times[:, 0]
        self.worker_of, orders = _schedule(rt, segment, units, unit_preds, costs_ns,
                                           self.tasks)
        self.buffers = {} if previous is None else previous.buffers
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
                        bind_task(rt, self.tasks[t], worker, buf)
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
        self.sleepers = np.zeros(1, dtype=np.int32)
        self.abort = np.zeros(1, dtype=np.int32)
        self.groups = _model_groups(self.bound)

    def build_shares(self):
        """(Re)make the shares' arrays from the bound tasks (after a rebind)."""
        self.shares = [Share(w, tasks, self.bound, self.waits_of, self.notify_of)
                       for w, tasks in zip(self.workers, self.share_tasks)]

    @property
    def python_tasks(self) -> int:
        """Tasks of this segment that run as Python."""
        return sum(b.calls is None for b in self.bound)

    def run_share(self, share, epoch):
        """Run one share (any thread); returns None, or ``(task index, exception)``."""
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
                times[t, 0] = now_ns()
                try:
                    self.bound[t].run_python()
                except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                    times[t, 1] = now_ns()
                    set_abort(abort, done, self.notify_tasks)
                    return t, exc
                times[t, 1] = now_ns()
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
    """``(worker_of per unit, orders)``: heft's plan, or :func:`plan` on known costs."""
    index = {w: i for i, w in enumerate(rt.workers)}
    heads = [t for t, _, _ in segment]
    planned = costs_ns is None and rt.policy_name == "heft" and all(
        t.assigned is not None for t in heads)
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

def set_params(graph, values) -> None:
    """Give ``graph``'s declared step parameters new values (``Graph.replay(**values)``):
    the tasks that take them get them, and are prepared again where compiled."""
    unknown = sorted(set(values) - set(graph._params))
    if unknown:
        raise SubmitError(f"Graph.replay: {unknown} are not step parameters of this graph "
                          f"(declared: {sorted(graph._params) or 'none'}; see Graph.param)")
    uses = getattr(graph, "_param_uses", None)
    if uses is None:
        uses = graph._param_uses = param_uses(graph._segments)
    changed = set()
    for name, value in values.items():
        for task, key in uses.get(name, ()):
            task.params[key] = value
            changed.add(task)
    compiled = graph._compiled
    if changed and compiled is not None and compiled.segments is not None:
        for seg in compiled.segments:
            hit = [i for i, t in enumerate(seg.tasks) if t in changed]
            for i in hit:
                seg.bound[i].rebind()
            if hit:
                seg.build_shares()


class CompiledGraph:
    """A graph's compiled segments and replay state (module docstring)."""

    def __init__(self, graph):
        self.graph = graph
        self.segments = None
        self.epoch = 0
        self.replanned = False
        self.exploring = True  # until the model's choice of every variant has settled

    def run(self, rt):
        """Replay every segment (compiling them first when needed)."""
        if self.segments is None:
            self.segments = [CompiledSegment(rt, s) for s in self.graph._segments]
        elif not self.replanned:  # once: plan again on the engine's own measured times
            self.replanned = True
            self.segments = [CompiledSegment(rt, s, seg)
                             for s, seg in zip(self.graph._segments, self.segments)]
        if self.exploring:
            self.exploring = any([_explore(rt, seg) for seg in self.segments])
        threads = _threads(rt)
        for seg in self.segments:
            self.epoch += 1
            _run_segment(rt, seg, self.epoch, threads)


def _explore(rt, seg) -> bool:
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
            seg.bound[i] = bind_task(rt, task, b.worker, b.buffers)
            changed = True
        fp = rt.footprint(task)[0]
        open_ = open_ or any(pm.count(task.codelet.name, v, kind, fp) < need
                             for v in rt.candidates(task.codelet, kind))
    if changed:
        seg.groups = _model_groups(seg.bound)
        seg.build_shares()
    return open_


def _threads(rt):
    engine = getattr(rt, "_engine", None)
    if engine is None:
        engine = rt._engine = EngineThreads(len(rt.workers) - 1)
    return engine


_ids_lock = threading.Lock()


def _run_segment(rt, seg, epoch, threads):
    for node in rt.nodes:
        node.arena.reset()
    n = len(seg.tasks)
    with _ids_lock:  # fresh task ids for the records, as a submitted flush would take
        base = next(rt._ids)
        rt._ids = itertools.count(base + n)
    seg.times[:] = 0
    seg.abort[0] = 0
    t_submit = _perf()
    results = threads.run([lambda s=s: seg.run_share(s, epoch) for s in seg.shares])
    failures = [r for r in results if r is not None]
    rt._flushes.generation += 1
    if rt.tracing:
        rt._flushes.records.append(ReplayRecords(seg, seg.times.copy(), base, t_submit,
                                         failures[0] if failures else None))
    if failures:
        t, exc = failures[0]
        b = seg.bound[t]
        task_id = base + t
        err = TaskError(f"task {task_id} (codelet {b.task.codelet.name!r}, variant "
                        f"{b.variant!r}, worker {b.worker.name}) failed: "
                        f"{type(exc).__name__}: {exc}", codelet=b.task.codelet.name,
                        task_id=task_id)
        raise err from exc
    _measure(rt, seg)


def _measure(rt, seg):
    """After a successful run: busy time per worker, samples for the performance model."""
    durations = seg.times[:, 1] - seg.times[:, 0]
    for share in seg.shares:
        share.worker.busy += float(durations[share.order].sum()) * 1e-9
    pm = rt.perfmodel
    if pm is None:
        return
    warm = rt._variants._warm
    for (codelet, variant, kind, fp, size), idx in seg.groups:
        seconds = durations[idx] * 1e-9
        wkey = (codelet, variant, fp)
        if wkey not in warm:  # the first run of a key in this process: a warm-up
            warm.add(wkey)
            seconds = seconds[1:]
        pm.record_array(codelet.name, variant, kind, fp, size, seconds)


def expand_records(records) -> list:
    """A flushes' ``records`` list with every :class:`ReplayRecords` made into its records."""
    return [r for chunk in records
            for r in (chunk if type(chunk) is ReplayRecords else (chunk,))]


class ReplayRecords:
    """The trace records of one compiled replay of a segment, made when read."""

    __slots__ = ("seg", "times", "base", "t_submit", "failure")

    def __init__(self, seg, times, base, t_submit, failure):
        self.seg = seg
        self.times = times
        self.base = base
        self.t_submit = t_submit
        self.failure = failure

    def __iter__(self):
        seg, times, base = self.seg, self.times, self.base
        offset = clock_offset()
        start = times[:, 0] * 1e-9 + offset
        end = times[:, 1] * 1e-9 + offset
        failed = self.failure[0] if self.failure is not None else -1
        for i, b in enumerate(seg.bound):
            if times[i, 0] == 0:
                continue  # not run (the replay failed first)
            preds = seg.task_preds[i]
            ready = max((float(end[p]) for p in preds), default=self.t_submit)
            ready = max(ready, self.t_submit)
            w = b.worker
            error = None
            if i == failed:
                exc = self.failure[1]
                error = f"{type(exc).__name__}: {exc}"
            yield TaskRecord(base + i, b.task.codelet.name, b.variant, w.name, w.device,
                             w.node.name, self.t_submit, ready, float(start[i]), float(end[i]),
                             0, tuple(base + p for p in preds), error)
