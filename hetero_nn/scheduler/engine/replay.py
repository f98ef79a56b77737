"""The replay engine: a captured graph run through bound tasks, fixed schedules and a
compiled dispatch loop.

Policy
------
``graph.replay()`` on a runtime the engine serves (:func:`engine_refusal` says which:
the local executor, with workers of one kind or under ``heft``) runs each recorded
flush (*segment*) as follows. At the first replay, and (on one memory node; on several
the placement made at capture or by heft is kept) once more after the first one measured
its own tasks where the plan made on those times saves 5% (:mod:`~hetero_nn.scheduler.engine.planning`),
the segment is *compiled* (:mod:`~hetero_nn.scheduler.engine.segment`):

1. a fixed schedule (:mod:`~hetero_nn.scheduler.policies.list_scheduling`): ``heft``'s plan when
   the policy is ``heft``, else list scheduling on the costs known (the last
   compiled run's times; before one, the performance model's predictions, or the
   capture run's times with each (codelet, footprint)'s median standing for all of
   them, so a first run's compilation does not count);
2. with several memory nodes, its copies between them planned
   (:mod:`~hetero_nn.scheduler.engine.data_plan`); every task bound for its worker
   (:mod:`~hetero_nn.scheduler.engine.bound`; *dynamic*, its operands acquired at every run,
   where no plan can be made);
3. per worker a *share*: its tasks in order, with their trampolines, argument
   blocks, the predecessors to wait for on other workers and whether another
   worker waits for them (:mod:`~hetero_nn.scheduler.engine.dispatch`); a CUDA worker's
   share is enqueued on its stream.

With ``deterministic=False`` a task's variant is the performance model's choice: while
the model still explores (a candidate with fewer runs than exploration asks), each
replay first binds again the tasks whose choice changed; once every choice is settled
no replay looks at variants again.

A replay then resets the node arenas, runs the shares at once (the calling
thread runs worker 0's, one engine thread per other worker runs the others),
a CPU worker's through :func:`~hetero_nn.scheduler.engine.dispatch.run_compiled` without
the interpreter lock, Python tasks in between, a CUDA worker's on its stream, and
ends the flush where ``wait()`` does, in :meth:`Flushes.end
<hetero_nn.scheduler.flush.Flushes.end>` (the nodes' streams synchronized first). On several
memory nodes the data plan's inputs are made valid first and the roots get the
coherence state the replay leaves after; a plan made on cells a later split has cut
again is made again first. No task object, policy hook, variant choice, handle lock or dependency
count is touched per task.

Measurement: the loop stamps each task's start and end into the segment's
``times``. After the run each worker's ``busy`` time grows, and the flush's end
gives the performance model one batch per model key (the first run of a key in the
process is a warm-up and is dropped, by the rule of every flush:
:meth:`Variants.feed_replay <hetero_nn.scheduler.variants.Variants.feed_replay>`) and
the trace one :class:`ReplayRecords`: the records are made from the stamps when the
trace is read.

Failures: a task that raises (in its kernel or in Python) stops its share and
sets ``abort``, which every other share sees before its next task or in its wait
(a futex sleep lasts at most ``WAIT_NS``), so what has not started is cancelled; the first failure is raised as the flush's
``TaskError`` naming the task, codelet, variant and worker. A compiled kernel's
exception cannot cross the loop, so the task is run once more in Python to name
it. The runtime and the graph stay usable. A wait that passes ``Runtime(wait_timeout=)``
stops the replay with a ``TaskError`` printing each share's state
(:mod:`~hetero_nn.scheduler.executors.stalls`); a ``KeyboardInterrupt`` stops every share, waits
for them and is raised.

Contention: a segment of CPU workers on one node replays on one thread instead (every
task in one merged order) while that is measured faster (:mod:`~hetero_nn.scheduler.engine.contention`).

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
the arrays ``done``, ``times``, ``sleepers``, ``abort``, ``bytes_in``.
:class:`EngineThreads` (``runtime._engine``): one thread per worker but the first, and
a spare one for an early replay's first share (:mod:`~.early`: a replay started while its
flush is submitted, through :meth:`EngineThreads.start`/:meth:`~EngineThreads.join` and
:func:`begin_segment`/:func:`end_segment`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

import numpy as np

from ...errors import SubmitError, TaskError
from .intrinsics import HAVE_CLOCK, clock_offset
from ..executors.local import LocalExecutor
from .cores import CoreBinding
from .contention import QuickHandoffs
from .dispatch import CUT, now_ns, set_abort
from .segment import CompiledSegment, explore, replan
from ..executors.stalls import TIMED_OUT, engine_state, stalled
from ..trace.records import TaskRecord

_perf = time.perf_counter
STOP_GRACE = 1.0  # seconds the other shares get to stop once one wait timed out
ENGINE_FUSES = ("the compiled replay engine runs each task by one indirect call: no dispatch "
                "left for a bundle to save")


def unavailable(rt) -> str | None:
    """Why ``rt``'s replays cannot use the engine, or None when they can
    (:func:`engine_refusal` on the runtime's settings; a runtime recording without running,
    :meth:`~hetero_nn.scheduler.runtime.Runtime.recording`, hands its replays to the
    recorder in the executor's place)."""
    runner = rt._flushes.sink or rt.executor
    return engine_refusal({w.kind for w in rt.workers}, rt.policy_name, rt.executor_name,
                          getattr(rt, "replay_engine", "compiled"), getattr(rt, "arenas", True),
                          None if type(runner) is LocalExecutor else type(runner).__name__)


def engine_refusal(kinds, policy, executor="local", replay_engine="compiled", arenas=True,
                   replaced=None) -> str | None:
    """The one rule for which path serves replays: why the compiled engine would not run
    the steps of a runtime with workers of ``kinds`` under ``policy`` (and the other
    settings of :class:`~hetero_nn.scheduler.runtime.Runtime`; ``replaced``: the class name
    of an executor put in the local one's place), or None when it would.
    The runtime asks it (:func:`unavailable`) and so does the simulator
    (:func:`~hetero_nn.simulation.paths.engine_serves`)."""
    if replay_engine != "compiled":
        return f"replay_engine={replay_engine!r}"
    if executor != "local":
        return f"the {executor!r} executor runs graphs as Dask graphs"
    if not arenas:  # scheduler/lifetimes.py
        return "arenas=False: per-task allocation makes each step's arrays, bound once here"
    if replaced is not None:
        return f"the executor was replaced ({replaced})"
    if len(set(kinds)) > 1 and policy != "heft":
        return (f"workers of several kinds under {policy!r}: a dynamic policy places "
                "each replay's tasks as they get ready (heft plans them once)")
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
            for member in (t.members or (t,)):
                for key, value in member.params.items():
                    if isinstance(value, (FloatParam, IntParam)):
                        uses.setdefault(value.param_name, []).append((member, key))
    return uses


# ----------------------------------------------------------------------------- threads

class EngineThreads:
    """One thread per worker but the first, each running the shares given to it (and a
    spare one, made at the first early replay, for its first share)."""

    def __init__(self, count, buffers=None, quick_handoffs=True, bind_threads=True):
        #: worker index -> its WorkerBuffers, shared by every graph of the runtime (their
        #: replays never overlap, and a buffer's key fixes what it must hold)
        self.buffers: dict = {} if buffers is None else buffers
        self.broken = False  # a share never returned: its thread is lost
        self.mode = "parallel"  # the mode the last replayed segment chose (contention.py)
        self.early = None  # the early replay under way (early.py)
        self._spare = None  # (queue, thread) that runs an early replay's first share
        self._claims = threading.Lock()  # who starts a job first: its thread, or _cancel
        self._started = None  # (claimed, finished) of the last start()
        self._queues = [queue.SimpleQueue() for _ in range(count)]
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True,
                                          name=f"hetero_nn-replay{i + 1}")
                         for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()
        self.handoffs = QuickHandoffs() if quick_handoffs else None  # until close()
        #: one core per thread of a parallel replay (cores.py); None: the OS places them
        self.binding = CoreBinding(self._threads) if bind_threads else None

    @staticmethod
    def _loop(q):
        while True:
            job = q.get()
            if job is None:
                return
            job()
            job = None  # else it holds the last replayed segment until the next one

    def run(self, jobs, seg=None, epoch=0, timeout=None):
        """Run ``jobs[0]`` here and ``jobs[i]`` on thread ``i - 1`` (the shares of ``seg``
        at replay ``epoch``); return their results. A ``KeyboardInterrupt`` stops the
        shares, waits for them, and is raised; a share that has not returned ``timeout``
        seconds after the last one did stops the replay with a ``TaskError`` printing the
        engine's state (these threads are then ``broken``: the runtime makes new ones)."""
        bound = self.binding is not None and self.binding.enter(len(jobs))
        try:
            results, finished = self.start(jobs, 1)
            interrupt = None
            try:
                results[0] = jobs[0]()
            except KeyboardInterrupt as exc:  # the segment aborted its shares: wait for them
                interrupt = exc
            if seg is not None and seg.abort[0] == CUT:  # a try cut: what has not started
                self._cancel()  # never will (the caller runs it), and is not waited for
            return self.join(results, finished, len(jobs) - 1, seg, epoch, timeout, interrupt)
        finally:
            if bound:
                self.binding.exit()

    def start(self, jobs, first):
        """Hand ``jobs[first:]`` to the threads (``jobs[i]`` to thread ``i - 1``; ``jobs[0]``,
        where ``first`` is 0, to a spare thread: an early replay's, :mod:`~.early`); returns
        ``(results, finished)`` for :meth:`join`."""
        results = [None] * len(jobs)
        finished = threading.Semaphore(0)
        claimed = [i < first for i in range(len(jobs))]  # started or cancelled (_claims)

        def wrap(i, job):
            def run():
                with self._claims:
                    if claimed[i]:
                        return  # cancelled before it started: released for it already
                    claimed[i] = True
                try:
                    results[i] = job()
                except BaseException as exc:  # noqa: BLE001 - never lose an engine thread
                    results[i] = (None, exc)
                finally:
                    finished.release()
            return run
        if first == 0:
            if self._spare is None:
                q = queue.SimpleQueue()
                thread = threading.Thread(target=self._loop, args=(q,), daemon=True,
                                          name="hetero_nn-replay0")
                thread.start()
                self._spare = (q, thread)
            self._spare[0].put(wrap(0, jobs[0]))
        for i in range(1, len(jobs)):
            self._queues[i - 1].put(wrap(i, jobs[i]))
        self._started = (claimed, finished)
        return results, finished

    def _cancel(self) -> None:
        """The jobs of the last :meth:`start` that no thread has begun are dropped, their
        ends released for them: a cut try's (the caller runs their tasks) need not wait
        until a thread whose core is taken gets it back only to return."""
        claimed, finished = self._started
        with self._claims:
            for i, started in enumerate(claimed):
                if not started:
                    claimed[i] = True
                    finished.release()

    def join(self, results, finished, left, seg=None, epoch=0, timeout=None, interrupt=None):
        """Wait for ``left`` jobs handed over by :meth:`start` (:meth:`run`'s rules)."""
        while left:
            wait = timeout
            if seg is not None and seg.abort[0] == TIMED_OUT:
                wait = STOP_GRACE  # a wait timed out: the others see it within WAIT_NS
            try:
                if finished.acquire(timeout=wait):
                    left -= 1
                    continue
            except KeyboardInterrupt as exc:
                if interrupt is not None:  # a second one: leave the shares behind
                    self.broken = True
                    raise
                interrupt = exc
                if seg is not None:
                    set_abort(seg.abort, seg.done, seg.notify_tasks)
                continue
            self.broken = True
            if seg is None:
                raise stalled("the replay engine", timeout, "(no segment)")
            if seg.abort[0] == 0:
                seg.abort[0] = TIMED_OUT
            raise stalled("a replay", timeout or STOP_GRACE, engine_state(seg, epoch))
        if interrupt is not None:
            raise interrupt
        return results

    def close(self):
        if self.early is not None:
            self.early.cancel()  # an early replay left running (its flush never waited for)
        spare = [self._spare] if self._spare is not None else []
        for q in self._queues + [q for q, _ in spare]:
            q.put(None)
        for t in self._threads + [t for _, t in spare]:
            t.join(STOP_GRACE if self.broken else None)  # a hung share's thread is lost
        if self.handoffs is not None:
            self.handoffs.close()


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
            if any([seg.bound[i].rebind() for i in hit]):  # (blocks rewritten in place:
                seg.build_shares()  # the shares' addresses hold)
            if hit and seg.contention is not None:
                seg.contention.restart()  # the walls measured other tasks' costs


