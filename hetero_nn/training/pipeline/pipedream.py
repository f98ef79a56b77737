"""PipeDream's schedule on a pipeline's stages: ``pipeline_schedule="pipedream"``.

Policy
------
``"pipedream"`` is PipeDream's asynchronous schedule with weight stashing (Narayanan
et al., SOSP 2019), with the trainer's step as the flush: it is *not* synchronous
training. Each micro-batch is a PipeDream minibatch with its own update: its loss is
its share of the batch's mean (``loss(batch=n)``, so the step's loss is still the
batch's mean and SGD moves about as far per step as a synchronous step), and after its
backward every stage applies the optimizer to that share at once. Stage ``s`` of
``P`` runs the forward of micro-batch ``k`` with its weights after ``max(0, k - (P - 1
- s))`` of the step's updates, as 1F1B's steady state has them (the last stage uses
the newest weights, the first is ``P - 1`` updates behind), and the backward of ``k``
with the *same* version (weight stashing: a copy of the stage's weights kept until the
backward that needs it), while the updates apply to the live weights. The step is
submitted micro-batch by micro-batch (``F k`` on every stage, the loss, ``B k`` on
every stage, the updates); the order comes from the data alone: a stage's forward of
``k + 1`` reads a stashed version, so it does not wait for the later stages' backward
of ``k``. Batch norm normalises each micro-batch by its own statistics (as PipeDream
and GPipe implementations do); every update, Dropout mask and batch-norm momentum is
a step input of its own, so the step replays. Gradient clipping is refused (one norm
would span several updates).

Why a module of its own: the synchronous schedules submit the step as without a
pipeline and add an order; this one submits another step (an update per micro-batch,
weight versions), so it keeps its submission here and shares only the stages
(:class:`~hetero_nn.training.pipeline.stages.Pipeline`) and the bubble. Its pieces for one
stage (:class:`WeightStash`: the version rule and the stash; :func:`zero_stage_grads`;
a stage's blocks through ``pipeline.submit_forward``/``submit_backward``) serve the stages across
Dask workers too (:func:`~hetero_nn.training.pipeline.stage_rank.submit_pipedream_stage`).
"""

from __future__ import annotations

import contextlib

from ...layers.base import temporarily
from .passes import _modules, submit_backward, submit_forward
from ...codelets.reduce import copy

__all__ = ["submit_pipedream", "WeightStash", "stage_parameters", "zero_stage_grads"]


def submit_pipedream(pipeline, trainer, xs, ys):
    """Submit one step of PipeDream with weight stashing (module docstring): per
    micro-batch, its forward on every stage with the stage's version of the weights,
    the loss, its backward with the same versions, then every stage's update."""
    rt, count, micro = trainer.runtime, len(pipeline.stages), len(xs)
    n = sum(x.shape[0] for x in xs)
    stashes = [WeightStash(rt, stage_parameters(pipeline.blocks[st.first:st.end]), s, count,
                           micro, st.workers) for s, st in enumerate(pipeline.stages)]
    stage_of = {id(p): s for s, stash in enumerate(stashes) for p in stash.params}
    pipeline.ops = [([], []) for _ in pipeline.stages]

    @contextlib.contextmanager
    def place(p):  # an update: on its stage's workers, part of its backward operation
        s = stage_of[id(p)]
        with rt.placing(pipeline.stages[s].workers) as tasks:
            yield
        pipeline.ops[s][1][-1].extend(tasks)

    with rt.keeping_temporaries():
        first = [stash.keep(0) for stash in stashes]  # the version-0 copies: part of F 0
        for k in range(micro):
            x, outputs = [xs[k]], {}
            for s, stage in enumerate(pipeline.stages):
                with stashes[s].weights(k), rt.placing(stage.workers) as tasks:
                    x = submit_forward(rt, pipeline.blocks, stage.first, stage.end, x, outputs)
                    if s == count - 1:
                        loss, correct, dys = trainer.loss(rt, x, [ys[k]], batch=n,
                                                          accumulate=k > 0)
                pipeline.ops[s][0].append(first[s] + tasks if k == 0 else tasks)
            kept = {outputs[len(pipeline.blocks) - 1], dys[0].root}
            for s in reversed(range(count)):
                stage = pipeline.stages[s]
                with stashes[s].weights(k), rt.placing(stage.workers) as tasks:
                    zero_stage_grads(rt, pipeline.blocks[stage.first:stage.end])
                    dys = submit_backward(rt, pipeline.blocks, pipeline.needs, stage.first,
                                          stage.end, dys, outputs, kept)
                pipeline.ops[s][1].append(tasks)
            trainer.optimizer.step(rt, place=place)
            for s, stash in enumerate(stashes):
                pipeline.ops[s][1][-1].extend(stash.keep(k + 1))
    return loss, correct, None


