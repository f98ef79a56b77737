"""Pipeline parallelism: the model cut into stages, each stage's tasks on its own workers,
the granularity's partitions flowing through as micro-batches.

Policy
------
A pipeline is a placement constraint on the step's task graph (DESIGN.md): the step
submits the same tasks in the same order as without it (zero the gradients, every
block's forward, the loss, every block's backward, the optimizer), each block's tasks
inside :meth:`Runtime.placing <hetero_nn.scheduler.runtime.Runtime.placing>` its
stage's workers, the loss on the last stage's. The REDUX trees of the gradients and
the optimizer's tasks are left to the policy. Same tasks, same operands, same trees:
with one synchronous update per step the weights are bit-identical to the same run
without a pipeline at the same granularity (on one device kind; see ``docs/pipeline.md``).
Micro-batch ``k`` is partition ``k`` of the batch: a stage starts on it as soon as the
stage before has finished it, since the dependencies are per partition.

*Cuts* are at the boundaries of the blocks a forward pass runs (``Sequential`` with
``fuse``: a fused run is one block). ``pipeline=[[layers], ...]`` gives them;
``pipeline=P`` balances P stages from the performance models: the predicted seconds of
every task a block submits in one step (captured, not run), summed per block on the
kind of the stage's workers (another kind's where the models know only that one), cut
so that the slowest stage is as fast as possible
(a contiguous partition by dynamic programming); ``imbalance`` is the slowest stage's
time over the mean. Where the models cannot predict some task, real steps calibrate
them first (the first kept out: compilation; at most ``CALIBRATION_STEPS``; weights and
state put back).

*Schedules* order each stage's micro-batch operations (``F k``: the stage's forward
tasks of partition ``k``, the loss's on the last stage; ``B k``: its backward tasks)
with dependencies added between consecutive operations, where the step is flushed as
one DAG (a captured step, the trainer's default):

- ``"gpipe"``: ``F 0 .. F M-1`` then ``B 0 .. B M-1``;
- ``"1f1b"`` (PipeDream-Flush, the default): ``P - 1 - s`` warm-up forwards on stage
  ``s``, then one forward and one backward in turn, then the remaining backwards:
  at most ``P - s`` micro-batches in flight per stage.

A stage with layers that couple the micro-batches (a training-mode ``BatchNorm2D``:
its statistics span the batch) cannot run one micro-batch's operation before
another's is complete: there the order is left to the data (``schedule_run`` says
``"dataflow"`` and why).

``"pipedream"`` is PipeDream's asynchronous schedule with weight stashing, an update
per micro-batch: not synchronous training (:mod:`~hetero_nn.training.pipeline.pipedream`).

A pipelined step keeps its temporaries to its end (:meth:`Runtime.keeping_temporaries`):
sharing the bytes of one micro-batch's dead temporaries with a later one's adds a
dependency between them that neither the data nor the schedule asks for, and would
hold a stage back from running ahead. A schedule's dependencies point against
submission order (a backward before a later forward): the flush then hands its tasks
over in a topological order (:func:`~hetero_nn.scheduler.flush.topological`), so the
arena's layout, a capture and the compiled replay engine's fixed shares follow the
schedule; the engine's plan keeps every task on its stage's workers.

*Bubble*: from a traced step, per stage the busy seconds of its tasks over its
workers' share of the pipeline's span (the first stage task's start to the last's
end): ``bubble = 1 - sum(busy) / (sum(workers) * span)``, against the ideal
``(P - 1) / (M + P - 1)``.

State
-----
``stages``: per stage, ``(first block, end block)`` into ``blocks`` (the model's
``_plan()``); ``workers``: per stage, its workers; ``ops``: per stage, the tasks of
each operation of the last step submitted (for the bubble); ``schedule_run``.
"""

from __future__ import annotations

import math
import contextlib
from dataclasses import dataclass

from ...errors import ConfigError
from ...layers.base import keeping_state
from ...layers.normalization import BatchNorm2D
from .passes import _modules, submit_backward, submit_forward
from .pipedream import submit_pipedream
from ...simulation.simulate import capture
from ..granularity import _models_for, _state_kept
from ...optim import submit_clip_grad_norm

SCHEDULES = ("1f1b", "gpipe", "pipedream")
CALIBRATION_STEPS = 8  # most real steps run for the models to predict every block


@dataclass
class Stage:
    """One stage: the blocks ``[first, end)`` of the model's plan and its workers."""

    first: int
    end: int
    workers: tuple
    predicted_seconds: float | None = None


