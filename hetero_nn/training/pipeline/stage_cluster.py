"""Pipeline stages across Dask workers: the client's side.

This module owns what the client does for ``Trainer(cluster=..., pipeline=P)``:
:class:`StagePipeline` (the run's stages, their workers and the measured bubble) and
:class:`StageCluster`, the :class:`~hetero_nn.training.cluster.Cluster` whose ranks are
:class:`~hetero_nn.training.pipeline.stage_rank.StageRank` s, one per stage. The workers' side,
and how a stage exchanges its micro-batches, is :mod:`hetero_nn.training.pipeline.stage_rank`.

Policy
------
A run of ``P`` stages needs ``P`` Dask workers: stage ``s`` is the rank of the ``s``-th
worker in address order (the group forms as the data-parallel path's, with the run's
whole state on every rank). The cut is made at the first step: the given lists of
layers (``pipeline=[[...], ...]``), or ``pipeline=P`` balanced from the performance
models of stage 0's worker on the first batch (the blocks' predicted forward and
backward seconds, :func:`~hetero_nn.training.pipeline.stages.block_costs`, cut by
:func:`~hetero_nn.training.pipeline.stages.balanced_cut`). Each step the client sends every
stage the step's number, the cut, the schedule and the hyper-parameters, the first
stage the samples (indices into the training set the workers hold, or the arrays) and
the last stage the labels, then reads one answer per stage: the loss from the last, the
busy time of its forward and backward tasks from each. Activations and gradients go
from stage to stage (:class:`~hetero_nn.training.pipeline.stage_rank.StageLink`).

*State pulled.* A stage updates only its own parameters, so the client brings its model
and optimizer up to date (before a checkpoint, an evaluation, a prediction, at the end
of ``fit``) from every stage: each weight, buffer, optimizer buffer and dropout counter
from the stage that owns its layer.

*Bubble.* Per step, from the stages' answers: the span from the first stage task's
start to the last one's end (``time.monotonic``: one machine's clock), per stage ``1 -
busy / (workers * span)``, and for the pipeline ``1 - sum(busy) / (sum(workers) *
span)`` beside the ideal ``(P - 1) / (M + P - 1)`` and the overhead-free bubble (the
schedule run on the stages' measured operation times,
:func:`~hetero_nn.training.pipeline.stages.schedule_span`), as in one process
(:meth:`Pipeline.bubble <hetero_nn.training.pipeline.stages.Pipeline.bubble>`).

*Refused* (one line, when the trainer is made): ``stage_devices`` (a stage is one
worker's runtime: ``--cluster-devices``), ``clip_grad_norm`` (the norm spans every
stage's gradients), ``granularity="auto"``, spiking models with a time axis.
``pipeline_schedule="pipedream"`` runs (each stage updates per micro-batch:
:func:`~hetero_nn.training.pipeline.stage_rank.submit_pipedream_stage`). *Faults*: a
stage's weights live only on its worker, so a lost stage worker (or a step that failed
after some stages had updated theirs) ends the run with a
:class:`~hetero_nn.errors.ClusterError` naming the last checkpoint; where the client
already held the state of the last completed step, the next step pushes it again.

State
-----
:class:`StagePipeline`: ``stages`` (:class:`~hetero_nn.training.pipeline.stages.Stage`, its
``workers`` the Dask worker's address), ``measured`` (the last step's bubble),
``stage_bubbles`` (per stage, each step's). :class:`StageCluster`: ``_broken`` (why the
stages no longer hold one run's state, or None).
"""

from __future__ import annotations

import statistics
import time

from ...errors import ClusterError, ConfigError
from ..cluster.client import Cluster, connect
from ..cluster.messages import DatasetBatch, RankLost, load_run_state, partition_starts, step_terms
from .stages import Pipeline, Stage, schedule_span
from .stage_rank import StageRank

__all__ = ["StagePipeline", "StageCluster", "connect_stages", "merge_states"]


