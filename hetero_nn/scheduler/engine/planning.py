"""A compiled segment's schedule: made at its compilation, made again on the times its
first replay measured.

Policy
------
At the compilation (the capture's end) a segment of workers of one kind is planned by
:func:`~hetero_nn.scheduler.policies.list_scheduling.plan` on the costs known then: the
performance model's predictions, else the capture run's times, each (codelet,
footprint)'s median standing for all its tasks (so a first run's compilation does not
count); ``heft``'s own plan where the policy is ``heft`` and every task has one.
Workers of several kinds (CPU and CUDA, hence several memory nodes) keep ``heft``'s plan
or, should its ranks tie across an edge, the placement at capture, each worker's tasks
in submission order.

After the first replay the engine plans once more on its own stamps (:func:`replan`):
each (codelet, footprint)'s median over the tasks it ran, standing for all of them (a
task that lost its core once on a busy machine does not move the plan). That new plan is
taken only when the time it expects for the segment (its makespan, in the list
scheduler's model) is under ``1 - REPLAN_GAIN`` of what the running plan takes on the
same measured times (:func:`~hetero_nn.scheduler.policies.list_scheduling.makespan`);
otherwise the compiled segment is kept as it is: nothing bound, laid out or measured
again, and a near-tie the measurement noise flipped does not cost a compilation.
The plan never changes a result (every order the dependencies allow gives the same
bits), only where and when the tasks run.

Re-planning runs inside the second replay, so it is made of arrays prepared at the
compilation (:class:`Planning`: the units' predecessors and allowed workers, each task's
cost group) and two compiled passes (the medians and unit costs, then list scheduling):
tens of microseconds for 2,000 units, where the Python planner took 6-8 ms on a quiet
machine (30-80 ms at load), 10-100 times a steady replay.
"""

from __future__ import annotations

import statistics

import numpy as np
from numba import njit

from ..policies.list_scheduling import (HANDOFF, csr, fixed_orders, makespan, orders_of,
                                        plan_units)
from ..policies.policies import UNKNOWN_COST

REPLAN_GAIN = 0.05
"""Share of the running plan's expected time a new plan must save to be compiled."""


class Planning:
    """What planning a segment again needs, as arrays (made once, at its compilation):
    ``pred_start``/``preds`` (each unit's predecessors, :func:`~.list_scheduling.csr`),
    ``allowed`` (per unit the worker indices it may run on, None: any) and its arrays
    ``allow_start``/``allow``, ``firsts`` (each unit's first task), ``group_order`` and
    ``group_start`` (the tasks sorted by cost group: (codelet, footprint))."""

    __slots__ = ("workers", "single_kind", "pred_start", "preds", "allowed", "allow_start",
                 "allow", "firsts", "group_order", "group_start")

    def __init__(self, rt, segment, units, unit_preds, tasks):
        workers = rt.workers
        index = {w: i for i, w in enumerate(workers)}
        self.workers = len(workers)
        self.single_kind = len({w.kind for w in workers}) == 1
        self.pred_start, self.preds = csr(unit_preds)
        self.allowed = [None if len(t.eligible) == len(workers) else
                        [index[w] for w in t.eligible] for t, _, _ in segment]
        self.allow_start, self.allow = csr(self.allowed)  # (a pipeline's stages)
        self.firsts = np.array([u[0] for u in units], dtype=np.int64)
        keys: dict = {}
        groups = np.array([keys.setdefault((t.codelet.name, rt.footprint(t)[0]), len(keys))
                           for t in tasks], dtype=np.int64)
        self.group_order = np.argsort(groups, kind="stable")
        self.group_start = np.searchsorted(groups[self.group_order],
                                           np.arange(len(keys) + 1)).astype(np.int64)

    def measured_costs(self, times):
        """Seconds per unit from a replay's stamps (``times``, the segment's): each cost
        group's median nanoseconds standing for its tasks (module docstring)."""
        return _measured_costs(times, self.group_order, self.group_start, self.firsts)

    def plan(self, costs):
        """``(worker_of, order, finish)`` of :func:`~.list_scheduling.plan_units` on
        ``costs`` (seconds per unit)."""
        return plan_units(costs, self.pred_start, self.preds, self.workers, HANDOFF,
                          self.allow_start, self.allow)

    def makespan(self, costs, arrays):
        """The time a schedule (:func:`schedule_arrays`) takes at ``costs``."""
        worker_of, order_start, order = arrays
        return makespan(costs, self.pred_start, self.preds, worker_of, order_start, order,
                        self.workers, HANDOFF)


