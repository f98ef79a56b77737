"""The StarPU task fields a submission may give (``priority``, ``after``, ``callback``,
``worker``): their checks, out of :meth:`Runtime.submit
<hetero_nn.scheduler.runtime.Runtime.submit>`'s hot path (which calls here only when one
is given)."""

from __future__ import annotations

from ..errors import SubmitError
from .task import Task


def task_options(rt, task, priority, after, callback, worker):
    """Check and set the StarPU task fields given to ``rt.submit`` on ``task``."""
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
