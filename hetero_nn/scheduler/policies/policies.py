"""Scheduling policies: where a ready task goes and which task an idle worker takes.

Names follow StarPU where they mean the same:

``eager``
    One shared FIFO; a worker takes the oldest task it has a variant for. Locality
    (no model says moving pays, so a task stays near its input when that costs no
    wait): a ready task goes to its *home* worker (the one that wrote its first
    input) when that worker is idle; else one of the tasks a finishing worker makes
    ready stays with it (its own queue, taken next in the same critical section), so
    a chain runs on one worker, its inputs warm in that core's cache; the rest are
    shared.
``random``
    Each ready task goes to an eligible worker drawn at random (seeded).
``ws``
    Work stealing: a worker pushes the tasks it releases on its own deque and
    pops the newest (depth first, cache-warm); an idle worker steals the oldest
    task of another worker. A task the program submits ready goes to its home
    worker (see ``eager``) when that one is idle, else round robin, to an idle
    worker where the next one is busy (a sleeping worker steals nothing).
``dmda``
    Deque model data aware: a ready task goes to the worker with the earliest
    expected finish time = when its queue drains + transfers of the inputs
    missing on its memory node + the predicted run time of the variant the
    model picks for that device (``UNKNOWN_COST`` when the model knows
    nothing); ties go to the worker that released the task, or for a task the
    program submits to its home worker (see ``eager``), then to an idle
    worker: a task moves away from its input only when the model says the
    move finishes it sooner; inputs are prefetched to the chosen node.
``heft``
    Static list scheduling of the whole flushed DAG (known before it runs): tasks
    by decreasing upward rank, each placed on the worker with the earliest
    finish time, counting the transfers of inputs made by a predecessor on
    another node and of inputs that already live elsewhere (written by an
    earlier graph); workers then run their tasks in rank order as they get ready.

Every policy honours two constraints a program may put on a task: ``priority=``
(among ready tasks, higher first; each queue is a :class:`ReadyQueue`, a plain deque
for priority 0 and a heap beside it for the others) and ``worker=`` (``task.eligible``
holds only the workers allowed: every placement picks from it, and once a task is
constrained the policy and the executor check eligibility on every pop and wake-up,
``homogeneous`` turned off).

A policy implements ``prepare(tasks)`` (once per flushed DAG; a policy that
defines it sees whole DAGs: the runtime hands it the tasks at ``wait()``
instead of streaming them as they are submitted),
``push(task, from_worker) -> Worker | None`` (``None``: a place every worker
looks at), ``pop(worker) -> Task | None`` and ``finished(task, worker)``. All
four run under the executor's lock, so they must be quick. See
``docs/policies.md`` for adding one.
"""

from __future__ import annotations

import heapq
import random as _random
import time
from collections import deque

from ...errors import PolicyError
from .list_scheduling import earliest_finish, upward_ranks

_perf = time.perf_counter
UNKNOWN_COST = 1e-5  # seconds assumed for a task the models know nothing about


class ReadyQueue(deque):
    """Ready tasks in arrival order (a deque: the common case costs nothing more). A
    task with a priority other than 0 waits in ``ranked`` instead, a heap by priority
    then submission, and is served before the others (priority > 0) or after them (< 0).
    """

    def __init__(self):
        super().__init__()
        self.ranked: list = []

    def push(self, task):
        """Queue a task with a priority other than 0."""
        heapq.heappush(self.ranked, (-task.priority, task.id, task))

    def take(self, worker=None, newest=False):
        """The next task, removed, or None: the highest priority first, then the oldest
        (``newest``: the newest) of priority 0. With ``worker``, only a task it may run."""
        ranked = self.ranked
        if ranked and ranked[0][0] < 0:  # a task of priority > 0 waits
            t = self._take_ranked(worker, positive=True)
            if t is not None:
                return t
        if self:
            if worker is None:
                return self.pop() if newest else self.popleft()
            for t in (reversed(self) if newest else self):
                if worker in t.eligible:
                    self.remove(t)
                    return t
        return self._take_ranked(worker, positive=False) if ranked else None

    def _take_ranked(self, worker, positive):
        ranked = self.ranked
        if worker is None:
            item = ranked[0]
            if positive and item[0] >= 0:
                return None
            return heapq.heappop(ranked)[2]
        for item in sorted(ranked):
            if positive and item[0] >= 0:
                return None
            if worker in item[2].eligible:
                ranked.remove(item)
                heapq.heapify(ranked)
                return item[2]
        return None

    def tasks(self) -> list:
        """Every task queued (for the executor's state)."""
        return list(self) + [item[2] for item in sorted(self.ranked)]

    def clear(self):
        super().clear()
        self.ranked.clear()


