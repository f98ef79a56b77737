"""Checkpoint: activation recomputation. A block keeps only its input through the forward
pass and runs its forward again, in the backward pass, just before its own backward.

``Checkpoint(block)`` wraps any layer (a ``Residual``, a ``Sequential``, ...). Its
forward submits the block's forward and *releases* every temporary the block made
there but its output (:meth:`Runtime.release
<hetero_nn.scheduler.runtime.Runtime.release>`): in a step laid out whole (a captured
step, the trainer's default) those bytes serve the next blocks' temporaries once the
block's forward tasks have read them. Its backward submits the block's forward again
on the kept input, then the block's backward, and releases what both made but the
input gradient. Only one block's activations are alive at a time in the backward pass.

The recomputed forward is the same tasks on the same inputs, so the same bits: the
gradients, the weights after the step and every later step are bit-identical to the
block without a Checkpoint. A layer with per-step state reproduces its first forward
while ``recomputing`` is set: a Dropout draws the mask of its step again (it reuses
the key handle of the first forward, which a replay rewrites once per step), a
BatchNorm2D normalises with the batch statistics again but does not update its running
statistics nor count the batch a second time.

The block's parameters, buffers and module paths are the block's own: a model's
``state_dict`` keys and its Dropout paths are the same with or without Checkpoints.
"""

from __future__ import annotations

import contextlib

from .base import Layer, temporarily
from .residual import Residual


@contextlib.contextmanager
def recomputing(block):
    """Mark every layer of ``block`` as recomputing its forward for the block's duration."""
    layers = block.modules()  # nested Checkpoints mark them too: their values come back
    with temporarily(layers, "recomputing", [True] * len(layers)):
        yield


def _release_made(rt, made, keep):
    """Release the temporaries in ``made`` but those ``keep`` (handles) belong to."""
    kept = {h.root for h in keep or ()}
    for h in made:
        if h.root not in kept:
            rt.release(h)


class Checkpoint(Layer):
    """Recompute ``block``'s activations in the backward pass instead of keeping them.

    >>> from hetero_nn.layers import Conv2D, ReLU, Residual
    >>> layer = Checkpoint(Residual([Conv2D(4, 4, 3, padding=1), ReLU()]))
    >>> [name for name, _ in layer.named_parameters()]
    ['body.0.weight', 'body.0.bias']
    """

    def __init__(self, block):
        super().__init__()
        if not isinstance(block, Layer):
            raise TypeError(f"Checkpoint: block must be a Layer, got {type(block).__name__}")
        self.block = block
        self._xs = None

    # ------------------------------------------------------------ the block's own state
    def named_parameters(self):
        return self.block.named_parameters()

    def parameters(self):
        return self.block.parameters()

    def named_buffers(self):
        return self.block.named_buffers()

    def named_state(self):
        return self.block.named_state()

    def named_children(self):
        return [("block", self.block)]

    def named_modules(self, prefix=""):
        """This layer, then the block and its layers at the paths they have without it."""
        yield prefix, self
        yield from self.block.named_modules(prefix)

    def reset_parameters(self, rng=None):
        self.block.reset_parameters(rng)

    def bind(self, rt):
        self.block.bind(rt)

    def zero_grad(self, rt):
        self.block.zero_grad(rt)

    def build(self, input_shape, dtype):
        self.output_shape = self.block.build(input_shape, dtype)
        self.input_shape, self.dtype = self.block.input_shape, self.block.dtype
        return self.output_shape

    # ------------------------------------------------------------ tasks
    def forward(self, rt, xs):
        with rt.collect_temporaries() as made:
            ys = self.block.forward(rt, xs)
        self._xs = xs
        _release_made(rt, made, [*ys, *xs])
        return ys

    def backward(self, rt, dys, need_input_grad=True):
        with rt.collect_temporaries() as made:
            with recomputing(self.block):
                self.block.forward(rt, self._xs)
            dxs = self.block.backward(rt, dys, need_input_grad=need_input_grad)
        _release_made(rt, made, dxs)
        self._xs = None
        return dxs


def checkpoint_blocks(model, kinds=None):
    """Wrap every layer of the Sequential ``model`` that is one of ``kinds`` (default:
    ``Residual``) in a :class:`Checkpoint`, in place; returns ``model`` and the number
    of layers wrapped. The ``state_dict`` keys do not change.

    >>> import hetero_nn as hn
    >>> model = hn.build_model("resnet-small", (3, 16, 16), 10)
    >>> keys = list(model.state_dict())
    >>> _, wrapped = checkpoint_blocks(model)
    >>> wrapped, list(model.state_dict()) == keys
    (3, True)
    """
    if kinds is None:
        kinds = (Residual,)
    wrapped = 0
    for i, layer in enumerate(model.layers):
        if isinstance(layer, tuple(kinds)) and not isinstance(layer, Checkpoint):
            model.layers[i] = Checkpoint(layer)
            wrapped += 1
    return model, wrapped
