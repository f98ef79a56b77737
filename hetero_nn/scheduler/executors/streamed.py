"""What a task launched on a device stream runs there, and how a fault reaches it.

The local executor's worker for a CUDA (or ``cuda-emu``) device launches a task's
variant into the worker's stream (:meth:`LocalExecutor._launch
<hetero_nn.scheduler.executors.local.LocalExecutor._launch>`): the variant runs in the
stream's order, and its Python exception, or a device fault the stream's wait reports
later, becomes the task's ``error``, which the completion callback (on a runtime
thread, never CUDA's) turns into the flush's ``TaskError``. Only the first fault is
kept: a fault already given to a task is not raised again at the stream's wait.
"""

from __future__ import annotations

import time

_perf = time.perf_counter


def run_on_stream(task, fn, arrays):
    """The kernel as the stream runs it (a launch into CuPy's stream on a GPU)."""
    task.t_start = max(task.t_start, _perf())
    try:
        fn(*arrays, **task.params)
    except BaseException as exc:  # noqa: BLE001 - reported at completion
        task.error = exc


def device_fault(task, exc):
    """A fault the stream's wait reported while ``task`` was its last: the task's error."""
    if task.error is None:
        task.error = exc
