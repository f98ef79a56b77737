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
more); a closed DAG resets them when it is handed over. It ends when its tasks
have run (or failed): the dependency state is dropped, the generation advances
(temporaries of the flush expire), measurements go to the performance model and
executed tasks become trace records.

State
-----
``pending``: tasks submitted since the last flush, in submission order (a
topological order), whether they have run or not. ``streaming``: whether this
flush's tasks go to the executor as they are submitted. ``generation``: number of
flushes run; temporaries (arena-backed handles, REDUX partials) belong to one
generation. ``capturing``: the :class:`~hetero_nn.scheduler.capture.Graph` being
recorded, or None. Trace records go to the runtime's bounded
:class:`~hetero_nn.scheduler.trace_buffer.TraceBuffer` (``rt._trace``), one unit per flush.
"""

from __future__ import annotations

from .bundle import traced
from .trace import TaskRecord


class Flushes:
    """One runtime's flush lifecycle (see the module docstring)."""

    def __init__(self, runtime):
        self.rt = runtime
        self.pending: list = []
        self.streaming = False
        self.generation = 0
        self.capturing = None

    def add(self, task, preds):
        """Take a task just submitted, with ``preds`` (a dict of the tasks it follows,
        possibly itself) from dependency inference."""
        pending = self.pending
        if not pending:
            self._begin()
        pending.append(task)
        if preds:
            preds.pop(task, None)  # a handle twice in one task
            task.preds = list(preds)
        if self.streaming:
            self.rt.executor.add(task)
        elif preds:
            task.npred = len(task.preds)
            for p in task.preds:
                p.succ.append(task)

    def _begin(self):
        """The first submission since a flush ended: decide whether this flush streams;
        streaming, the arenas are reset now (nothing of the previous flush runs)."""
        rt = self.rt
        self.streaming = rt.overlap and self.capturing is None
        if self.streaming:
            for node in rt.nodes:
                node.arena.reset()

    def wait(self):
        """Block until every task of the flush has run (handing them to the executor
        first where they were not streamed to it), then end the flush."""
        tasks = self.pending
        if not tasks:
            return
        self.pending = []
        if self.streaming:
            try:
                self.rt.executor.drain()
            finally:
                self.end(tasks)
            return
        if self.capturing is not None:
            self.capturing._segments.append([(t, t.preds, t.succ) for t in tasks])
        self.run(tasks, False)

    def run(self, tasks, planned):
        """Run a closed DAG on the executor (``planned``: a replay; a static policy keeps
        its plan), then end the flush."""
        rt = self.rt
        for node in rt.nodes:
            node.arena.reset()
        try:
            if planned:
                rt.executor.run(tasks, planned=True)
            else:
                rt.executor.run(tasks)
        finally:
            self.end(tasks)

    def end(self, tasks):
        """After ``tasks`` ran: dependency state dropped, the arenas' generation ended,
        measurements and records kept."""
        rt = self.rt
        rt._dependencies.drop()
        self.generation += 1
        if rt._variants._measured:
            rt._variants.feed()
        if rt.perfmodel is not None:
            rt.perfmodel.save_if_due()  # a killed run keeps its calibration (perfmodel.py)
        if rt.tracing:
            rt._trace.add_flush([_record(t) for t in traced(tasks) if t.t_start])  # not cancelled
        for t in tasks:
            t.done = True
            t.preds = ()
            t.succ = ()


def _record(t):
    w = t.worker
    if w is None or isinstance(w, str):  # not run, or run by a Dask worker
        worker, device, node = w or "", "cpu", "host0"
    else:
        worker, device, node = w.name, w.device, w.node.name
    preds = t.preds
    deps = tuple([p.id for p in preds]) if preds else ()
    # positional, in TaskRecord's field order (task_id, codelet, variant, worker, device,
    # node, submit, ready, start, end, bytes_in, deps, error): one per task, keep it cheap
    return TaskRecord(t.id, t.codelet.name, t.variant or "", worker, device, node, t.t_submit,
                      t.t_ready, t.t_start, t.t_end, t.bytes_in, deps, t.error)
