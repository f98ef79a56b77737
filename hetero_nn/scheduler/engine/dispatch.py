"""The compiled dispatch loop: one worker's share of a replayed graph in one call.

Policy
------
A worker's share is its tasks in a fixed order (:mod:`~hetero_nn.scheduler.policies.list_scheduling`).
:func:`run_compiled` runs them from a given position without the interpreter lock
(``nogil``): for each task it first waits for its predecessors that run on other
workers, then, if the task is compiled, stamps its start, calls each of its
entries' trampolines through their addresses, stamps its end and, if a task on
another worker waits for it, publishes it. It returns at the first task that
must run in Python (its predecessors already waited for), at the end of the
share, or when a task failed or another worker aborted the replay (checked before
every task, so a failure cancels what the other shares have not started).
:func:`run_share` is the Python side: it calls the loop, runs the Python tasks
it stops at, and calls it again.

Counters
--------
An edge between two workers is a counter: ``done[t]`` holds the number of the
last replay (its *epoch*) in which task ``t`` finished, so nothing is reset
between replays. A waiter spins (checks with the processor's pause hint) for at most
``spin_ns``, then yields its core a few times (``YIELDS``), then sleeps on the counter
with a futex (``WAIT_NS`` at most, so it also sees an abort), counting itself in
``sleepers``; a publisher stores the epoch and, only when someone sleeps, wakes the
sleepers of that counter. Tasks no other worker waits for publish nothing. A wait
longer than ``timeout_ns`` (``Runtime(wait_timeout=)``, :mod:`~hetero_nn.scheduler.executors.stalls`)
sets ``abort`` to ``TIMED_OUT`` and returns False: every share stops, and the replay
raises a ``TaskError`` with the engine's state.

How long to spin (:func:`spin_budget`): a futex sleep and its wake-up cost tens of
microseconds, so a worker that sleeps whenever its predecessor on another worker takes
longer than the spin makes every task of that size pay them (Task Bench showed a floor
of about 20 us per task with a 10 us spin). Where every thread of the replay has a core
of its own, a waiter spins ``SPIN_NS`` (100 us): it takes nothing from anyone. Where the
workers outnumber the cores, a spinning worker would take the core of the one it waits
for, so it spins ``SHORT_SPIN_NS`` (10 us) and sleeps. And whatever the budget, a spinner
that finds it lost its core meanwhile (two reads of the clock ``PREEMPTED_NS`` apart: another
process runs there, the OpenMP runtimes' "passive wait" case) stops spinning at once: its
spin only delays the thread it waits for. Where the whole replay loses to one thread, the
engine runs it on one (:mod:`~hetero_nn.scheduler.engine.contention`).

Each wait that does not find its counter set at once is counted in its share's row of
``stats`` (:data:`STATS`: waits, how many ended spinning and their spin time, cut short
because the core was lost, ended yielding, slept, futex calls, time asleep, the longest):
what a stalled replay's report prints (:func:`~hetero_nn.scheduler.executors.stalls.engine_state`)
and how a slow replay is told apart (a sleep of milliseconds is a partner without a core;
many sleeps of tens of microseconds would be hand-offs the spin missed).

A try of the other mode (:mod:`~hetero_nn.scheduler.engine.contention`) gives the calling
thread's share a ``cutoff_ns``: a wait of that share past it sets ``abort`` to :data:`CUT`
and returns ``ABORTED``; the other shares stop as after a failure, and the caller
finishes the replay on one thread. (Not earlier from the share's pace: the first tasks
carry the engine threads' wake-up, so a projection from them cut tries that would win.)

Where the spinner and the thread it waits for share one core (the operating system put
them there: :mod:`~hetero_nn.scheduler.engine.cores` binds a replay's threads to cores
of their own where it can), the other thread runs only when the spinner gives the core
up, and a spin never sees it finish: so the spinner yields its core every
``YIELD_ROUNDS`` rounds (a few microseconds; the yield returns at once where nothing else
waits for the core). Measured (a 1,000-task ``stencil_1d`` replay whose two threads the
OS had put on one core): 10-12 ms with the spin alone, 4 ms with the periodic yield,
against 0.5 ms on two cores.

State of one share (arrays, built by :mod:`~hetero_nn.scheduler.engine.replay`)
-----------------------------------------------------------------------
``order[k]``: the task at position ``k`` (an index into the segment's tasks);
``python[k]``: 1 when it runs in Python; ``entry_start[k]:entry_start[k+1]``: its
entries in ``trampolines``/``blocks`` (addresses); ``wait_start[k]:wait_start[k+1]``:
the predecessors to wait for in ``waits``; ``notify[k]``: whether to publish it.
Shared by the shares of a segment: ``done`` (int32 per task), ``times`` (int64
``[tasks, 2]``, start and end in ``monotonic_ns``), ``sleepers`` and ``abort``
(int32 ``[1]``).

Early replays (:mod:`~hetero_nn.scheduler.engine.early`): a replay may start while its
flush is still being submitted; ``gate`` (int32 ``[3]``: tasks submitted so far, gate
sleepers, the count a sleeper wants) holds back every task whose index is not below the
count (:func:`wait_gate`: a short spin, then futex sleeps until ``GATE_BATCH`` more are
submitted, so the submitter wakes it once per batch; no deadline: the program's pace is
not a stall; an abort ends it). :data:`OPEN` is the gate of every other replay: nothing held.

Return value of :func:`run_compiled`: ``len(order)`` when the share is done;
``k >= 0``: the task at ``k`` runs in Python; ``ABORTED``: another share failed;
``-(k + 2)``: the task at ``k`` failed (its trampoline returned non-zero).
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

from .intrinsics import (atomic_add, atomic_load, atomic_store, call_pointer, cpu_pause,
                         cpu_yield, futex_wait, futex_wake, monotonic_ns)
from ..executors.stalls import TIMED_OUT

SPIN_NS = 100_000        # spin before sleeping, where every thread has a core
SHORT_SPIN_NS = 10_000   # spin before sleeping, where workers outnumber the cores
WAIT_NS = 1_000_000      # longest futex sleep: how late at worst an abort is seen
PREEMPTED_NS = 50_000    # a gap this long between two reads of the clock while spinning:
#                          the spinner lost its core (contended): it stops spinning
YIELDS = 4               # sched_yield calls between the spin and the sleep
YIELD_ROUNDS = 4         # while spinning, a sched_yield every this many rounds of 64
#                          pause hints (about 7 us on the 2-core machine)
ABORTED = -1
CUT = 3                  # ``abort`` of a try stopped at its cutoff (contention.py): no failure
GATE_SPIN_NS = 2_000     # spin on the gate before sleeping (the submitter takes microseconds
#                          a task: a longer spin would take its core)
GATE_BATCH = 64          # submissions a sleeper on the gate waits for (one wake-up each)
# a share's wait counters (a row of ``CompiledSegment.wait_stats``, :func:`wait_done`)
WAITS, SPUN, SPIN_NS_SUM, PREEMPTED, YIELDED, SLEPT, FUTEX_CALLS, SLEEP_NS_SUM, LONGEST_NS = \
    range(9)
STATS = ("waits", "spun", "spin_ns", "preempted", "yielded", "slept", "futex_calls",
         "sleep_ns", "longest_ns")
OPEN = np.array([np.iinfo(np.int32).max, 0, 0], dtype=np.int32)  # every task submitted


def spin_budget(threads: int) -> int:
    """Nanoseconds a waiter spins when ``threads`` threads run a replay's shares (module
    docstring): ``SPIN_NS`` where the process may use as many cores, else
    ``SHORT_SPIN_NS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return SPIN_NS if threads <= cores else SHORT_SPIN_NS


