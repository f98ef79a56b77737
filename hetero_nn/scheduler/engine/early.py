"""Early replays: a compiled graph's replay started while its flush is still submitted.

Policy
------
Automatic capture (:mod:`~hetero_nn.scheduler.autocapture`) keeps a repeated flush's
submissions and replays the shape's graph at ``wait()``: submission, then replay, one
after the other. An early replay starts the replay once the first submissions matched
and runs it behind a *gate*: the count of kept submissions that matched, which the
submitting thread raises every :data:`STEP` tasks. A segment task whose index (its
submission position: only segments whose tasks are the flush's submissions, one for
one, in order) is not below the count waits for it
(:func:`~hetero_nn.scheduler.engine.dispatch.wait_gate`), so what runs is always a
matched prefix, each task once its dependencies in it ran. While the program submits,
the tasks run on one thread (a spare engine thread, the segment's serial share: every
task in one merged order): the submitting thread holds a core, and the workers' shares,
which wait on each other, would take turns on the other one (measured beside the
submission on 2 cores at load 6: 15 of 1,000 tasks run in 22 ms). Waits behind a gate have no
deadline (a program may pause while it submits).

Where the flush then matches to its end, :meth:`EarlyReplay.finish` opens the gate where
few tasks are left (:data:`ALONE`: the one thread runs them), else stops the one-thread
run where it is and runs the rest as a replay runs (each worker its share, or one thread
where the segment measured that faster: :mod:`~.contention`), the dispatch loop skipping
the tasks run already (their counters set first), with the runtime's ``wait_timeout``;
the replay then ends as any replay ends (records, samples, the first failure raised). Where it
does not (a submission differs, the flush ends early, a step value the graph does not
hold, a ``placing()`` block, ``Task.done()``...), :meth:`EarlyReplay.stop` aborts the
shares without opening the gate and says which tasks ran: a set closed under
dependencies (a task starts only after its predecessors ended), so submitting the others
in order afterwards gives what submitting them all would (a task that ran has no
predecessor among those not run; a task that raised counts as not run, and fails again
as submitted).

Served: a graph of one segment compiled for the engine, on one memory node, no stream,
replanned already, its variants settled, its replicas where they were bound
(:func:`refusal`). The rest replays at ``wait()``.

State
-----
``seg``, ``epoch``, ``base`` (the first kept task's id: its records' ids), ``gate``
(int32 ``[count, sleepers, the count a sleeper waits for]``) and ``view`` (the submitting thread's way to it), ``shares``, ``results``/``finished`` (from
``EngineThreads.start``), ``t_submit``.
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import SubmitError
from .dispatch import OPEN, open_gate, set_abort
from .executor import replay_executor
from .replay import _threads, begin_segment, end_segment

#: Kept submissions between two raises of the gate.
STEP = 8
#: Tasks left at ``wait()`` that the one thread runs itself (more: every worker's share).
ALONE = 64

_perf = time.perf_counter


def refusal(rt, graph, n) -> str | None:
    """Why ``graph`` (its flush of ``n`` submissions) cannot replay early on ``rt``, or
    None when it can (module docstring)."""
    compiled = graph._compiled
    if compiled is None or compiled.segments is None or len(compiled.segments) != 1:
        return "not compiled in one segment"
    if not compiled.replanned or compiled.exploring or compiled.perfmodel is not rt.perfmodel:
        return "not replayed to its steady state yet"
    seg = compiled.segments[0]
    if seg.n_tasks != n or len(seg.runs) != n or seg.multinode or seg.dynamic or \
            any(w.stream is not None for w in seg.workers):
        return "its tasks are not the flush's submissions on one node"
    flushes = rt._flushes
    if flushes.open or flushes.capturing is not None or flushes.sink is not None or \
            replay_executor(rt) is not rt.compiled:
        return "the runtime is not free to replay it"
    if seg.moved():
        return "a replica it was bound to moved"
    try:
        graph._check_roots(rt)
    except SubmitError as exc:
        return str(exc)
    return None


class EarlyReplay:
    """One early replay of a graph (module docstring): :meth:`advance` while the flush is
    submitted, then :meth:`finish` or :meth:`stop`."""

    def __init__(self, rt, graph, base, count):
        """Start ``graph``'s replay, its tasks from ``base`` on (their ids), ``count`` of
        them submitted (``refusal`` said None)."""
        self.rt, self.graph = rt, graph
        compiled = graph._compiled
        seg = self.seg = compiled.segments[0]
        self.threads = _threads(rt)
        compiled.epoch += 1
        self.epoch = compiled.epoch
        self.base = begin_segment(rt, seg, base)
        rt._flushes.streaming = False  # a kept task's wait() is the flush's (Runtime.wait)
        self.gate = np.array([count, 0, 0], dtype=np.int32)
        self.view = memoryview(self.gate)
        self.shares = [seg.serial_share()]  # one thread beside the submitting one
        seg.running = self.shares
        self.t_submit = _perf()
        gate, epoch = self.gate, self.epoch
        self.results, self.finished = self.threads.start(
            [lambda s=s: seg.run(s, epoch, gate) for s in self.shares], 0)
        self.threads.early = self

    def advance(self, count):
        """``count`` submissions matched: their tasks may run. The count is written through
        a memoryview (a compiled call costs about 1 us here), the sleepers woken if any; a
        sleeper that read the count just before this write still wakes within
        ``dispatch.WAIT_NS``, its futex sleep's bound."""
        view = self.view
        view[0] = count
        if view[1] and count >= view[2]:  # a sleeper waits for this many
            open_gate(self.gate, -1)

    def _join(self, timeout):
        threads, self.threads.early = self.threads, None
        return threads.join(self.results, self.finished, len(self.shares), self.seg,
                            self.epoch, timeout)

    def finish(self):
        """Every submission matched: where at most :data:`ALONE` tasks are left, the gate
        opens and the one thread runs them too (a thread hand-off costs more); else it
        stops where it is and the rest runs as a replay runs (on every worker, or on one
        where that was measured faster), the tasks run already skipped. The replay then
        ends as a replay ends (its first failure raised as the flush's ``TaskError``)."""
        rt, seg, epoch = self.rt, self.seg, self.epoch
        n = seg.n_tasks
        alone = n - int(np.count_nonzero(seg.times[:n, 1])) <= ALONE
        if alone:
            open_gate(self.gate, OPEN[0])
        else:
            self.cancel()
        try:
            results = self._join(rt.wait_timeout)
        except BaseException:
            self.graph.replays += 1
            raise
        if not alone and not any(results):  # (a failure ends the replay: nothing more runs)
            seg.done[:n][seg.times[:n, 1] != 0] = epoch  # what the other shares wait for
            seg.abort[0] = 0
            contention = seg.contention
            self.shares = seg.shares if contention is None or contention.mode == "parallel" \
                else [seg.serial_share()]
            try:
                results = self.threads.run(seg.jobs(self.shares, epoch), seg, epoch,
                                           rt.wait_timeout)
            finally:
                self.graph.replays += 1
        else:
            self.graph.replays += 1
        end_segment(rt, seg, epoch, self.base, self.t_submit, self.shares, results, None,
                    self.threads)

    def cancel(self):
        """Tell the shares to stop (nothing not started runs) and wake them."""
        seg = self.seg
        set_abort(seg.abort, seg.done, seg.notify_tasks)
        open_gate(self.gate, -1)

    def stop(self) -> list:
        """The flush left the shape: stop the shares, end the replay's flush (its records
        kept); returns per task whether it ran (and did not raise)."""
        rt, seg = self.rt, self.seg
        self.cancel()
        results = self._join(rt.wait_timeout)
        self.graph.replays += 1
        ran = seg.times[:seg.n_tasks, 1] != 0
        failed = [r[0] for r in results if r is not None and r[0] is not None]
        for t in failed:
            if t < seg.n_tasks:
                ran[t] = False
        end_segment(rt, seg, self.epoch, self.base, self.t_submit, self.shares, results, None,
                    self.threads, stopped=True)
        return ran.tolist()
