"""The local executor's CUDA workers: a task launched on a device stream, what runs there,
its completion, and how a fault reaches it.

A CUDA worker (a GPU, or an emulated ``cuda-emu`` device: one code path, two stream
implementations) binds a task's operands in its device context (copies in go on its node's
stream), launches the variant on that stream and goes on to the next task without waiting:
up to ``local.CUDA_PIPELINE`` tasks are in flight on the stream. A completion callback, queued
after the kernel, hands the task back (``state.completed``) and the worker releases its
successors, under the lock, on its own thread: the callback never touches the device. The
host waits for a stream only where it needs the data (a copy back to a host node) and when a
flushed graph ends. Roots a task uses are held on the node (no eviction under a memory
limit) until it completes.

The variant runs in the stream's order (:func:`run_on_stream`), and its Python exception,
or a device fault the stream's wait reports later, becomes the task's ``error``, which the
completion callback (on a runtime thread, never CUDA's) turns into the flush's
``TaskError``. Only the first fault is kept: a fault already given to a task is not raised
again at the stream's wait.
"""

from __future__ import annotations

import time

from ..flush import record_of

_perf = time.perf_counter


class StreamedWorkers:
    """The :class:`~hetero_nn.scheduler.executors.local.LocalExecutor`'s methods for workers
    with a stream (a mixin: they use its lock, state and faults)."""

    def _launch(self, task, w, rt):
        """Bind ``task`` in the device context and launch it on the stream; returns
        the task when it failed before reaching the stream (finish it now), else None."""
        node, stream = w.node, w.stream
        try:
            task.variant = variant = self._variants.choose(task, w.kind)
            fn = task.codelet.variants[variant]
            node.hold(task.handles)
            try:
                with node.context(), stream.activate():
                    arrays = self._bind(task, w)
                    task.t_start = _perf()  # launched; the stream's thread stamps the real start
                    began = stream.record()
                    stream.launch(run_on_stream, task, fn, arrays)
                    ended = stream.record()
            except BaseException:
                node.release(task.handles)
                raise
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            task.t_end = _perf()
            task.error = exc
            return task
        # on a runtime thread (not CUDA's); a device fault the wait reports is this task's
        stream.add_callback(lambda: self._completed(task, w, lambda: stream.elapsed(began, ended)),
                            fault=lambda exc: device_fault(task, exc))
        return None

    def _completed(self, task, w, device_time=None):
        """Stream callback: the task's kernels are done. Hand it to its worker, whatever
        fails on the way (the worker waits for it). ``device_time()``: the seconds the
        stream's events measured around the kernels (what the model learns)."""
        fault = None
        step = "the completion callback"
        try:
            now = _perf()
            w.node.release(task.handles)
            task.t_start = max(task.t_start, w.last_end)
            task.t_end = w.last_end = now
            if device_time is not None and task.error is None:
                task.t_start = now - device_time()
            if task.frees is not None:  # allocating per task (scheduler/lifetimes.py)
                self.rt._temporaries.plain.finished(task)
            if task.error is None:
                w.busy += task.t_end - task.t_start
                if self.rt.perfmodel is not None:
                    step = "the performance model's update in the completion callback"
                    self._variants.record(task, w.kind, w.index)
                    step = "the completion callback"
                if self.rt.tracing:
                    self._records.extend(record_of(task))
        except BaseException as exc:  # noqa: BLE001 - the flush's TaskError
            fault = exc
        if task.callback is not None:
            self._callback(task, w)
        with self._lock:
            if fault is not None:
                self._fail(f"{step} of task {task.id} (codelet {task.codelet.name!r}) on "
                           f"worker {w.name}", fault, abort=False)
            self.state.completed[w.index].append((task, False))  # ran: not failed when taken
            if w.idle:
                self._wake(w)
            else:
                w.cond.notify()




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
