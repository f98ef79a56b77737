"""A stage's passes: blocks ``[first, end)`` of a model submitted forward or backward on
one micro-batch's partitions, releasing the activations no later task reads.

What the synchronous schedules (:mod:`~hetero_nn.training.pipeline.stages`), PipeDream
(:mod:`~hetero_nn.training.pipeline.pipedream`) and the stages across Dask workers
(:mod:`~hetero_nn.training.pipeline.stage_rank`) share.
"""

from __future__ import annotations

from ...layers.sequential import release_dead


def submit_forward(rt, blocks, first, end, xs, outputs):
    """Submit blocks ``[first, end)``'s forward of the partitions ``xs``; records each
    block's output in ``outputs`` (block index -> root handle); returns the last one."""
    for i in range(first, end):
        xs = blocks[i].forward(rt, xs)
        outputs[i] = xs[0].root
    return xs


def submit_backward(rt, blocks, needs, first, end, dys, outputs, kept):
    """Submit blocks ``[first, end)``'s backward from ``dys``, the gradient of their
    output, releasing the activations no later task reads as ``Sequential.backward``
    does (``outputs`` from :func:`submit_forward`; ``kept``: handles never released,
    grown with each output passed). Returns the input gradient (None where no block
    before has parameters)."""
    for i in reversed(range(first, end)):
        if dys is None:  # no block before has parameters
            break
        incoming = dys
        dys = blocks[i].backward(rt, dys, need_input_grad=needs[i])
        release_dead(rt, [outputs[i], incoming[0].root], kept, dys)
        kept.add(outputs[i])
    return dys


def _modules(block):
    """The layers of a block (a fused run's, or the block's own) and their sublayers."""
    return [m for layer in getattr(block, "layers", (block,)) for m in layer.modules()]