class StagePipeline(Pipeline):
    """The stages of a pipelined cluster run (module docstring); ``bubble`` and
    ``describe`` answer as a :class:`~hetero_nn.training.pipeline.stages.Pipeline`'s."""

    def __init__(self, model, pipeline, schedule="1f1b", stage_devices=None):
        if stage_devices is not None:
            raise ConfigError("stage_devices: with cluster= each stage runs on one Dask "
                              "worker's runtime; give its devices with --cluster-devices")
        super().__init__(model, pipeline, None, schedule)
        self.measured = None
        self.stage_bubbles: list[list[float]] = []

    def cut(self, bounds, predicted, workers):
        """Take the stages ``bounds`` (blocks ``(first, end)``) with their predicted
        seconds, stage ``s`` on ``workers[s]``; decides whether the order is added."""
        self.stages = [Stage(a, b, (w,), p) for (a, b), w, p in zip(bounds, workers, predicted)]
        self._cut_made(predicted)
        self.stage_bubbles = [[] for _ in self.stages]

    @property
    def ops(self) -> bool:
        """Whether a step's bubble was measured (where an in-process pipeline has the
        operations of its last step; a stage's live in its rank)."""
        return self.measured is not None

    @ops.setter
    def ops(self, _value):  # Pipeline.__init__'s empty list
        pass

    def record(self, busy, micro):
        """Keep the bubble of a step from the stages' busy times (module docstring)."""
        if any(b is None for b in busy):
            self.measured = None
            return
        span = max(b["last"] for b in busy) - min(b["first"] for b in busy)
        if span <= 0:
            self.measured = None
            return
        per_stage = [1 - b["seconds"] / (b["workers"] * span) for b in busy]
        for history, value in zip(self.stage_bubbles, per_stage):
            history.append(value)
        count, seconds = len(busy), [b["seconds"] for b in busy]
        width = sum(b["workers"] for b in busy)
        free = None
        if not self.schedule_run.startswith("dataflow"):
            least = schedule_span(self.schedule, [b["ops"] for b in busy])
            free = 1 - sum(seconds) / (width * least) if least else None
        self.measured = {
            "bubble": 1 - sum(seconds) / (width * span),
            "ideal": (count - 1) / (micro + count - 1), "overhead_free": free,
            "stage_imbalance": max(seconds) / (sum(seconds) / count) if sum(seconds) else None,
            "span_seconds": span, "busy_seconds": seconds, "stage_bubbles": per_stage,
            "micro_batches": micro}

    def bubble(self, trace=None) -> dict | None:
        """The last step's bubble as the stages measured it (``trace``, the client's,
        holds none of their tasks)."""
        return self.measured

    def describe(self) -> dict:
        def median(values):  # the steps after the first (capture, compilation)
            values = values[1:] or values
            return statistics.median(values) if values else None

        return {"stages": [{"blocks": [type(b).__name__ for b in self.blocks[st.first:st.end]],
                            "workers": list(st.workers),
                            "predicted_seconds": st.predicted_seconds,
                            "bubble": median(history)}
                           for st, history in zip(self.stages, self.stage_bubbles)],
                "schedule": self.schedule, "schedule_run": self.schedule_run,
                "imbalance": self.imbalance, "across": "dask workers"}