@njit(nogil=True, cache=True)
def wait_done(done, t, epoch, sleepers, abort, spin_ns, timeout_ns, stats, cutoff_ns=0):
    """Block until ``done[t] >= epoch``; False if the replay was aborted meanwhile, or if
    ``timeout_ns`` passed first (then ``abort`` is set to ``TIMED_OUT``), or the clock
    passed ``cutoff_ns`` (when not 0: a losing try, ``abort`` set to :data:`CUT`). Counts
    the wait in ``stats`` (the share's row, :data:`STATS`), unless it was over before it
    began."""
    if atomic_load(done, t) >= epoch:
        return True
    start = monotonic_ns()
    deadline = start + spin_ns
    last = start
    rounds = 0
    stats[WAITS] += 1
    while True:  # spin
        for _ in range(64):
            if atomic_load(done, t) >= epoch:
                now = monotonic_ns()
                stats[SPUN] += 1
                stats[SPIN_NS_SUM] += now - start
                return True
            cpu_pause()
        now = monotonic_ns()
        if cutoff_ns != 0 and now >= cutoff_ns:
            cut(abort)
            return False
        if now - last > PREEMPTED_NS:  # the core is contended: spinning only delays
            stats[PREEMPTED] += 1
            break
        if now >= deadline:
            break
        last = now
        rounds += 1
        if rounds % YIELD_ROUNDS == 0:  # the awaited thread may be queued on this core
            cpu_yield()
    for _ in range(YIELDS):  # yield
        cpu_yield()
        if atomic_load(done, t) >= epoch:
            stats[YIELDED] += 1
            return True
    atomic_add(sleepers, 0, np.int32(1))  # sleep
    slept = monotonic_ns()
    stats[SLEPT] += 1
    ok = True
    while True:
        seen = atomic_load(done, t)
        if seen >= epoch:
            break
        if atomic_load(abort, 0) != 0:
            ok = False
            break
        now = monotonic_ns()
        if now - start >= timeout_ns:
            if atomic_load(abort, 0) == 0:
                atomic_store(abort, 0, np.int32(TIMED_OUT))
            ok = False
            break
        if cutoff_ns != 0 and now >= cutoff_ns:
            cut(abort)
            ok = False
            break
        stats[FUTEX_CALLS] += 1
        futex_wait(done, t, seen, WAIT_NS if cutoff_ns == 0 else
                   max(1_000, min(WAIT_NS, cutoff_ns - now)))
    atomic_add(sleepers, 0, np.int32(-1))
    now = monotonic_ns()
    stats[SLEEP_NS_SUM] += now - slept
    if now - start > stats[LONGEST_NS]:
        stats[LONGEST_NS] = now - start
    return ok


