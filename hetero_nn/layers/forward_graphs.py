"""Captured forward passes: what ``layer(x)`` replays instead of submitting per call.

Policy
------
``layer(x)`` (:meth:`~hetero_nn.layers.base.Layer.__call__`) runs the forward pass of
a NumPy batch in evaluation mode split into one partition per CPU worker of its runtime
(at least one image each; one partition on a runtime with an accelerator, whose one
worker takes the whole batch), so inference uses every core as a training step does:
each image's outputs are computed alone, in the layers' fixed summation orders, so the
split gives the bits of one partition. In training mode (a layer anywhere in
``train()``) the batch stays one partition: batch statistics summed over two partitions
round differently, and dropout draws its masks per partition, so the call keeps the
bits of the submitted one-partition pass it always gave. (One partition had also been
faster on the 2-core machine while a replay's two threads could land on one core:
:mod:`~hetero_nn.scheduler.engine.cores` binds them now.) Where
every layer of the model is ``replayable``, the first call of a *call key* captures the
forward tasks into a graph (``Runtime.capture``) that owns a copy of the batch; later
calls of that key copy the new batch in and replay the graph: no task built, no
dependency inferred, the same tasks on the same operands, so the same bits as
submitting them. A model with a layer that is not replayable is submitted per call.

The call key is the batch's shape, the layer's dtype and
:func:`model_form` (every layer's train/eval mode and settings, the model's ``fuse``
and ``granularities``, its spike rates): what the trainer's step key holds of the
model (:mod:`hetero_nn.training.step_cache`, which reads the same function). A call
in training mode replays too: what changes per call (a BatchNorm2D's momentum, a
Dropout's mask key) is written into the step inputs its layers registered at capture
(:func:`capture`, :func:`replay`), as a trainer's replayed step does.

Invalidation: a graph holds the handles its tasks read. When the runtime or any
parameter's or buffer's handle is no longer the one captured (the model bound to
another runtime, rebuilt, or its weights re-registered by ``load_state_dict``), every
graph of the layer is dropped before the call; a weight updated in place (a training
step, an optimizer) is read by the next replay as it is.

State (:class:`ForwardGraphs`, a layer's ``_forward_graphs``, made at its first call):
``runtime`` and ``handles``, the binding the graphs were captured on; ``_calls``, call
key -> :class:`CapturedCall`, least recently run first, up to ``max_bytes``
(:data:`MAX_BYTES`) of what they own in all, the graph just run always kept;
``captured``, the graphs captured so far.
"""

from __future__ import annotations

import numpy as np

from .events import rate_key

__all__ = ["MAX_BYTES", "CapturedCall", "ForwardGraphs", "capture", "model_form", "partitions",
           "replay"]

MAX_BYTES = 256 << 20  # bytes of captured forward graphs kept per layer


def model_form(model) -> tuple:
    """What a captured graph of ``model``'s tasks depends on besides data (hashable):
    every layer's mode and :meth:`~hetero_nn.layers.base.Layer.settings`, the model's
    ``fuse`` and ``granularities`` and its spike rates."""
    layers = tuple((layer.training, layer.settings()) for _, layer in model.named_modules())
    return (layers, getattr(model, "fuse", None), getattr(model, "granularities", None),
            rate_key(model))


def replayable(model) -> bool:
    """Whether every layer of ``model`` is ``replayable`` (its tasks the same every run)."""
    return all(layer.replayable for _, layer in model.named_modules())


def capture(rt, owners, submit):
    """``(graph, results, inputs)``: ``submit()`` captured on ``rt``, its result handles,
    and the step inputs ``owners`` (layers, an optimizer) registered meanwhile, as
    ``(owner, handle)`` pairs in registration order."""
    for owner in owners:
        owner.step_inputs = []
    try:
        with rt.capture() as graph:
            results = submit()
        inputs = [(owner, h) for owner in owners for h in owner.step_inputs]
    finally:
        for owner in owners:
            owner.step_inputs = None
    return graph, results, inputs


def replay(graph, writes, inputs) -> None:
    """Replay ``graph`` after copying each ``(handle, array)`` of ``writes`` in and each
    step input's next data (``owner.replayed()``, which advances its per-step state)."""
    for handle, array in writes:
        graph.write(handle, array)
    for owner, handle in inputs:
        graph.write(handle, owner.replayed())
    graph.replay()


class CapturedCall:
    """A captured forward pass: its graph, the batch handle it reads, its output
    partitions and its step inputs."""

    __slots__ = ("graph", "x", "outputs", "inputs")

    def __init__(self, graph, x, outputs, inputs):
        self.graph, self.x, self.outputs, self.inputs = graph, x, outputs, inputs

    @property
    def nbytes(self) -> int:
        return self.graph.nbytes + self.x.nbytes


class ForwardGraphs:
    """The captured forward passes of one layer's calls, by call key (module docstring)."""

    def __init__(self, layer, max_bytes: int = MAX_BYTES):
        self.layer = layer
        self.max_bytes = max_bytes
        self.runtime = None
        self.handles = ()
        self._calls: dict = {}
        self.nbytes = 0
        #: Graphs captured so far (a replay does not count).
        self.captured = 0

    def __len__(self):
        return len(self._calls)

    def clear(self) -> None:
        """Drop every captured graph."""
        self._calls.clear()
        self.nbytes = 0

    def _check_binding(self, rt) -> None:
        """Drop the graphs if the layer is no longer bound as they were captured."""
        handles = tuple(p.handle for _, p in self.layer.named_state())
        if rt is not self.runtime or len(handles) != len(self.handles) or any(
                a is not b for a, b in zip(handles, self.handles)):
            self.clear()
            self.runtime, self.handles = rt, handles

    def run(self, rt, x) -> np.ndarray:
        """The outputs of the batch ``x`` (the layer's dtype, built and bound to ``rt``):
        replayed, captured now, or submitted where the model cannot replay."""
        layer = self.layer
        if not replayable(layer):
            return _gather(rt, layer.forward(rt, [rt.register(x, name="x")]))
        self._check_binding(rt)
        key = (x.shape, x.dtype.str, model_form(layer))
        call = self._calls.pop(key, None)
        if call is None:
            xh = rt.register(x.copy(), name="x")  # the graph's own copy of the batch
            training = any(m.training for _, m in layer.named_modules())
            g = 1 if training else partitions(rt, len(x))
            xs = list(xh.split(0, g)) if g > 1 else [xh]
            graph, outputs, inputs = capture(rt, layer.modules(),
                                             lambda: layer.forward(rt, xs))
            call = CapturedCall(graph, xh, outputs, inputs)
            self.nbytes += call.nbytes
            self.captured += 1
        else:
            replay(call.graph, [(call.x, x)], call.inputs)
        self._calls[key] = call  # now the most recently run
        while self.nbytes > self.max_bytes and len(self._calls) > 1:
            self.nbytes -= self._calls.pop(next(iter(self._calls))).nbytes
        return _gather(rt, call.outputs)


def partitions(rt, n: int) -> int:
    """How many partitions ``layer(x)`` splits a batch of ``n`` into on ``rt``: one per
    CPU worker, at most ``n``; one where the runtime has an accelerator."""
    kinds = [w.device for w in rt.workers]
    if any(k != "cpu" for k in kinds):
        return 1
    return max(1, min(len(kinds), n))


def _gather(rt, outputs) -> np.ndarray:
    return np.concatenate([rt.fetch(y, copy=True) for y in outputs])