class Pipeline:
    """A model's stages, their workers and the schedule (see the module docstring)."""

    def __init__(self, model, pipeline, stage_devices=None, schedule="1f1b"):
        if schedule not in SCHEDULES:
            raise ConfigError(f"pipeline_schedule must be one of {', '.join(SCHEDULES)}, "
                              f"got {schedule!r}")
        if getattr(model, "granularities", None) is not None:
            raise ConfigError("pipeline: the model has per-layer granularities; a pipeline "
                              "runs every stage at the trainer's granularity")
        self.model = model
        self.spec = pipeline
        self.stage_devices = None if stage_devices is None else list(stage_devices)
        self.schedule = schedule
        self.schedule_run = None
        self.stages: list[Stage] = []
        self.blocks: list = []
        self.imbalance = None
        self.ops: list = []
        self.runtime = None  # the runtime the stages' workers belong to (bind)
        if isinstance(pipeline, bool) or not (
                isinstance(pipeline, int) and pipeline >= 1 or isinstance(pipeline, (list, tuple))):
            raise ConfigError(f"pipeline must be a number of stages or a list of lists of the "
                              f"model's layers, got {pipeline!r}")
        count = pipeline if isinstance(pipeline, int) else len(pipeline)
        if self.stage_devices is not None and len(self.stage_devices) != count:
            raise ConfigError(f"stage_devices: {len(self.stage_devices)} entries for {count} "
                              "stages")

    @property
    def num_stages(self) -> int:
        return self.spec if isinstance(self.spec, int) else len(self.spec)

    # ------------------------------------------------------------ setting up
    def bind(self, trainer, x, y):
        """Give every stage its workers and blocks (balancing ``pipeline=P`` from the
        models on the batch ``(x, y)``): at the first step, or when the runtime changes."""
        rt = trainer.runtime
        self.runtime = rt
        self.blocks = [block for _, block in self.model._plan()]
        firsts = [i for i, _ in self.model._plan()]
        self.needs = [self.model.needs_input_grad(i) for i in firsts]  # as Sequential's
        groups = self._worker_groups(rt)
        if isinstance(self.spec, int):
            bounds, predicted = self._balance(trainer, x, y, groups)
        else:
            bounds, predicted = self._given(firsts), [None] * len(groups)
        self.stages = [Stage(a, b, g, p) for (a, b), g, p in zip(bounds, groups, predicted)]
        self._cut_made(predicted)
        if self.schedule == "pipedream" and trainer.clip_grad_norm is not None:
            raise ConfigError("pipeline_schedule='pipedream' updates once per micro-batch: "
                              "clip_grad_norm (one norm per step) cannot apply; leave it unset")

    def _cut_made(self, predicted):
        """Set ``imbalance`` from the stages' ``predicted`` seconds and ``schedule_run``
        (``"dataflow"`` where a batch norm couples a synchronous schedule's micro-batches;
        pipedream normalises each by its own statistics)."""
        known = [p for p in predicted if p is not None]
        self.imbalance = (max(known) / (sum(known) / len(known))
                          if known and len(known) == len(predicted) and sum(known) else None)
        coupled = [s for s, st in enumerate(self.stages)
                   if any(isinstance(m, BatchNorm2D) and m.training
                          for b in self.blocks[st.first:st.end] for m in _modules(b))]
        self.schedule_run = self.schedule if not coupled or self.schedule == "pipedream" else (
            f"dataflow (batch norm in stage {coupled[0]} couples the micro-batches)")

    def _worker_groups(self, rt) -> list[tuple]:
        workers = list(rt.workers)
        count = self.num_stages
        if self.stage_devices is None:
            if len(workers) < count:
                raise ConfigError(f"pipeline: {count} stages need at least {count} workers; "
                                  f"the runtime has {len(workers)} ({rt.devices!r})")
            size = len(workers) // count
            return [tuple(workers[s * size:(s + 1) * size]) for s in range(count)]
        groups, free = [], list(workers)
        for s, spec in enumerate(self.stage_devices):
            kind, _, n = str(spec).partition(":")
            try:
                n = int(n) if n else 1
            except ValueError:
                n = -1
            if n < 1:
                raise ConfigError(f"stage_devices[{s}]: {spec!r} is not 'DEVICE:COUNT'")
            mine = [w for w in free if w.device == kind][:n]
            if len(mine) < n:
                raise ConfigError(f"stage_devices[{s}]: {spec!r} asks for {n} {kind} "
                                  f"worker(s); the runtime ({rt.devices!r}) has "
                                  f"{len(mine)} left")
            for w in mine:
                free.remove(w)
            groups.append(tuple(mine))
        return groups

    def _given(self, firsts) -> list[tuple]:
        layers = self.model.layers
        index = {id(layer): i for i, layer in enumerate(layers)}
        bounds, expected = [], 0
        for s, stage in enumerate(self.spec):
            if not isinstance(stage, (list, tuple)) or not stage:
                raise ConfigError(f"pipeline[{s}]: expected a non-empty list of layers")
            at = [index.get(id(layer)) for layer in stage]
            if None in at or at != list(range(expected, expected + len(at))):
                raise ConfigError(f"pipeline[{s}]: the stages must be the model's layers in "
                                  f"order, each once; stage {s} should start with layer "
                                  f"{expected}")
            if expected not in firsts:
                raise ConfigError(f"pipeline[{s}]: layer {expected} is inside a fused block "
                                  f"(model.fuse); cut at a block boundary or set fuse=False")
            bounds.append((firsts.index(expected), None))
            expected += len(at)
        if expected != len(layers):
            raise ConfigError(f"pipeline: the stages hold {expected} of the model's "
                              f"{len(layers)} layers")
        ends = [a for a, _ in bounds[1:]] + [len(firsts)]
        return [(a, e) for (a, _), e in zip(bounds, ends)]

    def _balance(self, trainer, x, y, groups):
        """Cut ``P`` stages from the blocks' predicted costs (module docstring)."""
        costs = block_costs(trainer, self, x, y, [g[0].kind for g in groups])
        nblocks, count = len(self.blocks), len(groups)
        if nblocks < count:
            raise ConfigError(f"pipeline: {count} stages but the model runs "
                              f"{nblocks} blocks")
        bounds, _ = balanced_cut(costs, count, [len(g) for g in groups])
        predicted = [sum(costs[s][a:b]) / len(g) for s, ((a, b), g) in
                     enumerate(zip(bounds, groups))]
        return bounds, predicted

    # ------------------------------------------------------------ a step
    def submit_stages(self, trainer, xs, ys):
        """Submit one optimizer step as the trainer would, each block on its stage's
        workers, the schedule's order added; returns the trainer's result handles."""

        if self.schedule == "pipedream":
            return submit_pipedream(self, trainer, xs, ys)
        rt, model = trainer.runtime, trainer.model
        model.zero_grad(rt)
        ordered = not rt.streaming and not self.schedule_run.startswith("dataflow")
        with rt.keeping_temporaries() if ordered else contextlib.nullcontext():
            loss, correct, forward, backward = self._submit_stages(trainer, xs, ys)
        self.ops = [_operations(f, b, len(xs)) for f, b in zip(forward, backward)]
        if ordered:
            for s, (fops, bops) in enumerate(self.ops):
                _chain(rt, schedule_order(self.schedule, s, len(self.stages), fops, bops))
        norm_sq = (submit_clip_grad_norm(trainer.optimizer, trainer.clip_grad_norm)
                   if trainer.clip_grad_norm is not None else None)
        trainer.optimizer.step(rt)
        return loss, correct, norm_sq

    def _submit_stages(self, trainer, xs, ys):
        """Every block's forward, the loss, every block's backward, each on its stage's
        workers, activations released as ``Sequential.backward`` releases them; returns
        the loss's handles and per stage its forward and backward tasks."""
        rt = trainer.runtime
        forward, outputs = [], {}
        for s, stage in enumerate(self.stages):
            with rt.placing(stage.workers) as tasks:
                xs = submit_forward(rt, self.blocks, stage.first, stage.end, xs, outputs)
                if s == len(self.stages) - 1:
                    loss, correct, dys = trainer.loss(rt, xs, ys)
            forward.append(tasks)
        backward = [None] * len(self.stages)
        kept = {outputs[len(self.blocks) - 1], dys[0].root}  # as Sequential.backward's
        for s in reversed(range(len(self.stages))):
            stage = self.stages[s]
            with rt.placing(stage.workers) as tasks:
                dys = submit_backward(rt, self.blocks, self.needs, stage.first, stage.end, dys,
                                      outputs, kept)
            backward[s] = tasks
        return loss, correct, forward, backward

    # ------------------------------------------------------------ the bubble
    def bubble(self, trace) -> dict | None:
        """The bubble fractions of the last step in ``trace`` (its stage tasks by their
        current ids), or None if the trace does not hold it: ``bubble`` measured,
        ``ideal`` (equal stages), ``overhead_free`` (the schedule run on these stages'
        measured operation times with no overhead, :func:`schedule_span`; None where
        the order is left to the data) and ``stage_imbalance`` (the busiest stage's
        seconds over the mean)."""
        ids = [{t.id for ops in stage_ops for op in ops for t in op}
               for stage_ops in self.ops]
        by_id = {r.task_id: r for r in trace}
        records = [[by_id[i] for i in stage if i in by_id] for stage in ids]
        if not all(records):
            return None
        start = min(r.start for rs in records for r in rs)
        end = max(r.end for rs in records for r in rs)
        span = end - start
        busy = [sum(r.end - r.start for r in rs) for rs in records]
        width = sum(len(st.workers) for st in self.stages)
        count, micro = len(self.stages), len(self.ops[0][0])
        free = None
        if not self.schedule_run.startswith("dataflow"):
            seconds = [[[sum(by_id[t.id].end - by_id[t.id].start for t in op if t.id in by_id)
                         / len(st.workers) for op in ops] for ops in stage_ops]
                       for st, stage_ops in zip(self.stages, self.ops)]
            least = schedule_span(self.schedule, seconds)
            free = 1 - sum(busy) / (width * least) if least else None
        return {"bubble": 1 - sum(busy) / (width * span) if span > 0 else None,
                "ideal": (count - 1) / (micro + count - 1), "overhead_free": free,
                "stage_imbalance": max(busy) / (sum(busy) / count) if sum(busy) else None,
                "span_seconds": span, "busy_seconds": busy, "micro_batches": micro}

    def describe(self) -> dict:
        """What ``metrics.json`` records of the pipeline."""
        return {"stages": [{"blocks": [type(b).__name__ for b in self.blocks[st.first:st.end]],
                            "workers": [w.name for w in st.workers],
                            "predicted_seconds": st.predicted_seconds} for st in self.stages],
                "schedule": self.schedule, "schedule_run": self.schedule_run,
                "imbalance": self.imbalance}