class Policy:
    """Base: the four hooks; see the module docstring."""

    name = ""
    plan_once = False  # True: prepare() plans statically, and a replayed DAG keeps the plan
    clock = staticmethod(_perf)  # what "now" is: the simulator gives its virtual time

    def __init__(self, runtime):
        self.rt = runtime
        self.workers = runtime.workers
        kinds = {w.kind for w in self.workers}
        self.homogeneous = len(kinds) == 1  # turned off by the first task given worker=
        for w in self.workers:
            w.queue = ReadyQueue()

    @property
    def whole_graph(self) -> bool:
        """Whether ``prepare`` needs the whole flushed DAG (the policy defines it)."""
        return type(self).prepare is not Policy.prepare

    def prepare(self, tasks):
        pass

    def push(self, task, from_worker):
        raise NotImplementedError

    def pop(self, worker):
        raise NotImplementedError

    def finished(self, task, worker):
        pass

    def queues(self) -> dict:
        """The policy's ready tasks by place, for the executor's state: the live queues
        (each worker's ``queue``; a policy with a shared one names it ``"shared"``)."""
        return {w.name: w.queue for w in self.workers}

    def clear(self):
        """Forget every task placed (a flush was aborted): empty the queues, reset the
        bookkeeping. A policy keeping tasks elsewhere than :meth:`queues` clears them."""
        for queue in self.queues().values():
            queue.clear()

    def _take(self, queue, worker):
        """The task of ``queue`` to serve next that ``worker`` may run (removed), or None:
        the highest priority, then the oldest."""
        if queue.ranked or not self.homogeneous:
            return queue.take(None if self.homogeneous else worker)
        return queue.popleft() if queue else None

    def _own_queue_pop(self, worker):
        q = worker.queue
        if q.ranked:
            return q.take()
        return q.popleft() if q else None

    @staticmethod
    def _home(task):
        """The worker that wrote ``task``'s first input (ran the last writer of its first
        read operand, in this flush) when ``task`` may run there, else None."""
        source = task.source
        if source is not None:
            w = source.worker
            if w is not None and w in task.eligible:
                return w
        return None

    @staticmethod
    def _queue(queue, task):
        """Append ``task`` to ``queue`` (a :class:`ReadyQueue`), by priority if it has one."""
        if task.priority:
            queue.push(task)
        else:
            queue.append(task)


class Eager(Policy):
    name = "eager"

    def __init__(self, runtime):
        super().__init__(runtime)
        self.queue = ReadyQueue()

    def push(self, task, from_worker):
        if task.priority:
            self.queue.push(task)
            return None
        source = task.source  # _home(task), inline: the hot path
        home = source.worker if source is not None else None
        if home is not None and home is not from_worker and home.idle and not home.queue \
                and home.stream is None and home in task.eligible:  # its input's worker is free
            home.queue.append(task)
            return home
        if from_worker is not None and not from_worker.queue and from_worker.stream is None \
                and from_worker in task.eligible:  # else the releasing worker takes it next
            from_worker.queue.append(task)
            return from_worker
        self.queue.append(task)
        return None

    def queues(self) -> dict:
        return {"shared": self.queue, **super().queues()}

    def pop(self, worker):
        q = self.queue
        own = worker.queue
        if own and not (q.ranked and q.ranked[0][0] < 0):  # none of priority > 0 waits
            return own.popleft()
        if q.ranked or not self.homogeneous:
            t = q.take(None if self.homogeneous else worker)
        else:
            t = q.popleft() if q else None
        if t is None and own:
            return own.popleft()
        return t


