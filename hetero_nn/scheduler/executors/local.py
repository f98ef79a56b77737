"""The local executor: one thread per device worker, running codelets in place.

Policy
------
Tasks arrive one at a time as the program submits them (``add``) or as a
closed DAG (``run(tasks)``: a policy that plans whole graphs, a replay, or
``Runtime(overlap=False)``); ``drain()`` blocks until every task handed over
has finished. ``add`` links a task to its predecessors under the lock that
releases successors, counting only those not finished yet (a task is marked
``done`` under that lock when it finishes), so a task is released exactly once
and one whose predecessors have all finished is ready at once. Ready tasks are
placed by the scheduling policy (``push``) and taken by workers (``pop``); both
happen under one lock, with each worker
sleeping on its own condition. A worker that finishes a task releases its
successors and, where the policy put work in a shared place, wakes only as many
idle workers as there are ready tasks beyond the one it will take itself: a
chain of tasks runs on one thread without a single context switch.

State (all under ``_lock``)
---------------------------
One :class:`ExecutorState`, ``executor.state``, printed (``str``) when a flush stalls
(``drain`` logs it every ``STALL_REPORT_SECONDS`` without progress, and stops the flush
with it after ``Runtime(wait_timeout=)``: :mod:`~hetero_nn.scheduler.executors.stalls`; a hung
task stays counted in ``remaining``): ``remaining``: tasks handed over not yet
finished; ``waiting``: those whose predecessors have not all finished; ``ready``: the
policy's queues, by place; ``running``: per worker, the tasks it took and has not
finished (on a CUDA worker, those launched on its stream); ``completed``: per worker,
the tasks its stream finished, for its thread to release; ``idle``: workers asleep;
``error``: the first :class:`~hetero_nn.errors.TaskError`; once set, the remaining
tasks (and those added after it) are cancelled until ``drain`` re-raises it;
``aborted``: a fault in the scheduling machinery ended the flush: the tasks not running
were cancelled, tasks added since are cancelled at once, no worker pops, until ``drain``
returns; ``closing``: ``close`` asked the workers to stop (it cancels tasks not started
and waits for the running ones). A worker's ``idle`` flag stays on the worker.

CUDA workers
------------
A CUDA (or ``cuda-emu``) worker launches its tasks on its stream, up to ``CUDA_PIPELINE``
in flight, and releases them as its stream completes them
(:class:`~hetero_nn.scheduler.executors.streamed.StreamedWorkers`).

Bundles
-------
A :class:`~hetero_nn.scheduler.executors.bundle.Bundle` (a fused chain of a replayed graph)
is taken and released as one task; ``_execute`` runs its members in order, each
as it runs a task alone, and a failing member is the one its ``TaskError`` names.
Bundles hold CPU tasks only (no stream).

Faults
------
A failure while binding a task's operands (a transfer, an arena allocation)
fails that task as its codelet would. A failing prefetch, done by a worker
for another worker's task, fails the flush the same way: a ``TaskError``
naming the task and the node, the rest cancelled, the runtime usable.

Threads
-------
BLAS is held to one thread (``threadpoolctl``) while the executor lives, so
``n`` workers use ``n`` cores; Numba kernels are compiled ``nogil``.
"""

from __future__ import annotations

import logging
import threading
import time

from threadpoolctl import threadpool_limits

from ...codelets.codelet import REDUX, SCRATCH
from ...errors import TaskError
from ..flush import record_of
from ..policies.policies import Policy
from ..variants import FEED_EVERY
from .stalls import stalled, wait_progress
from .contract import Executor
from .state import ExecutorState, Wakeup, prefetch_error, queued_tasks, task_error
from .streamed import StreamedWorkers
from .timing import caller

_perf = time.perf_counter
CUDA_PIPELINE = 4  # tasks a CUDA worker may have launched and not yet completed
STALL_REPORT_SECONDS = 60.0  # drain logs the state after this long without a task finishing
_log = logging.getLogger("hetero_nn.scheduler")


class _Fault(Exception):
    """A failure of a policy hook or of the executor's bookkeeping, raised with the
    place it happened (``where``); the original exception is its ``__cause__``."""

    def __init__(self, where):
        super().__init__(where)
        self.where = where


