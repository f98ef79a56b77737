"""A pipeline stage in a Dask worker process: its share of each step, and the activations
and gradients it exchanges point to point with the stages beside it.

This module owns the worker side of pipelines across Dask workers
(:mod:`hetero_nn.training.pipeline.stage_cluster` is the client's): :class:`StageRank`, the
:class:`~hetero_nn.training.cluster.rank.Rank` of a pipelined run, holds the whole model (built,
with the run's state) but runs only the blocks ``[first, end)`` of its stage, on its own
runtime; :class:`StageLink` carries its micro-batches' activations to the next stage's
rank and their input gradients back to the previous one, over the endpoints' TCP links
(:mod:`hetero_nn.training.cluster.endpoint`), never through the client or Dask's scheduler.

Policy
------
A step on stage ``s`` of ``P`` is one task graph (captured once per step key and
replayed, as a local trainer's), submitted in this order: zero the gradients of the
stage's layers; on ``s > 0`` one ``stage_recv`` task per micro-batch ``k`` (partition
``k`` of the batch) that waits for its activation and writes it into the stage's input;
the stage's blocks' forward; on the last stage the loss, else one ``stage_send`` task per
micro-batch that posts the output to stage ``s + 1``; then, where stage ``s + 1`` passes
gradients back, a ``stage_recv`` per micro-batch of the output's gradient; the blocks'
backward; on ``s > 0`` a ``stage_send`` of each micro-batch's input gradient; the
optimizer over the stage's own parameters. The blocks' tasks are the ones one process
submits, on all ``g`` partitions, so every REDUX tree (gradients, a batch norm's
statistics) is one process's: the weights are bit-identical to the same run without a
pipeline at the same granularity.

The schedule is the order of each stage's operations (``F k``: receive, forward, send
of micro-batch ``k``; ``B k``: the same backwards), added as dependencies between
consecutive operations exactly as in one process
(:func:`~hetero_nn.training.pipeline.stages.schedule_order`): a ``stage_recv`` blocks a worker
thread, so a stage whose order is not added (a batch norm couples its micro-batches:
``dataflow``; a streamed step) receives no gradient before every activation is sent --
GPipe's order at the links, with which no two stages can wait on each other.

``"pipedream"`` (:func:`submit_pipedream_stage`) submits micro-batch by micro-batch as
one process does (:mod:`~hetero_nn.training.pipeline.pipedream`), with the versions of the
stage's weights that process's :class:`~hetero_nn.training.pipeline.pipedream.WeightStash` keeps:
``F k`` receives activation ``k``, runs the forward with version ``max(0, k - (P - 1 -
s))``, sends (the loss's share on the last stage); ``B k`` receives gradient ``k``, runs
the backward with the same version, sends the input gradient, then applies the stage's
update for ``k`` and stashes the new version where a later micro-batch reads it. A
captured step adds 1F1B's order (pipedream's data allows it); a streamed one makes each
receive wait for the stage's send before it, which keeps the links from waiting in a
circle. The weights equal the in-process run's at the same cut and granularity.

Sends copy the micro-batch and return at once (the endpoint's writer sends it); a
message carries the group's generation and the step, and a receive waits for its own.
A step that fails on a stage tells the stages beside it, whose waits then fail too, so
the whole step fails in bounded time; a link to a neighbour that closes (its process
died) fails the step the same way (:class:`~hetero_nn.training.cluster.exchange.GroupBroken`).

*Busy time*, for the bubble: after each step, the trace records of the stage's forward
and backward tasks (not the sends or receives: a receive is waiting) on
``time.monotonic``, the clock every process of a machine shares.

State
-----
:class:`StageRank`: ``link`` (this group's :class:`StageLink`), ``ops`` (per operation
of the captured step, its tasks: ``(F, B)``, each ``g`` lists), ``_blank`` (the batch a
stage after the first binds into its graph: zeros, never read). :class:`StageLink`:
``step``, ``_inbox`` ``(step, what, k) -> array``, ``broken`` (a neighbour lost: every
later wait fails), ``failed`` (``step -> why``: that step only), ``waited``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import numpy as np
import types

from ...codelets.codelet import Codelet, R, W
from ..cluster.endpoint import serialized
from ..cluster.exchange import GroupBroken
from .pipedream import WeightStash, stage_parameters, zero_stage_grads
from .passes import submit_backward, submit_forward
from .stages import _chain, _operations, balanced_cut, block_costs, schedule_order
from ..cluster.rank import Rank, _clock, _set_hyper

__all__ = ["StageRank", "StageLink", "StageAssignment", "StagePlan", "submit_stage",
           "submit_pipedream_stage"]

#: Seconds a stage waits for a neighbour's micro-batch before giving the step up.
WAIT_LIMIT = 600.0
_COMMS = ("stage_send", "stage_recv")


class StageLink:
    """A stage rank's messages to and from the stages beside it (module docstring)."""

    def __init__(self, endpoint, generation, stage, peers):
        self.endpoint = endpoint
        self.generation = generation
        self.stage = stage
        self.peers = list(peers)
        self.prev = self.peers[stage - 1] if stage > 0 else None
        self.next = self.peers[stage + 1] if stage + 1 < len(self.peers) else None
        self.step = 0
        self.broken = None
        self.failed: dict = {}
        self.waited = 0.0
        self._inbox: dict = {}
        self._cond = threading.Condition()

    def begin(self, step):
        """Start step ``step``: drop what earlier steps left."""
        with self._cond:
            self.step, self.waited = step, 0.0
            self._inbox = {key: v for key, v in self._inbox.items() if key[0] >= step}
            self.failed = {s: why for s, why in self.failed.items() if s >= step}

    def fail(self, why, step=None):
        """Fail step ``step`` (None: every step from now on, the group is broken)."""
        with self._cond:
            if step is None:
                self.broken = self.broken or why
            else:
                self.failed.setdefault(step, why)
            self._cond.notify_all()

    def tell_failure(self, why):
        """Tell the neighbours that this stage failed the current step."""
        for peer in (self.prev, self.next):
            if peer is not None:
                self.endpoint.post(peer, {"op": "stage", "what": "failed", "k": self.stage,
                                          "gen": self.generation, "step": self.step,
                                          "value": why})

    def send(self, what, k, array):
        """Post micro-batch ``k``'s ``what`` ("act": to the next stage; "grad": to the
        previous one), a copy: the buffer serves the rest of the step."""
        self.endpoint.post(self.next if what == "act" else self.prev, {
            "op": "stage", "what": what, "k": k, "gen": self.generation, "step": self.step,
            "value": serialized(np.array(array, copy=True))})

    def deliver(self, message):
        """A neighbour's message (on the endpoint's loop thread)."""
        if message.get("gen") != self.generation:
            return
        if message["what"] == "failed":
            self.fail(f"pipeline stage {message['k']} failed step {message['step']}: "
                      f"{message['value']}", message["step"])
            return
        with self._cond:
            self._inbox[(message["step"], message["what"], message["k"])] = message["value"]
            self._cond.notify_all()

    def take(self, what, k) -> np.ndarray:
        """Micro-batch ``k``'s ``what`` of this step (blocks until it is in)."""
        key = (self.step, what, k)
        t0 = time.perf_counter()
        with self._cond:
            while key not in self._inbox:
                why = self.broken or self.failed.get(self.step)
                if why is not None:
                    raise GroupBroken(why)
                if time.perf_counter() - t0 > WAIT_LIMIT:
                    raise GroupBroken(f"pipeline stage {self.stage}: no {what} of micro-batch "
                                      f"{k} in step {self.step} for {WAIT_LIMIT:.0f} s")
                self._cond.wait(0.5)
            value = self._inbox.pop(key)
        self.waited += time.perf_counter() - t0
        return value


