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
(:class:`~hetero_nn.training.pipeline.Pipeline`) and the bubble.
"""

from __future__ import annotations

import contextlib

from ..layers.base import temporarily
from ..layers.sequential import release_dead
from .pipeline import _modules

__all__ = ["submit_pipedream"]


def submit_pipedream(pipeline, trainer, xs, ys):
    """Submit one step of PipeDream with weight stashing (module docstring): per
    micro-batch, its forward on every stage with the stage's version of the weights,
    the loss, its backward with the same versions, then every stage's update."""
    from ..codelets.reduce import copy

    rt, count, micro = trainer.runtime, len(pipeline.stages), len(xs)
    n = sum(x.shape[0] for x in xs)
    params = [_unique(p for b in pipeline.blocks[st.first:st.end] for m in _modules(b)
                      for p in m.parameters()) for st in pipeline.stages]
    stage_of = {id(p): s for s, ps in enumerate(params) for p in ps}
    pipeline.ops = [([], []) for _ in pipeline.stages]

    @contextlib.contextmanager
    def place(p):  # an update: on its stage's workers, part of its backward operation
        s = stage_of[id(p)]
        with rt.placing(pipeline.stages[s].workers) as tasks:
            yield
        pipeline.ops[s][1][-1].extend(tasks)

    def stash(s, into):  # a copy of stage s's live weights, for the micro-batches behind
        with rt.placing(pipeline.stages[s].workers) as tasks:
            handles = [rt.empty(p.shape, p.data.dtype, name=f"{p.name}.stash")
                       for p in params[s]]
            for p, h in zip(params[s], handles):
                rt.submit(copy, p.handle, h)
        into.extend(tasks)
        return handles

    with rt.keeping_temporaries():
        first = [[] for _ in pipeline.stages]  # the version-0 copies: part of F 0
        versions = [{0: stash(s, first[s])} if _stashed(0, s, count, micro) else {}
                    for s in range(count)]
        for k in range(micro):
            used = [max(0, k - (count - 1 - s)) for s in range(count)]
            weights = [versions[s].get(used[s]) for s in range(count)]  # None: live
            x, outputs = [xs[k]], []
            for s, stage in enumerate(pipeline.stages):
                with _weights(params[s], weights[s]), rt.placing(stage.workers) as tasks:
                    for block in pipeline.blocks[stage.first:stage.end]:
                        x = block.forward(rt, x)
                        outputs.append(x[0].root)
                    if s == count - 1:
                        loss, correct, dys = trainer.loss(rt, x, [ys[k]], batch=n,
                                                          accumulate=k > 0)
                pipeline.ops[s][0].append(first[s] + tasks if k == 0 else tasks)
            kept = {outputs[-1], dys[0].root}
            for s in reversed(range(count)):
                stage = pipeline.stages[s]
                with _weights(params[s], weights[s]), rt.placing(stage.workers) as tasks:
                    for block in pipeline.blocks[stage.first:stage.end]:
                        for layer in getattr(block, "layers", (block,)):
                            layer.zero_grad(rt)
                    for i in reversed(range(stage.first, stage.end)):
                        if dys is None:  # no block before has parameters
                            break
                        incoming = dys
                        dys = pipeline.blocks[i].backward(rt, dys,
                                                          need_input_grad=pipeline.needs[i])
                        release_dead(rt, [outputs[i], incoming[0].root], kept, dys)
                        kept.add(outputs[i])
                pipeline.ops[s][1].append(tasks)
            trainer.optimizer.step(rt, place=place)
            for s in range(count):
                if _stashed(k + 1, s, count, micro):
                    versions[s][k + 1] = stash(s, pipeline.ops[s][1][-1])
    return loss, correct, None


def _unique(params) -> list:
    """``params`` without repeats (a parameter shared by two layers updates once)."""
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


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

