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
One :class:`ExecutorState`, ``executor.state``, printed (``str``) when a flush
stalls (``drain`` logs it every ``STALL_REPORT_SECONDS`` without progress):
``remaining``: tasks handed over since the last ``drain`` not yet finished;
``waiting``: those whose predecessors have not all finished; ``ready``: the
policy's queues, by place (each worker's, and a shared one); ``running``: per
worker, the tasks it took and has not finished (at most one on a CPU worker;
on a CUDA worker, those launched on its stream); ``completed``: per worker, the
tasks its stream finished, for its thread to release; ``idle``: workers asleep;
``error``: the first :class:`~hetero_nn.errors.TaskError`; once set, the
remaining tasks (and those added after it) are cancelled (released without
running) until ``drain`` re-raises it; ``closing``: ``close`` asked the workers
to stop. ``close`` with tasks in flight cancels those not started and waits for
the running ones. A worker's ``idle`` flag stays on the worker (policies read it).

CUDA workers
------------
A CUDA worker (a GPU, or an emulated ``cuda-emu`` device: one code path, two
stream implementations) binds a task's operands in its device context (copies
in go on its node's stream), launches the variant on that stream and goes on to
the next task without waiting: up to ``CUDA_PIPELINE`` tasks are in flight on
the stream. A completion callback, queued after the kernel, hands the task back
(``state.completed``) and the worker releases its successors, under the lock, on
its own thread: the callback never touches the device. The host waits for a
stream only where it needs the data (a copy back to a host node) and when a
flushed graph ends. Roots a task uses are held on the node (no eviction under a
memory limit) until it completes.

Bundles
-------
A :class:`~hetero_nn.scheduler.bundle.Bundle` (a fused chain of a replayed graph)
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
from collections import deque
from dataclasses import dataclass, field

from ..errors import TaskError
from .bundle import Bundle

_perf = time.perf_counter
CUDA_PIPELINE = 4  # tasks a CUDA worker may have launched and not yet completed
STALL_REPORT_SECONDS = 60.0  # drain logs the state after this long without a task finishing
_log = logging.getLogger("hetero_nn.scheduler")


@dataclass(eq=False)
class ExecutorState:
    """What the local executor knows of the tasks handed to it (module docstring, *State*).

    Per-worker fields are lists indexed by ``Worker.index``. ``str(state)`` says
    where every unfinished task is, for a flush that stalls.
    """

    workers: list
    ready: dict                  # place ("shared" or a worker's name) -> the policy's queue
    remaining: int = 0
    waiting: dict = field(default_factory=dict)  # task -> None (an ordered set)
    running: list = field(default_factory=list)
    completed: list = field(default_factory=list)
    idle: list = field(default_factory=list)
    error: TaskError | None = None
    closing: bool = False

    def __post_init__(self):
        self.running = [deque() for _ in self.workers]
        self.completed = [deque() for _ in self.workers]

    def __str__(self):
        lines = [f"executor state: {self.remaining} task(s) not finished, "
                 f"{len(self.waiting)} waiting for predecessors"
                 + (f", error: {self.error}" if self.error is not None else "")
                 + (", closing" if self.closing else "")]
        for place, queue in self.ready.items():
            tasks = _queued(queue)
            if tasks:
                lines.append(f"  ready on {place}: {_some(tasks)}")
        for w in self.workers:
            state = "idle" if w in self.idle else "awake"
            lines.append(f"  {w.name} ({state}): running {_some(self.running[w.index])}"
                         + (f", completed {len(self.completed[w.index])} to release"
                            if self.completed[w.index] else ""))
        for t in list(self.waiting)[:8]:
            left = [p for p in t.preds if not p.done]
            lines.append(f"  waiting: {t!r} (npred {t.npred}) after {_some(left)}")
        if len(self.waiting) > 8:
            lines.append(f"  ... and {len(self.waiting) - 8} more waiting")
        return "\n".join(lines)


def _queued(queue) -> list:
    """The tasks in a policy's queue (a deque, or heft's heap of ``(rank, id, task)``)."""
    return [x[-1] if isinstance(x, tuple) else x for x in queue]