class CompiledGraph:
    """A graph's compiled segments and replay state (module docstring)."""

    def __init__(self, graph):
        self.graph = graph
        self.segments = None
        self.epoch = 0
        self.replanned = False
        self.perfmodel = None  # the runtime's model when compiled (model keys: rekey)
        self.exploring = True  # until the model's choice of every variant has settled

    def compile(self, rt, threads=None):
        """Compile every segment for its first replay: scheduled on the capture run's
        times, bound, laid out in shares; then what the first replays would otherwise make
        (the serial share of a segment that may run on one thread, the trace's layout)."""
        buffers = (threads or _threads(rt)).buffers
        self.segments = [CompiledSegment(rt, s, buffers=buffers) for s in self.graph._segments]
        self.perfmodel = rt.perfmodel  # what the bound tasks' model keys were made for
        self.replanned = len(rt.nodes) > 1  # placed as captured (or by heft): kept
        for seg in self.segments:
            if seg.contention is not None:
                seg.serial_share()
            if rt.tracing:
                record_layout(seg)
                if seg.contention is not None:
                    record_layout(seg, seg.workers[0])

    def run(self, rt):
        """Replay every segment (compiling them first when needed)."""
        threads = _threads(rt)
        if self.segments is None:
            self.compile(rt, threads)
        elif not self.replanned and self.epoch:  # once: plan again on its measured times
            self.replanned = True
            self.segments = [replan(rt, s, seg, threads.buffers)
                             for s, seg in zip(self.graph._segments, self.segments)]
        if self.perfmodel is not rt.perfmodel:  # compiled in another measuring mode
            self.perfmodel = rt.perfmodel
            for seg in self.segments:
                seg.rekey()
        if self.exploring:
            self.exploring = any([explore(rt, seg) for seg in self.segments])
        for i, seg in enumerate(self.segments):
            if seg.moved() or seg.data is not None and not seg.data.current():  # cut again
                seg = self.segments[i] = CompiledSegment(rt, self.graph._segments[i], seg,
                                                         threads.buffers)
            self.epoch += 1
            _run_segment(rt, seg, self.epoch, threads)


