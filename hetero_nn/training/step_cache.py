"""The step cache: a trainer's steps captured once per step key and replayed.

This module owns the one replay rule of the package and the graphs it keeps.
:class:`~hetero_nn.training.trainer.Trainer` runs every train and eval step through
it, and :mod:`hetero_nn.training.granularity` asks it whether the steps it predicts
will be replayed.

The rule (:meth:`StepCache.replays`): a step of kind ``what`` (the optimizer's
:meth:`~hetero_nn.optim.Optimizer.replay_key` for a train step, ``"eval"`` for an
eval step, ``"predict"`` for a batch of ``Trainer.predict``, whose labels are None;
None: never) is replayed when the trainer's ``replay`` is on and every
layer of the model is ``replayable``. Its *step key* (:meth:`StepCache.key`) is the
batch shape, dtype, granularity, ``what``, every layer's train/eval mode and
:meth:`~hetero_nn.layers.base.Layer.settings` (the current values of its constructor's
arguments: ``Dropout.p``, a LeakyReLU's slope, the model's ``fuse``...), the loss's
settings (:func:`~hetero_nn.layers.base.settings_signature`: its reduction, label
smoothing), the gradient clipping norm, the model's ``granularities``, and the spike
rates its spike-fed Dense layers choose their variants at
(:func:`~hetero_nn.layers.events.rate_key`; the model's part is
:func:`~hetero_nn.layers.forward_graphs.model_form`, which ``model(x)``'s graphs are
keyed by too). So any change to one of them after a step
captures a new graph for the next step, and a new
layer takes part without key code of its own; what the optimizer's schedule changes
(lr, momentum, betas) is a step input instead, written before every replay.

The first step of each key is captured with
:meth:`Runtime.capture <hetero_nn.scheduler.runtime.Runtime.capture>` into a graph
that owns copies of the batch; later steps of that key copy the new batch into those
buffers and replay the graph (no task built, no dependency inferred), bit for bit the
same as submitting. What changes every step lives in the data of small *step inputs*
that the captured tasks read: the optimizer's hyper handle (lr, momentum or betas,
step count: so Adam, AdamW and schedules stepped per step replay), a Dropout's mask
key, a BatchNorm2D's momentum. Each object that registered one while the step was
captured (``step_inputs``: one per registration, several where a step runs a forward
or an update more than once, as ``pipeline_schedule="pipedream"`` does per
micro-batch) is asked before every replay for the next values of each in turn
(``replayed()``, which also counts on the host as a submission would), written into
the captured handle.

Memory: a captured graph owns its activations, REDUX partials and a copy of the
batch. The cache keeps graphs up to ``max_bytes`` of those in all (default
:data:`MAX_BYTES`), dropping the least recently run first; the graph just run is
always kept, so a step larger than the budget still replays. Counted in bytes, not
graphs, so a long run that meets many keys (an odd last batch, eval, a changed
setting) holds a bounded amount whatever its model.

State: ``_steps``, step key -> :class:`CapturedStep`, least recently run first;
``nbytes``, what they own in all; ``captured``, the graphs captured since the trainer
was made. Rebinding the model (a new runtime, a rebuilt model) clears it: the graphs
hold the handles of the previous binding.
"""

from __future__ import annotations

import numpy as np

from ..layers.base import settings_signature
from ..layers.forward_graphs import capture, model_form, replay, replayable

__all__ = ["MAX_BYTES", "CapturedStep", "StepCache"]

MAX_BYTES = 256 << 20  # bytes of captured graphs kept (least recently run dropped first)


class CapturedStep:
    """A captured step: its graph, the batch handles it reads, its result handles,
    and its step inputs: ``(owner, handle)`` pairs whose data ``owner.replayed()`` gives."""

    __slots__ = ("graph", "x", "y", "results", "inputs")

    def __init__(self, graph, x, y, results, inputs):
        self.graph, self.x, self.y, self.results, self.inputs = graph, x, y, results, inputs

    @property
    def nbytes(self) -> int:
        """What this step holds alone: its graph's temporaries and its batch copies."""
        return self.graph.nbytes + self.x.nbytes + (0 if self.y is None else self.y.nbytes)


class StepCache:
    """The captured steps of ``trainer`` (a Trainer), by step key (module docstring)."""

    def __init__(self, trainer, max_bytes: int = MAX_BYTES):
        self.trainer = trainer
        self.max_bytes = max_bytes
        self._steps: dict = {}
        self.nbytes = 0
        #: Graphs captured so far (a replay does not count).
        self.captured = 0

    def replays(self, what) -> bool:
        """Whether steps of kind ``what`` are captured and replayed: THE replay rule."""
        t = self.trainer
        return t.replay and what is not None and replayable(t.model)

    def key(self, x, y, what):
        """The step key of ``(x, y)`` for a step of kind ``what``, or None when the step
        must be submitted; it computes the key and nothing else (the trainer resolved the
        granularity and built the model first: :meth:`Trainer.ready
        <hetero_nn.training.trainer.Trainer.ready>`)."""
        t = self.trainer
        if not self.replays(what):
            return None
        return (x.shape, np.shape(y), t.dtype, t.granularity, what, model_form(t.model),
                settings_signature(t.loss), t.clip_grad_norm)

    def run(self, key, x, y, submit):
        """Run the graph of ``key`` on ``(x, y)``: replay it with the batch copied in, or,
        the first time, capture ``submit(xs, ys)`` on the graph's own copies of the batch.
        Returns ``submit``'s result handles."""
        step = self._steps.pop(key, None)
        if step is not None:
            self._steps[key] = step  # now the most recently run
            writes = [(step.x, x)] if step.y is None else [(step.x, x), (step.y, y)]
            replay(step.graph, writes, step.inputs)
            return step.results
        t = self.trainer
        rt = t.runtime
        xh = rt.register(np.array(x, dtype=t.dtype), name="x")  # copies: the loader reuses x
        yh = None if y is None else rt.register(t.labels(xh, y).copy(), name="y")
        graph, results, inputs = capture(
            rt, [t.optimizer, *t.model.modules()],
            lambda: submit(t.split(xh), None if yh is None else t.split(yh)))
        step = self._steps[key] = CapturedStep(graph, xh, yh, results, inputs)
        self.nbytes += step.nbytes
        while self.nbytes > self.max_bytes and len(self._steps) > 1:
            self.nbytes -= self._steps.pop(next(iter(self._steps))).nbytes
        self.captured += 1
        return results

    @property
    def graphs(self) -> dict:
        """The captured graphs kept, by step key (a copy of the mapping)."""
        return {key: step.graph for key, step in self._steps.items()}

    def clear(self) -> None:
        """Drop every captured graph (they hold the handles of the binding they ran on)."""
        self._steps.clear()
        self.nbytes = 0