def _send_variant(x, *, link, what, k):
    link.send(what, k, x)


def _recv_variant(out, *, link, what, k):
    # a view layer (Flatten) passes its input's handle on: a stage ending in one sends
    # the unflattened batch, the next stage's buffer has the flat shape (and back)
    out[...] = link.take(what, k).reshape(out.shape)


STAGE_SEND = Codelet("stage_send", modes=(R,), variants={"ref": _send_variant})
STAGE_RECV = Codelet("stage_recv", modes=(W,), variants={"ref": _recv_variant})


class StageAssignment:
    """What a stage rank is assigned of the run's pipeline for a step (from the client's
    message): its index, every stage's blocks ``(first, end)``, the schedule and whether
    its order is added (not ``dataflow``). (Formerly ``StagePlan``: a *plan* is a
    partition plan, see docs/architecture.md's glossary.)"""

    def __init__(self, stage, bounds, schedule, dataflow):
        self.stage = stage
        self.bounds = [tuple(b) for b in bounds]
        self.count = len(self.bounds)
        self.schedule = schedule
        self.dataflow = bool(dataflow)
        self.first, self.last = stage == 0, stage == self.count - 1

    def key(self):
        return (self.stage, tuple(self.bounds), self.schedule, self.dataflow)



StagePlan = StageAssignment  # the former name, kept for code that imported it