def balanced_cut(costs, count, widths=None):
    """Cut the blocks into ``count`` contiguous stages minimising the slowest stage's time:
    ``costs[s][b]`` the seconds of block ``b`` on stage ``s``'s kind, divided by the
    stage's ``widths[s]`` workers. Returns ``([(first, end), ...], slowest seconds)``."""
    n = len(costs[0])
    widths = widths or [1] * count
    prefix = [[0.0] for _ in range(count)]
    for s in range(count):
        for c in costs[s]:
            prefix[s].append(prefix[s][-1] + c)
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(count + 1)]  # best[s][b]: stages < s over blocks < b
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0.0
    for s in range(1, count + 1):
        for b in range(s, n - (count - s) + 1):
            for a in range(s - 1, b):
                t = max(best[s - 1][a], (prefix[s - 1][b] - prefix[s - 1][a]) / widths[s - 1])
                if t < best[s][b]:
                    best[s][b], cut[s][b] = t, a
    bounds, b = [], n
    for s in range(count, 0, -1):
        a = cut[s][b]
        bounds.append((a, b))
        b = a
    return bounds[::-1], best[count][n]


def block_costs(trainer, pipeline, x, y, kinds) -> list[list[float]]:
    """Per stage kind, the predicted seconds of each block's tasks in one step (forward
    and backward), from the performance models (one calibration step where they know
    too little; the state is put back)."""

    rt = trainer.runtime
    with _models_for(rt):
        def submitted():
            per_block = [[] for _ in pipeline.blocks]
            xs, ys = trainer.register_batch(x, y)
            trainer.model.zero_grad(rt)
            for i, block in enumerate(pipeline.blocks):
                with rt.placing(rt.workers) as tasks:
                    xs = block.forward(rt, xs)
                per_block[i] += tasks
            _, _, dys = trainer.loss(rt, xs, ys)
            for i in reversed(range(len(pipeline.blocks))):
                if dys is None:  # no block before has parameters
                    break
                with rt.placing(rt.workers) as tasks:
                    dys = pipeline.blocks[i].backward(rt, dys,
                                                      need_input_grad=pipeline.needs[i])
                per_block[i] += tasks
            rt.wait()
            return per_block

        def predict(kind):
            out = []
            for tasks in holder:
                total = 0.0
                for t in tasks:
                    seconds = None  # this kind's time, else another's (the policy may
                    for k in (kind, *kinds):  # have run a codelet on one kind only)
                        if seconds is None and k in t.codelet.kinds:
                            seconds = rt.predict(t, k)[1]
                    if seconds is None:
                        return None
                    total += seconds
                out.append(total)
            return out

        holder = []
        with keeping_state(trainer.model):  # its forward counts batches and dropout steps
            capture(rt, lambda: holder.extend(submitted()), steps=1)
        costs = [predict(kind) for kind in kinds]
        if any(c is None for c in costs):
            saved, trainer.pipeline = trainer.pipeline, None  # the same tasks, unplaced
            try:
                with _state_kept(trainer):
                    with rt.measuring(None):  # capture, compilation (tasks wait on it):
                        trainer.train_step(x, y)  # no measurement kept
                    for _ in range(CALIBRATION_STEPS):
                        trainer.train_step(x, y)
                        if all(predict(kind) is not None for kind in kinds):
                            break
            finally:
                trainer.pipeline = saved
            costs = [predict(kind) for kind in kinds]
    if any(c is None for c in costs):
        raise ConfigError("pipeline: the performance models cannot predict every block "
                          "after calibration; give the stages as lists of layers")
    return costs


