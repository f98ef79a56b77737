"""What travels between a cluster run's client and its ranks, and how the client asks.

This module owns the pieces :mod:`hetero_nn.training.cluster` sends and reads:

- the deal of a batch: :func:`partition_starts` (``numpy.array_split``'s offsets) and
  :func:`blocks` (contiguous runs of partitions, one per rank);
- :func:`rank_spec`: the bytes a rank is made from -- the model's architecture with
  its arrays left out (the weights come with the group's state), the loss, the
  optimizer's recipe, the worker runtime's settings, the augmentation;
- :class:`ClientLinks`: the client's :class:`~hetero_nn.training.cluster.endpoint.Endpoint`
  and its requests: :meth:`ClientLinks.ask` sends one message per rank and waits for
  every answer, raising :class:`RankLost` as soon as a rank's link closes or its
  worker leaves the scheduler;
- :func:`run_state` / :func:`load_run_state`: the run's state as it travels between
  the client and the ranks (weights and buffers, optimizer state, dropout counters);
- :func:`scatter`: the training set onto one worker, bounded in time;
- :func:`step_terms`: a step's time split into what the client, the links and the
  ranks spent, from the ranks' timestamps (``time.monotonic``: one clock for the
  processes of one machine).
"""

from __future__ import annotations

import io
import itertools
import threading
import time

import numpy as np
import asyncio
import cloudpickle

from ...arena.handle import Handle
from ...errors import HeteroNNError
from ...layers.base import Parameter
from ...scheduler.runtime import Runtime
from ...layers.dropout import dropout_state
from ...layers.dropout import load_dropout_state
from .endpoint import Endpoint, serialized

__all__ = ["partition_starts", "blocks", "DatasetBatch", "rank_spec", "run_state",
           "load_run_state", "scatter", "ClientLinks", "RankLost", "step_terms"]

#: Seconds an answer may take before its rank counts as lost (a step of a large model
#: on a slow worker stays well below).
ANSWER_LIMIT = 900.0


def partition_starts(n: int, g: int) -> list[int]:
    """Sample offsets of the ``g`` partitions of ``n`` samples, and ``n`` (array_split sizes)."""
    q, r = divmod(n, g)
    return [i * q + min(i, r) for i in range(g + 1)]


def blocks(g: int, workers: int) -> list[tuple[int, int]]:
    """``(first partition, partitions)`` of each block: ``min(workers, g)`` contiguous runs
    of ``g`` partitions, as even as ``numpy.array_split`` makes them."""
    starts = partition_starts(g, max(1, min(workers, g)))
    return [(a, b - a) for a, b in zip(starts, starts[1:])]


class DatasetBatch:
    """A batch named by its sample indices into a dataset the workers hold."""

    __slots__ = ("data", "indices")

    def __init__(self, data, indices):
        self.data, self.indices = data, indices

    def __len__(self):
        return len(self.indices)


# ---------------------------------------------------------------------------------------
# The spec a rank is made from
# ---------------------------------------------------------------------------------------

def _placeholder(cls, name, shape, dtype):
    return cls(name, np.zeros(shape, dtype))


def _orphan(shape, dtype, name):
    return Handle(shape, dtype, name)


def _nothing():
    return None


def rank_spec(trainer, worker_devices) -> bytes:
    """The bytes a :class:`~hetero_nn.training.cluster.rank.Rank` unpickles once.

    Parameters and buffers travel as zeros of their shape (the group's state brings
    their values), every runtime handle the model or the loss still refers to as a
    handle of no runtime, a runtime as None; the optimizer as a fresh one of its
    class with its hyper-parameters.
    """

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, Parameter):
                return _placeholder, (type(obj), obj.name, obj.data.shape, obj.data.dtype.str)
            if isinstance(obj, Handle):
                return _orphan, (obj.shape, obj.dtype.str, obj.name)
            if isinstance(obj, Runtime):
                return _nothing, ()
            return super().reducer_override(obj)

    rt, opt, model = trainer.runtime, trainer.optimizer, trainer.model
    hyper = {k: tuple(v) if k == "betas" else v for k, v in opt.hyper().items()}
    runtime = {"devices": worker_devices, "policy": rt.policy_name,
               "deterministic": rt.deterministic, "variants": dict(rt.preferred) or None,
               "perfmodel": None if rt.perfmodel is not None else False, "trace": False}
    buf = io.BytesIO()
    _Pickler(buf).dump({"model": model, "loss": trainer.loss, "optimizer": type(opt)(**hyper),
                        "runtime": runtime, "input_shape": tuple(model.input_shape),
                        "dtype": np.dtype(trainer.dtype).name, "augment": trainer.augment,
                        "seed": trainer.seed, "clip": trainer.clip_grad_norm,
                        "replay": trainer.replay, "trainer": type(trainer)})
    return buf.getvalue()


