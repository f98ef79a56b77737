"""Task-level fusion: chains of small tasks of a captured graph run as one task.

Policy
------
A captured :class:`~hetero_nn.scheduler.runtime.Graph` is known whole and replayed
many times, so it is where tasks too small to pay for their own dispatch are fused
(StarPU's bundles, Dask's ``fuse_linear``). A *chain link* is an edge A -> B of the
graph's transitive reduction (the dependencies no other path implies) where B is A's
only successor and A is B's only predecessor: B becomes ready exactly when A ends
and nothing else waits for A alone, so running B right after A on A's worker delays
no task: the only thing it changes is that B gets no dispatch of its own. A link
is fused when

- the performance model predicts both A and B (``Runtime.predict``, the variant the
  runtime would run), and one of them below the *measured per-task overhead*: a
  task that costs less than its own dispatch runs with its chain neighbour (a
  link of two tasks above the overhead is left to the policy); a task the model
  knows nothing about is never fused;
- A and B have the same eligible workers, all of them without a stream (CPU
  workers: a CUDA worker's launches are already asynchronous).

The overhead is measured as the simulator measures its ``dispatch``
(:func:`~hetero_nn.scheduler.trace.records.dispatch_gaps`), over the graph's last run
(each task keeps its times until the next replay): per task that followed one of
its dependencies on the same worker, the time between the end of the one before
and its start (what a fused link saves: release, placement, binding, record), and
the median of those gaps (one preempted task must not decide the fusion of a
whole graph; the mean of all gaps, which the simulator uses, also counts wake-ups
that a chain handed on within one worker never pays). Maximal runs of fused links
become one :class:`Bundle` task each.

A bundle takes the union of its members' predecessors and successors (every
dependency kept) and the place of its first member in the graph's topological
order. Policies see one task: its eligible workers are its members', its predicted
time (``Runtime.predict``) their sum. The executor runs the members in order on the
worker that took the bundle, each bound and run as a task alone (same variant, same
operands: the same bits), each recorded for the performance model and the trace
with its own codelet, variant and times. A member that raises fails the flush with
the usual ``TaskError`` naming that member; the members after it are not run.

State
-----
``Bundle.members``: the fused tasks, in order; ``Bundle.failed``: the member that
raised, or None. :class:`BundleReport` (``graph.bundles``) keeps the decision: the
overhead, and per bundle its members' codelets and predicted seconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..task import Task
from ..trace.records import TaskRecord, dispatch_gaps


class BundleCodelet:
    """What a policy reads of a bundle's codelet: its name (``bundle(a+b)``)."""

    __slots__ = ("name",)
    footprint = None  # no footprint callback: a bundle is never measured as one

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"BundleCodelet({self.name!r})"


class Bundle(Task):
    """A chain of tasks run as one, in order, on one worker (see the module docstring)."""

    __slots__ = ("failed",)

    def __init__(self, members, preds, succ):
        first = members[0]
        handles = [h for m in members for h in m.handles]
        modes = tuple(x for m in members for x in m.modes)
        name = "bundle(" + "+".join(m.codelet.name for m in members) + ")"
        super().__init__(members[-1].id, BundleCodelet(name), handles, modes, {}, first.t_submit)
        self.eligible = first.eligible
        self.members = members
        self.failed = None
        self.preds = preds
        self.succ = succ
        first.preds = preds  # the members' dependencies, as traces show them
        for prev, m in zip(members, members[1:]):
            m.preds = [prev]

    def rearm_members(self, ids, now):
        """``rearm`` every member with a fresh id; the bundle takes its last member's,
        so a trace dependency on the bundle names that member."""
        for m in self.members:
            m.rearm(next(ids), now)
        self.id = self.members[-1].id
        self.failed = None

    def predict(self, rt, kind):
        """``(None, seconds or None)``: the sum of the members' predicted times."""
        total = 0.0
        for m in self.members:
            p = rt.predict(m, kind)[1]
            if p is None:
                return None, None
            total += p
        return None, total

    def run(self, execute, worker, kind, rt):
        """Run the members in order with the executor's ``execute(task, worker, kind,
        rt)``; stop at the first that fails (it names the bundle's error)."""
        ready = self.t_ready
        for m in self.members:
            m.worker = worker
            m.t_ready = ready
            execute(m, worker, kind, rt)
            if m.error is not None:
                self.failed = m
                self.error = m.error
                break
            ready = m.t_end
        self.variant = self.members[0].variant
        self.t_start = self.members[0].t_start
        self.t_end = ready if self.failed is None else self.failed.t_end


def traced(tasks):
    """``tasks`` with every bundle replaced by its members (what traces record)."""
    for t in tasks:
        if t.members is not None:
            yield from t.members
        else:
            yield t


@dataclass
class BundleReport:
    """The fusion decision for one graph (``graph.bundles``).

    ``overhead``: the per-task overhead it compared with (seconds; None when none was
    needed), ``measured``: whether it was measured or given; ``chains``: per bundle, ``[(codelet, predicted seconds), ...]`` of its
    members; ``tasks_before`` / ``tasks_after``: tasks per replay; ``reason``: why
    nothing was fused, when nothing could be.
    """

    overhead: float | None
    measured: bool = False
    chains: list = field(default_factory=list)
    tasks_before: int = 0
    tasks_after: int = 0
    reason: str = ""

    def __str__(self):
        if self.reason:
            return f"no task-level fusion: {self.reason}"
        lines = [f"task-level fusion: {self.tasks_before} -> {self.tasks_after} tasks, "
                 f"{len(self.chains)} bundles, overhead {1e6 * self.overhead:.1f} us/task "
                 f"({'measured' if self.measured else 'given'})"]
        for chain in self.chains:
            lines.append("  " + " + ".join(f"{name} ({1e6 * p:.1f} us)" for name, p in chain))
        return "\n".join(lines)