def _layer_range(model, a, b):
    """The model's layers ``[lo, hi)`` that blocks ``[a, b)`` of its plan run."""
    firsts = [i for i, _ in model._plan()]
    return firsts[a], firsts[b] if b < len(firsts) else len(model.layers)


def _receive(rt, link, what, shape, dtype, g, after=()):
    """A buffer of ``shape`` written by one ``stage_recv`` per micro-batch: its partitions."""
    parts = _inbox_buffer(rt, what, shape, dtype, g)
    for k, part in enumerate(parts):
        rt.submit(STAGE_RECV, part, after=after, link=link, what=what, k=k)
    return parts


def _inbox_buffer(rt, what, shape, dtype, g):
    """The partitions of a buffer of ``shape`` that the ``stage_recv`` tasks write."""
    h = rt.register(np.zeros(shape, dtype), name=f"stage.{what}")
    return list(h.split(0, g)) if g > 1 else [h]


def submit_stage(trainer, link, plan, xs, ys):
    """Submit stage ``plan.stage``'s share of a step on the partitions ``xs`` (the batch:
    read by the first stage only) and ``ys`` (the labels: the last stage's); returns
    ``(loss, correct, ops)`` (None, None on a stage before the last)."""
    if plan.schedule == "pipedream":
        return submit_pipedream_stage(trainer, link, plan, xs, ys)
    rt, model = trainer.runtime, trainer.model
    blocks = [b for _, b in model._plan()]
    a, b = plan.bounds[plan.stage]
    lo, hi = _layer_range(model, a, b)
    needs = [model.needs_input_grad(i) for i, _ in model._plan()]
    for layer in model.layers[lo:hi]:
        layer.zero_grad(rt)
    g, n, dtype = len(ys), ys[0].root.shape[0], trainer.dtype
    ordered = not rt.streaming and not plan.dataflow
    loss = correct = None
    with rt.keeping_temporaries() if ordered else contextlib.nullcontext():
        with rt.placing(rt.workers) as forward:
            if not plan.first:
                xs = _receive(rt, link, "act", (n, *model.layers[lo].input_shape), dtype, g)
            outputs = {}
            xs = submit_forward(rt, blocks, a, b, xs, outputs)
            if plan.last:
                loss, correct, dys = trainer.loss(rt, xs, ys)
            else:
                sends = [rt.submit(STAGE_SEND, x, link=link, what="act", k=k)
                         for k, x in enumerate(xs)]
        with rt.placing(rt.workers) as backward:
            if not plan.last:
                dys = None
                if needs[b]:  # the next stage passes input gradients back
                    dys = _receive(rt, link, "grad", (n, *xs[0].shape[1:]), dtype, g,
                                   after=() if ordered else sends)
            kept = {outputs[b - 1]} | ({dys[0].root} if dys else set())
            dys = submit_backward(rt, blocks, needs, a, b, dys, outputs, kept)
            if not plan.first and dys is not None:
                for k, dx in enumerate(dys):
                    rt.submit(STAGE_SEND, dx, link=link, what="grad", k=k)
    ops = _operations(forward, backward, g)
    if ordered:
        _chain(rt, schedule_order(plan.schedule, plan.stage, plan.count, *ops))
    trainer.optimizer.step(rt)
    return loss, correct, ops


