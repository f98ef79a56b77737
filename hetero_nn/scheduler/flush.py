"""The flush lifecycle: from the first submission after a synchronisation point to the
end of the next one.

Policy
------
Execution overlaps submission (StarPU's behaviour): with the local executor a
submitted task whose predecessors have finished goes to the policy at once and
may run while the program goes on submitting. ``wait()`` / ``fetch()`` are the
synchronisation points: they combine pending reductions, block until every
task submitted has finished and end the *flush* (a generation). Submitted tasks
instead accumulate until ``wait()``, which hands the closed DAG to the executor,
where the whole graph is needed or streaming is not possible: a policy that
defines ``prepare`` (``heft`` plans the whole step statically), the Dask
executors (one Dask graph per flush), a capture (each recorded task keeps its
full successor list), a runtime with CUDA (or emulated CUDA) workers, and
``Runtime(overlap=False)`` (kept for study). CUDA workers are left out: runs of
the suite hung in the emulated-device property test with streaming, through a
lock-order inversion (a policy reading a handle's validity under its lock while
placing under the executor's; fixed, see ``Handle.valid_hint``) that streaming
made likelier; streaming there waits for more runs. Their streams already
overlap launches with execution.

A flush begins at its first submission: it decides then whether it streams,
and, streaming, resets the node arenas (nothing of the previous flush runs any
more); a closed DAG resets them when it is handed over, after its temporaries are laid out in one
region per node from their lifetimes (:mod:`~hetero_nn.scheduler.lifetimes`). It ends when its tasks
have run (or failed): the dependency state is dropped, the generation advances
(temporaries of the flush expire), measurements go to the performance model and
executed tasks become trace records.

State
-----
``pending``: tasks submitted since the last flush, in submission order (a topological
order, unless ``Runtime.add_dependency`` made a task wait for one submitted after it: then
``reordered`` is set and ``wait`` hands the executor, the arena's layout and a capture the
tasks in :func:`topological` order instead), whether they have run or not. ``streaming``:
whether this flush's tasks go to the executor as they are submitted (``hand_over``, what
the runtime gives a submitted task to, is then the executor's ``add``; otherwise
:meth:`Flushes.add`). ``generation``: number of flushes run; temporaries (arena-backed
handles, REDUX partials) belong to one generation. ``capturing``: the
:class:`~hetero_nn.scheduler.capture.Graph` being recorded, or None. ``records``: the
trace records of the flush's tasks, flat (each record's fields extend one list,
:class:`~hetero_nn.scheduler.trace.records.FlatRecords`; the local and sync executors add
each as its task ends); at the flush's end they go to the runtime's bounded
:class:`~hetero_nn.scheduler.trace.buffer.TraceBuffer` (``rt._trace``) as one unit.
``memory``: per flush run as one DAG, its temporaries' lifetimes (trace memory records),
as many flushes as the trace buffer keeps. ``collector``: the open flush's share of the garbage
collector's raised young threshold (:class:`Collector`), from its first task (or closed
DAG, or replay) to its end.

The garbage collector while flushes run
---------------------------------------
A submitted task allocates a few objects the collector tracks (the task, its operands'
tuple, its dependency lists; automatic capture keeps each call of a new shape), most of
them alive until the task has run. With CPython's default thresholds (a young collection
every 700 such allocations, an older one every 10 of those, a full one every 10 older
ones where enough has survived) a 10,000-task flush set off 60-80 young collections, 5-8
older ones and, every second or third flush, a full one, which walks every object of
the process (the imports alone are about 95,000: 70 ms of CPU on the 2-core machine).
In all they took 2.5-12 us of CPU a task, as much as the submission itself (measured
with ``gc.callbacks``: docs/benchmarks.md, "Submission and the garbage collector"). So while
any flush of any runtime is open, :class:`Collector` keeps the young threshold at
least :data:`FLUSH_THRESHOLD`: collections still run (cyclic garbage is still freed, at
most that many allocations later), but a flush's tasks have mostly run and died before
one comes, and the older and full collections come about 70 times less often. The
program's thresholds come back when the last open flush ends, unless it set others
meanwhile. Results do not depend on it, only when garbage cycles are freed.

The threshold is above what a 10,000-task flush keeps alive (about 5 tracked objects a
task: the workers get the interpreter lock only now and then while the program submits,
so most of a streamed flush's tasks are still alive when it is submitted): at 50,000 such
a flush met one young collection that walked all of them (45-60 ms at load 6-7 on the
2-core machine, 20% of the submitting thread's time) and moved them to the older
generation, to be walked again. At :data:`FLUSH_THRESHOLD` the collection comes after
the flush, when its tasks are gone: it walks only what outlives them (the trace's
records, automatic capture's calls).
"""