class Random(Policy):
    name = "random"

    def __init__(self, runtime):
        super().__init__(runtime)
        self.rng = _random.Random(runtime.seed)

    def push(self, task, from_worker):
        w = self.rng.choice(task.eligible)
        self._queue(w.queue, task)
        return w

    pop = Policy._own_queue_pop


class WorkStealing(Policy):
    name = "ws"

    def __init__(self, runtime):
        super().__init__(runtime)
        self._next = 0

    def push(self, task, from_worker):
        if from_worker is not None and from_worker in task.eligible:
            self._queue(from_worker.queue, task)
            return None  # others may steal it: wake idle ones
        home = self._home(task)
        if home is not None and home.idle:
            self._queue(home.queue, task)
            return home
        eligible = task.eligible
        w = eligible[self._next % len(eligible)]
        self._next += 1
        if not w.idle:  # a task the program submits: an idle worker rather than a busy one
            for v in eligible:
                if v.idle:
                    w = v
                    break
        self._queue(w.queue, task)
        return w

    def pop(self, worker):
        q = worker.queue
        if q.ranked:
            return q.take(newest=True)  # its own: all eligible
        if q:
            return q.pop()
        n = len(self.workers)
        for k in range(1, n):
            victim = self.workers[(worker.index + k) % n]
            task = self._take(victim.queue, worker)
            if task is not None:
                return task
        return None


class Dmda(Policy):
    name = "dmda"

    def push(self, task, from_worker):
        rt = self.rt
        pm = rt.perfmodel
        multi_node = not rt._single_node
        now = self.clock()
        best, best_eft, best_cost = None, None, 0.0
        costs = None
        near = self._home(task) or from_worker  # wins ties: where its input is, or warm
        # no model: every worker predicts the same small cost, so queues still balance
        cost = UNKNOWN_COST
        for w in task.eligible:
            if pm is not None:
                if costs is None:
                    costs = {}
                cost = costs.get(w.kind)
                if cost is None:
                    _, cost = rt.predict(task, w.kind)
                    cost = costs[w.kind] = cost if cost is not None else UNKNOWN_COST
            start = w.running_end if w.running_end > now else now
            eft = start + w.queued_work + cost
            if multi_node:
                eft += self._transfer(task, w.node)
            # ties go to the worker that released the task (or, submitted, wrote its
            # first input): its caches are warm and a chain then runs on one thread,
            # with no wake-up; otherwise to an idle worker rather than a busy one
            if best_eft is None or eft < best_eft or (eft == best_eft and best is not near and (
                    w is near or w.idle and not best.idle)):
                best, best_eft, best_cost = w, eft, cost
        task.predicted = best_cost
        best.queued_work += best_cost
        self._queue(best.queue, task)
        return best

    def _transfer(self, task, node):
        rt = self.rt
        pm = rt.perfmodel
        if pm is None:
            return 0.0
        total = 0.0
        for h, m in zip(task.handles, task.modes):
            valid = h.valid_hint if m.reads else None  # computed from the cells: once
            if valid and node.index not in valid:
                src = rt.nodes[min(valid)]
                total += pm.predict_transfer(src.name, node.name, h.nbytes)
        return total

    def pop(self, worker):
        q = worker.queue
        if q.ranked:
            t = q.take()
        elif q:
            t = q.popleft()
        else:
            return None
        worker.queued_work -= t.predicted
        if worker.queued_work < 0.0:
            worker.queued_work = 0.0
        worker.running_end = self.clock() + t.predicted
        return t

    def finished(self, task, worker):
        worker.running_end = 0.0  # nothing running: the worker is free now

    def clear(self):
        super().clear()
        for w in self.workers:
            w.queued_work = w.running_end = 0.0


