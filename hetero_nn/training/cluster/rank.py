"""A Dask worker's share of a cluster run: the rank that trains on its partitions.

This module owns the worker side of :mod:`hetero_nn.training.cluster`. A
:class:`Rank` is a Dask actor, one per worker process in a run's group, made once
and kept between steps: it holds the model built and bound to a local
:class:`~hetero_nn.scheduler.runtime.Runtime` (the fine-grained tasks run there), a
local :class:`~hetero_nn.training.trainer.Trainer` of the client trainer's class (its step cache captures and
replays the rank's step), the optimizer and its state, the training set, and an
:class:`~hetero_nn.training.cluster.endpoint.Endpoint` over which the client sends commands
and the ranks reduce (:mod:`hetero_nn.training.cluster.exchange`). Weights never travel
after the group forms: every rank applies the same update to the same reduced
gradients.

Policy
------
Commands come in on the client's link and run one at a time on the rank's own
thread, in order; each is answered on that link with its ``id``:

- ``configure``: join group ``gen`` as rank ``rank`` of ``peers`` (endpoint
  addresses, in rank order), with the run's state (weights, buffers, optimizer
  state, dropout counters) when the client sends one;
- ``step``: read the rank's samples (indices into the training set, or arrays),
  apply the augmentation, and run the step on partitions ``starts[rank] ..
  starts[rank + 1] - 1`` of the batch's ``g``: forward with BatchNorm2D statistics
  reduced across the group, loss over the whole batch (``batch=n``), backward,
  gradients reduced in buckets while the backward runs, clipping, the optimizer
  (its hyper-parameters as the client's schedule set them). Answered ``done`` with
  the loss, the correct count, the gradient norm and the step's timings;
- ``state``: the run's state as this rank holds it; ``tune``: choose this rank's
  granularity (``granularity="auto"``); ``abort``: answered once the step in flight
  (made to fail at once) is over, with the last step completed.

Faults. A step that fails (a peer lost, an abort) puts back what it changed before
its reductions completed -- the BatchNorm2D running statistics and the step
counters, kept at its start -- so the rank holds the state after its last
completed step; weights and optimizer buffers change only after every reduction is
in. A rank drops everything (runtime, threads, links) when its client's link
closes (the client process ended or died), when the Dask worker releases the actor
(the client released it or left the scheduler), or on ``close``.

State: ``_RANKS``, run id -> the Rank of that run in this process.
"""

from __future__ import annotations

import functools
import pickle
import queue
import threading
import time

import numpy as np

from ...errors import HeteroNNError
from ...optim import submit_clip_grad_norm
from .messages import load_run_state, run_state
from .exchange import Exchange, GroupBroken
from ...scheduler.runtime import Runtime
from .endpoint import Endpoint, serialized

__all__ = ["Rank", "live_ranks", "drop_run", "place_share", "submit_share"]

_RANKS: dict = {}
_RANKS_LOCK = threading.Lock()
#: Seconds between two looks at whether the Dask worker still holds the actor.
WATCH_EVERY = 2.0
_clock = time.monotonic  # one clock for every process of a machine (timings across them)


def live_ranks() -> list[str]:
    """Run ids with a rank in this process (what a client that left must not leave behind)."""
    with _RANKS_LOCK:
        return sorted(_RANKS)


def drop_run(run_id) -> int:
    """Close the rank of run ``run_id`` in this process, if any; returns how many."""
    with _RANKS_LOCK:
        rank = _RANKS.pop(run_id, None)
    if rank is not None:
        rank.close()
    return int(rank is not None)