def _threads(rt):
    engine = getattr(rt, "_engine", None)
    if engine is None or engine.broken:  # (a hung share keeps its thread: new ones)
        if engine is not None:
            engine.close()
        engine = rt._engine = EngineThreads(len(rt.workers) - 1,
                                            None if engine is None else engine.buffers,
                                            rt.study.gil_handoff, rt.study.bind_threads)
    return engine


_ids_lock = threading.Lock()


def _run_segment(rt, seg, epoch, threads):
    base = begin_segment(rt, seg)
    contention = seg.contention  # parallel, or every task on this thread (contention.py)
    mode = "parallel" if contention is None else contention.next_mode()
    shares = seg.shares if mode == "parallel" else [seg.serial_share()]
    t_submit = _perf()
    if seg.data is not None:
        seg.run_copies()
    limit = None if mode == "serial" or contention is None or not rt.study.cut_tries \
        else contention.cutoff()
    cut_ns = 0 if limit is None else now_ns() + int(limit * 1e9)
    results = threads.run(seg.jobs(shares, epoch, cut_ns), seg, epoch, rt.wait_timeout)
    cut = seg.abort[0] == CUT and not any(results)
    if cut:  # a try of parallel lost already: the tasks left run here (contention.py)
        seg.abort[0] = 0
        results = threads.run(seg.jobs([seg.serial_share()], epoch), seg, epoch, rt.wait_timeout)
    end_segment(rt, seg, epoch, base, t_submit, shares, results, _perf() - t_submit, threads,
                cut=cut)


