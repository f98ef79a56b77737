"""Deadlines of the runtime's waits, and what a wait that passes its deadline reports.

Policy
------
No wait of the runtime is unbounded. ``Runtime(wait_timeout=...)`` (seconds,
default :data:`WAIT_TIMEOUT`, ten minutes) is how long any wait may go *without
progress*: the local executor's ``drain`` (no task finished) and ``close``, the
replay engine's wait for its shares (:class:`~hetero_nn.scheduler.engine.replay.EngineThreads`),
a compiled share's wait for a predecessor on another worker
(:func:`~hetero_nn.scheduler.engine.dispatch.wait_done`), an emulated stream's
``synchronize`` and a stream's ``close`` (:mod:`~hetero_nn.arena.stream`). When it passes, the wait stops the run and raises a
:class:`~hetero_nn.errors.TaskError` made by :func:`stalled`, whose text carries
the state of what waited: the executor's (``str(ExecutorState)``) or the engine's
(:func:`engine_state`: per share, the task it runs or the tasks it waits on).
A task that never returns cannot be stopped (Python has no way to kill a thread):
its worker stays busy, every other task is cancelled, and the runtime reports it
at its next wait.

``wait_timeout=None`` waits for ever (the old behaviour), for a debugger session.
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import ConfigError, TaskError

WAIT_TIMEOUT = 600.0
"""Seconds any wait of the runtime may go without progress (``Runtime(wait_timeout=)``)."""
TIMED_OUT = 2
"""The value of a compiled segment's ``abort`` flag when a wait passed its deadline
(``1``: a task failed)."""


def check_wait_timeout(value) -> float | None:
    """``Runtime(wait_timeout=value)`` checked: a positive number of seconds, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"Runtime: wait_timeout={value!r}; expected a positive number of "
                          "seconds or None")
    return float(value)


def timeout_ns(seconds) -> int:
    """A deadline for the compiled waits, in nanoseconds (None: about 292 years)."""
    return 2 ** 63 - 1 if seconds is None else int(seconds * 1e9)


def stalled(what: str, seconds, state: str) -> TaskError:
    """The ``TaskError`` of a wait that made no progress for ``seconds``."""
    return TaskError(f"{what} made no progress for {seconds:g} s (Runtime(wait_timeout=)); "
                     f"the run was stopped\n{state}")


def wait_progress(cond, remaining, timeout, report_every, report=None) -> bool:
    """Wait on ``cond`` (its lock held) until ``remaining()`` is 0: True; False once it
    has not changed for ``timeout`` seconds (None: never). ``report(seconds)`` is called
    after every ``report_every`` seconds without a change."""
    last, since = remaining(), time.monotonic()
    while last:
        quiet = time.monotonic() - since
        if timeout is not None and quiet >= timeout:
            return False
        step = report_every if timeout is None else min(report_every, timeout - quiet)
        notified = cond.wait(step)
        now = remaining()
        if now != last:
            last, since = now, time.monotonic()
        elif not notified and step == report_every and report is not None:
            report(report_every)
    return True


def engine_state(seg, epoch) -> str:
    """What each share of a compiled segment does at replay ``epoch``: done, running a
    task, or waiting on tasks of other workers (read from its stamps and counters)."""
    times, done = seg.times, seg.done
    shares = seg.running or seg.shares  # (a serial replay's one share)
    lines = [f"replay engine state: {seg.n_tasks} task(s) in {len(shares)} share(s), "
             f"abort flag {int(seg.abort[0])}"]
    for share in shares:
        order = share.order
        ended = times[order, 1] != 0 if len(order) else np.zeros(0, dtype=bool)
        left = np.flatnonzero(~ended)
        head = f"  {share.worker.name}: {len(order) - len(left)}/{len(order)} done"
        waited = _waited(getattr(seg, "wait_stats", None), share)
        if not len(left):
            lines.append(head + waited)
            continue
        k = int(left[0])
        t = int(order[k])
        if times[t, 0] != 0:
            lines.append(f"{head}, running {_name(seg, t)}{waited}")
            continue
        pending = [int(p) for p in share.waits[share.wait_start[k]:share.wait_start[k + 1]]
                   if done[p] < epoch]
        lines.append(f"{head}, next {_name(seg, t)}"
                     + (f" waits on {', '.join(_name(seg, p) for p in pending)}"
                        if pending else "") + waited)
    return "\n".join(lines)


def _waited(stats, share) -> str:
    """`` (waits: N spun, N slept, ...)``: the share's wait counters this replay
    (:data:`~hetero_nn.scheduler.engine.dispatch.STATS`), or nothing before it waited."""
    if stats is None or not stats[share.row, 0]:
        return ""
    w, spun, _, preempted, yielded, slept, _, sleep_ns, longest = stats[share.row].tolist()
    return (f" (waits: {spun} spun, {yielded} yielded, {slept} slept {sleep_ns * 1e-6:.1f} ms"
            f" in all, {preempted} cut short by a lost core; longest {longest * 1e-6:.1f} ms)")


def _name(seg, t) -> str:
    b = seg.runs[t]
    if t >= seg.n_tasks:
        return f"copy {b.transfer.name} ({b.worker.name})"
    return f"task {t} ({b.task.codelet.name!r}, variant {b.variant!r}, {b.worker.name})"