class Heft(Policy):
    name = "heft"
    plan_once = True

    def __init__(self, runtime):
        super().__init__(runtime)
        for w in self.workers:
            w.queue = []  # a heap of (-priority, -rank, id, task)

    def prepare(self, tasks):
        """Rank every task of the DAG and assign each one to a worker, statically."""
        rt = self.rt
        pm = rt.perfmodel
        multi_node = not rt._single_node and pm is not None
        kinds_of = {}  # codelet -> device kinds of its eligible workers
        unknown = {}   # codelet -> the cost per kind when there is no model
        cost = {}
        for t in tasks:
            kinds = kinds_of.get(t.codelet)
            if kinds is None:
                kinds = kinds_of[t.codelet] = tuple(sorted({w.kind for w in t.eligible}))
                unknown[t.codelet] = dict.fromkeys(kinds, UNKNOWN_COST)
            if pm is None:
                cost[t] = unknown[t.codelet]
            else:
                c = {}
                for kind in kinds:
                    _, p = rt.predict(t, kind)
                    c[kind] = p if p is not None else UNKNOWN_COST
                cost[t] = c
        index = {t: i for i, t in enumerate(tasks)}  # (topological: submission order)
        ranks = upward_ranks([sum(c.values()) / len(c) for c in map(cost.get, tasks)],
                             [[index[p] for p in t.preds if p in index] for t in tasks])
        for t, rank in zip(tasks, ranks):
            t.rank = rank
        finish = {}

        def ready_on(t, w):
            if multi_node:
                ready = self._resident(t, w.node)
                for p in t.preds:
                    f = finish.get(p, 0.0)
                    if p.assigned is not None and p.assigned.node is not w.node:
                        f += self._comm(t, p.assigned.node, w.node)
                    if f > ready:
                        ready = f
                return ready
            ready = 0.0
            for p in t.preds:
                f = finish.get(p, 0.0)
                if f > ready:
                    ready = f
            return ready

        order = sorted(tasks, key=lambda t: (-t.rank, t.id))
        for t, best, eft in earliest_finish(order, _eligible, ready_on,
                                            lambda t, w: cost[t][w.kind],
                                            dict.fromkeys(self.workers, 0.0)):
            t.assigned = best
            finish[t] = eft

    def _comm(self, task, src, dst):
        pm = self.rt.perfmodel
        if pm is None:
            return 0.0
        nbytes = sum(h.nbytes for h, m in zip(task.handles, task.modes) if m.reads)
        return pm.predict_transfer(src.name, dst.name, nbytes)

    def _resident(self, task, node):
        """Transfers to ``node`` of the inputs no predecessor in this graph writes: data
        that lives where an earlier graph left it."""
        pm = self.rt.perfmodel
        nodes = self.rt.nodes
        total = 0.0
        for h, m in zip(task.handles, task.modes):
            valid = h.valid_hint if m.reads else None  # computed from the cells: once
            if valid and node.index not in valid and not any(_writes(p, h) for p in task.preds):
                total += pm.predict_transfer(nodes[min(valid)].name, node.name, h.nbytes)
        return total

    def push(self, task, from_worker):
        w = task.assigned
        heapq.heappush(w.queue, (-task.priority, -task.rank, task.id, task))
        return w

    def pop(self, worker):
        q = worker.queue
        return heapq.heappop(q)[3] if q else None


def _eligible(task):
    return task.eligible


def _writes(task, h) -> bool:
    """Whether ``task`` writes ``h`` or a handle of its partition family."""
    root = h.root
    return any(m.writes and x.root is root for x, m in zip(task.handles, task.modes))


POLICIES = {cls.name: cls for cls in (Eager, Random, WorkStealing, Dmda, Heft)}


def policy_class(name):
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise PolicyError(f"unknown scheduling policy {name!r}; expected one of "
                          f"{', '.join(sorted(POLICIES))}") from None


def make_policy(name, runtime) -> Policy:
    """The policy called ``name`` for ``runtime``'s workers."""
    return policy_class(name)(runtime)