def begin_segment(rt, seg, base=None) -> int:
    """A segment's run begins (a flush): its arrays reset; returns the id of its first
    task's record (``base``: the ids its tasks took already, an early replay's)."""
    rt._flushes.begin()
    n = len(seg.tasks)
    if base is None:
        with _ids_lock:  # fresh task ids for the records, as a submitted flush would take
            base = next(rt._ids)
            rt._ids = itertools.count(base + n)
    seg.times[:] = 0
    seg.abort[0] = 0
    seg.wait_stats[:] = 0
    return base


def end_segment(rt, seg, epoch, base, t_submit, shares, results, wall, threads, stopped=False,
                cut=False):
    """After a segment's shares returned ``results``: the flush ended (records, the
    performance model's samples), the first failure raised, the mode's wall observed
    (``wall`` None: an early replay's, which times no mode; ``stopped``: one stopped
    midway, :mod:`~.early`: its records kept, nothing measured or raised; ``cut``: a
    try of parallel stopped at its cutoff and finished on one thread, a lost try)."""
    n = len(seg.tasks)
    mode = "parallel" if shares is seg.shares else "serial"
    contention = seg.contention
    if seg.multinode:
        for node in rt.nodes:  # copies made for tasks that ran on other nodes
            node.synchronize()
    failures = [r for r in results if r is not None]
    if seg.data is not None:
        seg.copies_done(bool(failures))
    records = None
    if rt.tracing:
        for t, i in zip(seg.tasks, range(base, base + n)):  # the ids its records carry,
            t.id = i  # as the executor's replay rearms them: a record is found from its task
        records = ReplayRecords(seg, seg.times.copy(), base, t_submit,
                                failures[0] if failures else None,
                                seg.bytes_in.copy() if seg.multinode else None,
                                None if mode == "parallel" else shares[0].worker)
    timed_out = seg.abort[0] == TIMED_OUT
    durations = None if failures or timed_out or stopped else _measure(seg, shares)
    rt._flushes.end((), failed=bool(failures) or timed_out or stopped, replayed=records,
                    samples=None if durations is None else (seg.groups, durations))
    if stopped:
        return
    interrupted = [exc for _, exc in failures if isinstance(exc, KeyboardInterrupt)]
    if interrupted:  # in a Python task of the calling thread's share: the shares stopped
        raise interrupted[0]
    if timed_out and not failures:
        raise stalled("a replay", rt.wait_timeout, engine_state(seg, epoch))
    if failures:
        t, exc = failures[0]
        if t is None:
            raise TaskError(f"the replay engine failed: {type(exc).__name__}: {exc}") from exc
        if t >= seg.n_tasks:
            b = seg.runs[t]
            raise TaskError(f"the replay's {b.transfer.name} (worker {b.worker.name}) "
                            f"failed: {type(exc).__name__}: {exc}") from exc
        b = seg.bound[t]
        task_id = base + t
        err = TaskError(f"task {task_id} (codelet {b.task.codelet.name!r}, variant "
                        f"{b.variant!r}, worker {b.worker.name}) failed: "
                        f"{type(exc).__name__}: {exc}", codelet=b.task.codelet.name,
                        task_id=task_id)
        raise err from exc
    if contention is not None and wall is not None:
        if cut:
            contention.lost()
        else:
            contention.observe(mode, wall, float(durations.sum()) * 1e-9)
        threads.mode = contention.mode