def graph_overhead(segments) -> float | None:
    """The per-task overhead measured over the last run of a graph's tasks (see the
    module docstring), or None when they have not run."""
    records = []
    for segment in segments:
        for t, preds, _ in segment:
            if not t.t_start or t.worker is None or t.members is not None:
                return None
            records.append(TaskRecord(t.id, t.codelet.name, t.variant or "", t.worker.name, "",
                                      "", t.t_submit, t.t_ready, t.t_start, t.t_end, 0,
                                      tuple(p.id for p in preds), None))
    if not records:
        return None
    gaps = dispatch_gaps(records, handoffs=True) or dispatch_gaps(records)
    return statistics.median(gaps)


def _essential_links(tasks, preds_of):
    """``(essential predecessors, essential successor count)`` per task index: the
    edges of the transitive reduction of a DAG given in topological order."""
    index = {t: i for i, t in enumerate(tasks)}
    ancestors = [0] * len(tasks)
    essential = []
    nsucc = [0] * len(tasks)
    for i, t in enumerate(tasks):
        ps = [index[p] for p in preds_of[t]]
        anc = 0
        for p in ps:
            anc |= ancestors[p] | (1 << p)
        ancestors[i] = anc
        if len(ps) > 1:  # p is implied when another predecessor descends from it
            ps = [p for p in ps if not any(q != p and ancestors[q] >> p & 1 for q in ps)]
        essential.append(ps)
        for p in ps:
            nsucc[p] += 1
    return essential, nsucc


def find_chains(rt, segment, overhead):
    """Chains to fuse in one flushed segment ``[(task, preds, succ), ...]``: lists of
    ``[(task, predicted seconds), ...]`` of two tasks or more (module docstring)."""
    tasks = [t for t, _, _ in segment]
    preds_of = {t: preds for t, preds, _ in segment}
    essential, nsucc = _essential_links(tasks, preds_of)
    predictions = {}

    def predicted(i):
        if i not in predictions:
            t = tasks[i]
            p = None
            if all(w.stream is None for w in t.eligible):
                p = rt.predict(t, t.eligible[0].kind)[1]
            predictions[i] = p
        return predictions[i]

    def linked(a, b):
        if nsucc[a] != 1 or essential[b] != [a] or tasks[a].eligible != tasks[b].eligible:
            return False
        pa, pb = predicted(a), predicted(b)
        return pa is not None and pb is not None and min(pa, pb) < overhead

    nxt = {}
    for b, ps in enumerate(essential):
        if len(ps) == 1 and linked(ps[0], b):
            nxt[ps[0]] = b
    heads = set(nxt) - set(nxt.values())
    chains = []
    for a in sorted(heads):
        chain = [a]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        chains.append([(tasks[i], predictions[i]) for i in chain])
    return chains


def fuse_segment(segment, chains):
    """A new segment with each chain replaced by one :class:`Bundle` (module docstring)."""
    bundle_of = {}
    for chain in chains:
        members = [t for t, _ in chain]
        member_set = set(members)
        entries = {t: (preds, succ) for t, preds, succ in segment if t in member_set}
        preds = _unique(p for m in members for p in entries[m][0] if p not in member_set)
        succ = _unique(s for m in members for s in entries[m][1] if s not in member_set)
        bundle = Bundle(members, preds, succ)
        for m in members:
            bundle_of[m] = bundle
    out = []
    for t, preds, succ in segment:
        b = bundle_of.get(t)
        if b is not None:
            if t is b.members[0]:
                out.append((b, b.preds, b.succ))
            continue
        if any(p in bundle_of for p in preds):
            preds = _unique(bundle_of.get(p, p) for p in preds)
        if any(s in bundle_of for s in succ):
            succ = _unique(bundle_of.get(s, s) for s in succ)
        out.append((t, preds, succ))
    for b in set(bundle_of.values()):  # in place: the segment and the first member hold them
        b.preds[:] = _unique(bundle_of.get(p, p) for p in b.preds)
        b.succ[:] = _unique(bundle_of.get(s, s) for s in b.succ)
    return out


def _unique(items) -> list:
    return list(dict.fromkeys(items))


def fuse_chains(graph, overhead=None) -> BundleReport:
    """Decide and apply task-level fusion on ``graph`` (see :meth:`Graph.fuse_chains`)."""
    rt = graph.runtime
    before = graph.num_tasks
    if rt.executor_name != "local":
        return BundleReport(None, tasks_before=before, tasks_after=before,
                            reason=f"the {rt.executor_name!r} executor runs tasks pure, one by one")
    if rt.perfmodel is None:
        return BundleReport(None, tasks_before=before, tasks_after=before,
                            reason="no performance model (perfmodel=False)")
    measured = overhead is None
    if measured:
        overhead = graph_overhead(graph._segments)
        if overhead is None:
            return BundleReport(None, tasks_before=before, tasks_after=before,
                                reason="the graph has not run (no overhead measured)")
    report = BundleReport(float(overhead), measured, tasks_before=before)
    segments = []
    for segment in graph._segments:
        chains = find_chains(rt, segment, overhead)
        report.chains += [[(t.codelet.name, p) for t, p in chain] for chain in chains]
        segments.append(fuse_segment(segment, chains) if chains else segment)
    graph._segments = segments
    report.tasks_after = graph.num_tasks
    return report
