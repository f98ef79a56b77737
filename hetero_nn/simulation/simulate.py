"""The simulator: replay a flushed task graph on a described platform, in virtual time.

As StarPU does with SimGrid, the graph a runtime would run (the very tasks a
training step submits, captured at flush without running them: :func:`capture`)
is replayed as a discrete-event simulation on a :class:`Platform`: workers per
device kind, memory nodes (the host, one per CUDA device), links with a latency
and a bandwidth, and per-kind run times from the performance models (measured
here, or read from a file, or another kind's scaled by a factor). The real
policy classes place the tasks: the simulator hands them a platform that looks
like a runtime (workers, nodes, a transfer model, ``predict``) and its virtual
clock.

Model of a task's time on a worker: ``dispatch`` (the runtime's per-task cost
on the host, measured) + the transfers of its inputs missing on the worker's
node (coherence as the runtime keeps it: a read copies from the lowest valid
node, a write leaves one valid replica; each copy ``latency + bytes /
bandwidth``, links not shared) + the predicted run time of the fastest variant
for the worker's kind. A worker runs one task at a time; the one that finishes
a task releases its successors and takes work first. Not modelled: prefetch
overlap, contention on links and memory bandwidth, the device memory limit.

A step's predicted time is the host's submission time (measured when the graph
was captured) plus the makespan of each flushed graph, the data staying where
the previous step left it (the step is replayed twice; the second is reported).

Paths: a step runs on one of three paths, each with its own per-task cost
(:func:`path_costs`, measured from real records of that path): *submitted*
(the executor under the policy, tasks released one by one), *replayed through
the executor* (the same, minus submission), and *compiled* (the replay engine of
:mod:`~hetero_nn.scheduler.engine.replay`). For the compiled path (``engine=True``) the
tasks do not go through the policy: each graph runs on the engine's fixed
schedule (``heft``'s plan, else :func:`~hetero_nn.scheduler.policies.list_scheduling.plan` on the
predicted costs, as the engine plans), a task costs ``dispatch`` (the loop's
per-task cost) plus its run time, and one whose last predecessor to finish ran
on another worker starts ``handoff`` seconds after it (the counter seen, a
sleeping worker woken). The host's time per step is then the replay's own
(writing the batch, the replay call, reading the loss). :mod:`~hetero_nn.simulation.paths`
measures those costs.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from ..codelets.codelet import R, SCRATCH
from ..errors import ConfigError
from ..scheduler.trace.records import dispatch_gaps
from .machine import DEFAULT_LINKS, Platform, _Machine
from .paths import EngineOrders, engine_serves
from ..scheduler.policies.policies import make_policy

_perf = time.perf_counter


# ------------------------------------------------------------------------------ graphs
class SimHandle:
    """A handle of a captured graph: size, partition family, and simulated coherence."""

    __slots__ = ("name", "nbytes", "parent", "children", "root", "valid", "initial")

    def __init__(self, name, nbytes, parent=None, valid=()):
        self.name = name
        self.nbytes = nbytes
        self.parent = parent
        self.children = []
        self.root = self if parent is None else parent.root
        self.initial = frozenset(valid)   # node indices valid before the first replay
        self.valid = set(valid)
        if parent is not None:
            parent.children.append(self)

    @property
    def valid_hint(self) -> set:
        """What a policy reads to estimate transfers (``Handle.valid_hint``): here exact."""
        return self.valid

    def descendants(self):
        """Every handle below this one (the children of all its partition plans)."""
        stack = list(self.children)
        while stack:
            h = stack.pop()
            yield h
            stack.extend(h.children)

    def __repr__(self):
        return f"SimHandle({self.name!r}, {self.nbytes} B)"


class SimTask:
    """A task of a captured graph, with the attributes the policies use."""

    __slots__ = ("id", "codelet", "handles", "modes", "preds", "succ", "npred", "eligible",
                 "cost", "predicted", "priority", "rank", "assigned", "footprint", "size",
                 "kinds", "variants", "start", "end", "worker", "only", "source", "params")

    def __init__(self, task_id, codelet, handles, modes, preds, footprint, size):
        self.id = task_id
        self.codelet = codelet
        self.handles = handles
        self.modes = modes
        self.preds = preds
        self.succ = []
        self.npred = 0
        self.eligible = ()
        self.cost = {}
        self.predicted = 0.0
        self.priority = 0           # the program's priority= (policies serve it first)
        self.rank = 0.0             # heft's upward rank
        self.only = None            # names of the workers given as worker=, or None
        self.source = None          # no locality preference in a simulation
        self.assigned = None
        self.footprint = footprint
        self.size = size
        self.kinds = tuple(codelet.kinds)
        self.variants = {}
        self.start = self.end = 0.0
        self.worker = None
        self.params = {}

    def __repr__(self):
        return f"SimTask({self.codelet.name}#{self.id})"


@dataclass
class StepGraph:
    """What :func:`capture` keeps of one submitted step: its flushed graphs (in order)
    and the seconds the host spent submitting them."""

    graphs: list
    submit_seconds: float

    @property
    def tasks(self) -> int:
        return sum(len(g) for g in self.graphs)


class _GraphRecorder:
    """What a runtime recording without running hands each flushed DAG to
    (:meth:`~hetero_nn.scheduler.runtime.Runtime.recording`): it keeps it as SimTasks."""

    def __init__(self, runtime, handles):
        self.rt = runtime
        self.handles = handles      # real Handle -> SimHandle, across the captured steps
        self.graphs = []
        self.flushed_at = []

    def _sim_handle(self, h):
        s = self.handles.get(h)
        if s is None:
            parent = self._sim_handle(h.parent) if h.parent is not None else None
            s = SimHandle(h.name, h.nbytes, parent, valid={0} if h.valid else ())
            self.handles[h] = s
        return s

    def run(self, tasks, planned=False):
        self.flushed_at.append(_perf())
        made = {}
        graph = []
        for t in tasks:
            fp, size = self.rt.footprint(t)
            st = SimTask(t.id, t.codelet, [self._sim_handle(h) for h in t.handles], t.modes,
                         [made[p.id] for p in t.preds if p.id in made], fp, size)
            st.priority = t.priority
            if t.eligible != self.rt._eligible.get(t.codelet, t.eligible):  # given worker=
                st.only = tuple(w.name for w in t.eligible)
            st.params = t.params
            for p in st.preds:
                p.succ.append(st)
            made[t.id] = st
            graph.append(st)
        self.graphs.append(graph)


def capture(runtime, submit_step, steps: int = 2, handles=None) -> list[StepGraph]:
    """Run ``submit_step()`` ``steps`` times on ``runtime`` recording without running
    (:meth:`~hetero_nn.scheduler.runtime.Runtime.recording`): the DAGs it flushes are
    kept, not run (work submitted before is run first). Returns one :class:`StepGraph` per step.
    ``handles``, if given, is filled with each real handle's :class:`SimHandle`.

    The runtime's data are left as they were (nothing ran); use a runtime made for this.
    """
    recorder = _GraphRecorder(runtime, {} if handles is None else handles)
    out = []
    with runtime.recording(recorder):  # whole DAGs, none run
        for _ in range(steps):
            first = len(recorder.graphs)
            t0 = _perf()
            submit_step()
            t1 = _perf()
            graphs = recorder.graphs[first:]
            # host time outside the flushes' execution: everything, since none ran
            out.append(StepGraph(graphs, t1 - t0))
    return out


# ------------------------------------------------------------------------------ costs
def assign_costs(graphs, platform, runtime, fallback=None, counts=None,
                 models=None) -> list[tuple[str, str, str]]:
    """Give every task its predicted run time per kind of the platform's workers.

    Each kind takes its fastest modelled variant (the runtime's ``candidates``);
    a kind in ``platform.scale`` takes another kind's time times a factor. A task
    with no measured model (or of a kind ``platform.measured`` rules out) takes
    ``fallback(task, kind)`` -> ``(seconds, how)`` when it gives one (a roofline
    from datasheet figures). ``models(task, kind)``, if given, comes before the
    measured models, for the tasks its caller models itself (a network's). ``counts``, if given, gets
    ``{kind: {"measured" or how: tasks}}``. Returns the ``(codelet, kind,
    footprint)`` with no prediction at all (empty: all known).
    """
    pm = runtime.perfmodel
    missing = []
    seen = set()
    kinds = [k for k, n in platform.workers.items() if n]
    for graph in graphs:
        for t in graph:
            for kind in kinds:
                base, factor = platform.scale.get(kind, (kind, 1.0))
                if kind not in t.codelet.kinds or base not in t.codelet.kinds:
                    continue
                best = None
                own = models(t, kind) if models is not None else None
                if own is not None:
                    best, factor = (own[1], own[0]), 1.0
                for v in (runtime.candidates(t.codelet, base)
                          if best is None and platform.measured.get(kind, True) else ()):
                    p = pm.predict(t.codelet.name, v, base, t.footprint, t.size) if pm else None
                    if p is not None and (best is None or p < best[1]):
                        best = (v, p)
                how = "measured" if own is None else own[1]
                if best is None and fallback is not None:
                    guess = fallback(t, kind)
                    if guess is not None:
                        best, how, factor = (guess[1], guess[0]), guess[1], 1.0
                if counts is not None and best is not None:
                    row = counts.setdefault(kind, {})
                    row[how] = row.get(how, 0) + 1
                if best is None:
                    key = (t.codelet.name, base, t.footprint)
                    if key not in seen:
                        seen.add(key)
                        missing.append(key)
                    continue
                t.cost[kind] = best[1] * factor
                t.variants[kind] = best[0]
    return missing


# ------------------------------------------------------------------------------ the simulation
@dataclass
class SimulationResult:
    """Predicted figures of one step (or graph) on a platform."""

    platform: str
    policy: str
    step_seconds: float
    makespan: float
    submit_seconds: float
    tasks: int
    utilisation: dict
    busy: dict
    links: dict
    schedule: list = field(default_factory=list)  # (task id, codelet, worker, start, end)
    dispatch: float = 0.0  # the per-task dispatch applied (the platform's, or the caller's)
    predicted_by: dict = field(default_factory=dict)  # {kind: {"measured"/"roofline"/...: n}}

    @property
    def bytes_moved(self) -> int:
        return sum(row["bytes"] for row in self.links.values())

    def to_json(self) -> dict:
        return {"platform": self.platform, "policy": self.policy,
                "step_seconds": self.step_seconds, "makespan_seconds": self.makespan,
                "submit_seconds": self.submit_seconds, "tasks": self.tasks,
                "utilisation": self.utilisation, "busy_seconds": self.busy,
                "bytes_moved": self.bytes_moved, "dispatch_seconds": self.dispatch,
                "links": {f"{s} -> {d}": row for (s, d), row in self.links.items()},
                "predicted_by": self.predicted_by}


def _make_valid(h, node, links_model, nodes, moved):
    """Simulated ``make_valid``: seconds of the copies bringing ``h`` to ``node``."""
    n = node.index
    if n in h.valid:
        return 0.0
    seconds = 0.0
    if h.valid:
        src = nodes[min(h.valid)]
        seconds = links_model.predict_transfer(src.name, node.name, h.nbytes)
        row = moved.setdefault((src.name, node.name), {"bytes": 0, "copies": 0})
        row["bytes"] += h.nbytes
        row["copies"] += 1
        for x in (h, *h.descendants()):
            x.valid.add(n)
        return seconds
    for c in h.children:
        seconds += _make_valid(c, node, links_model, nodes, moved)
    h.valid.add(n)
    return seconds


def _written(h, n):
    for x in (h, *h.descendants()):
        x.valid = {n}
    a = h.parent
    while a is not None:
        if a.valid:
            a.valid = {n} if n in a.valid else set()
        a = a.parent


def simulate_graph(graph, machine, policy, dispatch: float, start: float, moved: dict,
                   handoff: float = 0.0) -> float:
    """Replay one flushed graph from virtual time ``start``; returns when it ends.
    ``handoff``: seconds added to a task whose last predecessor ran on another worker."""
    clock = [start]
    policy.clock = lambda: clock[0]
    nodes = machine.nodes
    links_model = machine.perfmodel
    for t in graph:
        t.npred = len(t.preds)
        t.eligible = tuple(w for w in machine.workers if w.kind in t.cost)
        if not t.eligible:
            raise ConfigError(f"simulate: codelet {t.codelet.name!r} has no model for any "
                              f"worker kind of the platform ({sorted(machine_kinds(machine))})")
        if t.only is not None:  # worker= as submitted: the same constraint here
            t.eligible = tuple(w for w in t.eligible if w.name in t.only)
            if not t.eligible:
                raise ConfigError(f"simulate: task {t.id} (codelet {t.codelet.name!r}) was "
                                  f"submitted with worker={list(t.only)}, and the platform has "
                                  f"no such worker with a model for it "
                                  f"({[w.name for w in machine.workers]})")
    if any(t.only is not None for t in graph):  # pops check eligibility from now on
        policy.homogeneous = False
    for w in machine.workers:
        w.running_end = w.queued_work = 0.0
    free = {w: True for w in machine.workers}
    events = []
    seq = 0
    policy.prepare(graph)
    for t in graph:
        if t.npred == 0:
            policy.push(t, None)

    def begin(w, t):
        nonlocal seq
        now = clock[0]
        node = w.node
        copy = 0.0
        for h, m in zip(t.handles, t.modes):
            if m is SCRATCH:
                continue
            if m.reads:
                copy += _make_valid(h, node, links_model, nodes, moved)
            if m is not R:
                _written(h, node.index)
        if handoff:
            last = max(t.preds, key=lambda p: p.end, default=None)
            if last is not None and last.worker is not w and last.end + handoff > now:
                now = last.end + handoff
        t.worker = w
        t.start = now
        t.end = now + dispatch + copy + t.cost[w.kind]
        free[w] = False
        seq += 1
        heapq.heappush(events, (t.end, seq, t))

    def dispatch_from(first):
        order = [first] + [w for w in machine.workers if w is not first] if first else \
            machine.workers
        for w in order:
            if free[w]:
                t = policy.pop(w)
                if t is not None:
                    begin(w, t)

    dispatch_from(None)
    end = start
    while events:
        now, _, t = heapq.heappop(events)
        clock[0] = end = now
        w = t.worker
        free[w] = True
        policy.finished(t, w)
        for s in t.succ:
            s.npred -= 1
            if s.npred == 0:
                policy.push(s, w)
        dispatch_from(w)
    left = [t for t in graph if t.worker is None]
    if left:
        raise ConfigError(f"simulate: {len(left)} tasks never ran (first: {left[0]!r})")
    return end


def machine_kinds(machine):
    return {w.kind for w in machine.workers}


def simulate(steps: list[StepGraph], platform: Platform, policy: str, runtime,
             dispatch: float = 0.0, seed: int = 0, partial: bool = False,
             engine: bool = False, handoff: float = 0.0, fallback=None,
             models=None) -> SimulationResult:
    """Replay ``steps`` (each after the previous, data carried over) on ``platform`` under
    ``policy``; the last step's figures are returned (the steady state).

    ``runtime``: the runtime that captured the graphs (its performance models and
    variant preferences give the run times). Raises ConfigError naming the codelets
    without a model; with ``partial``, only when a task has no model on any kind of
    the platform (the others then run it where it has one). ``engine``: the graphs
    run as the compiled replay engine runs them (the module docstring), ``handoff``
    seconds per edge between workers; a platform the engine does not serve under
    ``policy`` (:func:`~hetero_nn.simulation.paths.engine_serves`: workers of several
    kinds under a dynamic policy) is simulated under the policy. ``fallback``, ``models``: see
    :func:`assign_costs`; the result's ``predicted_by`` says how each kind's tasks were
    predicted.
    """

    graphs = [g for step in steps for g in step.graphs]
    counts: dict = {}
    missing = assign_costs(graphs, platform, runtime, fallback or platform.fallback, counts,
                           models)
    if missing and not (partial and all(t.cost for graph in graphs for t in graph)):
        raise MissingModels(missing)
    machine = _Machine(platform, runtime.perfmodel, seed)
    engine = engine and engine_serves(platform, policy)
    pol = EngineOrders(machine, policy) if engine else make_policy(policy, machine)
    if not engine:
        handoff = 0.0
    if platform.dispatch is not None:
        dispatch = platform.dispatch
    for graph in graphs:  # a fresh start: every handle where capture found it
        for t in graph:
            for h in t.handles:
                h.valid = set(h.initial)
    now = 0.0
    result = None
    for step in steps:
        moved: dict = {}
        for graph in step.graphs:
            for t in graph:
                t.worker = None
        step_start = now
        now += step.submit_seconds
        makespan = 0.0
        schedule = []
        for graph in step.graphs:
            flush_start = now
            now = simulate_graph(graph, machine, pol, dispatch, now, moved, handoff)
            makespan += now - flush_start
            schedule += [(t.id, t.codelet.name, t.worker.name, t.start - step_start,
                          t.end - step_start) for t in graph]
        busy = {w.name: 0.0 for w in machine.workers}
        for _, _, wname, s, e in schedule:
            busy[wname] += e - s
        util = {k: (v / makespan if makespan > 0 else 0.0) for k, v in busy.items()}
        result = SimulationResult(platform.name, policy, now - step_start, makespan,
                                  step.submit_seconds, len(schedule), util, busy,
                                  dict(sorted(moved.items())), schedule, dispatch, counts)
    return result


class MissingModels(ConfigError):
    """Codelets the models know nothing about; the message says how to get them."""

    def __init__(self, missing):
        self.missing = missing
        names = ", ".join(f"{c} on {k} ({fp})" for c, k, fp in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        super().__init__(
            f"simulate: no performance model for {names}{more}; run with --calibrate (a few "
            "real steps on --devices fill them), or train once with the same model, batch "
            "size and granularity, or give the kind a scale in --platform "
            "(\"scale\": {\"cuda\": {\"from\": \"cpu\", \"factor\": 0.1}})")


def format_result(r: SimulationResult) -> str:
    """The figures as text: step time, utilisation per worker, bytes per link."""
    lines = [f"platform {r.platform}, policy {r.policy}: predicted step "
             f"{1e3 * r.step_seconds:.3f} ms (graph {1e3 * r.makespan:.3f} ms + submission "
             f"{1e3 * r.submit_seconds:.3f} ms), {r.tasks} tasks, dispatch "
             f"{1e6 * r.dispatch:.1f} us per task",
             "worker      busy ms  util %"]
    for w, b in r.busy.items():
        lines.append(f"{w:<10} {1e3 * b:8.3f}  {100 * r.utilisation[w]:6.1f}")
    if r.links:
        lines.append("link                      copies         bytes")
        for (s, d), row in r.links.items():
            lines.append(f"{s + ' -> ' + d:<24} {row['copies']:7d} {row['bytes']:13d}")
    lines.append(f"bytes moved {r.bytes_moved}")
    for kind, row in r.predicted_by.items():
        lines.append(f"{kind} tasks predicted by " + ", ".join(
            f"{how}: {n}" + (" (no measured model)" if how == "roofline" else "")
            for how, n in sorted(row.items())))
    return "\n".join(lines)


def measured_dispatch(trace) -> float:
    """Mean of :func:`dispatch_gaps`: the runtime's per-task cost besides the codelet."""
    gaps = dispatch_gaps(trace.records)
    return sum(gaps) / len(gaps) if gaps else 0.0


__all__ = ["Platform", "SimHandle", "SimTask", "StepGraph", "SimulationResult", "MissingModels",
           "capture", "assign_costs", "simulate", "simulate_graph", "format_result",
           "measured_dispatch", "DEFAULT_LINKS"]
