"""The local executor's state: one object that says where every task handed to it is.

Policy
------
Everything here is read and written under the executor's lock (the runtime's
``_lock``). ``str(state)`` is what a stalled flush logs: the tasks not finished, those
waiting for predecessors (and which), the ready queues by place, and what each
worker runs. :func:`task_error` makes the ``TaskError`` of a task whose codelet raised,
for every executor that runs tasks in place (local, sync).

State
-----
:class:`ExecutorState`'s fields (``remaining``, ``waiting``, ``ready``, ``running``,
``completed``, ``idle``, ``error``, ``aborted``, ``closing``) are described where they
are used, in :mod:`hetero_nn.scheduler.executors.local`'s docstring, *State*.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from ...errors import TaskError


@dataclass(eq=False)
class ExecutorState:
    """What the local executor knows of the tasks handed to it (the fields:
    :mod:`hetero_nn.scheduler.executors.local`, *State*).

    Per-worker fields are lists indexed by ``Worker.index``. ``str(state)`` says
    where every unfinished task is, for a flush that stalls.
    """

    workers: list
    ready: dict                  # place ("shared" or a worker's name) -> the policy's queue
    remaining: int = 0
    waiting: dict = field(default_factory=dict)  # task -> None (an ordered set)
    running: list = field(default_factory=list)
    completed: list = field(default_factory=list)
    idle: list = field(default_factory=list)
    error: TaskError | None = None
    aborted: bool = False
    aborts: int = 0              # flushes aborted so far (Task.wait() notices one)
    closing: bool = False

    def __post_init__(self):
        self.running = [deque() for _ in self.workers]
        self.completed = [deque() for _ in self.workers]

    def __str__(self):
        lines = [f"executor state: {self.remaining} task(s) not finished, "
                 f"{len(self.waiting)} waiting for predecessors"
                 + (f", error: {self.error}" if self.error is not None else "")
                 + (", aborted" if self.aborted else "")
                 + (", closing" if self.closing else "")]
        for place, queue in self.ready.items():
            tasks = queued_tasks(queue)
            if tasks:
                lines.append(f"  ready on {place}: {_some(tasks)}")
        for w in self.workers:
            state = "idle" if w in self.idle else "awake"
            lines.append(f"  {w.name} ({state}): running {_some(self.running[w.index])}"
                         + (f", completed {len(self.completed[w.index])} to release"
                            if self.completed[w.index] else ""))
        for t in list(self.waiting)[:8]:
            left = [p for p in t.preds if not p.ended]
            lines.append(f"  waiting: {t!r} (npred {t.npred}) after {_some(left)}")
        if len(self.waiting) > 8:
            lines.append(f"  ... and {len(self.waiting) - 8} more waiting")
        return "\n".join(lines)


    def cancel(self, policy):
        """Abort the flush: the tasks not running are cancelled (the policy's queues and
        the waiting ones); ``remaining`` counts the running ones."""
        self.aborted = True
        self.aborts += 1
        for queue in self.ready.values():
            for t in queued_tasks(queue):
                t.ended = True
                t.error = "cancelled"
            queue.clear()
        try:
            policy.clear()
        except BaseException:  # noqa: BLE001 - the policy is broken; take() drops leftovers
            pass
        for t in self.waiting:
            t.ended = True
            t.error = "cancelled"
        self.waiting.clear()
        self.remaining = sum(len(r) for r in self.running)


def queued_tasks(queue) -> list:
    """The tasks in a policy's queue (a ReadyQueue, or heft's heap of tuples ending with
    the task)."""
    if hasattr(queue, "tasks"):
        return queue.tasks()
    return [x[-1] if isinstance(x, tuple) else x for x in queue]


def _some(tasks, n=6) -> str:
    tasks = list(tasks)
    text = ", ".join(repr(t) for t in tasks[:n])
    return f"[{text}{', ...' if len(tasks) > n else ''}] ({len(tasks)})" if tasks else "[]"


def task_error(task) -> TaskError:
    """The :class:`TaskError` of a task whose codelet raised (a bundle's: the member that
    raised), kept as its ``failure``; its ``error`` becomes the exception's text."""
    if task.members is not None:
        task = task.failed  # name the member that raised
    exc = task.error
    err = TaskError(f"task {task.id} (codelet {task.codelet.name!r}, variant "
                    f"{task.variant!r}, worker {task.worker.name}) failed: "
                    f"{type(exc).__name__}: {exc}", codelet=task.codelet.name, task_id=task.id)
    err.__cause__ = exc
    task.error = f"{type(exc).__name__}: {exc}"
    task.failure = err
    return err


def prefetch_error(task, node, exc) -> TaskError:
    """The :class:`TaskError` of a failed prefetch of ``task`` to ``node``."""
    err = TaskError(f"prefetch of task {task.id} (codelet {task.codelet.name!r}) to "
                    f"{node.name} failed: {type(exc).__name__}: {exc}",
                    codelet=task.codelet.name, task_id=task.id)
    err.__cause__ = exc
    return err


class Wakeup:
    """A worker's sleep on the executor's lock: ``threading.Condition``'s ``wait`` and
    ``notify`` for its one waiter, without the Python frames of ``threading.py`` on the way
    (a sleep and a wake-up per task where workers outrun the program). ``gate``: a raw
    lock, held while no wake-up is due, that the sleeping worker blocks on; ``waiting``:
    whether it sleeps (read and written under the executor's lock, so a wake-up is never
    lost nor given twice)."""

    __slots__ = ("lock", "gate", "waiting")

    def __init__(self, lock):
        self.lock = lock
        self.gate = threading.Lock()
        self.gate.acquire()
        self.waiting = False

    def wait(self):
        """Sleep until :meth:`notify` (the executor's lock held; released while asleep)."""
        self.waiting = True
        self.lock.release()
        try:
            self.gate.acquire()
        finally:
            self.lock.acquire()

    def notify(self):
        """Wake the worker if it sleeps (the executor's lock held)."""
        if self.waiting:
            self.waiting = False
            self.gate.release()