def submit_pipedream_stage(trainer, link, plan, xs, ys):
    """Submit stage ``plan.stage``'s share of a ``"pipedream"`` step (module docstring;
    the versions are :class:`~hetero_nn.training.pipeline.pipedream.WeightStash`'s, as in one
    process); returns ``(loss, correct, ops)`` as :func:`submit_stage`."""
    rt, model = trainer.runtime, trainer.model
    blocks = [b for _, b in model._plan()]
    a, b = plan.bounds[plan.stage]
    lo, _ = _layer_range(model, a, b)
    needs = [model.needs_input_grad(i) for i, _ in model._plan()]
    g, n, dtype = len(ys), ys[0].root.shape[0], trainer.dtype
    ordered = not rt.streaming
    stash = WeightStash(rt, stage_parameters(blocks[a:b]), plan.stage, plan.count, g,
                        rt.workers)
    acts = grads = None
    if not plan.first:
        acts = _inbox_buffer(rt, "act", (n, *model.layers[lo].input_shape), dtype, g)
    fops, bops, sent = [], [], ()
    loss = correct = None
    with rt.keeping_temporaries():
        first = stash.keep(0)
        for k in range(g):  # unordered, each receive waits for the send before it
            with stash.weights(k), rt.placing(rt.workers) as forward:
                x = [xs[k]]
                if acts is not None:
                    x = [acts[k]]
                    rt.submit(STAGE_RECV, x[0], after=() if ordered else sent, link=link,
                              what="act", k=k)
                outputs = {}
                x = submit_forward(rt, blocks, a, b, x, outputs)
                if plan.last:
                    loss, correct, dys = trainer.loss(rt, x, [ys[k]], batch=n,
                                                      accumulate=k > 0)
                else:
                    sent = [rt.submit(STAGE_SEND, x[0], link=link, what="act", k=k)]
                    if k == 0 and needs[b]:  # the next stage passes input gradients back
                        grads = _inbox_buffer(rt, "grad", (n, *x[0].shape[1:]), dtype, g)
            fops.append(first + forward if k == 0 else forward)
            with rt.placing(rt.workers) as backward:
                with stash.weights(k):
                    if not plan.last:
                        dys = None if grads is None else [grads[k]]
                        if dys is not None:
                            rt.submit(STAGE_RECV, dys[0], after=() if ordered else sent,
                                      link=link, what="grad", k=k)
                    kept = {outputs[b - 1]} | ({dys[0].root} if dys else set())
                    zero_stage_grads(rt, blocks[a:b])
                    dys = submit_backward(rt, blocks, needs, a, b, dys, outputs, kept)
                    if not plan.first and dys is not None:
                        sent = [rt.submit(STAGE_SEND, dys[0], link=link, what="grad", k=k)]
                trainer.optimizer.step(rt)  # the live weights
                stash.keep(k + 1)
            bops.append(backward)
    if ordered:
        _chain(rt, schedule_order(plan.schedule, plan.stage, plan.count, fops, bops))
    return loss, correct, (fops, bops)


