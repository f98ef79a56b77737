"""Replays that suit the machine: a segment runs on its workers' threads only while that
beats running it on one.

Policy
------
A compiled segment's shares run on one thread per worker (*parallel*). Where other
processes take the cores (a busy machine, a neighbour pinned to one core), a worker
whose thread waits for a core holds up every worker that waits for its tasks: the
replay of a fine-grained graph can then take many times what one thread takes for
the whole of it. So each segment of CPU workers on one memory node keeps a
:class:`Contention`: the wall times of its last replays in each *mode*, parallel or
*serial* (every task on the calling thread, in one topological merge of the shares'
orders, :func:`serial_order`, no counter waited on or published). It replays in the
mode measured faster (a new one starts in the mode the runtime's last segment replayed
in: a busy machine stays busy between two graphs); the other mode is tried again after
``probe`` replays (4 at first, doubling each time the try loses, to :data:`MAX_PROBE`;
back to 4 when it wins), so a
neighbour that comes or goes is noticed. Two parallel replays in a row slower than the
sum of their tasks' own times (what one thread would take) try serial at the next
replay; one under :data:`CLEAR_WIN` of that sum beats one thread plainly, and no serial
try is made while they do (a try costs a replay at up to twice the time). When the
tasks change cost (a step parameter's new value, :meth:`Contention.restart`) the walls
measured are forgotten and the other mode is tried at the third replay: a verdict made
for tasks of another size does not hold for these (Task Bench halves its tasks' size at
each point, four replays a point: a serial verdict at one size kept every replay of the
next, larger one on one thread, capping its efficiency at 50%).

One replay decides nothing alone: on a shared or virtual machine a thread loses its
core for milliseconds now and then (measured on the 2-core machine: a parallel replay of
10 ms took 27-44 ms once in about twenty, where the other thread's core was taken), and
a parallel replay pays for it in full where a serial one does not. So a try is judged
against the median of the current mode's last :data:`RECENT` walls (one such replay moves
no median; their best was used until the seventh session, and beside a busy loop it
judged serial tries against a parallel replay that had had both cores by luck, so
parallel stayed at 1.5x serial's time), and the early serial try needs two slow parallel
replays in a row. A parallel replay under :data:`CLEAR_WIN` of its tasks' summed time
stops serial tries only while no serial wall measured is under it: beside a busy loop the
tasks' own times include the time their thread waited for its core, so that sum
overstates what one thread takes. Luck runs the other way too: beside a
busy loop pinned to one core, the scheduler now and then gave a parallel try both cores
(3.4 ms against serial's 4.8), and the parallel replays after it took 8 ms until the next
try, four replays later. So a win is kept only if the next replay in the new mode also
beats the wall the try beat; else the mode goes back at once, the period doubled as
after a loss.

A try costs: beside a busy loop pinned to one core a parallel replay took up to ten
times a serial one, so each try of parallel was the largest replay of its run (30-50 ms
among 4-5 ms ones). A try of parallel against serial is therefore *cut* once it cannot
win (:meth:`Contention.cutoff`: :data:`WIN` of serial's recent median wall): the calling
thread's share stops the replay (``abort`` set to :data:`~.dispatch.CUT`) when one of
its waits passes that time; the engine jobs no thread has started yet are dropped rather than waited for
(their thread may be the one without a core), and the calling thread runs every task
not yet run in the serial order (:func:`serial_order`; the loop skips tasks already
ended). Same kernels on the same replicas in an order the dependencies allow: the same
bits. The try is lost (:meth:`Contention.lost`), its wall not kept (part of it ran
serially); its trace records name each task's own worker, also for the tasks the calling
thread finished. ``StudyOptions(cut_tries=False)`` runs every try to its end.

The interpreter lock: a replay takes it a few times (an engine thread picking up its share,
each share's thread coming back from the compiled loop, the calling thread collecting
the results). Beside a thread that holds the lock (pure Python in a loop: an event
loop's callbacks, a profiler, a neighbour library's worker), each of those waits lasts
the interpreter's switch interval (5 ms by default), so a 1 ms replay took 15-20 ms.
:class:`QuickHandoffs` lowers the switch interval to :data:`REPLAY_SWITCH_INTERVAL`
from a runtime's first compiled replay (when its engine threads start) to its
``close()``, then restores the program's value (``StudyOptions(gil_handoff=False)``
leaves it alone). Not per replay: the program's own Python between two replays (a
training step's other code) would pay the same waits, and a value restored at the end
of a replay makes the calling thread's next wait for the lock a full 5 ms one.

Tasks keep their binding (their worker's buffers): a serial replay runs the same
kernels on the same replicas in an order their dependencies allow, so its results
are the parallel replay's bit for bit. Its trace records name the worker whose thread
ran them (the first).

The deadline on the calling thread: a share that runs on an engine thread is bounded
by the replay's deadline (``Runtime(wait_timeout=)``: the caller stops waiting for it
and raises a ``TaskError``). The share the calling thread runs (a serial replay's one
share, worker 0's of a parallel one) cannot be: a task that never returns there keeps
the program's own thread, and Python cannot take a thread back from a call. Handing the
serial share to an engine thread while the caller only waits would cover it, at two
thread wake-ups per replay: beside other processes (load 6 on 2 cores) that made
serial replays 5.6-6.7 ms against 0.8-1.1 ms, the very cost serial mode exists to
avoid. So the :data:`WATCHDOG` looks at the calling thread's share under way: once no
task of the replay has ended for ``wait_timeout``, it stops the replay (``abort``:
nothing that has not started runs, as when a wait passes its deadline) and logs the
engine's state, naming the task that runs (logger ``hetero_nn.scheduler``, error); the
replay raises its ``TaskError`` as soon as that task returns. It is one thread per
process while replays run, asleep but every :data:`IDLE_LOOK` seconds (or
``wait_timeout``, where shorter); a look that finds no replay since the one before
ends it. Its cost on a replay: a lock taken and two dictionary operations (and a
thread started after a pause of a second or more).

State
-----
``walls``: per mode, the last :data:`KEEP` wall times; ``mode``: the mode of the next
replay; ``probe``, ``countdown``: replays between tries of the other mode; ``beaten``,
``lost_probe``: after a try won, the wall it beat and the period before (the next
replay confirms the win or undoes it); ``cuts``: tries cut. The
watchdog's ``running``: per segment whose calling thread's share runs, its replay's
epoch, deadline, last progress (a task ended), tasks ended, and whether it was reported.
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time

import numpy as np

from ..executors.stalls import TIMED_OUT, engine_state, stalled

KEEP = 5          # wall times kept per mode
FIRST_PROBE = 4   # replays before the other mode is tried again (doubles while it loses)
MAX_PROBE = 256
REPLAY_SWITCH_INTERVAL = 1e-4  # seconds: the interpreter's switch interval during replays
IDLE_LOOK = 1.0   # seconds between two looks of the watchdog at most; one that finds no
#                   replay since the last ends its thread (the next replay starts another)
WIN = 0.9         # the other mode wins when its time is under this share of the current's
CLEAR_WIN = 0.75  # a parallel replay under this share of its tasks' summed time: no serial try
RECENT = 3        # a try is judged against the median of the current mode's last walls


def serial_order(seg) -> list:
    """The segment's tasks (and planned copies) in one order that every worker's order and
    every wait between workers allow: the shares merged."""
    emitted = set()
    pos = [0] * len(seg.share_tasks)
    out = []
    progress = True
    while progress:
        progress = False
        for w, tasks in enumerate(seg.share_tasks):
            k = pos[w]
            while k < len(tasks) and all(p in emitted for p in seg.waits_of[tasks[k]]):
                emitted.add(tasks[k])
                out.append(tasks[k])
                k += 1
                progress = True
            pos[w] = k
    if len(out) != sum(len(t) for t in seg.share_tasks):
        raise RuntimeError("the shares' orders cannot be merged (a wait on no task)")
    return out


class Contention:
    """Which mode a segment's next replay runs in, from the replays measured (module
    docstring)."""

    def __init__(self, mode="parallel"):
        self.walls = {"parallel": [], "serial": []}
        self.mode = mode  # the first replays' (the runtime's last verdict: EngineThreads.mode)
        self.probe = FIRST_PROBE
        self.countdown = FIRST_PROBE
        self.slow = 0  # parallel replays in a row slower than one thread would be
        self.beaten = None  # after a try won: the wall it beat (the next replay must too)
        self.lost_probe = FIRST_PROBE  # the probe before that win, doubled if not confirmed
        self.cuts = 0  # tries of parallel cut at their cutoff (lost)

    def __repr__(self):
        medians = {m: f"{1e3 * statistics.median(w):.2f} ms" for m, w in self.walls.items()
                   if w}
        return (f"Contention(mode={self.mode!r}, medians={medians}, probe={self.probe}, "
                f"cuts={self.cuts})")

    def restart(self) -> None:
        """The segment's tasks changed cost (a step parameter's new value): forget the
        walls, keep the mode for two replays, then try the other one."""
        self.walls = {"parallel": [], "serial": []}
        self.probe = FIRST_PROBE
        self.countdown = 2
        self.slow = 0
        self.beaten = None

    def next_mode(self) -> str:
        """The mode of the next replay: the current one, or the other when it is due."""
        if self.countdown <= 0:
            return "serial" if self.mode == "parallel" else "parallel"
        return self.mode

    def cutoff(self) -> float | None:
        """Seconds the next replay may take before it has lost: a try of parallel against
        serial cannot win once it took :data:`WIN` of the wall it must beat, so it is cut
        there (module docstring); None for any other replay."""
        if self.mode != "serial" or self.next_mode() != "parallel":
            return None
        mine = self.reference("serial")
        return None if mine is None else WIN * mine

    def reference(self, mode) -> float | None:
        """The wall a try against ``mode`` must beat: the median of its last :data:`RECENT`
        walls (None before any). Not their best: beside a busy loop a parallel replay now
        and then had both cores (3 ms among 7-11 ms ones), and a serial try judged against
        that luck lost at every try while parallel stayed 1.5x slower."""
        recent = self.walls[mode][-RECENT:]
        return statistics.median(recent) if recent else None

    def lost(self) -> None:
        """A try of parallel was cut at :meth:`cutoff`: lost, its wall not kept (serial
        ran part of it)."""
        self.probe = min(2 * self.probe, MAX_PROBE)
        self.countdown = self.probe
        self.cuts += 1

    def observe(self, mode, wall, task_seconds) -> None:
        """A replay in ``mode`` took ``wall`` seconds; its tasks ran ``task_seconds``."""
        walls = self.walls[mode]
        walls.append(wall)
        del walls[:-KEEP]
        if mode != self.mode:  # a try of the other mode
            mine = self.reference(self.mode)
            if mine is None:
                mine = float("inf")
            if wall < WIN * mine:  # won: kept if the next replay confirms it
                self.mode, self.beaten, self.lost_probe = mode, mine, self.probe
                self.probe = FIRST_PROBE
            else:
                self.probe = min(2 * self.probe, MAX_PROBE)
            self.countdown = self.probe
            return
        if self.beaten is not None:  # the first replay after a win: is it one too?
            beaten, self.beaten = self.beaten, None
            if wall >= beaten:  # no: the win was a lucky replay; back, as after a loss
                self.mode = "serial" if mode == "parallel" else "parallel"
                self.probe = self.countdown = min(2 * self.lost_probe, MAX_PROBE)
                return
        self.countdown -= 1
        if mode != "parallel":
            return
        self.slow = self.slow + 1 if wall > task_seconds else 0
        serial = self.reference("serial")
        if wall < CLEAR_WIN * task_seconds and (serial is None or serial >= wall):
            self.countdown = max(self.countdown, 1)  # one thread cannot win: no try due
        elif self.slow >= 2 and not self.walls["serial"]:
            self.countdown = 0  # worse than one thread would do, twice: try it now


class QuickHandoffs:
    """The switch interval is :data:`REPLAY_SWITCH_INTERVAL` while any holder (the engine
    threads of a runtime) is open; the last one closed restores the program's value,
    unless the program set another meanwhile (module docstring)."""

    _lock = threading.Lock()
    _active = 0
    _saved = None
    _set = None  # the value read back after setting it (the interpreter keeps microseconds)

    def __init__(self):
        cls = QuickHandoffs
        self.open = True
        with cls._lock:
            if cls._active == 0:
                cls._saved = sys.getswitchinterval()
                if cls._saved > REPLAY_SWITCH_INTERVAL:
                    sys.setswitchinterval(REPLAY_SWITCH_INTERVAL)
                cls._set = sys.getswitchinterval()
            cls._active += 1

    def close(self):
        cls = QuickHandoffs
        with cls._lock:
            if not self.open:
                return
            self.open = False
            cls._active -= 1
            if cls._active == 0:
                if sys.getswitchinterval() == cls._set:  # else the program changed it
                    sys.setswitchinterval(cls._saved)
                cls._saved = cls._set = None


class Watchdog:
    """The deadline of the shares the calling thread runs (module docstring)."""

    def __init__(self):
        self.running: dict = {}  # segment -> [epoch, deadline s, since, tasks ended, told]
        self.started = 0  # watched replays so far (an idle look ends the thread)
        self.period = None  # seconds between two looks (IDLE_LOOK, or a shorter deadline)
        self._wake = threading.Condition(threading.Lock())
        self._thread = None

    def watch(self, seg, epoch, run):
        """``run()`` (the calling thread's share of ``seg`` at replay ``epoch``), watched."""
        timeout = seg.rt.wait_timeout
        with self._wake:
            self.running[seg] = [epoch, timeout, time.monotonic(), 0, False]
            self.started += 1
            if self._thread is None or timeout < self.period:
                self.period = min(timeout, self.period or IDLE_LOOK)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name="hetero_nn-watchdog")
                    self._thread.start()
                self._wake.notify()
        try:
            return run()
        finally:
            self.running.pop(seg, None)

    def _loop(self):
        seen = -1
        while True:
            with self._wake:
                self._wake.wait(self.period)
                if not self.running and self.started == seen:  # a whole period idle
                    self._thread = self.period = None
                    return
                seen = self.started
            self._look()

    def _look(self):
        """Stop, and report, each watched replay in which no task ended for its deadline
        (holding no segment once it returns)."""
        now = time.monotonic()
        for seg, entry in list(self.running.items()):
            epoch, timeout, since, ended, told = entry
            count = int(np.count_nonzero(seg.times[:, 1]))
            if count != ended:
                entry[2], entry[3] = now, count
            elif now - since >= timeout and not told and self.running.get(seg) is entry:
                entry[4] = True
                if seg.abort[0] == 0:  # (else a wait on another worker saw it first)
                    seg.abort[0] = TIMED_OUT
                _log.error("%s\n(the replay raises this once that task returns: it runs on "
                           "the calling thread)",
                           stalled("a replay", timeout, engine_state(seg, epoch)))


_log = logging.getLogger("hetero_nn.scheduler")
WATCHDOG = Watchdog()
"""The process's watchdog (:class:`Watchdog`)."""