class Rank:
    """A worker process's share of run ``run_id`` (see the module docstring).

    Parameters
    ----------
    run_id : str
    spec : bytes
        From :func:`hetero_nn.training.cluster.messages.rank_spec`: the model's architecture (no
        weights), the loss, the optimizer recipe, the runtime's settings, the
        augmentation, the seed, clipping and replay.
    data : Dataset or None
        The training set (a Dask future resolved on this worker), or None when the
        steps send their samples.
    """

    address = ""  # the endpoint's; declared here so the client's actor proxy can read it

    def __init__(self, run_id, spec, data=None):
        # distributed loads with the first cluster (heavy at start-up)
        from distributed import get_worker


        spec = pickle.loads(spec)
        self.run_id = run_id
        self.data = data
        self.augment = spec["augment"]
        self.seed = spec["seed"]
        self.exchange = None
        self.completed = -1
        self.last_result = None
        self.closed = False
        self._worker = get_worker()
        self.runtime = Runtime(**spec["runtime"])
        try:
            model = spec["model"]
            model.build(spec["input_shape"], spec["dtype"])
            self.trainer = spec["trainer"](model, spec["loss"], spec["optimizer"], self.runtime,
                                           batch_size=2 ** 31, granularity=1, dtype=spec["dtype"],
                                           seed=spec["seed"], clip_grad_norm=spec["clip"],
                                           replay=spec["replay"])
            host = self._worker.address.split("://", 1)[-1].rsplit(":", 1)[0]
            self.endpoint = Endpoint(f"rank-{run_id}", host, self._on_message, self._on_closed)
            self.endpoint.name = self.endpoint.address
        except BaseException:
            self.runtime.close()
            raise
        self.address = self.endpoint.address
        self._commands = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"hetero_nn-rank-{run_id}")
        self._thread.start()
        with _RANKS_LOCK:
            old = _RANKS.pop(run_id, None)
            _RANKS[run_id] = self
        if old is not None:
            old.close()
        self.endpoint.loop.call_soon_threadsafe(self._watch)

    # ------------------------------------------------------------ lifetime
    def _watch(self):
        """Close when the Dask worker no longer holds this actor (checked on the loop)."""
        if self.closed:
            return
        actors = getattr(getattr(self._worker, "state", None), "actors", None)
        if actors is not None and self._held_once and not any(a is self for a in actors.values()):
            threading.Thread(target=self.close, daemon=True).start()
            return
        self._held_once = self._held_once or (actors is not None and
                                              any(a is self for a in actors.values()))
        self.endpoint.loop.call_later(WATCH_EVERY, self._watch)

    _held_once = False

    def close(self):
        """Drop the run's state in this process: links, thread, runtime."""
        if self.closed:
            return
        self.closed = True
        with _RANKS_LOCK:
            if _RANKS.get(self.run_id) is self:
                del _RANKS[self.run_id]
        if self.exchange is not None:
            self.exchange.fail("the rank closed")
        self._commands.put(None)
        self.endpoint.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(30.0)
        self.runtime.close()

    # ------------------------------------------------------------ messages (loop thread)
    def _on_message(self, peer, message):
        op = message.get("op")
        if op in ("piece", "reduced"):
            if self.exchange is not None:
                self.exchange.on_message(message)
            return
        if op == "abort" and self.exchange is not None:
            self.exchange.fail("the client aborted the step")
        if op == "close":
            threading.Thread(target=self.close, daemon=True).start()
            return
        self._commands.put(message)

    def _on_closed(self, peer):
        if peer == "client":
            threading.Thread(target=self.close, daemon=True).start()
        elif self.exchange is not None and peer in self.exchange.peers:
            self.exchange.fail(f"cluster: the link to rank {self.exchange.peers.index(peer)} "
                               f"({peer}) closed")

    # ------------------------------------------------------------ the rank's thread
    def _serve(self):
        while True:
            message = self._commands.get()
            if message is None:
                return
            op = message.get("op")
            try:
                reply = getattr(self, f"_{op}")(message)
            except BaseException as exc:  # answered, never fatal to the rank
                cause = exc.__cause__ or exc.__context__
                broken = isinstance(exc, GroupBroken) or isinstance(cause, GroupBroken)
                reply = {"op": "error", "error": f"{type(exc).__name__}: {exc}",
                         "broken": broken, "hetero_nn": isinstance(exc, HeteroNNError)}
            reply["id"] = message.get("id")
            reply.setdefault("op", "ok")
            reply.setdefault("completed", self.completed)
            self.endpoint.post("client", reply)

    def _configure(self, m):
        peers = list(m["peers"])
        for address in peers:
            if address != self.address and address not in self.endpoint.peers():
                self.endpoint.connect(address, address)
        if self.exchange is not None:
            self.exchange.fail("a new group formed")
        self.exchange = Exchange(self.endpoint, m["gen"], m["rank"], peers,
                                 bucket_bytes=m["bucket_bytes"])
        if m.get("fuse") is not None and hasattr(self.trainer.model, "fuse"):
            self.trainer.model.fuse = m["fuse"]
        if m.get("state") is not None:
            load_run_state(self.trainer.model, self.trainer.optimizer, m["state"])
            self.completed = m["state"]["completed"]
        self.trainer.unbind()
        return {"op": "ready"}

    def _state(self, m):
        t = self.trainer
        return {"op": "state", "state": serialized(run_state(t.model, t.optimizer,
                                                               self.completed))}

    def _abort(self, m):
        return {"op": "aborted", "result": self.last_result}

    def _tune(self, m):
        x, y = self._batch(m)
        t = self.trainer
        t.granularity = None
        try:
            t.tune_granularity(x, y, per_layer=False)
        finally:
            t.unbind()
        return {"op": "tuned", "granularity": int(t.granularity),
                "decision": serialized(t.granularity_decision)}

    def _batch(self, m):
        dtype = self.trainer.dtype
        if m.get("indices") is not None:
            indices = np.asarray(m["indices"], dtype=np.int64)
            x, y = self.data.batch(indices, dtype=dtype)
            if self.augment is not None:
                self.augment(x, indices, seed=self.seed, epoch=m["epoch"])
            return x, y
        return np.ascontiguousarray(m["x"], dtype=dtype), np.asarray(m["y"], dtype=np.int64)

    def _step(self, m):
        t_got = _clock()
        ex = self.exchange
        if ex is None or m["gen"] != ex.generation:
            raise GroupBroken(f"cluster: a step of group {m['gen']} sent to a rank of group "
                              f"{None if ex is None else ex.generation}")
        x, y = self._batch(m)
        t_data = _clock()
        t = self.trainer
        starts, n = list(m["starts"]), int(m["n"])
        offset = place_share(t, ex.rank, starts, m["sample_starts"], n)
        _set_hyper(t.optimizer, m["hyper"])
        ex.begin(m["step"])
        saved = self._snapshot()
        submit = functools.partial(submit_share, t, ex, starts, n)
        try:
            opt_key = t.optimizer.replay_key()
            key = t.step_cache.key(t.ready(x, y), y, None if opt_key is None else
                                   ("cluster", opt_key, n, tuple(starts), offset))
            if key is None:
                results = submit(*t.register_batch(x, y))
            else:
                results = t.step_cache.run(key, x, y, submit)
            loss = t._read_step(*results)
        except BaseException:
            self._restore(saved)
            raise
        self.completed = m["step"]
        self.last_result = {"step": m["step"], "loss": loss, "correct": t.last_correct,
                            "norm": t.last_grad_norm}
        t_end = _clock()
        return {"op": "done", "result": self.last_result,
                "times": {"got": t_got, "data": t_data - t_got, "end": t_end,
                          "step": t_end - t_data, "waited": ex.waited}}

    def _snapshot(self):
        """What a step changes before its reductions are in: buffers, step counters."""
        t = self.trainer
        buffers = {name: np.array(b.host(), copy=True) for name, b in t.model.named_buffers()}
        counters = [(layer, layer.steps) for layer in t.model.modules()
                    if isinstance(getattr(layer, "steps", None), int)]
        return buffers, counters, t.optimizer.steps

    def _restore(self, saved):
        buffers, counters, opt_steps = saved
        t = self.trainer
        try:
            t.runtime.wait()
        except Exception:  # the failed step's own error, already raised
            pass
        for layer, steps in counters:
            layer.steps = steps
        t.optimizer.steps = opt_steps
        if buffers:
            t.model.load_state_dict(buffers, strict=False)
        t.unbind()

    def __repr__(self):
        return f"Rank({self.run_id!r}, {self.address!r}, completed={self.completed})"