class StageRank(Rank):
    """The rank of one pipeline stage in a worker process (module docstring); the client
    sends it ``configure``, ``cut``, ``step``, ``state``, ``abort`` as to a
    :class:`~hetero_nn.training.cluster.rank.Rank`."""

    link = None
    ops = ()
    _blank = None

    def __init__(self, run_id, spec, data=None):
        super().__init__(run_id, spec, data)
        self.runtime.tracing = True  # the bubble is read from the trace

    # ------------------------------------------------------------ messages (loop thread)
    def _on_message(self, peer, message):
        op = message.get("op")
        if op == "stage":
            if self.link is not None:
                self.link.deliver(message)
            return
        if op == "abort" and self.link is not None:
            self.link.fail("the client aborted the step", self.link.step)
        super()._on_message(peer, message)

    def _on_closed(self, peer):
        link = self.link
        if link is not None and peer in (link.prev, link.next):
            link.fail(f"pipeline stage {link.stage}: the link to the stage beside it "
                      f"({peer}) closed")
        super()._on_closed(peer)

    # ------------------------------------------------------------ commands (rank thread)
    def _configure(self, m):
        reply = super()._configure(m)
        if self.link is not None:
            self.link.fail("a new group formed")
        self.link = StageLink(self.endpoint, m["gen"], m["rank"], m["peers"])
        return reply

    def _cut(self, m):
        """Balance ``count`` stages from this worker's performance models on the batch of
        ``m`` (:func:`~hetero_nn.training.pipeline.stages.block_costs`; the state is put back)."""

        t = self.trainer
        x, y = self._batch(m)
        t.granularity = int(m["g"])
        plan = t.model._plan()
        holder = types.SimpleNamespace(blocks=[blk for _, blk in plan],
                                       needs=[t.model.needs_input_grad(i) for i, _ in plan])
        kind = self.runtime.workers[0].kind
        count = int(m["count"])
        try:
            costs = block_costs(t, holder, x, y, [kind] * count)
        finally:
            t.unbind()
            self.runtime.trace(clear=True)
        bounds, _ = balanced_cut(costs, count)
        return {"op": "cut", "bounds": bounds,
                "predicted": [sum(costs[s][a:b]) for s, (a, b) in enumerate(bounds)]}

    def _stage_batch(self, m, plan):
        """``(x, y)`` of the step's graph: the samples on the first stage (augmented),
        the labels on the last; a blank batch and zero labels elsewhere."""
        t, n = self.trainer, int(m["n"])
        if m.get("indices") is not None and plan.first:
            x, y = self._batch(m)  # augmented
        elif m.get("indices") is not None:
            x, y = self.data.batch(np.asarray(m["indices"], dtype=np.int64), dtype=t.dtype)
        else:
            x = None if m.get("x") is None else np.ascontiguousarray(m["x"], dtype=t.dtype)
            y = None if m.get("y") is None else np.asarray(m["y"], dtype=np.int64)
        if not plan.first:
            shape = (n, *t.model.input_shape)
            if self._blank is None or self._blank.shape != shape or self._blank.dtype != t.dtype:
                self._blank = np.zeros(shape, t.dtype)
            x = self._blank
        if not plan.last:
            y = np.zeros(n, np.int64)
        return x, y

    def _step(self, m):
        link = self.link
        if link is None or m["gen"] != link.generation:
            raise GroupBroken(f"cluster: a step of group {m['gen']} sent to a stage of group "
                              f"{None if link is None else link.generation}")
        link.begin(m["step"])
        try:
            return self._run_stage(m, link)
        except BaseException as exc:  # the stages beside this one stop waiting for it
            link.tell_failure(f"{type(exc).__name__}: {exc}")
            raise

    def _run_stage(self, m, link):
        t_got = _clock()
        plan = StageAssignment(link.stage, m["bounds"], m["schedule"], m["dataflow"])
        x, y = self._stage_batch(m, plan)
        t_data = _clock()
        t, rt = self.trainer, self.runtime
        t.granularity = int(m["g"])
        self._own_parameters(t, x, plan)
        _set_hyper(t.optimizer, m["hyper"])
        saved = self._snapshot()
        submit = functools.partial(submit_stage, t, link, plan)
        try:
            opt_key = t.optimizer.replay_key()
            key = t.step_cache.key(t.ready(x, y), y, None if opt_key is None else
                                   ("stage", opt_key, plan.key()))
            if key is None:
                loss, correct, self.ops = submit(*t.register_batch(x, y))
            else:
                loss, correct, self.ops = t.step_cache.run(key, x, y, submit)
            result = None
            if plan.last:
                result = {"step": m["step"], "loss": t._read_step(loss, correct, None),
                          "correct": t.last_correct, "norm": None}
            rt.wait()
        except BaseException:
            self._restore(saved)
            raise
        self.completed = m["step"]
        self.last_result = result
        t_end = _clock()
        return {"op": "done", "result": result, "busy": self._busy(),
                "times": {"got": t_got, "data": t_data - t_got, "end": t_end,
                          "step": t_end - t_data, "waited": link.waited}}

    def _own_parameters(self, t, x, plan):
        """Bind the model (as the step cache would) and the optimizer to the stage's own
        parameters: each stage updates only its own."""
        t.prepare(np.empty((0, *x.shape[1:]), t.dtype))
        lo, hi = _layer_range(t.model, *plan.bounds[plan.stage])
        mine = {id(p) for layer in t.model.layers[lo:hi] for m in layer.modules()
                for p in m.parameters()}
        named = [(name, p) for name, p in t.model.named_parameters() if id(p) in mine]
        opt = t.optimizer
        if [name for name, _ in opt.params] != [name for name, _ in named]:
            opt.bind(named, self.runtime)

    def _busy(self) -> dict | None:
        """The seconds the stage's forward and backward tasks of the last step ran (in all,
        and per operation ``(F, B)`` over the stage's workers), and the first start and
        last end, on ``time.monotonic`` (module docstring)."""
        offset = time.monotonic() - time.perf_counter()
        by_id = {r.task_id: r for r in self.runtime.trace(clear=True)}
        ops = [[[by_id[task.id] for task in op
                 if task.codelet.name not in _COMMS and task.id in by_id] for op in kind]
               for kind in self.ops]
        records = [r for kind in ops for op in kind for r in op]
        if not records:
            return None
        workers = len(self.runtime.workers)
        return {"seconds": sum(r.end - r.start for r in records),
                "first": min(r.start for r in records) + offset,
                "last": max(r.end for r in records) + offset, "workers": workers,
                "ops": [[sum(r.end - r.start for r in op) / workers for op in kind]
                        for kind in ops]}