class StageCluster(Cluster):
    """A :class:`~hetero_nn.training.cluster.Cluster` whose ranks are pipeline stages
    (module docstring)."""

    _broken = None

    def _rank_class(self):
        return StageRank

    def train_step(self, trainer, x, y) -> float:
        if not isinstance(trainer.pipeline, StagePipeline):
            raise ConfigError("cluster: a StageCluster runs pipeline stages; give the trainer "
                              "pipeline=, or train data-parallel on a Cluster")
        if self._broken is not None:
            raise ClusterError(self._broken)
        try:
            return super().train_step(trainer, x, y)
        except BaseException:
            if self._stale:  # some stages may have updated their weights, others not
                self._broken = (f"cluster {self.spec}: a pipelined step failed after the "
                                f"stages took over the run; {trainer.describe_last_checkpoint()}")
            else:
                self._dirty = True  # the client holds the run: pushed at the next step
            raise

    def _ensure_group(self, trainer, data, size):
        count = trainer.pipeline.num_stages
        deadline = time.perf_counter() + self.worker_grace
        while len(self._seen) < count:
            if time.perf_counter() > deadline:
                raise ClusterError(f"cluster {self.spec}: {count} pipeline stages need {count} "
                                   f"Dask workers, {len(self._seen)} left; step "
                                   f"{trainer.global_step + 1} was not applied; "
                                   f"{trainer.describe_last_checkpoint()}")
            time.sleep(0.1)
        super()._ensure_group(trainer, data, count)
        if len(self._group) < count:
            raise ClusterError(f"cluster {self.spec}: only {len(self._group)} of the {count} "
                               f"pipeline stages could start; "
                               f"{trainer.describe_last_checkpoint()}")

    def _addresses(self) -> list[str]:
        return [self._ranks[w].address for w in self._group]

    def _run_step(self, trainer, x, y, n, g, step):
        pipe = trainer.pipeline
        if not pipe.stages:
            self._cut(trainer, x, y, g)
        for stage, worker in zip(pipe.stages, self._group):  # as the group formed
            stage.workers = (worker,)
        addresses = self._addresses()
        hyper = trainer.optimizer.hyper()
        common = {"op": "step", "gen": self._generation, "step": step, "epoch": trainer.epoch,
                  "n": n, "g": g, "hyper": hyper, "schedule": pipe.schedule,
                  "bounds": [(st.first, st.end) for st in pipe.stages],
                  "dataflow": pipe.schedule_run != pipe.schedule}
        messages = {a: dict(common) for a in addresses}
        self._add_batch(messages, x, y, trainer.epoch)
        t_send = time.monotonic()
        replies = self.links.ask(messages, self._alive)
        t_all = time.monotonic()
        self._raise_errors(replies, trainer)
        answers = [replies[a] for a in addresses]
        pipe.record([a["busy"] for a in answers], g)
        return answers[-1]["result"], step_terms(t_send, t_all, answers)

    def _add_batch(self, messages, x, y, epoch):
        """The samples to the first stage's message, the labels to the last's."""
        first, last = self._addresses()[0], self._addresses()[-1]
        if isinstance(x, DatasetBatch):
            indices = self.links.array(x.indices)
            for address in {first, last}:
                messages[address].update(indices=indices, epoch=epoch)
            return
        messages[first]["x"] = self.links.array(x)
        messages[last]["y"] = self.links.array(y)

    def _cut(self, trainer, x, y, g):
        """The stages: the given lists, or ``pipeline=P`` balanced on stage 0's worker."""
        pipe, model = trainer.pipeline, trainer.model
        plan = model._plan()
        pipe.blocks = [b for _, b in plan]
        count = pipe.num_stages
        if not isinstance(pipe.spec, int):
            bounds, predicted = pipe._given([i for i, _ in plan]), [None] * count
        elif len(plan) < count:
            raise ConfigError(f"pipeline: {count} stages but the model runs {len(plan)} blocks")
        else:
            first = self._addresses()[0]
            message = {"op": "cut", "g": g, "count": count}
            if isinstance(x, DatasetBatch):
                message.update(indices=self.links.array(x.indices), epoch=trainer.epoch)
            else:
                message.update(x=self.links.array(x), y=self.links.array(y))
            reply = self.links.ask({first: message}, self._alive)
            self._raise_errors(reply, trainer)
            bounds, predicted = reply[first]["bounds"], reply[first]["predicted"]
        pipe.cut(bounds, predicted, list(self._group))

    def _raise_errors(self, replies, trainer):
        """A stage's own error first: the stages beside it fail with a broken link."""
        ordered = sorted(replies.items(), key=lambda item: bool(item[1].get("broken")))
        super()._raise_errors(dict(ordered), trainer)

    def _recover(self, trainer, step, lost):
        survivors = [a for a in self._addresses() if a not in lost.addresses]
        stages = [s for s, a in enumerate(self._addresses()) if a in lost.addresses]
        self._abort(survivors)
        self._forget(list(lost.addresses))
        self._group, self._dirty = [], True
        raise ClusterError(f"cluster {self.spec}: pipeline stage(s) {stages or '?'} lost in step "
                           f"{step} ({lost}); a stage's weights live only on its worker"
                           f"{', so the run stops' if self._stale else ''}; "
                           f"{trainer.describe_last_checkpoint()}") from None

    def pull(self, trainer):
        """Bring the run's state from every stage into ``trainer`` (module docstring)."""
        if not self._stale or self.client is None or trainer is not self._trainer:
            return
        if self._broken is not None:
            raise ClusterError(self._broken)
        addresses = self._addresses()
        if len(addresses) != trainer.pipeline.num_stages:
            raise ClusterError(f"cluster {self.spec}: a pipeline stage's worker was lost; "
                               f"{trainer.describe_last_checkpoint()}")
        try:
            replies = self.links.ask({a: {"op": "state"} for a in addresses}, lambda: addresses)
        except RankLost as lost:
            raise ClusterError(f"cluster {self.spec}: a pipeline stage's worker was lost "
                               f"({lost}); {trainer.describe_last_checkpoint()}") from None
        if any(replies[a].get("op") != "state" for a in addresses):
            raise ClusterError(f"cluster {self.spec}: a pipeline stage could not send its "
                               f"state; {trainer.describe_last_checkpoint()}")
        states = [replies[a]["state"] for a in addresses]
        load_run_state(trainer.model, trainer.optimizer,
                       merge_states(trainer.model, trainer.pipeline, states))
        trainer.step_cache.clear()  # its graphs hold the handles the load replaced
        self._stale = False

    def invalidate(self):
        """The client's state was replaced (a checkpoint loaded): every stage gets it at
        the next step, whatever an earlier failed step left on them."""
        super().invalidate()
        self._broken = None

    def tune(self, trainer, x, y=None):
        raise ConfigError("pipeline across Dask workers: granularity='auto' is not built; "
                          "give the granularity (the micro-batches)")


