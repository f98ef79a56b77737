"""Device streams: in-order asynchronous queues of copies and kernels, CuPy's or emulated.

A CUDA memory node owns one stream; everything that touches the node's memory
goes through it, in order: copies in (host -> device from a staging buffer,
device -> device after an event of the source stream), kernels, copies out.
The host waits only where it needs the data (a copy back to a host replica,
the end of a flushed graph). Two implementations share one interface:

:class:`CupyStream`
    A ``cupy.cuda.Stream(non_blocking=True)`` on one GPU: ``launch`` calls the
    function inside the stream's context, so CuPy enqueues its kernels there and
    returns at once; callbacks are CUDA host functions.
:class:`EmulatedStream`
    One thread per stream draining a FIFO: ``launch`` enqueues the call and
    returns at once, the thread runs calls in order; events are set when the
    thread reaches them; callbacks run on the thread. With NumPy arrays this is
    the CUDA worker's path with everything but CuPy itself, so CI runs it.

Interface: ``launch(fn, *args)``, ``record() -> event`` (``event.synchronize()``,
``event.done``), ``wait_event(event)`` (later work waits for it),
``add_callback(fn)`` (called with no argument once earlier work is done: it must
not touch the device), ``synchronize()``, ``close()``; and ``activate()``, a
context in which array-module calls made by the host go to this stream.

The emulated device context (:func:`emulated_device`) is thread-local, as
CUDA's current device is; allocations on an emulated node check it, so an
allocation made outside the target device's context fails in CI as it would
land on the wrong GPU on a real machine.
"""

from __future__ import annotations

import contextlib
import threading
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
    """A point in an emulated stream; set when the stream's thread reaches it."""

    __slots__ = ("_flag",)

    def __init__(self):
        self._flag = threading.Event()

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

    wait_timeout = 600.0  # Runtime(wait_timeout=) sets it (scheduler/stalls.py)

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
        self._put(event._flag.set)
        return event

    def wait_event(self, event) -> None:
        """Work enqueued from now on waits for ``event`` (of any stream)."""
        if not event.done:
            self._put(event.synchronize)

    def add_callback(self, fn) -> None:
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
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def __repr__(self):
        return f"EmulatedStream({self.name})"


class CupyStream:
    """A non-blocking CuPy stream on one GPU behind the same interface."""

    def __init__(self, cupy, name: str, device_id: int):
        self.cupy = cupy
        self.name = name
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def launch(self, fn, *args) -> None:
        with self.cupy.cuda.Device(self.device_id), self._stream:
            fn(*args)

    def record(self):
        with self.cupy.cuda.Device(self.device_id):
            return self._stream.record()

    def wait_event(self, event) -> None:
        self._stream.wait_event(event)

    def add_callback(self, fn) -> None:
        self._stream.launch_host_func(lambda _arg: fn(), None)

    def synchronize(self) -> None:
        self._stream.synchronize()

    def activate(self):
        return self._stream

    def close(self) -> None:
        self._stream.synchronize()

    def __repr__(self):
        return f"CupyStream({self.name})"
