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

Units
-----
Tasks are scheduled as *units*: a task, or the members of a bundle
(:mod:`~hetero_nn.scheduler.executors.bundle`), which stay together on one worker in
their order. ``preds[u]`` lists the units ``u`` waits for (by index, each
before ``u`` in the segment's order).
"""

from __future__ import annotations

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
    every = range(workers)
    n = len(costs)
    rank = upward_ranks(costs, preds)
    worker_of = [-1] * n
    finish = [0.0] * n
    orders: list = [[] for _ in range(workers)]

    def candidates(u):
        return (allowed[u] or every) if allowed is not None else every

    def ready_on(u, w):
        ready = 0.0
        for p in preds[u]:
            f = finish[p] if worker_of[p] == w else finish[p] + handoff
            if f > ready:
                ready = f
        return ready

    def prefer(u):  # the worker of the predecessor finishing last: its data is in cache
        last_pred_worker, last_pred_finish = -1, -1.0
        for p in preds[u]:
            if finish[p] > last_pred_finish:
                last_pred_finish, last_pred_worker = finish[p], worker_of[p]
        return last_pred_worker

    order = sorted(range(n), key=lambda u: (-rank[u], u))
    for u, w, eft in earliest_finish(order, candidates, ready_on, lambda u, w: costs[u],
                                     [0.0] * workers, prefer):
        worker_of[u] = w
        finish[u] = eft
        orders[w].append(u)
    return worker_of, orders


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