def _some(tasks, n=6) -> str:
    tasks = list(tasks)
    text = ", ".join(repr(t) for t in tasks[:n])
    return f"[{text}{', ...' if len(tasks) > n else ''}] ({len(tasks)})" if tasks else "[]"


class LocalExecutor:
    """Runs tasks on the runtime's workers with a scheduling policy, as they are
    submitted (``add``) or as flushed DAGs (``run``)."""

    def __init__(self, runtime, policy):
        self.rt = runtime
        self.policy = policy
        self.workers = runtime.workers
        self._lock = runtime._lock
        self._done = threading.Condition(self._lock)
        self.state = ExecutorState(self.workers, policy.queues())
        self._mixed = not policy.homogeneous  # device kinds differ: wake only eligible workers
        self._blas = None
        try:
            from threadpoolctl import threadpool_limits
            self._blas = threadpool_limits(limits=1, user_api="blas")
        except Exception:  # threadpoolctl missing or no BLAS found: nothing to limit
            self._blas = None
        for w in self.workers:
            w.thread = threading.Thread(target=self._loop, args=(w,), daemon=True,
                                        name=f"hetero_nn-{w.name}")
            w.thread.start()

    # ------------------------------------------------------------------ main thread
    def add(self, task):
        """Take a task just submitted (its ``preds`` set): link it to the predecessors
        not finished yet, or, if none, hand it to the policy now."""
        state = self.state
        with self._lock:
            state.remaining += 1
            n = 0
            for p in task.preds:
                if not p.done:
                    p.succ.append(task)
                    n += 1
            if n:
                task.npred = n
                state.waiting[task] = None
                return
            task.t_ready = _perf()
            target = self.policy.push(task, None)
            if target is None:
                if self._mixed:
                    self._wake_for(task)
                elif state.idle:
                    self._wake_some(1)
            elif target.idle:
                self._wake(target)

    def drain(self):
        """Block until every task handed over has finished; re-raise the first failure.

        A flush that makes no progress for ``STALL_REPORT_SECONDS`` is logged with
        the executor's state (it keeps waiting)."""
        state = self.state
        with self._lock:
            while state.remaining:
                before = state.remaining
                if not self._done.wait(STALL_REPORT_SECONDS) and state.remaining == before:
                    _log.warning("a flush made no progress for %.0f s\n%s",
                                 STALL_REPORT_SECONDS, str(state))  # as it is now
            error = state.error
            state.error = None
        for node in self.rt.nodes:  # copies made for tasks that ran elsewhere (ws, steals)
            node.synchronize()
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
            state.remaining = len(tasks)  # nothing else is in flight at a flush
            state.error = None
            if not (planned and policy.plan_once):
                policy.prepare(tasks)
            shared = 0
            for t in tasks:
                if t.npred == 0:
                    t.t_ready = now
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
                while state.remaining:
                    self._done.wait()
            state.closing = True
            for w in self.workers:
                w.cond.notify()
        for w in self.workers:
            if w.thread is not None:
                w.thread.join()
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None

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
        while True:
            prefetch = None
            with lock:
                if task is not None:  # finish the task just run
                    prefetch = self._finish(task, w, failed, True, prefetch)
                while completed:  # tasks its stream finished (CUDA workers)
                    done, done_failed = completed.popleft()
                    prefetch = self._finish(done, w, done_failed, False, prefetch)
                task = pop(w) if len(running) < CUDA_PIPELINE else None
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
                    task = pop(w) if len(running) < CUDA_PIPELINE else None
                running.append(task)
                failed = state.error is not None
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

    def _finish(self, task, w, failed, takes_one, prefetch):
        """Mark a task done and release its successors (lock held); returns the
        prefetch list. ``takes_one``: the worker will take one of them itself."""
        state = self.state
        state.running[w.index].remove(task)
        task.done = True
        if failed:
            task.error = "cancelled"
        elif task.error is not None:
            err = self._task_error(task)
            if state.error is None:
                state.error = err
        self.policy.finished(task, w)
        succ = task.succ
        node = w.node
        if succ:
            shared = -1 if takes_one else 0
            now = _perf()
            push = self.policy.push
            waiting = state.waiting
            for s in succ:
                s.npred -= 1
                if s.npred == 0:
                    del waiting[s]
                    s.t_ready = now
                    target = push(s, w)
                    if target is None:
                        if not self._mixed:
                            shared += 1
                        elif takes_one and w in s.eligible:
                            takes_one = False  # this worker will take it
                        else:
                            self._wake_for(s)
                    elif target is not w:
                        if target.idle:
                            self._wake(target)
                        if target.node is not node:
                            if prefetch is None:
                                prefetch = []
                            prefetch.append((s, target.node))
            if shared > 0 and state.idle:
                self._wake_some(shared)
        state.remaining -= 1
        if not state.remaining:
            self._done.notify_all()  # drain(), and close() from another thread
        return prefetch

    # ------------------------------------------------------------------ CUDA workers
    def _launch(self, task, w, rt):
        """Bind ``task`` in the device context and launch it on the stream; returns
        the task when it failed before reaching the stream (finish it now), else None."""
        node, stream = w.node, w.stream
        try:
            task.variant = variant = rt.choose_variant(task, w.kind)
            fn = task.codelet.variants[variant]
            node.hold(task.handles)
            try:
                with node.context(), stream.activate():
                    arrays = rt.bind(task, w)
                    task.t_start = _perf()  # launched; the stream's thread stamps the real start
                    stream.launch(self._run_on_stream, task, fn, arrays)
            except BaseException:
                node.release(task.handles)
                raise
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            task.t_end = _perf()
            task.error = exc
            return task
        stream.add_callback(lambda: self._completed(task, w))
        return None

    @staticmethod
    def _run_on_stream(task, fn, arrays):
        """The kernel as the stream runs it (a launch into CuPy's stream on a GPU)."""
        task.t_start = max(task.t_start, _perf())
        try:
            fn(*arrays, **task.params)
        except BaseException as exc:  # noqa: BLE001 - reported at completion
            task.error = exc

    def _completed(self, task, w):
        """Stream callback: the task's kernels are done. Hand it to its worker."""
        now = _perf()
        w.node.release(task.handles)
        task.t_start = max(task.t_start, w.last_end)
        task.t_end = w.last_end = now
        if task.error is None:
            w.busy += task.t_end - task.t_start
            self.rt.record(task, w.kind)
        with self._lock:
            self.state.completed[w.index].append((task, False))  # it ran: not failed when taken
            if w.idle:
                self._wake(w)
            else:
                w.cond.notify()

    def _execute(self, task, w, kind, rt):
        if task.__class__ is Bundle:  # members run in order, each as a task alone
            task.run(self._execute, w, kind, rt)
            return
        try:
            task.variant = variant = rt.choose_variant(task, kind)
            fn = task.codelet.variants[variant]
            arrays = rt.bind(task, w)
            task.t_start = _perf()
            fn(*arrays, **task.params)
            task.t_end = _perf()
            w.busy += task.t_end - task.t_start
            rt.record(task, kind)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            task.t_end = _perf()
            task.error = exc

    def _prefetch_failed(self, task, node, exc):
        err = TaskError(f"prefetch of task {task.id} (codelet {task.codelet.name!r}) to "
                        f"{node.name} failed: {type(exc).__name__}: {exc}",
                        codelet=task.codelet.name, task_id=task.id)
        err.__cause__ = exc
        with self._lock:
            if self.state.error is None:
                self.state.error = err

    @staticmethod
    def _task_error(task):
        if task.__class__ is Bundle:
            task = task.failed  # name the member that raised
        exc = task.error
        err = TaskError(f"task {task.id} (codelet {task.codelet.name!r}, variant "
                        f"{task.variant!r}, worker {task.worker.name}) failed: "
                        f"{type(exc).__name__}: {exc}", codelet=task.codelet.name, task_id=task.id)
        err.__cause__ = exc
        task.error = f"{type(exc).__name__}: {exc}"
        return err