from __future__ import annotations

from collections import deque
import contextlib
import gc
from operator import attrgetter
import heapq
import threading

from ..errors import TaskError
from .trace.buffer import TraceBuffer
from .trace.records import FlatRecords


#: The garbage collector's young threshold while a flush is open (CPython's default: 700).
FLUSH_THRESHOLD = 200_000


class Collector:
    """The young threshold of the garbage collector, raised while any flush of the process
    is open (module docstring). Class state, under ``_lock``: ``open``, flushes holding it;
    ``saved``, the thresholds the first found; ``set``, those it set."""

    _lock = threading.Lock()
    open = 0
    saved = None
    set = None

    @classmethod
    def hold(cls) -> None:
        """A flush opens: the first one open raises the young threshold."""
        with cls._lock:
            if cls.open == 0:
                cls.saved = gc.get_threshold()
                if 0 < cls.saved[0] < FLUSH_THRESHOLD:  # 0: the program turned collection off
                    gc.set_threshold(FLUSH_THRESHOLD, *cls.saved[1:])
                cls.set = gc.get_threshold()
            cls.open += 1

    @classmethod
    def release(cls) -> None:
        """A flush ends: the last one open gives the program its thresholds back."""
        with cls._lock:
            if cls.open == 0:
                return
            cls.open -= 1
            if cls.open == 0:
                if gc.get_threshold() == cls.set:  # else the program changed them meanwhile
                    gc.set_threshold(*cls.saved)
                cls.saved = cls.set = None


class CollectorShare:
    """One holder's share of :class:`Collector`'s raised threshold (a runtime's open flush,
    a flush automatic capture keeps): taken at most once, given back at most once."""

    __slots__ = ("held",)

    def __init__(self):
        self.held = False

    def hold(self) -> None:
        if not self.held:
            self.held = True
            Collector.hold()

    def release(self) -> None:
        if self.held:
            self.held = False
            Collector.release()


