"""The paths a step runs on, and what each costs besides its kernels.

A training step runs on one of three paths: *submitted* (tasks inferred,
placed by the policy and released one by one by the executor), *replayed
through the executor* (the same without submission), or *compiled* (the replay
engine of :mod:`~hetero_nn.scheduler.engine.replay`: fixed schedules, a compiled loop
per worker). Predictions (``granularity="auto"``, ``hetero-nn simulate``) hold
only with the costs of the path that will run, measured on it:

- :func:`path_costs`: from a real run's records, the per-task cost (the median
  wait of a task whose own worker was the last thing it waited for) and the
  cost of an edge between workers (the median wait of a task whose last
  predecessor ran elsewhere);
- :func:`flush_seconds`: the time a step's flushes took, so that the rest of a
  measured step is the host's own time (submission, or, replaying, writing the
  batch, the replay call, reading the loss);
- :class:`EngineOrders`: the engine's schedule as a policy of the simulator, and
  :func:`engine_serves`, whether the engine would run a platform's steps;
- :class:`PathCosts`: the three figures of a path measured from real steps, and
  :func:`step_path`, the path a trainer's steps run on.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..scheduler.engine.replay import engine_refusal, unavailable
from ..scheduler.policies.policies import make_policy
from ..scheduler.policies.list_scheduling import fixed_orders
from ..scheduler.trace.records import dispatch_gaps

_perf = time.perf_counter


def engine_serves(platform, policy="eager") -> bool:
    """Whether the compiled replay engine would run steps on ``platform`` under
    ``policy`` (the runtime's default: ``eager``):
    :func:`~hetero_nn.scheduler.engine.replay.engine_refusal`, the rule the runtime asks
    too (workers of one kind, or ``heft``'s assignment over several)."""
    kinds = {kind for kind, n in platform.workers.items() if n}
    return engine_refusal(kinds, policy) is None


class EngineOrders:
    """The replay engine's fixed schedule as a policy of the simulator: ``prepare``
    plans the graph as the engine does (``heft``'s plan under ``heft``, else list
    scheduling on the predicted costs); each worker then takes its tasks in their
    planned order only, as the engine's loop runs them."""

    plan_once = False

    def __init__(self, machine, policy):
        self.machine = machine
        self.workers = machine.workers
        self.heft = make_policy("heft", machine) if policy == "heft" else None
        self.clock = _perf
        self._orders: dict = {}
        self._ready: set = set()

    def prepare(self, graph):
        index = {t: i for i, t in enumerate(graph)}
        preds = [[index[p] for p in t.preds] for t in graph]
        kind = self.workers[0].kind
        if self.heft is not None:
            self.heft.prepare(graph)
        if len({w.kind for w in self.workers}) > 1:  # heft's plan, as the engine's segment
            assigned = [t.assigned.index for t in graph]  # (else its tasks in submission order)
            _, orders = fixed_orders(preds, len(self.workers), None, assigned,
                                     [t.rank for t in graph],
                                     fallback=(assigned, [-u for u in range(len(graph))]))
        else:
            _, orders = fixed_orders(
                preds, len(self.workers), lambda: [t.cost[kind] for t in graph],
                [t.assigned.index for t in graph] if self.heft is not None else None,
                [t.rank for t in graph])
        self._orders = {w: [graph[u] for u in reversed(order)]
                        for w, order in zip(self.workers, orders)}
        self._ready = set()

    def push(self, task, from_worker):
        self._ready.add(task)
        return None

    def pop(self, worker):
        order = self._orders.get(worker)
        if order and order[-1] in self._ready:
            task = order.pop()
            self._ready.discard(task)
            return task
        return None

    def finished(self, task, worker):
        pass


EnginePlan = EngineOrders  # the name before the glossary (docs/architecture.md)


def path_costs(records) -> tuple:
    """``(dispatch, handoff)`` of a real run's records: the median wait of a task whose
    own worker finished last before it (the per-task cost), and of one whose last
    predecessor to finish ran on another worker (an edge between workers). 0 where
    no task waited that way."""
    local, cross = _gaps_by_cause(records)
    return (statistics.median(local) if local else 0.0,
            statistics.median(cross) if cross else 0.0)


def _gaps_by_cause(records):
    by_id = {r.task_id: r for r in records}
    last_end = {}
    local, cross = [], []
    for r in sorted(records, key=lambda r: r.start):
        deps = [by_id[d] for d in r.deps if d in by_id]
        dep = max(deps, key=lambda d: d.end, default=None)
        prev = last_end.get(r.worker)
        if dep is not None and dep.worker != r.worker and (prev is None or dep.end > prev):
            cross.append(max(0.0, r.start - dep.end))
        elif prev is not None:
            local.append(max(0.0, r.start - max(prev, dep.end if dep else prev)))
        last_end[r.worker] = max(r.end, prev or r.end)
    return local, cross


def flush_seconds(records) -> float:
    """Seconds the flushes of ``records`` took, from each one's submission to its last
    task's end (the records of one flush share a submit time when it was replayed)."""
    spans: dict = {}
    for r in records:
        spans[r.submit] = max(spans.get(r.submit, r.submit), r.end)
    return sum(end - submit for submit, end in spans.items())


PATHS = ("submitted", "replayed", "compiled")


@dataclass
class PathCosts:
    """What a step costs besides its kernels on one path (the module docstring).

    ``dispatch``: seconds per task; ``handoff``: seconds per edge between workers
    (compiled path; 0 elsewhere, where ``dispatch`` covers wake-ups); ``host``:
    seconds of the host's own work in a replayed step (None: not measured, or a
    submitted path, whose submission is measured where its graph is captured);
    ``serial``: on the compiled path, most steps measured ran every task on one
    thread (the engine's serial mode, :mod:`~hetero_nn.scheduler.engine.contention`:
    chosen where other load on the cores made its parallel replays slower), so the
    steps to come are predicted on one worker.
    """

    path: str = "submitted"
    dispatch: float = 0.0
    handoff: float = 0.0
    host: float | None = None
    serial: bool = False

    @classmethod
    def measure(cls, path, runs) -> "PathCosts":
        """From real steps on ``path``: ``runs`` holds, per configuration measured, its
        steps as ``(wall seconds, records)``. ``dispatch`` and ``handoff`` are medians
        over every task (:func:`path_costs`; off the compiled path, the median of
        :func:`~hetero_nn.scheduler.trace.records.dispatch_gaps`); ``host`` the median over
        configurations of their fastest step's wall time less its flushes'."""
        if path not in PATHS:
            raise ValueError(f"path {path!r}: expected one of {PATHS}")
        records = [r for steps in runs for _, recs in steps for r in recs]
        if path == "compiled":
            dispatch, handoff = path_costs(records)
        else:
            gaps = dispatch_gaps(records)
            dispatch, handoff = (statistics.median(gaps) if gaps else 0.0), 0.0
        host = None
        if path != "submitted":
            hosts = [min(max(0.0, wall - flush_seconds(recs)) for wall, recs in steps)
                     for steps in runs if steps]
            host = statistics.median(hosts) if hosts else None
        # a serial replay's records all name the worker whose thread ran them (the first)
        alone = [len({r.worker for r in recs}) == 1 for steps in runs for _, recs in steps
                 if recs]
        serial = path == "compiled" and 2 * sum(alone) > len(alone)
        return cls(path, dispatch, handoff, host, serial)

    def to_json(self) -> dict:
        return {"path": self.path, "dispatch_seconds": self.dispatch,
                "handoff_seconds": self.handoff, "host_seconds": self.host,
                "serial": self.serial}


def step_path(trainer) -> str:
    """The path ``trainer``'s training steps run on: its step cache's replay rule, then
    whether its runtime's replay engine serves them."""
    if not trainer.step_cache.replays(trainer.optimizer.replay_key()):
        return "submitted"
    return "compiled" if unavailable(trainer.runtime) is None else "replayed"
