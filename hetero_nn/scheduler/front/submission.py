"""Submission: :meth:`Runtime.submit <hetero_nn.scheduler.runtime.Runtime.submit>` and
what it does per task, as a mixin :class:`RuntimeSubmission` that ``Runtime`` inherits.

Policy
------
Tasks are submitted in program order (StarPU's sequential task flow). A submission checks
its operands (:mod:`~hetero_nn.scheduler.handles`), infers its dependencies from its
non-REDUX operands (:mod:`~hetero_nn.scheduler.dependencies`; combining first any REDUX
tree pending on their roots, :mod:`~hetero_nn.scheduler.redux`), gives its REDUX operands
private partials, and hands the task to the flush (:mod:`~hetero_nn.scheduler.flush`),
which streams it to the executor or keeps it for ``wait()``. ``SCRATCH`` operands are
private temporaries and make no dependency. A program's submission without task options
goes to automatic capture first (:mod:`~hetero_nn.scheduler.autocapture`), which may keep
it for a replay. The path makes no call it can avoid: it runs once per task
(docs/benchmarks.md).

State
-----
None of its own: the runtime's ``_eligible`` (codelet -> the workers with a variant for
it), ``_ids`` (task ids in submission order), ``_placing`` and the components it hands
each concern to.
"""

from __future__ import annotations

import time

from ...arena.handle import Handle
from ...codelets.codelet import R, REDUX, RW, SCRATCH, Codelet
from ...errors import SubmitError
from ..autocapture import NONE, RECORD
from ..dependencies import check_overlap
from ..task import Task, link, task_options

_perf = time.perf_counter


