"""Tasks: one codelet applied to handles, a node of the task DAG.

The runtime fills ``preds``/``succ``/``npred`` at submission from the access
modes (and ``after=``); an executor decrements ``npred`` as predecessors finish,
and a policy places the task when it reaches zero. Times are
``time.perf_counter()`` seconds.

What a program holds (StarPU's ``starpu_task``, a ``concurrent.futures.Future``):
``submit`` returns the task; :meth:`Task.done`, :meth:`Task.wait` and
:meth:`Task.exception` say whether it ran and how it ended. Everything else is the
runtime's and the executor's state, mutated under the executor's lock. ``members``
is None for a task that runs its own codelet, and the chain of tasks it runs in order
for a fused one (:class:`~hetero_nn.scheduler.executors.bundle.Bundle`): code that
must see the tasks that ran asks for ``t.members or (t,)``.

:func:`task_options` checks the StarPU task fields a submission may give
(``priority``, ``after``, ``callback``, ``worker``), off :meth:`Runtime.submit
<hetero_nn.scheduler.runtime.Runtime.submit>`'s hot path (called only when one is given).
"""

from __future__ import annotations

from ..errors import SubmitError, TaskError


class Task:
    """A submitted codelet instance. Plain state, mutated by the runtime and one executor."""

    __slots__ = ("id", "codelet", "handles", "modes", "params", "preds", "succ", "npred", "ended",
                 "eligible", "variant", "worker", "t_submit", "t_ready", "t_start", "t_end",
                 "bytes_in", "predicted", "priority", "rank", "assigned", "error", "failure",
                 "runtime", "after", "callback", "watched", "source", "_fp", "frees", "members")

    def __init__(self, task_id, codelet, handles, modes, params, t_submit, eligible=(),
                 runtime=None):
        self.id = task_id
        self.codelet = codelet
        self.handles = handles      # operands after REDUX partial substitution
        self.modes = modes
        self.params = params
        self.preds: list[Task] | tuple = ()
        self.succ: list[Task] | tuple = ()  # a list once a successor is linked
        self.npred = 0
        self.ended = False          # finished, failed or cancelled
        self.eligible = eligible    # workers that may run it (a variant; ``worker=``)
        self.variant = None
        self.worker = None
        self.t_submit = t_submit
        self.t_ready = 0.0
        self.t_start = 0.0
        self.t_end = 0.0
        self.bytes_in = 0
        self.predicted = 0.0        # policy's predicted run time (dmda, heft)
        self.priority = 0           # the program's: higher first among ready tasks
        self.rank = 0.0             # heft's upward rank
        self.assigned = None        # heft's static worker
        self.error = None           # while running the exception, then its text or "cancelled"
        self.failure = None         # the TaskError of a task that raised
        self.runtime = runtime
        self.after = ()             # tasks given as ``after=``
        self.callback = None
        self.watched = False        # a thread waits in wait(): notify when it ends
        self.source = None          # the last writer of its first read operand (locality)
        self._fp = None             # cached (footprint, size) for the perfmodel
        self.frees = None           # released roots to report when done (Runtime(arenas=False))
        self.members = None         # the tasks run as this one, in order (a bundle's chain)

    def rearm(self, task_id, now):
        """Reset the per-run state for a replay: a fresh id, not ended, no variant, worker,
        error, times or bytes (dependencies are the replay's to set)."""
        self.id = task_id
        self.ended = False
        self.variant = self.worker = self.error = self.failure = None
        self.t_submit = now
        self.t_ready = self.t_start = self.t_end = 0.0
        self.bytes_in = 0

    # ---------------------------------------------------------------- the program's view
    def done(self) -> bool:
        """Whether the task has ended (run, failed, or cancelled by a failure before it).

        A task automatic capture keeps for ``wait()`` is submitted now, with the rest of
        its flush, so that a program polling ``done()`` sees it end."""
        if not self.ended:
            self.runtime._auto.release()
        return self.ended

    def wait(self, timeout: float | None = None) -> None:
        """Block until the task has ended; raise its :class:`~hetero_nn.errors.TaskError`
        if it failed or was cancelled.

        Where the runtime keeps its tasks until ``wait()`` (``heft``, a capture, the Dask
        executors, ``overlap=False``), this runs the flush, and so raises the flush's
        failure if any (the synchronisation point that ends a flush raises its failure);
        otherwise ``Runtime.wait()`` still raises it. ``timeout``: seconds (streamed
        tasks), then ``TimeoutError``."""
        if not self.ended:
            self.runtime._wait_task(self, timeout)
        exc = self.exception()
        if exc is not None:
            raise exc

    def exception(self):
        """The task's :class:`~hetero_nn.errors.TaskError` once it ended: the codelet's
        failure, or its cancellation; None when it ran (or has not ended yet)."""
        if self.failure is not None or self.error is None or not self.ended:
            return self.failure
        return TaskError(f"task {self.id} (codelet {self.codelet.name!r}) was cancelled: "
                         "a task of its flush failed before it ran",
                         codelet=self.codelet.name, task_id=self.id)

    @property
    def key(self) -> str:
        """The task's key in the Dask graph."""
        return f"{self.codelet.name}-{self.id}"

    def __repr__(self):
        return f"Task({self.codelet.name}#{self.id})"


def link(before, after) -> bool:
    """Make ``after`` wait for ``before`` as well (both of one flush not yet run; their
    lists are ``()`` until linked). False where it already did."""
    if after in before.succ:
        return False
    if before.succ:
        before.succ.append(after)
    else:
        before.succ = [after]
    if after.preds:
        after.preds.append(before)
    else:
        after.preds = [before]
    after.npred += 1
    return True


# ---------------------------------------------------------------- submit's task fields
def task_options(rt, task, priority, after, callback, worker):
    """Check and set the StarPU task fields given to ``rt.submit`` on ``task``."""
    rt._auto.forget()  # its flush has no shape: tasks kept for it are submitted first
    name = task.codelet.name
    pure = rt.executor_name in ("dask", "distributed")
    if priority:
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise SubmitError(f"codelet {name!r}: priority={priority!r}: expected a number")
        if pure:
            raise SubmitError(f"codelet {name!r}: priority= orders the ready tasks of "
                              f"executor='local' or 'sync'; the {rt.executor_name!r} "
                              "executor orders tasks itself")
        task.priority = priority
    if after:
        if isinstance(after, Task):
            after = (after,)
        after = tuple(after)
        for p in after:
            if not isinstance(p, Task) or p.runtime is not rt:
                raise SubmitError(f"codelet {name!r}: after= takes tasks this Runtime's "
                                  f"submit returned, got {p!r}")
        task.after = after
    if callback is not None:
        if not callable(callback):
            raise SubmitError(f"codelet {name!r}: callback={callback!r} is not callable")
        task.callback = callback
    if worker is not None:
        if pure:
            raise SubmitError(f"codelet {name!r}: worker= places a task on a worker of "
                              f"executor='local' or 'sync'; the {rt.executor_name!r} "
                              "executor places tasks itself")
        wanted = rt._workers_named(worker, name)
        eligible = tuple(w for w in task.eligible if w in wanted)
        if not eligible:
            raise SubmitError(
                f"codelet {name!r}: worker={[w.name for w in wanted]}: none of them has a "
                f"variant for it (it runs on {sorted(task.codelet.kinds)} workers)")
        task.eligible = eligible
        if not rt._constrained:
            rt._constrained = True
            rt.executor.constrain()
