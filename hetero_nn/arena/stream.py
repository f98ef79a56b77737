"""Device streams: in-order asynchronous queues of copies and kernels, CuPy's or emulated.

A CUDA memory node owns one stream; everything that touches the node's memory
goes through it, in order: copies in (host -> device from a staging buffer,
device -> device after an event of the source stream), kernels, copies out.
The host waits only where it needs the data (a copy back to a host replica,
the end of a flushed graph). Two implementations share one interface:

:class:`CupyStream`
    A ``cupy.cuda.Stream(non_blocking=True)`` on one GPU: ``launch`` calls the
    function inside the stream's context, so CuPy enqueues its kernels there and
    returns at once; callbacks run on a runtime thread that waits for an event
    (never on CUDA's host-function thread).
:class:`EmulatedStream`
    One thread per stream draining a FIFO: ``launch`` enqueues the call and
    returns at once, the thread runs calls in order; events are set when the
    thread reaches them; callbacks run on the thread. With NumPy arrays this is
    the CUDA worker's path with everything but CuPy itself, so CI runs it.

Interface: ``launch(fn, *args)``, ``record() -> event`` (``event.synchronize()``,
``event.done``), ``elapsed(start, end)`` (seconds between two completed events: the
device's time, which feeds the performance model), ``wait_event(event)`` (later work
waits for it), ``add_callback(fn, fault=None)`` (``fn()`` on a runtime thread once
earlier work is done; ``fault(error)`` first if the device faulted meanwhile),
``synchronize()``, ``close()``; and ``activate()``, a context in which array-module
calls made by the host go to this stream.

The emulated device context (:func:`emulated_device`) is thread-local, as
CUDA's current device is: an emulated stream's thread runs in its device's context, and
``MemoryNode.context()`` enters it for an emulated node as ``cupy.cuda.Device`` does for
a real one; :func:`current_emulated_device` reads it. No allocation checks it (an
emulated node's arrays are host arrays wherever they are made).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque

from ..errors import TaskError

_current = threading.local()


@contextlib.contextmanager
def emulated_device(device_id: int):
    """Make emulated device ``device_id`` current on this thread (like ``cupy.cuda.Device``)."""
    previous = getattr(_current, "device", None)
    _current.device = device_id
    try:
        yield
    finally:
        _current.device = previous


def current_emulated_device():
    """The emulated device current on this thread, or ``None``."""
    return getattr(_current, "device", None)


class EmulatedEvent:
    """A point in an emulated stream; set (and stamped) when the stream's thread reaches it."""

    __slots__ = ("_flag", "time")

    def __init__(self):
        self._flag = threading.Event()
        self.time = None

    def _set(self):
        self.time = time.perf_counter()
        self._flag.set()

    @property
    def done(self) -> bool:
        return self._flag.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the stream reaches this event; ``TaskError`` after ``timeout`` s."""
        if not self._flag.wait(timeout):
            raise TaskError(f"an emulated stream made no progress for {timeout:g} s "
                            "(Runtime(wait_timeout=)): the event was not reached")


class EmulatedStream:
    """An in-order asynchronous queue served by one thread (see the module docstring)."""

    wait_timeout = 600.0  # Runtime(wait_timeout=) sets it (scheduler/executors/stalls.py)

    def __init__(self, name: str, device_id: int):
        self.name = name
        self.device_id = device_id
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._error = None
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"hetero_nn-{name}-stream")
        self._thread.start()

    # -- the stream's thread
    def _serve(self):
        cond, queue = self._cond, self._queue
        with emulated_device(self.device_id):
            while True:
                with cond:
                    while not queue:
                        if self._closing:
                            return
                        cond.wait()
                    fn, args = queue.popleft()
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - kept, raised at synchronize
                    if self._error is None:
                        self._error = exc

    def _put(self, fn, args=()):
        with self._cond:
            if self._closing:
                raise RuntimeError(f"stream {self.name} is closed")
            self._queue.append((fn, args))
            self._cond.notify()

    # -- the interface
    def launch(self, fn, *args) -> None:
        """Enqueue ``fn(*args)``; it runs after everything enqueued before it."""
        self._put(fn, args)

    def record(self) -> EmulatedEvent:
        event = EmulatedEvent()
        self._put(event._set)
        return event

    @staticmethod
    def elapsed(start, end) -> float:
        """Seconds between two completed events of this stream."""
        return end.time - start.time

    def wait_event(self, event) -> None:
        """Work enqueued from now on waits for ``event`` (of any stream)."""
        if not event.done:
            self._put(event.synchronize)

    def add_callback(self, fn, fault=None) -> None:
        """``fn()`` on the stream's thread once earlier work is done (an emulated device
        has no faults of its own: a kernel's exception is its task's)."""
        self._put(fn)

    def synchronize(self) -> None:
        """Block until everything enqueued so far has run (``TaskError`` naming the stream
        after ``wait_timeout`` s, the runtime's); re-raise a copy's failure."""
        try:
            self.record().synchronize(self.wait_timeout)
        except TaskError as exc:
            raise TaskError(f"stream {self.name} ({len(self._queue)} call(s) queued): "
                            f"{exc}") from None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def activate(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        """Serve what is queued, then stop the thread (``TaskError`` naming the stream when
        it has not finished after ``wait_timeout`` s: a call that never returns)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        _join(self._thread, self.name, self.wait_timeout, len(self._queue))

    def __repr__(self):
        return f"EmulatedStream({self.name})"


def _join(thread, name, timeout, queued) -> None:
    """Join a stream's thread, for ``timeout`` s at most (None: for ever); a thread still
    running then is left behind (a daemon) and the close raises."""
    thread.join(timeout)
    if thread.is_alive():
        raise TaskError(f"stream {name} made no progress for {timeout:g} s "
                        f"(Runtime(wait_timeout=)) at close: its call in progress has not "
                        f"returned, {queued} more queued; its thread is left behind")


class CupyStream:
    """A non-blocking CuPy stream on one GPU behind the same interface.

    Callbacks never run on CUDA's own thread (``cudaLaunchHostFunc``, where CUDA calls are
    forbidden and an exception is lost): :meth:`add_callback` records an event, and a
    runtime thread per stream waits for the events in order and runs the callbacks. A
    device fault that the wait reports goes to the callback's ``fault`` (the task whose
    work the event closed), else it is raised by the next :meth:`synchronize`.
    """

    wait_timeout = 600.0  # Runtime(wait_timeout=) sets it: close()'s deadline

    def __init__(self, cupy, name: str, device_id: int):
        self.cupy = cupy
        self.name = name
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._pending: deque = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._error = None
        self._fault = None  # a device fault already given to a task (CUDA's errors are sticky)
        self._thread = threading.Thread(target=self._serve_callbacks, daemon=True,
                                        name=f"hetero_nn-{name}-callbacks")
        self._thread.start()

    def launch(self, fn, *args) -> None:
        with self.cupy.cuda.Device(self.device_id), self._stream:
            fn(*args)

    def record(self):
        with self.cupy.cuda.Device(self.device_id):
            return self._stream.record()

    def elapsed(self, start, end) -> float:
        """Seconds between two completed events of this stream (CUDA's event timer)."""
        return self.cupy.cuda.get_elapsed_time(start, end) / 1e3

    def wait_event(self, event) -> None:
        self._stream.wait_event(event)

    def add_callback(self, fn, fault=None) -> None:
        """``fn()`` on this stream's callback thread once the work enqueued so far is done;
        ``fault(error)`` first if the device reports a fault while it is waited for."""
        event = self.record()
        with self._cond:
            self._pending.append((event, fn, fault))
            self._cond.notify()

    def _serve_callbacks(self):
        cond, pending = self._cond, self._pending
        with self.cupy.cuda.Device(self.device_id):
            while True:
                with cond:
                    while not pending:
                        if self._closing:
                            return
                        cond.wait()
                    event, fn, fault = pending[0]
                try:
                    try:
                        event.synchronize()
                    except Exception as exc:  # noqa: BLE001 - a device fault: the task's error
                        if fault is None:
                            raise
                        self._fault = exc
                        fault(exc)
                    fn()
                except BaseException as exc:  # noqa: BLE001 - raised at synchronize
                    if self._error is None:
                        self._error = exc
                with cond:
                    pending.popleft()
                    cond.notify_all()

    def synchronize(self) -> None:
        """Block until the stream's work and the callbacks before now have run; re-raise
        a failure nobody else was given. The callbacks go first, so that a device fault
        reaches the task it belongs to before this wait sees it."""
        with self._cond:
            while self._pending:
                self._cond.wait()
        self._device_synchronize()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _device_synchronize(self):
        try:
            self._stream.synchronize()
        except Exception:
            if self._fault is None:  # a fault no task was given: this wait's error
                raise

    def activate(self):
        return self._stream

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        _join(self._thread, self.name, self.wait_timeout, len(self._pending))  # serves first
        self._device_synchronize()

    def __repr__(self):
        return f"CupyStream({self.name})"
