"""Fixed worker schedules for replayed graphs: which worker runs each task, in what order.

Policy
------
A replayed segment of a graph runs without a policy: each worker runs its
tasks in a fixed order and waits, through a counter, for the predecessors that
other workers run. The schedule comes from one of two places:

- ``heft``'s plan, when the policy is ``heft`` and every task has one: the
  worker it assigned, tasks ordered by decreasing upward rank (ties by position),
  as ``heft`` runs them;
- otherwise :func:`plan`: list scheduling of the segment by upward rank (HEFT
  without insertion) on the given costs, where an edge between two workers adds
  ``handoff`` seconds to the successor's ready time. A task goes to the worker
  where it finishes first; on a tie, to the worker that ran the predecessor
  finishing last (its data is in that core's cache), then to the lowest index.
  So a chain stays on one worker unless moving it lets it finish earlier by more
  than the handoff (StarPU's locality-aware policies make the same trade). A unit
  with a placement constraint (``worker=``, ``Runtime.placing``: a pipeline stage)
  goes only to the workers it allows.

Either way every worker's order is a subsequence of one topological order of
the segment (upward ranks decrease along edges; ties go by position, which is
topological), so the workers cannot deadlock on their counters.

Planning runs compiled (:func:`plan_units`, Numba, over arrays: 2,000 units in tens of
microseconds), so the replay engine can plan again on a graph's measured times inside a
replay; :func:`makespan` is the same model's finish time of given orders, to tell whether
a new plan gains enough to be worth compiling (:mod:`~hetero_nn.scheduler.engine.planning`).

Units
-----
Tasks are scheduled as *units*: a task, or the members of a bundle
(:mod:`~hetero_nn.scheduler.executors.bundle`), which stay together on one worker in
their order. ``preds[u]`` lists the units ``u`` waits for (by index, each
before ``u`` in the segment's order).
"""

from __future__ import annotations

import numpy as np
from numba import njit

HANDOFF = 2e-6
"""Seconds an edge between two workers adds in :func:`plan`: a counter's store seen by a
spinning waiter on another core (a sleeping one costs more; a plan that moves less is safer)."""


def upward_ranks(costs, preds) -> list:
    """Upward rank per unit: its cost plus the largest rank of its successors."""
    n = len(costs)
    rank = list(costs)
    best_succ = [0.0] * n
    for u in range(n - 1, -1, -1):
        rank[u] = costs[u] + best_succ[u]
        for p in preds[u]:
            if rank[u] > best_succ[p]:
                best_succ[p] = rank[u]
    return rank


def plan(costs, preds, workers: int, handoff: float = HANDOFF, allowed=None):
    """``(worker_of, orders)``: each unit's worker index and each worker's units in order.

    See the module docstring; ``costs[u]`` is unit ``u``'s run time in seconds;
    ``allowed[u]``, where given, the worker indices unit ``u`` may run on (None: any).
    """
    pred_start, flat = csr(preds)
    allow_start, allow = csr(allowed if allowed is not None else [()] * len(costs))
    worker_of, order, _ = plan_units(np.asarray(costs, dtype=np.float64), pred_start, flat,
                                     workers, handoff, allow_start, allow)
    return worker_of.tolist(), orders_of(worker_of, order, workers)


def csr(lists):
    """``(start, flat)`` int64 arrays of a list of index lists (``None`` counts as empty):
    list ``i`` is ``flat[start[i]:start[i + 1]]``."""
    start = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) if x else 0 for x in lists], out=start[1:])
    flat = np.fromiter((i for x in lists if x for i in x), dtype=np.int64, count=int(start[-1]))
    return start, flat


def orders_of(worker_of, order, workers: int) -> list:
    """Each worker's units (lists), in ``order``: what :func:`plan_units` returns, as
    :func:`plan` gives it."""
    placed = worker_of[order]
    return [order[placed == w].tolist() for w in range(workers)]


@njit(cache=True)
def plan_units(costs, pred_start, preds, workers, handoff, allow_start, allow):
    """:func:`plan` over arrays (``preds`` and ``allow`` as :func:`csr` makes them; a unit
    with no allowed worker listed may run on any): ``(worker_of, order, finish)``, the
    units in the order they were placed (each worker's order is its subsequence) and the
    finish time the plan expects of each."""
    n = costs.shape[0]
    rank = np.empty(n)
    best_succ = np.zeros(n)
    for u in range(n - 1, -1, -1):  # upward ranks (upward_ranks)
        r = costs[u] + best_succ[u]
        rank[u] = r
        for j in range(pred_start[u], pred_start[u + 1]):
            if r > best_succ[preds[j]]:
                best_succ[preds[j]] = r
    order = np.argsort(-rank, kind="mergesort")  # by decreasing rank, ties by position
    worker_of = np.full(n, -1, dtype=np.int64)
    finish = np.zeros(n)
    avail = np.zeros(workers)
    for u in order:
        prefer, last = -1, -1.0  # the worker of the predecessor finishing last
        for j in range(pred_start[u], pred_start[u + 1]):
            if finish[preds[j]] > last:
                last, prefer = finish[preds[j]], worker_of[preds[j]]
        listed = allow_start[u + 1] - allow_start[u]
        best, best_eft = -1, 0.0
        for i in range(listed if listed > 0 else workers):
            w = allow[allow_start[u] + i] if listed > 0 else i
            ready = 0.0
            for j in range(pred_start[u], pred_start[u + 1]):
                p = preds[j]
                f = finish[p] if worker_of[p] == w else finish[p] + handoff
                if f > ready:
                    ready = f
            eft = (avail[w] if avail[w] > ready else ready) + costs[u]
            if best < 0 or eft < best_eft or (eft == best_eft and w == prefer):
                best, best_eft = w, eft
        avail[best] = best_eft
        worker_of[u] = best
        finish[u] = best_eft
    return worker_of, order, finish


