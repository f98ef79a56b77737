"""The group of ranks a cluster run trains on: which workers, made how, formed when.

This module owns the membership half of :mod:`hetero_nn.training.cluster`:
:class:`Group`, the base of :class:`~hetero_nn.training.cluster.Cluster`, keeps a
rank (a :class:`~hetero_nn.training.cluster.rank.Rank` actor) on each worker of the current
group and forms the group again when it must.

Policy
------
A monitor thread reads the scheduler's list of workers every
:data:`WORKER_REFRESH` seconds (``_seen``); nothing on a step's path asks the
scheduler anything. At a step boundary the group is formed again when there is
none, when a worker of it left, when a worker joined (the group takes the first
``min(workers, g)`` in address order), or when the client's state is newer than
the ranks' (``_dirty``: another trainer, a loaded checkpoint). Forming: the client
first pulls the run's state (the ranks are ahead of it), makes a rank on each new
worker (the actor placed there, given the spec from
:func:`~hetero_nn.training.cluster.messages.rank_spec` and the training set, scattered
once), opens a link to it, and sends every rank of the new group its number, its
peers and the state (``configure``); ranks of workers left out are closed. A
worker that dies meanwhile is left out and the formation tried again
(:data:`ATTEMPTS` times); with no worker at all for ``worker_grace`` seconds it
fails with one line naming the last checkpoint.

State
-----
``_ranks``: worker address -> :class:`RankRef`; ``_group``: worker addresses in
rank order; ``_generation``: the group's number (every message of a rank carries
it); ``_seen``; ``_data``: ``(dataset, future)`` of the training set on the
cluster; ``_spec_key``: what the ranks were made from (another model or recipe
makes new ranks); ``_trainer``: the trainer whose run the ranks hold.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

from ...errors import ClusterError, TaskError
from .messages import ClientLinks, RankLost, rank_spec, run_state, scatter
from .rank import Rank

__all__ = ["Group", "RankRef", "WORKER_GRACE", "WORKER_REFRESH", "FORM_TIMEOUT", "ATTEMPTS"]

_perf = time.perf_counter
#: Seconds without a single worker before a step gives up.
WORKER_GRACE = 20.0
#: Seconds between two looks at the scheduler's list of workers.
WORKER_REFRESH = 0.5
#: Seconds a rank may take to start (its actor placed, its runtime built).
FORM_TIMEOUT = 120.0
#: Tries of a formation (and of a step, each after a new group formed).
ATTEMPTS = 6
_keys = itertools.count()


class RankRef:
    """The client's handle on one rank: its actor future and its endpoint address."""

    __slots__ = ("worker", "future", "address")

    def __init__(self, worker, future, address):
        self.worker, self.future, self.address = worker, future, address