def _operations(forward, backward, micro) -> tuple[list, list]:
    """The stage's tasks by operation: ``(F, B)``, each a list of ``micro`` task lists
    (by the partition their batch operands belong to; a task of several or none, as a
    batch norm's statistics, belongs to none)."""
    fops, bops = [[] for _ in range(micro)], [[] for _ in range(micro)]
    for tasks, ops in ((forward, fops), (backward, bops)):
        for t in tasks:
            k = _micro_batch(t)
            if k is not None and k < micro:
                ops[k].append(t)
    return fops, bops


def _micro_batch(task):
    """The index of the batch partition ``task`` works on, or None."""
    found = None
    for h in task.handles:
        plan = h.plan
        if plan is None or plan.axis != 0:
            continue
        k = plan.children.index(h)
        if found is not None and k != found:
            return None
        found = k
    return found


def schedule_order(schedule, stage, count, fops, bops) -> list:
    """The operations of ``stage`` of ``count`` in ``schedule``'s order."""
    micro = len(fops)
    if schedule == "gpipe":
        return fops + bops
    warm = min(count - 1 - stage, micro)
    order = list(fops[:warm])
    for k in range(micro - warm):
        order += [fops[warm + k], bops[k]]
    return order + bops[micro - warm:]


def schedule_span(schedule, seconds) -> float | None:
    """The span of ``schedule`` run with no overhead: ``seconds[s]`` is stage ``s``'s
    ``(F, B)`` operation times per micro-batch; stage ``s``'s ``F k`` follows ``F k`` on
    ``s - 1``, its ``B k`` follows ``B k`` on ``s + 1``, and each stage runs its operations
    in the schedule's order (pipedream's data allows 1F1B's). The bubble this gives is
    what the schedule itself costs on these stages (imbalance, fill and drain), at the
    grain of whole operations: a real step may start a stage's backward as soon as the
    input gradient it needs is out, before the stage after it finishes its operation."""
    count = len(seconds)
    micro = len(seconds[0][0])
    labels = [("F", k) for k in range(micro)], [("B", k) for k in range(micro)]
    orders = [schedule_order("gpipe" if schedule == "gpipe" else "1f1b", s, count, *labels)
              for s in range(count)]
    end, free, at = {}, [0.0] * count, [0] * count
    moved = True
    while moved:
        moved = False
        for s in range(count):
            while at[s] < len(orders[s]):
                kind, k = orders[s][at[s]]
                before = ((kind, k, s - 1) if kind == "F" and s > 0 else
                          (kind, k, s + 1) if kind == "B" and s < count - 1 else None)
                if before is not None and before not in end:
                    break
                begin = max(free[s], end[before] if before else 0.0)
                end[(kind, k, s)] = free[s] = begin + seconds[s][kind == "B"][k]
                at[s] += 1
                moved = True
    return max(free) if all(a == len(o) for a, o in zip(at, orders)) else None


def _chain(rt, ops):
    """Each operation after the one before: its first tasks wait for the other's last."""
    ops = [op for op in ops if op]
    for before, after in zip(ops, ops[1:]):
        mine_b, mine_a = set(before), set(after)
        lasts = [t for t in before if not any(s in mine_b for s in t.succ)]
        firsts = [t for t in after if not any(p in mine_a for p in t.preds)]
        for a in lasts:
            for b in firsts:
                rt.add_dependency(a, b)
