"""Reductions between the ranks of a cluster run, in partition order, bit for bit.

This module owns how the workers (*ranks*) of :mod:`hetero_nn.training.cluster` sum
what their partitions of a batch contribute -- parameter gradients, the loss, the
correct count, batch-norm statistics -- without the client, and so that every rank
ends with the bytes one process would have.

The arithmetic to reproduce
---------------------------
In one process a handle that the ``g`` partitions of a batch contribute to ends as
``head + T(q)``: ``q`` the REDUX partials in partition order, ``T`` the runtime's
balanced tree (``q[i] += q[i + s]`` for ``s = 1, 2, 4, ...``,
:mod:`hetero_nn.scheduler.redux`), ``head`` what the handle held before. Two
*modes*: **overwrite** -- the first partition wrote the handle in place (a fresh
gradient's ``overwriting`` twin, ``SoftmaxCrossEntropy``'s loss), so ``head`` is
partition 0's value and ``q`` holds partitions ``1..g-1``; **zero** -- the handle
was zeroed (``fill_zero``) and ``q`` holds all ``g``. The twin runs its base's
variant after ``init``, so a partition's value is the same bits whichever of the
two computed it.

Rank ``j`` runs partitions ``P_j .. P_{j+1}-1`` (contiguous), so its values are the
leaves of ``q`` in one contiguous range. It adds, in the tree's order, the pairs
whose whole subtree lies in its range (*local* operations), and sends what is left;
whoever reduces a range of the flattened values runs the other operations in the
same order, then ``head + q[0]``. Elementwise IEEE additions in the same order: the
same bits as one process, whatever the number of ranks.

Policy
------
- **Buckets.** After the backward pass is submitted, the rank takes each gradient's
  partials out of its runtime's tree (:meth:`Runtime.take_partials`) and submits a
  ``cluster_send`` task per bucket -- the loss and correct count, then the
  parameters in backward order, at most ``bucket_bytes`` each unless one parameter
  is larger, one mode and one dtype per bucket -- which reads them and hands the message to the endpoint:
  it starts as soon as its layers' backward tasks are done, so the transfers and the
  reductions overlap the rest of the backward pass (PyTorch DDP's buckets). One
  ``cluster_recv`` task then writes every reduced gradient, the loss and the count;
  the optimizer's tasks follow it, so weights change only once the whole step's
  reductions are in (a rank that fails before has not touched them).
- **Order.** The tasks that wait (``cluster_reduce``, ``cluster_recv``) all write one
  small handle, so each rank runs them in submission order, the same on every rank:
  a rank's schedule (the replay engine's plan, a policy) could otherwise run two
  independent ones in another order than its peer, each then waiting for what the
  other has not sent. Sends never wait, so they stay free to run early.
- **Batch statistics.** During forward and backward the rank's runtime hands every
  REDUX tree due to :meth:`Exchange.combine` (:meth:`Runtime.combining_with`): one
  ``cluster_reduce`` task that sends, waits and writes (BatchNorm2D's sums). From
  :data:`TREE_FROM` ranks on they go along the tree itself (:meth:`Exchange.along_tree`:
  each rank sends up what its left neighbour adds, about ``2 log2 W`` messages in a
  row), fewer messages than every rank's values to every other.
- **Who reduces.** A reduction of at most :data:`SCATTER_MIN_BYTES` bytes, or with
  two ranks, goes to every rank, which each reduce the whole (one hop: an
  all-gather of the contributions); a larger one is cut into one range per rank,
  each reduced by its rank and sent to the others (reduce-scatter, then
  all-gather: two hops, each rank sending about twice the values once).
  Reductions run on the endpoint's loop thread as the last piece arrives.

State
-----
``step``: the step number the rank is running (message keys are ``(step, tag,
range)``; tags number the reductions of a step in submission order, the same on
every rank); ``_pieces``: key -> {rank: piece} awaiting the missing ranks;
``_results``: key -> reduced values; ``broken``: why the group can no longer
complete a step (a peer lost, an abort), which every wait raises as
:class:`GroupBroken`; ``waited``: seconds spent blocked in waits this step.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ...codelets.codelet import RW, R, W, Codelet
from ...errors import HeteroNNError
from .endpoint import serialized

__all__ = ["tree_ops", "Exchange", "GroupBroken", "SCATTER_MIN_BYTES", "BUCKET_BYTES"]

#: Reductions larger than this are reduce-scattered (with more than two ranks).
SCATTER_MIN_BYTES = 64 * 1024
#: Bytes per gradient bucket (a bucket closes before the parameter that would pass it).
BUCKET_BYTES = 128 * 1024
#: Batch statistics go along the tree (2 log2 W hops, one message each) from this many
#: ranks on, instead of from every rank to every other (W - 1 messages from each).
TREE_FROM = 9
#: Seconds a rank waits for a reduction before giving the group up.
WAIT_LIMIT = 600.0
_perf = time.perf_counter


class GroupBroken(HeteroNNError, RuntimeError):
    """A reduction cannot complete: a rank of the group is gone, or the step was aborted."""


def tree_ops(m):
    """``(i, j, s)`` for every ``q[i] += q[j]`` of the runtime's tree over ``m`` partials,
    in its order (``j = i + s``)."""
    s = 1
    while s < m:
        for i in range(0, m - s, 2 * s):
            yield i, i + s, s
        s *= 2


def _codelet(kind, modes, fn, cache={}):
    key = (kind, modes)
    c = cache.get(key)
    if c is None:
        c = cache[key] = Codelet(kind, modes=modes, variants={"ref": fn})
    return c


class _Shape:
    """A reduction's static facts, the same on every rank: mode, leaf ranges, flat layout."""

    def __init__(self, starts, mode, shapes, dtype, tree=False):
        self.mode = mode
        self.tree = tree  # reduced along the tree between the ranks, not at owners
        self.sizes = [int(np.prod(s)) for s in shapes]
        self.size = sum(self.sizes)
        self.dtype = np.dtype(dtype)
        shift = 1 if mode == "overwrite" else 0
        self.m = starts[-1] - shift
        self.leaves = [(max(a - shift, 0), b - shift) for a, b in zip(starts, starts[1:])]
        ranks = len(starts) - 1
        if ranks > 2 and self.size * self.dtype.itemsize > SCATTER_MIN_BYTES:
            bounds = [self.size * r // ranks for r in range(ranks + 1)]
            self.ranges = [((bounds[r], bounds[r + 1]), (r,)) for r in range(ranks)]
        else:
            self.ranges = [((0, self.size), tuple(range(ranks)))]

    def local_part(self, rank, values) -> dict:
        """``{leaf: value}`` of ``rank``'s leaves (``values`` in order) after the
        operations of the tree whose whole subtree is its own, done in order."""
        a, b = self.leaves[rank]
        q = dict(zip(range(a, b), values))
        for i, j, s in tree_ops(self.m):
            if self.local(i, s, rank):
                q[i] = q[i] + q.pop(j)
        return q

    def values_sent(self, rank) -> int:
        """How many flat values ``rank`` sends per range: its leaves left after the local
        operations of the tree, and rank 0's head."""
        a, b = self.leaves[rank]
        return len(self.local_part(rank, [0] * (b - a))) + (1 if rank == 0 else 0)

    def tree_steps(self, rank):
        """What ``rank`` does along the tree, in order: ``("add", i, j, from_rank)`` (from_rank
        None: its own ``q[j]``) or ``("send", j, to_rank)``; then the head's addition."""
        steps = []
        for i, j, s in tree_ops(self.m):
            oi, oj = self.owner_of_leaf(i), self.owner_of_leaf(j)
            if self.local(i, s, oi):
                continue  # the owner added it before sending anything
            if oi == rank:
                steps.append(("add", i, j, None if oj == rank else oj))
            elif oj == rank:
                steps.append(("send", j, oi))
        return steps

    def owner_of_leaf(self, i):
        for r, (a, b) in enumerate(self.leaves):
            if a <= i < b:
                return r
        raise IndexError(i)

    def local(self, i, s, rank):
        a, b = self.leaves[rank]
        return a <= i and min(i + 2 * s, self.m) <= b


class Exchange:
    """The reductions of one rank in one group (see the module docstring).

    Parameters
    ----------
    endpoint : Endpoint
        The rank's endpoint, with a link to each peer named by its address.
    generation : int
        The group's number; messages of other generations are dropped.
    rank : int
    peers : list of str
        The endpoint addresses of the group's ranks, in rank order.
    """

    def __init__(self, endpoint, generation, rank, peers, bucket_bytes=BUCKET_BYTES,
                 tree_from=TREE_FROM):
        self.endpoint = endpoint
        self.generation = generation
        self.rank = rank
        self.peers = list(peers)
        self.ranks = len(self.peers)
        self.starts = None
        self.local_partitions = 0
        self.bucket_bytes = int(bucket_bytes)
        self.tree_from = int(tree_from)
        self.step = 0
        self.broken = None
        self.waited = 0.0
        self._tags = 0
        self._order = None
        self._pieces: dict = {}
        self._results: dict = {}
        self._cond = threading.Condition()

    # ------------------------------------------------------------ the group's state
    def fail(self, why):
        """Mark the group broken: every wait, now or later, raises :class:`GroupBroken`."""
        with self._cond:
            if self.broken is None:
                self.broken = why
            self._cond.notify_all()

    def begin(self, step):
        """Start step ``step``: drop what an aborted earlier step left behind."""
        with self._cond:
            self.step = step
            self.waited = 0.0
            for store in (self._pieces, self._results):
                for key in [k for k in store if k[0] < step]:
                    del store[key]

    # ------------------------------------------------------------ submission (the rank's thread)
    def start_submission(self, starts):
        """Before a step is submitted: its layout (``P_0 = 0, ..., P_W = g``: rank ``j``
        runs partitions ``P_j..P_{j+1}-1``), and its reductions numbered from 0."""
        self._order = None
        self.starts = list(starts)
        self.local_partitions = starts[self.rank + 1] - starts[self.rank]
        self._tags = 0

    def _tag(self, mode, shapes, dtype, tree=False):
        """A new reduction of this step: ``(tag, its _Shape)``."""
        tag = self._tags
        self._tags += 1
        return tag, _Shape(self.starts, mode, shapes, dtype, tree)

    def _mode(self, count, name):
        k = self.local_partitions
        if count == k:
            return "zero"
        if count == k - 1:
            return "overwrite"
        raise GroupBroken(f"cluster: {count} partial sums of {name!r} from {k} partitions: "
                          f"not a sum over the batch's partitions")

    def combine(self, h, partials):
        """The runtime's hook for a REDUX tree due during forward or backward (batch
        statistics): one task that sends this rank's values, waits, writes ``h``."""
        tag, shape = self._tag(self._mode(len(partials), h.name), [h.shape], h.dtype,
                               tree=self.ranks >= self.tree_from)
        codelet = _codelet("cluster_reduce", (RW, RW) + (R,) * len(partials), _reduce_variant)
        h.owner.submit(codelet, self._order_handle(h.owner), h, *partials, exchange=self,
                       tag=tag, shape=shape)

    def _order_handle(self, rt):
        """The handle every waiting task of a step writes, in submission order: they wait
        in the same order on every rank, whatever order a rank's schedule would give its
        independent ones (two ranks each waiting on the other's other reduction would
        never wake)."""
        if self._order is None or self._order.owner is not rt:
            self._order = rt.register(np.zeros(1), name="cluster.order")
        return self._order

    def submit_exchange(self, rt, params, fresh, scalars):
        """Submit the step's gradient buckets and scalar reductions, then the task that
        writes their results (see the module docstring).

        ``params``: ``[(name, Parameter, per_partition)]`` in ``named_parameters``
        order; ``fresh``: whether each gradient was fresh after ``zero_grad`` (its first
        contribution overwrote it); ``scalars``: the loss and correct-count handles.
        Gradients not computed per partition (BatchNorm2D's) stay in the local tree.
        """
        items = []  # (handle, partials, mode): the count, then the loss with the last layers
        for h in reversed(scalars):
            partials = rt.take_partials(h)
            items.append((h, partials, self._mode(len(partials), h.name)))
        for (name, p, per_partition), was_fresh in reversed(list(zip(params, fresh))):
            if not per_partition:
                continue
            partials = rt.take_partials(p.grad)
            want = self.local_partitions - (1 if was_fresh else 0)
            if len(partials) != want:
                raise GroupBroken(f"cluster: parameter {name!r} got {len(partials)} partial "
                                  f"gradients from {self.local_partitions} partitions")
            items.append((p.grad, partials, "overwrite" if was_fresh else "zero"))
        outputs, reductions, bucket = [], [], []
        for h, partials, mode in items + [(None, None, None)]:
            if bucket and (h is None or mode != bucket[0][2] or h.dtype != bucket[0][0].dtype
                           or sum(x.nbytes for x, _, _ in bucket) + h.nbytes > self.bucket_bytes):
                reductions.append(self._send(rt, [(x, ps) for x, ps, _ in bucket], bucket[0][2]))
                outputs.extend(x for x, _, _ in bucket)
                bucket = []
            if h is not None:
                bucket.append((h, partials, mode))
        recv = _codelet("cluster_recv", (RW,) + (W,) * len(outputs), _recv_variant)
        rt.submit(recv, self._order_handle(rt), *outputs, exchange=self,
                  reductions=tuple(reductions))

    def _send(self, rt, bucket, mode):
        handles = [h for h, _ in bucket]
        tag, shape = self._tag(mode, [h.shape for h in handles], handles[0].dtype)
        operands = []
        for h, partials in bucket:  # h first: the recv that overwrites it comes after
            operands += [h, *partials]
        send = _codelet("cluster_send", (R,) * len(operands), _send_variant)
        rt.submit(send, *operands, exchange=self, tag=tag, shape=shape,
                  counts=tuple(len(p) for _, p in bucket))
        return tag, shape

    # ------------------------------------------------------------ execution (task threads)
    def contribute(self, tag, shape, values, head):
        """Send this rank's ``values`` (flat arrays, one per local leaf, in order) of
        reduction ``tag``, with ``head`` (rank 0's, else None), after the local
        operations of the tree."""
        q = shape.local_part(self.rank, values)
        step = self.step
        for r, ((lo, hi), owners) in enumerate(shape.ranges):
            piece = {i: v[lo:hi] for i, v in q.items()}
            part_head = None if head is None else head[lo:hi]
            for owner in owners:
                if owner == self.rank:
                    self._add_piece((step, tag, r), self.rank, piece, part_head, shape)
                else:
                    self.endpoint.post(self.peers[owner], {
                        "op": "piece", "gen": self.generation, "step": step, "tag": tag,
                        "range": r, "src": self.rank,
                        "leaves": list(piece), "values": [serialized(np.ascontiguousarray(v))
                                                          for v in piece.values()],
                        "head": None if part_head is None else serialized(
                            np.ascontiguousarray(part_head))})

    def wait(self, tag, shape) -> np.ndarray:
        """The reduced flat values of reduction ``tag`` of this step (blocks)."""
        parts = self._take([(self.step, tag, r) for r in range(len(shape.ranges))])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _take(self, keys) -> list:
        """The results under ``keys``, removed (blocks until all are in, or the group breaks)."""
        t0 = _perf()
        with self._cond:
            while not all(k in self._results for k in keys):
                if self.broken is not None:
                    raise GroupBroken(self.broken)
                if _perf() - t0 > WAIT_LIMIT:
                    raise GroupBroken(f"cluster: no reduction of step {self.step} for "
                                      f"{WAIT_LIMIT:.0f} s")
                self._cond.wait(0.5)
            parts = [self._results.pop(k) for k in keys]
        self.waited += _perf() - t0
        return parts

    def _post(self, rank, tag, key, values):
        self.endpoint.post(self.peers[rank], {
            "op": "reduced", "gen": self.generation, "step": self.step, "tag": tag,
            "range": key, "values": serialized(np.ascontiguousarray(values))})

    def along_tree(self, tag, shape, values, head) -> np.ndarray:
        """Reduce along the tree between the ranks (blocks): each rank adds what it owns
        and sends up its left neighbours' subtrees, rank 0 adds the head, and the result
        comes back down a binomial tree. The same additions in the same order as
        :meth:`contribute`'s owners; ``log2 W`` sequential messages each way."""
        q = shape.local_part(self.rank, values)
        step = self.step
        for action in shape.tree_steps(self.rank):
            if action[0] == "send":
                self._post(action[2], tag, f"q{action[1]}", q.pop(action[1]))
            else:
                _, i, j, src = action
                other = q.pop(j) if src is None else self._take([(step, tag, f"q{j}")])[0]
                q[i] = q[i] + other
        result = None
        first = shape.owner_of_leaf(0) if shape.m else 0
        if shape.m and first == self.rank and self.rank != 0:
            self._post(0, tag, "q0", q.pop(0))
        if self.rank == 0:
            if shape.m:
                q0 = q.pop(0) if first == 0 else self._take([(step, tag, "q0")])[0]
                result = head + q0
            else:
                result = np.array(head, copy=True)
        else:
            result = self._take([(step, tag, "down")])[0]
        d = 1
        while d < self.ranks:
            if self.rank < d and self.rank + d < self.ranks:
                self._post(self.rank + d, tag, "down", result)
            d *= 2
        return result

    # ------------------------------------------------------------ messages (loop thread)
    def on_message(self, message):
        """A piece to reduce, or a reduced range from its owner."""
        if message.get("gen") != self.generation:
            return
        key = (message["step"], message["tag"], message["range"])
        if message["op"] == "piece":
            piece = dict(zip(message["leaves"], message["values"]))
            self._add_piece(key, message["src"], piece, message["head"])
        elif message["op"] == "reduced":
            with self._cond:
                self._results[key] = message["values"]
                self._cond.notify_all()

    def _add_piece(self, key, src, piece, head, shape=None):
        """Keep a piece; the last of the ``ranks`` pieces of ``key`` (this rank's own
        brings the reduction's shape) reduces them."""
        with self._cond:
            pieces = self._pieces.setdefault(key, {})
            pieces[src] = (piece, head)
            if shape is not None:
                pieces["shape"] = shape
            if len(pieces) <= self.ranks:
                return
            del self._pieces[key]
        self._reduce(key, pieces.pop("shape"), pieces)

    def _reduce(self, key, shape, pieces):
        step, tag, r = key
        q, head = {}, None
        for piece, part_head in pieces.values():
            q.update(piece)
            if part_head is not None:
                head = part_head
        for i, j, s in tree_ops(shape.m):
            if not shape.local(i, s, shape.owner_of_leaf(i)):
                q[i] = q[i] + q.pop(j)
        result = head + q[0] if shape.m else np.array(head, copy=True)
        _, owners = shape.ranges[r]
        if len(owners) == 1:  # a scattered range: its owner tells the others
            for other in range(self.ranks):
                if other != self.rank:
                    self.endpoint.post(self.peers[other], {
                        "op": "reduced", "gen": self.generation, "step": step, "tag": tag,
                        "range": r, "values": serialized(result)})
        with self._cond:
            self._results[key] = result
            self._cond.notify_all()


# ---------------------------------------------------------------------------------------
# The variants of the exchange's codelets (Python: they wait on other processes)
# ---------------------------------------------------------------------------------------

def _values(arrays, counts, mode, rank):
    """Flat per-leaf values (and rank 0's head) from a bucket's operands:
    per handle, the handle then its partials."""
    per_handle, at = [], 0
    for c in counts:
        per_handle.append(arrays[at:at + 1 + c])
        at += 1 + c
    if mode == "overwrite":
        rows = [list(ops) for ops in per_handle]
        heads = None
        if rank == 0:
            heads, rows = [r[0] for r in rows], [r[1:] for r in rows]
    else:
        rows = [list(ops[1:]) for ops in per_handle]
        heads = [ops[0] for ops in per_handle] if rank == 0 else None
    values = [np.concatenate([row[v].reshape(-1) for row in rows])
              for v in range(len(rows[0]))] if rows and rows[0] else []
    head = None if heads is None else np.concatenate([h.reshape(-1) for h in heads])
    return values, head


def _send_variant(*arrays, exchange, tag, shape, counts):
    values, head = _values(arrays, counts, shape.mode, exchange.rank)
    exchange.contribute(tag, shape, values, head)


def _recv_variant(_order, *outputs, exchange, reductions):
    at = 0
    for tag, shape in reductions:
        flat = exchange.wait(tag, shape)
        offset = 0
        for size in shape.sizes:
            out = outputs[at]
            out[...] = flat[offset:offset + size].reshape(out.shape)
            offset += size
            at += 1


def _reduce_variant(_order, h, *partials, exchange, tag, shape):
    values, head = _values((h, *partials), (len(partials),), shape.mode, exchange.rank)
    if shape.tree:
        h[...] = exchange.along_tree(tag, shape, values, head).reshape(h.shape)
        return
    exchange.contribute(tag, shape, values, head)
    h[...] = exchange.wait(tag, shape).reshape(h.shape)