class Group:
    """The ranks of a cluster run and the forming of its group (module docstring).

    A base class: :class:`~hetero_nn.training.cluster.Cluster` adds the steps and
    provides ``pull(trainer)``, which forming calls first.
    """

    def __init__(self, client, worker_devices, worker_grace, bucket_bytes):
        self.client = client
        self.worker_devices = worker_devices
        self.worker_grace = float(worker_grace)
        self.bucket_bytes = int(bucket_bytes)
        self.run_id = uuid.uuid4().hex[:12]
        self.links = None              # ClientLinks, made at the first formation
        self._ranks: dict = {}
        self._group: list = []
        self._generation = 0
        self._stale = False
        self._dirty = True
        self._spec_key = None
        self._trainer = None
        self._data = None
        self._seen = sorted(client.nthreads())
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch_workers, daemon=True,
                                         name=f"hetero_nn-cluster-{self.run_id}")
        self._monitor.start()

    @property
    def workers(self) -> list[str]:
        """Addresses of the workers now connected (asks the scheduler)."""
        return sorted(self.client.nthreads())

    @property
    def group(self) -> list[str]:
        """Worker addresses of the ranks of the current group, in rank order."""
        return list(self._group)

    def _watch_workers(self):
        """The monitor thread: the scheduler's workers every ``WORKER_REFRESH`` s."""
        while not self._stop.wait(WORKER_REFRESH):
            try:
                self._seen = sorted(self.client.nthreads())
            except Exception:  # the scheduler is gone: a step will say so
                self._seen = []

    def _ensure_group(self, trainer, data, size):
        """Form the group if there is none, it lost or can gain a worker, or the client's
        state is newer than the ranks'."""
        wanted = self._seen[:size]
        if self._group and not self._dirty and self._group == wanted:
            return
        if self._group and not self._dirty and set(self._group) <= set(self._seen) \
                and len(self._group) == size:
            return
        self._form(trainer, data, size)

    def _form(self, trainer, data, size):
        self._open_links()
        self.pull(trainer)  # the client holds the run's state before pushing it
        spec = self._spec(trainer)
        deadline = _perf() + self.worker_grace
        for _ in range(ATTEMPTS):
            workers = self._wait_for_workers(trainer, deadline)[:size]
            data_future = self._data_future(data)
            self._start_ranks(workers, spec, data_future)
            group = [w for w in workers if w in self._ranks]
            if not group:
                continue
            self._generation += 1
            state = self.links.serialized(run_state(trainer.model, trainer.optimizer,
                                                    trainer.global_step))
            peers = [self._ranks[w].address for w in group]
            messages = {a: {"op": "configure", "gen": self._generation, "rank": j,
                            "peers": peers, "state": state, "bucket_bytes": self.bucket_bytes,
                            "fuse": getattr(trainer.model, "fuse", None)}
                        for j, a in enumerate(peers)}
            try:
                self._raise_errors(self.links.ask(messages, lambda: peers), trainer)
            except RankLost as lost:
                self._forget(lost.addresses)
                continue
            self._group, self._dirty = group, False
            for worker in list(self._ranks):  # ranks left out of the group: closed
                if worker not in group:
                    self._close_rank(worker)
            return
        raise ClusterError(f"cluster {self.spec}: no group of workers could be formed; step "
                           f"{trainer.global_step + 1} was not applied; "
                           f"{trainer.describe_last_checkpoint()}")

    def _wait_for_workers(self, trainer, deadline):
        while True:
            try:
                workers = self.workers
            except Exception as exc:
                raise ClusterError(f"cluster {self.spec}: the scheduler is gone "
                                   f"({type(exc).__name__}); "
                                   f"{trainer.describe_last_checkpoint()}") from None
            if workers:
                self._seen = workers
                return workers
            if _perf() > deadline:
                raise ClusterError(f"cluster {self.spec}: no worker left for "
                                   f"{self.worker_grace:.0f} s; step {trainer.global_step + 1} "
                                   f"was not applied; {trainer.describe_last_checkpoint()}")
            time.sleep(WORKER_REFRESH)

    def _start_ranks(self, workers, spec, data_future):
        """A rank on each of ``workers`` that has none (its actor placed there); workers
        that die meanwhile are left out."""
        from distributed import wait  # distributed loads with the first cluster (heavy at start-up)

        new = {}
        rank_class = self._rank_class()
        for w in workers:
            if w not in self._ranks:
                new[w] = self.client.submit(
                    rank_class, self.run_id, spec, data_future, actor=True, workers=[w],
                    allow_other_workers=False, pure=False,
                    key=f"hetero_nn-rank-{self.run_id}-{next(_keys)}")
        if not new:
            return
        t0 = _perf()
        while _perf() - t0 < FORM_TIMEOUT:
            try:
                wait(list(new.values()), timeout=WORKER_REFRESH)
            except Exception:  # not yet (TimeoutError), or cancelled with a dead worker
                pass
            seen = set(self.workers)
            if all(f.done() or w not in seen for w, f in new.items()):
                break
        for w, future in new.items():
            try:
                if future.status != "finished":
                    raise RankLost(f"worker {w} left")
                address = future.result(timeout=10).address
                self.links.connect(address)
            except Exception:  # the worker died, or its rank could not start
                future.release()
                continue
            self._ranks[w] = RankRef(w, future, address)

    def _rank_class(self):
        """The actor class of the ranks (a subclass may run another share of a step)."""
        return Rank

    def _data_future(self, data):
        """The training set on the cluster (scattered once), or None."""
        if data is None:
            return None
        if self._data is not None and self._data[0] is data and \
                self._data[1].status == "finished":
            return self._data[1]
        if self._data is not None:  # another dataset: the ranks hold the old one
            for worker in list(self._ranks):
                self._close_rank(worker)
        for _ in range(ATTEMPTS):
            future = scatter(self.client, data, self.worker_grace)
            if future is not None:
                self._data = (data, future)
                return future
        raise ClusterError(f"cluster {self.spec}: the training set could not be sent to a "
                           f"worker")

    def _adopt(self, trainer):
        """Make ``trainer``'s run the one the ranks hold (pushed at the next formation)."""
        if trainer is not self._trainer:
            self._trainer, self._stale, self._dirty = trainer, False, True

    def _spec(self, trainer):
        key = (trainer.model, trainer.model.input_shape, trainer.dtype.name, trainer.loss,
               type(trainer.optimizer), trainer.augment, trainer.clip_grad_norm,
               trainer.seed, trainer.replay)
        if self._spec_key is None or any(a is not b and a != b for a, b in
                                         zip(self._spec_key[0], key)):
            if self._spec_key is not None:  # another model or recipe: new ranks
                for worker in list(self._ranks):
                    self._close_rank(worker)
            self._spec_key = (key, rank_spec(trainer, self.worker_devices))
        return self._spec_key[1]

    def _open_links(self):
        if self.links is None:
            self.links = ClientLinks(self.run_id)

    def _forget(self, addresses):
        for worker, ref in list(self._ranks.items()):
            if ref.address in addresses:
                self._close_rank(worker)
        self._group = [w for w in self._group if w in self._ranks]

    def _close_rank(self, worker):
        ref = self._ranks.pop(worker, None)
        if ref is None:
            return
        if self.links is not None:
            self.links.close_rank(ref.address)
        try:
            ref.future.release()
        except Exception:
            pass

    def _alive(self) -> list[str]:
        """Ranks (endpoint addresses) whose workers the scheduler still lists."""
        seen = set(self._seen)
        return [self._ranks[w].address for w in self._group if w in seen and w in self._ranks]

    def _raise_errors(self, replies, trainer):
        """A rank's own error (not a lost peer) ends the step with one line."""
        for address, reply in replies.items():
            if reply.get("op") != "error":
                continue
            if reply.get("broken"):
                raise RankLost(f"rank {address}: {reply['error']}")
            self._abort(list(replies))
            raise TaskError(f"cluster rank {address} failed step {trainer.global_step + 1}: "
                            f"{reply['error']}")