@njit(nogil=True, cache=True)
def cut(abort):
    """Stop a losing try (:data:`CUT`), unless the replay stops for another reason already."""
    if atomic_load(abort, 0) == 0:
        atomic_store(abort, 0, np.int32(CUT))


@njit(nogil=True, cache=True)
def wait_gate(gate, t, abort):
    """Block until ``gate[0] > t`` (task ``t`` submitted; once asleep, until ``GATE_BATCH``
    more are, or the gate opens); False once the replay is aborted (a stop wakes the
    sleepers without opening the gate)."""
    deadline = monotonic_ns() + GATE_SPIN_NS
    while monotonic_ns() < deadline:
        for _ in range(64):
            if atomic_load(gate, 0) > t:
                return True
            cpu_pause()
        if atomic_load(abort, 0) != 0:
            return False
    atomic_store(gate, 2, np.int32(t + GATE_BATCH))  # the count to be woken at
    atomic_add(gate, 1, np.int32(1))
    ok = True
    while True:
        seen = atomic_load(gate, 0)
        if seen >= t + GATE_BATCH:  # (or opened, or the replay stopped: early.py)
            break
        if atomic_load(abort, 0) != 0:
            ok = False
            break
        futex_wait(gate, 0, seen, WAIT_NS)
    atomic_add(gate, 1, np.int32(-1))
    return ok


@njit(nogil=True, cache=True)
def open_gate(gate, count):
    """``gate[0] = count`` (``count`` tasks submitted), waking its sleepers if any; with
    ``count`` -1, only the wake (a stop: the sleepers then see the abort)."""
    if count >= 0:
        atomic_store(gate, 0, np.int32(count))
    if count < 0 or atomic_load(gate, 1) != 0 and count >= atomic_load(gate, 2):
        futex_wake(gate, 0)


@njit(nogil=True, cache=True)
def publish(done, t, epoch, sleepers):
    """``done[t] = epoch``, waking whoever sleeps on it."""
    atomic_store(done, t, epoch)
    if atomic_load(sleepers, 0) != 0:
        futex_wake(done, t)


@njit(nogil=True, cache=True)
def set_abort(abort, done, notify_tasks):
    """Tell every share to stop; wakes the sleepers of the counters in ``notify_tasks``."""
    atomic_store(abort, 0, np.int32(1))
    wake(done, notify_tasks)


@njit(nogil=True, cache=True)
def wake(done, notify_tasks):
    """Wake the sleepers of the counters in ``notify_tasks`` (they look at ``abort``)."""
    for t in notify_tasks:
        futex_wake(done, t)


@njit(nogil=True, cache=True)
def now_ns():
    """``monotonic_ns()``, for the Python tasks' stamps (the loop's clock)."""
    return monotonic_ns()


@njit(nogil=True, cache=True)
def run_compiled(k0, order, python, entry_start, trampolines, blocks, wait_start, waits,
                 notify, done, times, epoch, sleepers, abort, spin_ns, timeout_ns, gate,
                 stats, cutoff_ns=0):
    """Run the share from position ``k0``; see the module docstring for the result. With a
    ``cutoff_ns`` (a try, :mod:`~.contention`): cut (:data:`CUT`) by a wait past it."""
    n = order.shape[0]
    for k in range(k0, n):
        t = order[k]
        if atomic_load(abort, 0) != 0:  # another share failed: the rest is cancelled
            return ABORTED
        if times[t, 1] != 0:  # run already (an early replay's one-thread start)
            continue
        if atomic_load(gate, 0) <= t and not wait_gate(gate, t, abort):
            return ABORTED
        for j in range(wait_start[k], wait_start[k + 1]):
            if not wait_done(done, waits[j], epoch, sleepers, abort, spin_ns, timeout_ns,
                             stats, cutoff_ns):
                return ABORTED
        if python[k]:
            return k
        times[t, 0] = monotonic_ns()
        for e in range(entry_start[k], entry_start[k + 1]):
            if call_pointer(trampolines[e], blocks[e]) != 0:
                times[t, 1] = monotonic_ns()
                atomic_store(abort, 0, np.int32(1))
                return -(k + 2)
        times[t, 1] = monotonic_ns()
        if notify[k]:
            publish(done, t, epoch, sleepers)
    return n