class WeightStash:
    """The weight versions of stage ``stage`` of ``count`` over one step of ``micro``
    micro-batches (module docstring): micro-batch ``k`` runs its forward and backward
    with version :meth:`version` ``(k)``, the stage's weights after that many of the
    step's updates. A version is copied (on ``workers``) when it is made, where a later
    micro-batch reads it after another update has replaced it live.

    ``params``: the stage's parameters (:func:`stage_parameters`); ``versions``:
    version -> the handles of its copy."""

    def __init__(self, rt, params, stage, count, micro, workers):
        self.rt, self.params, self.workers = rt, list(params), workers
        self.stage, self.count, self.micro = stage, count, micro
        self.versions: dict = {}

    def version(self, k) -> int:
        """The version of the weights micro-batch ``k`` reads."""
        return max(0, k - (self.count - 1 - self.stage))

    def weights(self, k):
        """The context to submit micro-batch ``k``'s forward or backward in: the stage's
        parameters read from its version (the live handles where no copy was needed).
        Not the updates': they write the live weights."""
        return _weights(self.params, self.versions.get(self.version(k)))

    def keep(self, version) -> list:
        """Submit a copy of the live weights, which are ``version`` (after that many
        updates), where a later micro-batch reads it; returns the copy tasks."""

        if not _stashed(version, self.stage, self.count, self.micro):
            return []
        rt = self.rt
        with rt.placing(self.workers) as tasks:
            handles = [rt.empty(p.shape, p.data.dtype, name=f"{p.name}.stash")
                       for p in self.params]
            for p, h in zip(self.params, handles):
                rt.submit(copy, p.handle, h)
        self.versions[version] = handles
        return tasks


def stage_parameters(blocks) -> list:
    """The parameters of a stage's ``blocks``, each once (a parameter shared by two
    layers updates once)."""
    seen, out = set(), []
    for p in (p for b in blocks for m in _modules(b) for p in m.parameters()):
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def zero_stage_grads(rt, blocks):
    """Zero the gradients of a stage's ``blocks`` (before each micro-batch's backward:
    an update per micro-batch)."""
    for block in blocks:
        for layer in getattr(block, "layers", (block,)):
            layer.zero_grad(rt)


def _stashed(version, stage, count, micro) -> bool:
    """Whether pipedream's micro-batches read ``version`` of ``stage``'s weights after a
    later update has replaced it live (so it must be stashed): micro-batch ``k`` reads
    version ``max(0, k - (count - 1 - stage))`` when ``k`` updates have been submitted."""
    lag = count - 1 - stage
    readers = range(0, min(lag, micro - 1) + 1) if version == 0 else [version + lag]
    return any(k > version and k < micro for k in readers)


def _weights(params, handles):
    """Submit with ``params`` read from ``handles`` (a stashed version of the stage's
    weights) instead of their live handles; ``handles`` None: the live ones."""
    return contextlib.nullcontext() if handles is None else temporarily(params, "handle",
                                                                        handles)