class RuntimeSubmission:
    """The submission methods of :class:`~hetero_nn.scheduler.runtime.Runtime`."""

    @property
    def streaming(self) -> bool:
        """Whether the current flush (or, with nothing submitted yet, the next one) hands its
        tasks to the executor as they are submitted (then no dependency can be added)."""
        flushes = self._flushes
        if flushes.pending:
            return flushes.streaming
        return self.overlap and flushes.capturing is None

    def add_dependency(self, before, after):
        """Make the submitted task ``after`` wait for ``before`` as well (an order the
        data does not imply: a pipeline schedule). Both must belong to the current flush,
        which must not stream (a capture, ``overlap=False``, CUDA workers, ``heft``)."""
        if self.streaming:
            raise SubmitError("add_dependency: this flush streams its tasks to the executor "
                              "as they are submitted; order tasks inside a capture")
        self._auto.forget()  # the flush's tasks as submitted (autocapture.py)
        if link(before, after) and before.id > after.id:  # against submission order
            self._flushes.reordered = True

    # ------------------------------------------------------------------ submission
    def submit(self, codelet: Codelet, *handles, priority=0, after=(), callback=None,
               worker=None, modes=None, **params) -> Task:
        """Submit ``codelet`` on ``handles`` (one per mode); ``params`` reach the variant.

        Returns the :class:`~hetero_nn.scheduler.task.Task` (``done()``, ``wait()``,
        ``exception()``). StarPU's task fields, as keywords (reserved: a variant cannot
        take a parameter of these names):

        priority : int
            Among ready tasks, higher first (0 by default; negative: after the others).
        after : sequence of Task
            Explicit dependencies on tasks of this runtime, besides those the access
            modes imply (tasks of an earlier flush have ended: nothing to wait for).
        callback : callable(task)
            Called once the task has run (whether it succeeded or raised), in the thread
            that ran it, before its successors are released; an exception it raises
            fails the flush. Not called for a cancelled task.
        worker : Worker, worker name, worker index, or a collection of them
            Run on that worker (an int is its index in ``workers``: StarPU's worker id),
            or on one of those (a placement constraint every policy
            honours, see :mod:`~hetero_nn.scheduler.policies`).
        modes : sequence of AccessMode
            The operands' modes, for a codelet declared with ``modes=None``.

        The Dask executors order and place tasks themselves: ``priority`` and ``worker``
        are refused there.
        """
        if self._closed:
            raise SubmitError("submit on a closed Runtime")
        auto = self._auto  # a repeated flush's submissions are kept and replayed (autocapture.py)
        if auto.on and not (priority or after or callback is not None or worker is not None):
            state = auto.state
            if state == RECORD:  # AutoCapture.submit's record of a new shape, inline
                auto.calls.append((codelet, handles, modes, params))
                auto.room -= 1
                if not auto.room:
                    auto.state = NONE
            elif state != NONE:
                task = auto.submit(codelet, handles, modes, params)
                if task is not None:
                    return task
            try:
                return self._submit(codelet, handles, params, modes)
            except BaseException:
                auto.forget()  # a refused submission: the flush has no shape
                raise
        return self._submit(codelet, handles, params, modes, priority, after, callback, worker)

    def _submit(self, codelet, handles, params, modes=None, priority=0, after=(), callback=None,
                worker=None, task=None):
        """:meth:`submit`'s work, and the runtime's own submissions (REDUX trees; a kept
        flush's ``task``, made)."""
        n = len(handles)  # the hot path makes no call it can avoid (docs/benchmarks.md)
        if modes is None and codelet.modes is not None:
            modes = codelet.modes
            if n != codelet.arity:
                codelet.check_operands(n)
        else:
            modes = codelet.submission_modes(n, modes)
        if n > 1:
            check_overlap(codelet, handles, modes)
        eligible = (self._eligible[codelet] if codelet in self._eligible
                    else self._compute_eligible(codelet))
        if task is None:
            task = Task(next(self._ids), codelet, handles, modes, params, _perf(), eligible, self)
        else:
            task.modes = modes
            task.eligible = eligible
            task.runtime = self
        if self._placing is not None:
            if worker is None:
                worker = self._placing[0]
            self._placing[1].append(task)
        if priority or after or callback is not None or worker is not None:
            task_options(self, task, priority, after, callback, worker)
        preds: dict = {}
        redux = False
        generation = self._flushes.generation
        reductions = self._reductions
        redux_pending = reductions.pending
        dependencies = self._dependencies
        source = None
        i = 0
        for h in handles:
            if type(h) is not Handle or h.owner is not self or (
                    h.temporary and h.generation != generation):
                self._handles.bad_operand(codelet, i, h)
            m = modes[i]
            i += 1
            if m is REDUX:
                redux = True
            elif m is not SCRATCH:
                if redux_pending and h.root in redux_pending:
                    reductions.combine_family(h.root)
                if source is None and (m is R or m is RW):  # where its first input was made
                    source = task.source = h._last_writer
                if h.parent is None and not h.plans:
                    dependencies.depend_root(task, h, m is not R, preds)
                else:
                    dependencies.depend(task, h, m is not R, preds)
        if redux:  # after the other operands, so no combine ever takes this task's own partials
            task.handles = reductions.contribute(task, codelet, handles, modes)
        if task.after:
            flushes = self._flushes
            for p in task.after:  # a task of an earlier flush has ended: nothing to follow
                if flushes.open and p.id >= flushes.first_id:
                    preds[p] = None
        if preds:
            preds.pop(task, None)  # a handle twice in one task
            task.preds = list(preds)
        self._flushes.hand_over(task)  # streaming: the executor's add itself (flush.py)
        return task

    def _wait_task(self, task, timeout):
        """Block until ``task`` ended (:meth:`Task.wait`): where it waits in a flush kept
        for ``wait()``, that is the flush run now."""
        flushes = self._flushes
        if flushes.open and flushes.streaming:
            self.executor.wait_for(task, timeout)
        elif not task.ended:
            self.wait()

    def _compute_eligible(self, codelet):
        kinds = set(codelet.kinds)
        eligible = tuple(w for w in self.workers if w.kind in kinds)
        if not eligible:
            have = sorted({w.kind for w in self.workers})
            raise SubmitError(f"codelet {codelet.name!r} has variants for {sorted(kinds)} but this "
                              f"runtime's devices are {have} ({self.devices!r})")
        self._eligible[codelet] = eligible
        return eligible
