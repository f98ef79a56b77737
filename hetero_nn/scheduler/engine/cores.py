"""Which core each thread of a parallel replay runs on: one thread per core.

Policy
------
A parallel replay runs one share per worker: the calling thread runs the first, one
engine thread per other worker runs the others, and a share waiting on another spins
(:mod:`~hetero_nn.scheduler.engine.dispatch`). Left to itself, the operating system
places a woken thread near the thread that woke it: after the process was idle (a
sleep, a Dask run, a program's pause between steps) it woke an engine thread on the
calling thread's core, and the two shares took turns on one core while the other core
stayed idle, each waiter spinning out its budget before the thread it waited for could
run. Measured on the 2-core machine (a 1,000-task Task Bench ``stencil_1d`` replay,
parallel mode): 0.5 ms back to back, 10-12 ms right after a 0.3 s sleep or a
``dask.threaded.get``; the load balancer did not separate the threads within a replay.

So, where a replay's threads are no more than the cores the calling thread may use,
:class:`CoreBinding` binds each engine thread to a core of its own (once; again only
when the calling thread has moved to that core) and the calling thread to the core it
is on, for the replay only: the calling thread's own affinity is restored when the
replay returns. StarPU binds its workers to cores the same way by default
(``STARPU_WORKERS_NOBIND``); ``StudyOptions(bind_threads=False)`` leaves placement to
the operating system. Where the threads outnumber the cores, or the platform has no
``sched_setaffinity``/``sched_getcpu``, nothing is bound, and a spinner's periodic
yield (``dispatch.YIELD_ROUNDS``) is what lets a thread on its core run.
"""

from __future__ import annotations

import ctypes
import os


def _sched_getcpu():
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


_GETCPU = _sched_getcpu()
HAVE_BINDING = hasattr(os, "sched_setaffinity") and _GETCPU is not None
"""Whether threads can be bound here (Linux: ``sched_setaffinity`` and ``sched_getcpu``)."""


class CoreBinding:
    """The cores of one runtime's engine threads (module docstring).

    >>> binding = CoreBinding([])
    >>> binding.enter(1)  # one thread: nothing to place
    False
    """

    def __init__(self, threads):
        self.threads = threads  # the engine threads (``threading.Thread``), in share order
        self.cores: dict[int, int] = {}  # engine thread index -> the core it is bound to
        self._saved = None  # the calling thread's affinity while a replay holds it

    def enter(self, count: int) -> bool:
        """Bind for a replay of ``count`` threads (the calling thread and the first
        ``count - 1`` engine threads); False, binding nothing, where they outnumber the
        calling thread's cores or binding is not available."""
        if count < 2 or not HAVE_BINDING or count - 1 > len(self.threads):
            return False
        try:
            mask = os.sched_getaffinity(0)
            here = _GETCPU()
            if len(mask) < count or here not in mask:
                return False
            others = [c for c in sorted(mask) if c != here]
            for i in range(count - 1):
                if self.cores.get(i) != others[i]:
                    os.sched_setaffinity(self.threads[i].native_id, {others[i]})
                    self.cores[i] = others[i]
            os.sched_setaffinity(0, {here})
        except OSError:  # a core taken away meanwhile (cgroups): run unbound
            self.cores.clear()
            return False
        self._saved = mask
        return True

    def exit(self) -> None:
        """Give the calling thread back the affinity it had before :meth:`enter`."""
        mask, self._saved = self._saved, None
        if mask is not None:
            try:
                os.sched_setaffinity(0, mask)
            except OSError:  # pragma: no cover - a core taken away meanwhile
                pass