class Flushes:
    """One runtime's flush lifecycle (see the module docstring)."""

    def __init__(self, runtime):
        self.rt = runtime
        self.pending: list = []
        self.open = False
        self.first_id = 0  # the id of the flush's first task: later ones belong to it
        self.streaming = False
        self.generation = 0
        self.capturing = None
        self.records: list = []  # this flush's trace records (flat), one list for its life
        self.memory: deque = deque(maxlen=runtime._trace.flushes)
        self.reordered = False  # a dependency on a task submitted later (add_dependency)
        self.sink = None  # recording without running: takes the closed DAGs (recording)
        self.hand_over = self.add  # a submitted task's way in: add, or the executor's add
        self.collector = CollectorShare()  # the open flush's share of the raised threshold

    def add(self, task):
        """Take a task just submitted, its ``preds`` (from dependency inference) set."""
        if not self.open:
            self._begin(task)
        if self.streaming:  # the executor holds it; finished, nothing keeps it alive
            self.rt.executor.add(task)
            return
        self.pending.append(task)
        if task.preds:
            task.npred = len(task.preds)
            for p in task.preds:
                if p.succ:
                    p.succ.append(task)
                else:
                    p.succ = [task]

    def _begin(self, task):
        """The first submission since a flush ended: decide whether this flush streams;
        streaming, the arenas are reset now (nothing of the previous flush runs)."""
        rt = self.rt
        self.open = True
        self.first_id = task.id
        self.collector.hold()
        self.streaming = rt.overlap and self.capturing is None and self.sink is None
        if self.streaming:
            self.hand_over = rt.executor.add  # the flush's next tasks: no call more per task
            for node in rt.nodes:
                node.arena.reset()

    def wait(self):
        """Block until every task of the flush has run (handing them to the executor
        first where they were not streamed to it), then end the flush."""
        if not self.open:
            return
        tasks, self.pending = self.pending, []
        if self.reordered:
            self.reordered = False
            try:
                tasks = topological(tasks)
            except TaskError:
                self.end(tasks, failed=True)
                raise
        if self.streaming:
            try:
                self.rt.executor.drain()
            except BaseException:
                self.end(tasks, failed=True)
                raise
            self.end(tasks)
            return
        lifetimes = self.rt._temporaries.lay_out(tasks, self.generation, self.capturing)
        if self.capturing is not None:
            self.capturing._segments.append([(t, t.preds, t.succ) for t in tasks])
            self.capturing._lifetimes.append(lifetimes)
        self.run(tasks, False, lifetimes)

    def begin(self, lifetimes=None):
        """A closed DAG starts to run (on the executor, or compiled: a replay): the node
        arenas reset, its temporaries (``lifetimes``: their layout, if laid out) counted."""
        rt = self.rt
        self.open = True
        self.collector.hold()
        for node in rt.nodes:
            node.arena.reset()
        rt._temporaries.begin(lifetimes)

    def run(self, tasks, planned, lifetimes=None):
        """Run a closed DAG on the executor (``planned``: a replay; a static policy keeps
        its plan; ``lifetimes``: its temporaries' layout), then end the flush."""
        runner = self.sink or self.rt.executor
        self.begin(lifetimes)
        try:
            if planned:
                runner.run(tasks, planned=True)
            else:
                runner.run(tasks)
        except BaseException:
            self.end(tasks, lifetimes, failed=True)
            raise
        self.end(tasks, lifetimes)

    @contextlib.contextmanager
    def recording(self, sink):
        """Inside the block each flush is recorded without running: its tasks, closed as a
        DAG (nothing streams), go to ``sink.run(tasks)`` in the executor's place, and a
        graph's replay goes there too (:meth:`Runtime.recording
        <hetero_nn.scheduler.runtime.Runtime.recording>`). Work submitted before is run
        first; what is pending when the block ends is recorded then."""
        self.rt.wait()
        previous, self.sink = self.sink, sink
        try:
            yield sink
            self.rt.wait()
        finally:
            self.sink = previous

    @contextlib.contextmanager
    def tracing_apart(self):
        """Inside the block the runtime traces into a :class:`TraceBuffer` of its own,
        unbounded (yielded); after it, its flushes join the runtime's trace if that is on
        (:meth:`Runtime.tracing_apart <hetero_nn.scheduler.runtime.Runtime.tracing_apart>`)."""
        rt = self.rt
        tracing, kept = rt.tracing, rt._trace
        rt.tracing, rt._trace = True, TraceBuffer(None, workers=kept.workers)
        try:
            yield rt._trace
        finally:
            apart, rt._trace, rt.tracing = rt._trace, kept, tracing
            if tracing:
                kept.extend(apart)

    def end(self, tasks, lifetimes=None, failed=False, replayed=None, samples=None):
        """After ``tasks`` ran (streamed ones are not listed: the executor finished
        them): dependency state dropped, the temporaries' and arenas' generation ended,
        measurements and records kept (the local executor records each task as it
        finishes). The one end of every flush: a compiled replay ends its segment's run
        here too, giving no tasks, ``replayed`` (its trace records, a
        :class:`~hetero_nn.scheduler.engine.replay.ReplayRecords`, when tracing) and
        ``samples`` (its measurements, :meth:`Variants.feed_replay
        <hetero_nn.scheduler.variants.Variants.feed_replay>`'s arguments; None after a
        failure).

        A failing update of the performance model raises a ``TaskError`` naming it,
        once the flush has ended, unless the flush already ``failed`` (its error wins)."""
        rt = self.rt
        self.open = False
        self.hand_over = self.add
        rt._dependencies.drop()
        rt._temporaries.end(self.generation)
        self.generation += 1
        fault = None
        if samples is not None or rt._variants.has_measurements():
            try:
                if samples is not None:
                    rt._variants.feed_replay(*samples)
                if rt._variants.has_measurements():
                    rt._variants.feed()
            except BaseException as exc:  # noqa: BLE001 - raised below, as the flush's
                fault = exc
        if rt.perfmodel is not None:
            rt.perfmodel.save_if_due()  # a killed run keeps its calibration (perfmodel.py)
        records = self.records
        if rt.tracing and replayed is not None:
            rt._trace.add_flush(replayed)
        elif rt.tracing:
            if not getattr(rt.executor, "records_tasks", False):
                for t in tasks:
                    if t.members is not None:
                        for m in t.members:
                            if m.t_start:
                                records.extend(record_of(m))
                    elif t.t_start:  # not cancelled
                        records.extend(record_of(t))
            rt._trace.add_flush(FlatRecords(records[:]))
            if lifetimes is not None:
                self.memory.append(lifetimes.memory_records())
        records.clear()  # the same list: executors append to it
        for t in tasks:
            t.ended = True
            t.preds = ()
            t.succ = ()
        self.collector.release()  # after the flush's own allocations at its end
        if fault is not None and not failed:
            raise TaskError(f"the performance model's update at the end of flush "
                            f"{self.generation - 1} failed: {type(fault).__name__}: "
                            f"{fault}") from fault


