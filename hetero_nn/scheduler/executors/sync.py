"""The synchronous executor: every task runs in the calling thread (dask's ``get_sync``).

``Runtime(executor="sync")`` is for debugging: a codelet runs inside ``submit``, in
the program's own thread, so a debugger's breakpoints stop in it and a traceback
shows the line that submitted it. Results are the same bits as under the local
executor (same variants, same operands, same REDUX trees).

Policy
------
``add(task)`` (at submission) runs the task at once: every task it depends on was
submitted before it and has run. It runs on the first worker it may run on
(``task.eligible``: ``worker=`` is honoured), bound on that worker's memory node;
a CUDA worker (or ``cuda-emu``) launches it on its stream and waits for the stream.
A closed DAG (``run``: a capture, a replay) runs in topological order, the ready
task of highest priority first (``priority=``), then the first submitted. A callback
runs right after its task. After the first failure the tasks of the flush are
cancelled (ended without running) and ``drain`` (``wait()``) raises the failure's
``TaskError`` (its ``__cause__`` is the codelet's exception, with its traceback),
as the local executor does. No policy runs: ``policy=`` is accepted and unused.

State
-----
``error``: the first ``TaskError`` of the flush, or None.
"""

from __future__ import annotations

import heapq
import time

from ...errors import TaskError
from ..flush import record_of
from .contract import Executor
from .state import task_error

_perf = time.perf_counter


class SyncExecutor(Executor):
    """Runs each task in the calling thread (see the module docstring)."""

    records_tasks = True  # trace records are made as tasks run

    def __init__(self, runtime):
        self.rt = runtime
        self.workers = runtime.workers
        self.policy = None
        self.error = None

    def constrain(self):
        """``worker=`` needs nothing more here: a task runs on its first eligible worker."""

    def add(self, task):
        """Run ``task`` now (its predecessors have run)."""
        if self.error is not None:
            task.ended = True
            task.error = "cancelled"
            return
        task.t_ready = _perf()
        self._run_one(task)

    def run(self, tasks, planned=False):
        """Run a closed DAG: ready tasks by priority, then submission order."""
        self.error = None
        order = {t: i for i, t in enumerate(tasks)}
        now = _perf()
        ready = [(-t.priority, order[t], t) for t in tasks if t.npred == 0]
        heapq.heapify(ready)
        while ready:
            t = heapq.heappop(ready)[2]
            succ = t.succ  # _run_one drops the task's links
            if self.error is not None:
                t.ended = True
                t.error = "cancelled"
            else:
                t.t_ready = now
                self._run_one(t)
            for s in succ:
                s.npred -= 1
                if s.npred == 0:
                    heapq.heappush(ready, (-s.priority, order[s], s))
            now = _perf()
        self.drain()

    def drain(self):
        error, self.error = self.error, None
        if error is not None:
            raise error

    def wait_for(self, task, timeout=None):
        """Every task has ended once ``submit`` returned."""

    def close(self):
        pass

    # ------------------------------------------------------------------ one task
    def _run_one(self, task):
        w = task.eligible[0]
        task.worker = w
        if task.members is not None:
            task.run(lambda m, worker, kind, rt: self._execute(m, worker), w, w.kind, self.rt)
        else:
            self._execute(task, w)
        task.ended = True
        if task.error is not None:
            err = task_error(task)
            if self.error is None:
                self.error = err
            if self.rt.tracing:
                failed = task.failed if task.members is not None else task
                self.rt._flushes.records.extend(record_of(failed))
        task.preds = task.succ = ()  # ran: nothing here keeps the others alive
        task.source = None

    def _execute(self, task, w):
        rt = self.rt
        try:
            task.variant = variant = rt.choose_variant(task, w.kind)
            fn = task.codelet.variants[variant]
            if w.stream is None:
                arrays = rt.bind(task, w)
                task.t_start = _perf()
                fn(*arrays, **task.params)
            else:
                node = w.node
                node.hold(task.handles)
                raised = []

                def kernel(arrays):  # on the stream: after the copies binding queued there
                    try:
                        fn(*arrays, **task.params)
                    except BaseException as exc:  # noqa: BLE001 - raised below
                        raised.append(exc)

                try:
                    with node.context(), w.stream.activate():
                        arrays = rt.bind(task, w)
                        task.t_start = _perf()
                        w.stream.launch(kernel, arrays)
                    w.stream.synchronize()
                finally:
                    node.release(task.handles)
                if raised:
                    raise raised[0]
            task.t_end = _perf()
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError at wait()
            task.t_end = _perf()
            task.error = exc
        else:
            w.busy += task.t_end - task.t_start
            if rt.tracing:
                rt._flushes.records.extend(record_of(task))
            try:
                rt.record(task, w.kind)
            except BaseException as exc:  # noqa: BLE001 - not the codelet's failure
                self._fail(f"the performance model's update after task {task.id}", exc)
        if task.callback is not None:
            try:
                task.callback(task)
            except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
                self._fail(f"the callback of task {task.id} (codelet {task.codelet.name!r})",
                           exc)

    def _fail(self, where, exc):
        if self.error is None:
            err = TaskError(f"{where} failed: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            self.error = err