def _measure(seg, shares):
    """After a successful run: busy time per worker; returns each task's nanoseconds
    (the flush's end gives them to the performance model)."""
    durations = seg.times[:, 1] - seg.times[:, 0]
    for share in shares:
        share.worker.busy += float(durations[share.order].sum()) * 1e-9
    return durations


def record_layout(seg, worker=None) -> tuple:
    """``(rows, preds)`` of a segment's tasks as its replays run them now: per task
    ``(codelet, variant, worker, device, node)`` (``worker``: the one whose thread ran
    them all, else each task's), and its predecessors. Made once per binding
    (``seg.layout``, cleared when the shares are rebuilt): a replay's records read this,
    never the segment, so the trace holds no compiled graph and names the variant that
    ran even after the model's exploration binds another."""
    if seg.layout is None:
        seg.layout = {}
    layout = seg.layout.get(worker)
    if layout is None:
        rows = tuple((b.task.codelet.name, b.variant, *_where(worker or b.worker))
                     for b in seg.bound)
        layout = seg.layout[worker] = (rows, tuple(tuple(p) for p in seg.task_preds))
    return layout


def _where(w) -> tuple:
    return w.name, w.device, w.node.name


class ReplayRecords:
    """The trace records of one compiled replay of a segment, made when read: the
    runtime's trace buffer keeps it as one flush's records (a list it iterates). It
    holds plain values only (:func:`record_layout`, the stamps, the failure's text)."""

    __slots__ = ("layout", "times", "base", "t_submit", "failure", "bytes_in", "count")

    def __init__(self, seg, times, base, t_submit, failure, bytes_in=None, worker=None):
        self.layout = record_layout(seg, worker)
        self.times = times[:seg.n_tasks]  # the tasks' (the planned copies' are transfers)
        self.base = base
        self.t_submit = t_submit
        # (task index, "Type: message"): an exception would keep the segment (its frames)
        self.failure = None if failure is None else \
            (failure[0], f"{type(failure[1]).__name__}: {failure[1]}")
        self.bytes_in = bytes_in  # per task, bytes copied in (several nodes), else None
        self.count = int(np.count_nonzero(self.times[:, 0]))

    def __len__(self):
        """The records it makes: the tasks that ran."""
        return self.count

    def workers(self) -> set:
        """The workers its records name (without making them)."""
        rows = self.layout[0]
        ran = range(len(rows)) if self.count == len(rows) else np.flatnonzero(self.times[:, 0])
        return {rows[i][2] for i in ran}

    def __iter__(self):
        (rows, task_preds), times, base = self.layout, self.times, self.base
        offset = clock_offset()
        start = times[:, 0] * 1e-9 + offset
        end = times[:, 1] * 1e-9 + offset
        failed, error = self.failure if self.failure is not None else (-1, None)
        for i, (codelet, variant, worker, device, node) in enumerate(rows):
            if times[i, 0] == 0:
                continue  # not run (the replay failed first)
            preds = task_preds[i]
            ready = max((float(end[p]) for p in preds), default=self.t_submit)
            ready = max(ready, self.t_submit)
            moved = 0 if self.bytes_in is None else int(self.bytes_in[i])
            yield TaskRecord(base + i, codelet, variant, worker, device, node, self.t_submit,
                             ready, float(start[i]), float(end[i]), moved,
                             tuple(base + p for p in preds), error if i == failed else None)