@njit(cache=True)
def makespan(costs, pred_start, preds, worker_of, order_start, order, workers, handoff):
    """When the last unit ends if each worker runs its units in the given order (worker
    ``w``'s: ``order[order_start[w]:order_start[w + 1]]``) at ``costs``, in :func:`plan`'s
    model (an edge between workers adds ``handoff``); ``inf`` if the orders deadlock."""
    n = costs.shape[0]
    finish = np.zeros(n)
    ended = np.zeros(n, dtype=np.bool_)
    head = order_start[:-1].copy()
    avail = np.zeros(workers)
    placed, end = 0, 0.0
    while placed < n:
        moved = False
        for w in range(workers):
            while head[w] < order_start[w + 1]:
                u = order[head[w]]
                ready = 0.0
                for j in range(pred_start[u], pred_start[u + 1]):
                    p = preds[j]
                    if not ended[p]:
                        ready = -1.0
                        break
                    f = finish[p] if worker_of[p] == w else finish[p] + handoff
                    if f > ready:
                        ready = f
                if ready < 0.0:
                    break
                finish[u] = (avail[w] if avail[w] > ready else ready) + costs[u]
                avail[w] = finish[u]
                ended[u] = True
                end = max(end, finish[u])
                head[w] += 1
                placed += 1
                moved = True
        if not moved:
            return np.inf
    return end


def earliest_finish(order, candidates, ready_on, cost_on, avail, prefer=None):
    """The list scheduler :func:`plan` and ``heft`` (``Heft.prepare``) share: each unit of
    ``order`` (by decreasing upward rank) goes to the worker among ``candidates(u)`` where
    it finishes first, ``max(avail[w], ready_on(u, w)) + cost_on(u, w)``; on a tie, to
    ``prefer(u)`` when it is one of them, else to the first. Yields ``(u, worker, finish)``
    as it places each (the caller records the finish before the next is placed) and
    advances ``avail`` (indexed by worker)."""
    for u in order:
        pref = prefer(u) if prefer is not None else None
        best, best_eft = None, None
        for w in candidates(u):
            a = avail[w]
            ready = ready_on(u, w)
            eft = (a if a > ready else ready) + cost_on(u, w)
            if best_eft is None or eft < best_eft or (eft == best_eft and w == pref):
                best, best_eft = w, eft
        avail[best] = best_eft
        yield u, best, best_eft


def from_assignment(worker_of, priority, workers: int):
    """``(worker_of, orders)`` for a given assignment, each worker's units by decreasing
    ``priority`` (ties by position): ``heft``'s plan as it runs it."""
    orders: list = [[] for _ in range(workers)]
    for u in sorted(range(len(worker_of)), key=lambda u: (-priority[u], u)):
        orders[worker_of[u]].append(u)
    return list(worker_of), orders


def fixed_orders(preds, workers: int, costs, assigned=None, priority=None, fallback=None,
                 allowed=None):
    """``(worker_of, orders)`` of a segment's units: the given assignment (``heft``'s:
    worker indices and upward ranks) when it can run; else ``fallback`` (another
    ``(assigned, priority)`` known to run: an assignment in submission order) or
    :func:`plan` on ``costs`` (a callable: only planning asks for them) and the
    ``allowed`` workers of each unit."""
    if assigned is not None:
        worker_of, orders = from_assignment(assigned, priority, workers)
        try:
            check_orders(orders, preds)
            return worker_of, orders
        except ValueError:
            pass  # ranks that tie across an edge: plan here instead
    if fallback is not None:
        return from_assignment(*fallback, workers)
    return plan(costs(), preds, workers, allowed=allowed)


def check_orders(orders, preds) -> list:
    """The units in one topological order that merges the workers' orders (each a
    subsequence of it); ``ValueError`` unless every worker's order can run (a predecessor
    on the same worker comes before its successor, and the orders merge)."""
    position = {}
    for w, order in enumerate(orders):
        for k, u in enumerate(order):
            position[u] = (w, k)
    if len(position) != len(preds):
        raise ValueError(f"schedule: {len(position)} units placed, {len(preds)} in the segment")
    # simulate: repeatedly advance any worker whose next unit has all predecessors done
    done = [False] * len(preds)
    heads = [0] * len(orders)
    merged = []
    while len(merged) < len(preds):
        moved = False
        for w, order in enumerate(orders):
            while heads[w] < len(order) and all(done[p] for p in preds[order[heads[w]]]):
                done[order[heads[w]]] = True
                merged.append(order[heads[w]])
                heads[w] += 1
                moved = True
        if not moved:
            stuck = [order[heads[w]] for w, order in enumerate(orders) if heads[w] < len(order)]
            raise ValueError(f"schedule: the workers' orders deadlock at units {stuck}")
    return merged