def _set_hyper(optimizer, hyper):
    """Give the rank's optimizer the client's hyper-parameters of this step."""
    for key, value in hyper.items():
        if key == "betas":
            value = tuple(value)
        if getattr(optimizer, key, None) != value:
            setattr(optimizer, key, value)


def place_share(trainer, rank, starts, sample_starts, n) -> int:
    """Make ``trainer`` run rank ``rank``'s share of a batch of ``n`` samples: its
    partitions ``starts[rank]..starts[rank + 1] - 1`` of those whose sample offsets are
    ``sample_starts``; returns the offset of its first sample in the batch."""
    first = starts[rank]
    trainer.granularity = max(1, starts[rank + 1] - first)
    offset = sample_starts[first]
    for layer in trainer.model.modules():
        layer.batch_span = (offset, n)
    return offset


def submit_share(trainer, exchange, starts, n, xs, ys):
    """Submit a rank's step on its partitions ``xs``, ``ys`` of a batch of ``n`` samples
    (what its step cache captures; the module docstring says what it does)."""
    t, ex = trainer, exchange
    rt, model = t.runtime, t.model
    ex.start_submission(starts)
    model.zero_grad(rt)
    params = [(p, layer.grads_per_partition) for layer in model.modules()
              for p in getattr(layer, "_params", {}).values()]
    named = {id(p): name for name, p in model.named_parameters()}
    fresh = [p.fresh for p, _ in params]
    with rt.combining_with(ex.combine):
        logits = model.forward(rt, xs)
        loss, correct, dlogits = t.loss(rt, logits, ys, batch=n)
        model.backward(rt, dlogits)
    ex.submit_exchange(rt, [(named.get(id(p), "?"), p, per) for p, per in params], fresh,
                   (loss, correct))
    norm_sq = (submit_clip_grad_norm(t.optimizer, t.clip_grad_norm)
               if t.clip_grad_norm is not None else None)
    t.optimizer.step(rt)
    return loss, correct, norm_sq