def record_of(t, where=None) -> tuple:
    """A task's trace record, as a tuple of :class:`TaskRecord`'s fields in order (made a
    ``TaskRecord`` when the trace is read), but ``deps`` of one task given as its id:
    plain values only, no tuple the garbage collector tracks. The executors extend the
    flush's flat ``records`` with it (:class:`~.trace.records.FlatRecords`), so the tuple
    dies at once and the collector tracks no object per record (a flush's records would
    otherwise make every collection after it longer). ``where``: the worker's ``(name,
    device, node name)``, where the caller keeps it (the local executor, once per worker:
    a record per task reads no attribute more)."""
    if where is None:
        w = t.worker
        if w is None or type(w) is str:  # not run, or run by a Dask worker (its name)
            where = (w or "", "cpu", "host0")
        else:
            where = (w.name, w.device, w.node.name)
    preds = t.preds
    if not preds:
        ids = ()
    elif len(preds) == 1:  # a chain's: its id, no tuple (FlatRecords reads it back as one)
        ids = preds[0].id
    else:
        ids = tuple(map(_task_id, preds))
    return (t.id, t.codelet.name, t.variant or "", *where, t.t_submit, t.t_ready, t.t_start,
            t.t_end, t.bytes_in, ids, t.error)


_task_id = attrgetter("id")


def topological(tasks) -> list:
    """``tasks`` (one flush, closed) in a topological order of their dependencies that
    keeps submission order wherever the dependencies allow (each step takes the earliest
    submitted task whose predecessors are all placed); TaskError on a cycle."""

    index = {t: i for i, t in enumerate(tasks)}
    waiting = [sum(1 for p in t.preds if p in index) for t in tasks]
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        t = tasks[heapq.heappop(ready)]
        out.append(t)
        for s in t.succ:
            j = index.get(s)
            if j is not None:
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, j)
    if len(out) < len(tasks):
        stuck = [t for t, n in zip(tasks, waiting) if n > 0][:3]
        raise TaskError(f"add_dependency closed a cycle: {len(tasks) - len(out)} tasks wait "
                        f"for each other (among them {', '.join(map(repr, stuck))})")
    return out