class LocalExecutor(StreamedWorkers, Executor):
    """Runs tasks on the runtime's workers with a scheduling policy, as they are
    submitted (``add``) or as flushed DAGs (``run``)."""

    records_tasks = True  # a task's trace record is made as it finishes (see _finish)

    def __init__(self, runtime, policy):
        self.rt = runtime
        self.policy = policy
        self.workers = runtime.workers
        self._lock = runtime._lock
        self._done = threading.Condition(self._lock)
        self.state = ExecutorState(self.workers, policy.queues())
        self._mixed = not policy.homogeneous  # device kinds differ: wake only eligible workers
        self._variants = runtime._variants
        # the base hook does nothing: not called per task
        self._finished = None if type(policy).finished is Policy.finished else policy.finished
        self._calls = {}  # kind -> {codelet: (variant, caller)} for pinned codelets
        for w in self.workers:
            runtime._variants.pinned.setdefault(w.kind, {})
            self._calls[w.kind] = {}
        self._bind = runtime._binder.bind
        self._single = runtime._binder.single_node  # operands are the host replicas
        self._records = runtime._flushes.records
        self._where = {w: (w.name, w.device, w.node.name) for w in self.workers}  # records'
        self._blas = None
        try:
            self._blas = threadpool_limits(limits=1, user_api="blas")
        except Exception:  # no BLAS found: nothing to limit
            self._blas = None
        for w in self.workers:
            w.cond = Wakeup(self._lock)  # Condition's wait and notify, without its frames
            w.thread = threading.Thread(target=self._loop, args=(w,), daemon=True,
                                        name=f"hetero_nn-{w.name}")
            w.thread.start()

    # ------------------------------------------------------------------ main thread
    def add(self, task):
        """Take a task just submitted (its ``preds`` set): link it to the predecessors
        not finished yet, or, if none, hand it to the policy now."""
        state = self.state
        with self._lock:
            if state.aborted:  # the flush failed inside the executor: cancelled at once
                task.ended = True
                task.error = "cancelled"
                return
            state.remaining += 1
            n = 0
            for p in task.preds:
                if not p.ended:
                    if p.succ:
                        p.succ.append(task)
                    else:
                        p.succ = [task]
                    n += 1
            if n:
                task.npred = n
                state.waiting[task] = None
                return
            task.t_ready = task.t_submit or _perf()  # ready as submitted: no clock read more
            try:
                target = self.policy.push(task, None)
            except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                self._fail(f"policy {self.policy.name!r} push() of task {task.id} "
                           f"(codelet {task.codelet.name!r}) submitted ready", exc, abort=True)
                return
            if target is None:
                if self._mixed:
                    self._wake_for(task)
                elif state.idle:
                    self._wake_some(1)
            elif target.idle:
                self._wake(target)

    def constrain(self):
        """A task was given ``worker=``: from now on check eligibility on every pop and
        wake-up (the policy's fast paths for workers all alike are off)."""
        with self._lock:
            self.policy.homogeneous = False
            self._mixed = True

    def wait_for(self, task, timeout=None):
        """Block until ``task`` (handed over) has ended; ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self.state
        with self._lock:
            task.watched = True
            aborts = state.aborts
            while not task.ended:
                if state.aborts != aborts and not any(task in r for r in state.running):
                    task.ended = True  # an aborted flush lost it in transit: cancelled
                    task.error = "cancelled"
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{task!r} had not ended after {timeout} s")
                self._done.wait(left)

    def drain(self):
        """Block until every task handed over has finished; re-raise the first failure.

        A flush that makes no progress for ``STALL_REPORT_SECONDS`` is logged with
        the executor's state; after ``Runtime(wait_timeout=)`` seconds it is stopped
        (the tasks not running cancelled) with a ``TaskError`` printing that state."""
        state = self.state
        timeout = self.rt.wait_timeout
        with self._lock:
            if not wait_progress(self._done, lambda: state.remaining, timeout,
                                 STALL_REPORT_SECONDS, lambda s: _log.warning(
                                     "a flush made no progress for %.0f s\n%s", s,
                                     str(state))):  # the state as it is now
                stall = stalled("a flush", timeout, str(state))
                self._fail("a flush", stall, abort=True)  # running tasks stay counted
                state.error = stall
            error = state.error
            state.error = None
            state.aborted = False
        for node in self.rt.nodes if not state.remaining else ():  # (not after a stall)
            node.synchronize()  # copies made for tasks that ran elsewhere (ws, steals)
        if error is not None:
            raise error

    def run(self, tasks, planned=False):
        """Execute ``tasks`` (a closed DAG in topological order); re-raise the first failure.

        ``planned``: the DAG ran before (a replay); a policy that plans statically
        (``plan_once``) keeps the plan it made then."""
        policy = self.policy
        state = self.state
        waiting = state.waiting
        now = _perf()
        with self._lock:
            state.remaining += len(tasks)  # only a stalled flush's hung tasks are in flight
            state.error = None
            shared = 0
            where = f"policy {policy.name!r} prepare() of a flushed DAG of {len(tasks)} tasks"
            try:
                if not (planned and policy.plan_once):
                    policy.prepare(tasks)
                for t in tasks:
                    if t.npred == 0:
                        t.t_ready = now
                        where = f"policy {policy.name!r} push() of task {t.id} (codelet " \
                                f"{t.codelet.name!r}) at the start of a flushed DAG"
                        target = policy.push(t, None)
                        if target is None:
                            if self._mixed:
                                self._wake_for(t)
                            else:
                                shared += 1
                        elif target.idle:
                            self._wake(target)
                    else:
                        waiting[t] = None
            except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                self._fail(where, exc, abort=True)
            self._wake_some(shared)
        self.drain()

    def close(self):
        """Stop the workers: tasks in flight that have not started are cancelled, the
        running ones finish first."""
        state = self.state
        with self._lock:
            if state.remaining:
                if state.error is None:
                    state.error = TaskError("the runtime was closed with tasks in flight")
                wait_progress(self._done, lambda: state.remaining, self.rt.wait_timeout,
                              STALL_REPORT_SECONDS)
            state.closing = True
            for w in self.workers:
                w.cond.notify()
            report = str(state)
        hung = [w.name for w in self.workers if w.thread is not None
                and (w.thread.join(self.rt.wait_timeout) or w.thread.is_alive())]
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None
        if hung:
            raise stalled(f"closing the runtime (workers {hung} still running)",
                          self.rt.wait_timeout, report)

    # ------------------------------------------------------------------ wake-ups (lock held)
    def _wake(self, w):
        w.idle = False
        self.state.idle.remove(w)
        w.cond.notify()

    def _wake_for(self, task):
        """Wake one idle worker that has a variant for ``task`` (workers of several kinds)."""
        for w in self.state.idle:
            if w in task.eligible:
                self._wake(w)
                return

    def _wake_some(self, n):
        idle = self.state.idle
        while n > 0 and idle:
            w = idle.pop()
            w.idle = False
            w.cond.notify()
            n -= 1

    # ------------------------------------------------------------------ workers
    def _loop(self, w):
        """Take a task, run it, and in the same critical section that releases its
        successors take the next one (one lock round trip per task)."""
        lock = self._lock
        pop = self.policy.pop
        rt = self.rt
        kind = w.kind
        execute = self._execute
        state = self.state
        running = state.running[w.index]
        completed = state.completed[w.index]
        idle = state.idle
        task = None
        failed = False  # whether the DAG had failed when this worker took ``task``

        def take():
            """The next task for ``w`` (lock held), or None: its stream is full, the
            flush was aborted, or the policy has nothing for it. Tasks an aborted
            flush left in a policy are dropped here."""
            while len(running) < CUDA_PIPELINE and not state.aborted:
                t = pop(w)
                if t is None or not t.ended:
                    return t
            return None

        while True:
            prefetch = None
            with lock:
                try:
                    if task is not None:  # finish the task just run
                        done, task = task, None
                        prefetch = self._finish(done, w, failed, True, prefetch)
                    while completed:  # tasks its stream finished (CUDA workers)
                        done, done_failed = completed.popleft()
                        prefetch = self._finish(done, w, done_failed, False, prefetch)
                    # take(), its first step inlined for a worker with nothing running
                    task = pop(w) if not running and not state.aborted else take()
                    if task is not None and task.ended:
                        task = take()
                    while task is None:
                        if state.closing and not running:
                            return
                        if len(running) >= CUDA_PIPELINE:  # a full stream: wait for a completion
                            w.cond.wait()
                        else:
                            w.idle = True
                            idle.append(w)
                            w.cond.wait()
                            if w.idle:  # woken by close() or a completion, not by a push
                                w.idle = False
                                idle.remove(w)
                        while completed:
                            done, done_failed = completed.popleft()
                            prefetch = self._finish(done, w, done_failed, False, prefetch)
                        task = take()
                    running.append(task)
                    failed = state.error is not None
                except _Fault as fault:
                    self._fail(fault.where, fault.__cause__, abort=True)
                    task = None
                    continue
                except BaseException as exc:  # noqa: BLE001 - no fault may end this thread
                    self._fail(f"policy {self.policy.name!r} pop() on worker {w.name}", exc,
                               abort=True)
                    task = None
                    continue
            try:
                if prefetch is not None:
                    for s, target_node in prefetch:
                        if s.t_start == 0.0:
                            try:
                                rt.prefetch(s, target_node)
                            except BaseException as exc:  # noqa: BLE001 - fails the flush
                                self._prefetch_failed(s, target_node, exc)
                task.worker = w
                if not failed:
                    if w.stream is not None:
                        task = self._launch(task, w, rt)  # None once on the stream
                    else:
                        execute(task, w, kind, rt)
            except BaseException as exc:  # noqa: BLE001 - no fault may end this thread
                if task is not None and task.error is None:
                    task.error = exc  # its TaskError, when the worker finishes it

    def _finish(self, task, w, failed, takes_one, prefetch):
        """Mark a task done and release its successors (lock held); returns the
        prefetch list. ``takes_one``: the worker will take one of them itself.
        Raises :class:`_Fault` naming the hook or step that failed."""
        state = self.state
        try:
            state.running[w.index].remove(task)
            task.ended = True
            if failed:
                task.error = "cancelled"
            elif task.error is not None:
                err = task_error(task)
                if state.error is None:
                    state.error = err
                if self.rt.tracing:  # a success was recorded where it ran
                    failed_task = task.failed if task.members is not None else task
                    self._records.extend(record_of(failed_task))
        except BaseException as exc:
            raise _Fault(f"the end of task {task.id} on worker {w.name}") from exc
        if self._finished is not None:
            try:
                self._finished(task, w)
            except BaseException as exc:
                raise _Fault(f"policy {self.policy.name!r} finished() of task {task.id} "
                             f"on worker {w.name}") from exc
        succ = task.succ
        if succ and not state.aborted:  # counted done in its successors; the ready ones
            shared = -1 if takes_one else 0  # handed to the policy (one call less per task)
            now = _perf()
            push = self.policy.push
            waiting = state.waiting
            for s in succ:
                if s.ended:  # cancelled by a stalled flush while this task hung
                    continue
                s.npred -= 1
                if s.npred == 0:
                    del waiting[s]
                    s.t_ready = now
                    try:
                        target = push(s, w)
                    except BaseException as exc:
                        raise _Fault(f"policy {self.policy.name!r} push() of task {s.id} "
                                     f"(codelet {s.codelet.name!r}, released by task {task.id} "
                                     f"on worker {w.name})") from exc
                    if target is None:
                        if not self._mixed:
                            shared += 1
                        elif takes_one and w in s.eligible:
                            takes_one = False  # this worker will take it
                        else:
                            self._wake_for(s)
                    elif target is w:
                        if takes_one:  # it takes this one: the shared ones need other workers
                            takes_one = False
                            shared += 1
                    elif target is not w:
                        if target.idle:
                            self._wake(target)
                        if target.node is not w.node:
                            if prefetch is None:
                                prefetch = []
                            prefetch.append((s, target.node))
            if shared > 0 and state.idle:
                self._wake_some(shared)
        task.preds = task.succ = ()  # released: nothing here keeps the others alive
        task.source = None
        state.remaining -= 1
        if not state.remaining or task.watched:
            self._done.notify_all()  # drain(), close() from another thread, Task.wait()
        return prefetch

    # ------------------------------------------------------------------ faults (lock held)
    def _fail(self, where, exc, abort):
        """An exception outside a codelet: the flush's error names ``where``. With
        ``abort`` (a policy hook or the release of successors failed, so queues and
        counts cannot be trusted) the tasks not running are cancelled now and
        ``drain`` returns once the running ones end; the next flush starts clean."""
        state = self.state
        err = TaskError(f"{where} failed: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        if state.error is None:
            state.error = err
        if not abort:
            return
        state.cancel(self.policy)
        self._done.notify_all()  # drain() if nothing runs, and any Task.wait()

    def _execute(self, task, w, kind, rt):
        """Run ``task`` on CPU worker ``w``: variant, operands, call, times, model,
        callback. A pinned codelet's decisions are made once (``_calls``): its variant,
        its caller (and compiled trampoline), whether its operands are plain host replicas."""
        if task.members is not None:  # members run in order, each as a task alone
            task.run(self._execute, w, kind, rt)
            return
        codelet = task.codelet
        variants = self._variants
        try:
            calls = self._calls[kind]
            pinned = codelet in calls  # (a test, not calls.get: no call on the hot path)
            if pinned:
                variant, call, timed, plain = calls[codelet]
            else:
                variant = variants.choose(task, kind)
                call = caller(codelet.variants[variant])
                timed, plain = None, False
                if codelet in variants.pinned[kind]:  # its only candidate: ask no more
                    modes = codelet.modes  # plain: no SCRATCH or REDUX, one host node
                    fixed = getattr(call, "fixed", None)  # its trampoline of len(modes) operands
                    calls[codelet] = (variant, call, getattr(call, "timed", None)
                                      if modes is None or fixed is None else fixed(len(modes)),
                                      self._single and modes is not None
                                      and SCRATCH not in modes and REDUX not in modes)
            task.variant = variant
            if plain:  # Binder.bind on the one host node, inline: the replicas themselves
                arrays = []
                for h in task.handles:
                    replicas = h._replicas
                    arrays.append(replicas[0] if 0 in replicas else h.replica(w.node))
            else:
                arrays = self._bind(task, w)
            params = task.params
            task.t_start = start = _perf()
            task.t_end = end = timed(*arrays) if timed is not None and not params \
                else call(arrays, params)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            task.t_end = _perf()
            task.error = exc
        else:
            w.busy += end - start
            if task.frees is not None:  # allocating per task (scheduler/lifetimes.py)
                rt._temporaries.plain.finished(task)
            if rt.tracing:
                self._records.extend(record_of(task, self._where[w]))
            if rt.perfmodel is not None:
                try:
                    if pinned:  # Variants.record for a codelet of one variant, inline
                        measured = variants._measured[w.index]
                        measured.append((task, kind))
                        if len(measured) >= FEED_EVERY:
                            variants.feed(w.index)
                    else:
                        variants.record(task, kind, w.index)
                except BaseException as exc:  # noqa: BLE001 - not the codelet's failure
                    with self._lock:
                        self._fail(f"the performance model's update after task {task.id} "
                                   f"(codelet {codelet.name!r}) on worker {w.name}", exc,
                                   abort=False)
        if task.callback is not None:
            self._callback(task, w)

    def _callback(self, task, w):
        """Call the program's ``callback=`` (outside the lock: it may submit or wait)."""
        try:
            task.callback(task)
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
            with self._lock:
                self._fail(f"the callback of task {task.id} (codelet {task.codelet.name!r}) "
                           f"on worker {w.name}", exc, abort=False)

    def _prefetch_failed(self, task, node, exc):
        err = prefetch_error(task, node, exc)
        with self._lock:
            if self.state.error is None:
                self.state.error = err