def run_state(model, optimizer, completed) -> dict:
    """The run's state (copies): weights and buffers, optimizer state, dropout counters,
    and ``completed``, the last step it includes."""

    return {"model": {k: np.array(v, copy=True) for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "dropout": dropout_state(model),
            "completed": completed}


def load_run_state(model, optimizer, state) -> None:
    """Load a :func:`run_state` into ``model`` and ``optimizer`` (rebinding their arrays)."""

    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    load_dropout_state(model, state["dropout"])


def scatter(client, value, grace):
    """``value`` on one worker now: its future, or None when no worker took it within
    ``grace`` seconds or one died receiving it.

    Not a broadcast (the ranks fetch it where they need it): replicating to every
    listed worker kept a worker SIGKILLed mid-transfer listed, and the scheduler
    retried its address 30 s per try. The whole scatter is bounded, not only its
    wait for workers."""

    try:
        [future] = client.sync(asyncio.wait_for,
                               client._scatter([value], broadcast=False, hash=False,
                                               timeout=grace), 2 * grace)
    except (TimeoutError, asyncio.TimeoutError, OSError):
        return None
    return future


# ---------------------------------------------------------------------------------------
# The client's links
# ---------------------------------------------------------------------------------------

class RankLost(HeteroNNError, RuntimeError):
    """Ranks (endpoint addresses in ``addresses``) that cannot answer: link closed,
    worker gone, or an answer that says a peer was lost."""

    def __init__(self, why, addresses=()):
        super().__init__(why)
        self.addresses = set(addresses)


class ClientLinks:
    """The client's endpoint, its links to the ranks (named by their addresses), and the
    requests it makes of them."""

    def __init__(self, run_id):

        self._cond = threading.Condition()
        self._replies: dict = {}
        self._pending: set = set()
        self._lost: set = set()
        self._ids = itertools.count()
        self.endpoint = Endpoint("client", "127.0.0.1", self._on_message, self._on_closed)

    def _on_message(self, peer, message):
        with self._cond:
            key = message.get("id")
            if key in self._pending:
                self._replies[key] = message
                self._cond.notify_all()

    def _on_closed(self, peer):
        with self._cond:
            self._lost.add(peer)
            self._cond.notify_all()

    @staticmethod
    def array(a):
        """``a`` as a message part that travels as frames (not pickled)."""
        return serialized(np.ascontiguousarray(a))

    @staticmethod
    def serialized(obj):
        """``obj`` (a state with many arrays) as one message part, pickled with its
        arrays out of band."""
        return serialized(obj)

    def connect(self, address):
        """A link to the rank whose endpoint is at ``address``."""
        self.endpoint.connect(address, address)
        with self._cond:
            self._lost.discard(address)

    def peers(self) -> list[str]:
        return self.endpoint.peers()

    def post(self, address, message):
        self.endpoint.post(address, message)

    def ask(self, messages, alive, partial=False, timeout=ANSWER_LIMIT) -> dict:
        """Send ``{address: message}`` and wait for every answer: ``{address: answer}``.

        ``alive()`` lists the addresses still worth waiting for (their workers are
        listed by the scheduler). A rank lost before answering raises
        :class:`RankLost` naming it -- or, with ``partial``, is left out of the
        answers, as are those that did not answer within ``timeout`` seconds.
        """
        ids = {}
        with self._cond:
            for address, message in messages.items():
                key = next(self._ids)
                ids[key] = address
                self._pending.add(key)
        peers = set(self.peers())
        for key, address in ids.items():
            if address in peers:
                self.endpoint.post(address, {**messages[address], "id": key})
        t0 = time.monotonic()
        waiting = dict(ids)
        answers = {}
        try:
            with self._cond:
                while waiting:
                    for key in [k for k in waiting if k in self._replies]:
                        answers[waiting.pop(key)] = self._replies.pop(key)
                    if not waiting:
                        break
                    live = set(alive())
                    lost = {a for a in waiting.values()
                            if a in self._lost or a not in peers or a not in live}
                    late = time.monotonic() - t0 > timeout
                    if lost or late:
                        if not partial:
                            raise RankLost(f"rank(s) {sorted(lost or waiting.values())} lost",
                                           lost or set(waiting.values()))
                        waiting = {k: a for k, a in waiting.items()
                                   if a not in lost and not late}
                        continue
                    self._cond.wait(0.2)
        finally:
            with self._cond:
                self._pending.difference_update(ids)
                for key in ids:
                    self._replies.pop(key, None)
        return answers

    def close_rank(self, address):
        """Close the link to one rank (it drops the run when it sees it close)."""
        self.endpoint.disconnect(address)

    def close(self):
        self.endpoint.close()


def step_terms(t_send, t_all, answers) -> dict:
    """A step's time beyond the ranks' compute, term by term (seconds).

    ``dispatch``: the command's way to the last rank to get it; ``data``: the
    slowest rank's reading (and augmenting) of its samples; ``compute``: the
    slowest rank's step less the time it waited for reductions; ``exchange``: the
    longest such wait (reductions the backward pass did not hide); ``report``: the
    last rank's answer's way back; ``client``: the client's own bookkeeping is what
    the caller's total leaves over.
    """
    times = [a["times"] for a in answers if "times" in a]
    if not times:
        return {}
    return {"dispatch": max(t["got"] for t in times) - t_send,
            "data": max(t["data"] for t in times),
            "compute": max(t["step"] - t["waited"] for t in times),
            "exchange": max(t["waited"] for t in times),
            "report": t_all - max(t["end"] for t in times),
            "links": t_all - t_send}