def merge_states(model, pipeline, states) -> dict:
    """One run state from the stages' (:func:`~hetero_nn.training.cluster.messages.run_state`
    each): every weight, buffer, optimizer buffer and dropout counter from the stage that
    owns its top-level layer; the optimizer's step count and options from the last."""
    firsts = [i for i, _ in model._plan()]
    owner = {}
    for s, st in enumerate(pipeline.stages):
        hi = firsts[st.end] if st.end < len(firsts) else len(model.layers)
        for i in range(firsts[st.first], hi):
            owner[model.names[i]] = s

    def pick(key, what):
        mine = what(states[owner[key.split(".", 1)[0]]])
        return mine[key]

    last = states[-1]
    optimizer = dict(last["optimizer"])
    optimizer["state"] = {k: pick(k, lambda st: st["optimizer"]["state"])
                          for k in last["optimizer"]["state"]}
    return {"model": {k: pick(k, lambda st: st["model"]) for k in last["model"]},
            "optimizer": optimizer,
            "dropout": {k: pick(k, lambda st: st["dropout"]) for k in last["dropout"]},
            "completed": min(st["completed"] for st in states)}


def connect_stages(trainer, spec) -> tuple[StageCluster, bool]:
    """``(cluster, owned)`` for ``Trainer(cluster=spec, pipeline=...)``: refuses what the
    stages cannot train as one process does, then connects (a :class:`StageCluster`
    given is used as it is, the caller closing it; another
    :class:`~hetero_nn.training.cluster.Cluster` through its client, the trainer closing
    what it made)."""
    model, pipe = trainer.model, trainer.pipeline
    if trainer.clip_grad_norm is not None:
        raise ConfigError("pipeline across Dask workers: clip_grad_norm needs the norm of "
                          "every stage's gradients before any stage updates; not built")
    if trainer.auto_granularity:
        raise ConfigError("pipeline across Dask workers: granularity='auto' is not built; "
                          "give the granularity (the micro-batches)")
    if any(getattr(m, "makes_time", False) for m in model.modules()):
        raise ConfigError("pipeline across Dask workers: spiking models (a time axis) are "
                          "not built; train them with --devices")
    owned = not isinstance(spec, StageCluster)
    if not owned:
        cluster = spec
    elif isinstance(spec, Cluster):  # its client and workers' devices; closed by the trainer
        cluster = StageCluster(spec.client, devices=spec.worker_devices,
                               worker_grace=spec.worker_grace, spec=spec.spec)
    else:
        cluster = connect(spec, cls=StageCluster)
    workers = len(cluster.workers)
    if workers < pipe.num_stages:
        if owned:
            cluster.close()
        raise ConfigError(f"pipeline: {pipe.num_stages} stages need {pipe.num_stages} Dask "
                          f"workers (one per stage); cluster {cluster.spec} has {workers}")
    return cluster, owned