@njit(cache=True)
def _measured_costs(times, group_order, group_start, firsts):
    """:meth:`Planning.measured_costs`."""
    n = group_order.shape[0]
    ns = (times[:n, 1] - times[:n, 0]).astype(np.float64)
    per_task = np.empty(n)
    for g in range(group_start.shape[0] - 1):
        members = group_order[group_start[g]:group_start[g + 1]]
        per_task[members] = np.median(ns[members])
    units = firsts.shape[0]
    out = np.empty(units)
    for k in range(units):
        end = firsts[k + 1] if k + 1 < units else n
        total = 0.0
        for i in range(firsts[k], end):
            total += per_task[i]
        out[k] = total * 1e-9
    return out


def schedule_arrays(schedule):
    """``(worker_of, order_start, order)`` arrays of a schedule ``(worker_of, orders)``,
    what :func:`~.list_scheduling.makespan` reads."""
    worker_of, orders = schedule
    order_start, order = csr(orders)
    return np.asarray(worker_of, dtype=np.int64), order_start, order


def better_schedule(seg):
    """``(worker_of, orders)`` planned on ``seg``'s last replay's stamps when it is worth
    compiling (it saves ``REPLAN_GAIN`` of the running plan's time on them), else None
    (module docstring). Workers of several kinds or nodes keep their placement: None."""
    planning = seg.planning
    if seg.multinode or not planning.single_kind:
        return None
    costs = planning.measured_costs(seg.times)
    worker_of, order, finish = planning.plan(costs)
    expected = float(finish.max()) if len(finish) else 0.0
    if expected >= (1.0 - REPLAN_GAIN) * planning.makespan(costs, seg.schedule_arrays):
        return None
    return worker_of.tolist(), orders_of(worker_of, order, planning.workers)


def schedule(rt, segment, units, unit_preds, costs, tasks, planning):
    """``(worker_of per unit, orders)``: heft's plan, or :func:`plan` on ``costs``
    (seconds per unit; None: the ones known at the compilation, :func:`_unit_costs`);
    on workers of several kinds, heft's plan or the capture run's placement (module
    docstring)."""
    index = {w: i for i, w in enumerate(rt.workers)}
    heads = [t for t, _, _ in segment]
    planned = costs is None and rt.policy_name == "heft" and all(
        t.assigned is not None for t in heads)
    if not planning.single_kind:  # heft's plan (or, if its ranks tie across an edge, its
        placed = [index.get(t.worker, index[t.eligible[0]]) for t in heads]  # placement
        return fixed_orders(unit_preds, len(rt.workers), None,  # at capture)
                            [index[t.assigned] for t in heads] if planned else placed,
                            [t.rank for t in heads] if planned else
                            [-u for u in range(len(heads))],
                            fallback=(placed, [-u for u in range(len(heads))]))
    return fixed_orders(unit_preds, len(rt.workers),
                        lambda: _unit_costs(rt, units, tasks) if costs is None else costs,
                        [index[t.assigned] for t in heads] if planned else None,
                        [t.rank for t in heads], allowed=planning.allowed)


def _unit_costs(rt, units, tasks):
    """Seconds per unit at the compilation: predicted, else the capture run's median per
    (codelet, footprint)."""
    kind = rt.workers[0].kind
    per_task = []
    medians: dict = {}
    for t in tasks:
        p = None
        if rt.perfmodel is not None:
            p = rt.predict(t, kind)[1]
        if p is None and t.t_start and t.t_end >= t.t_start:
            medians.setdefault((t.codelet.name, rt.footprint(t)[0]), []).append(
                t.t_end - t.t_start)
        per_task.append(p)
    medians = {k: statistics.median(v) for k, v in medians.items()}
    out = []
    for u in units:
        total = 0.0
        for i in u:
            p = per_task[i]
            if p is None:
                t = tasks[i]
                p = medians.get((t.codelet.name, rt.footprint(t)[0]), UNKNOWN_COST)
            total += p
        out.append(total)
    return out
