"""The runtime: sequential task flow over handles, REDUX trees, flushes to an executor.

Policy
------
Tasks are submitted in program order (StarPU's sequential task flow). For every
operand the runtime keeps, per handle, the last writer and the readers since;
an ``R`` access waits for the last writer, a ``W``/``RW`` access waits for the
last writer and every reader since (write-after-read). Accesses through any
handle of one root are ordered as sequential NumPy on the same views would be:
two handles conflict when their boxes (index ranges in the root) intersect,
whether one is below the other or they belong to different partition plans.
Children of one plan are disjoint by construction and never compared.

The cost of a submission does not grow with what is pending. A reader appends
itself to its handle's reader list; a writer takes that list as dependencies
once and empties it, and empties the state of every handle inside the region
it writes (it depends on them, so later accesses need only it). Finding the
conflicting handles walks the ancestors, the descendants that hold state
(``_live_below`` counts them), and, per other plan of an ancestor, only the
children whose range meets the access (a bisection). All dependency state
belongs to the tasks of one flush and is dropped when the flush ends.

``REDUX`` contributions make no dependency on the handle: each one gets a
private partial; at the next non-REDUX access to the handle's root (or at
``wait``) the runtime submits a balanced tree of ``redux`` tasks over the
partials in submission order and adds the result into the handle, so the
result is bit-for-bit the same whatever the executor, policy or timing. A
task's non-REDUX operands are processed before its REDUX ones, and a REDUX
access combines the other handles of its root but keeps those the same task
accumulates into, so no tree ever takes the partial of the task being
submitted (the pending list stays in topological order).
``SCRATCH`` operands are private temporaries and make no dependency.

Variants: a pinned runtime (the default) runs per codelet and device kind the
variant :data:`~hetero_nn.codelets.pinned.PINNED_VARIANTS` names, so results
are the same bits under every policy and worker count;
``deterministic=False`` lets the performance model choose.

Execution overlaps submission (StarPU's behaviour): with the local executor a
submitted task whose predecessors have finished goes to the policy at once and
may run while the program goes on submitting. ``wait()`` / ``fetch()`` are the
synchronisation points: they combine pending reductions, block until every
task submitted has finished and end the *flush* (a generation). Submitted tasks
instead accumulate until ``wait()``, which hands the closed DAG to the executor,
where the whole graph is needed or streaming is not possible: a policy that
defines ``prepare`` (``heft`` plans the whole step statically), the Dask
executors (one Dask graph per flush), a capture (each recorded task keeps its
full successor list), a runtime with CUDA (or emulated CUDA) workers, and
``Runtime(overlap=False)`` (kept for study). CUDA workers are left out: runs of
the suite hung in the emulated-device property test with streaming, through a
lock-order inversion (a policy reading a handle's validity under its lock while
placing under the executor's; fixed, see ``Handle.valid_hint``) that streaming
made likelier; streaming there waits for more runs. Their streams already
overlap launches with execution.

State
-----
``_pending``: tasks submitted since the last flush, in submission order (a
topological order), whether they have run or not. ``_streaming``: whether this
flush's tasks go to the executor as they are submitted (decided at its first
submission, see ``_begin_flush``). ``_redux_pending``: root handle -> handles of
that root with REDUX partials not yet combined, in the order of their first
contribution.
``_tracked``: handles given dependency state in this flush (dropped at its end).
``_generation``: number of flushes run; temporaries (arena-backed handles, REDUX
partials) belong to one generation, and the node arenas are reset when the next
flush starts (streaming: at its first submission, when nothing of the previous
one runs any more). ``_records``: trace records of executed tasks.
``_capturing``: the :class:`Graph` being recorded (see :meth:`Runtime.capture`),
or None.

Capture and replay
------------------
``with rt.capture() as graph:`` records the tasks of every flush inside the
block, with their dependencies and REDUX trees as submitted; ``graph.replay()``
runs the same task objects again (only their per-run state reset): no
dependency inference, no task built, no tree rebuilt, and a static policy
(``heft``) keeps the plan it made at capture. Temporaries made while capturing
(``temporary()``, REDUX partials) are the graph's own: ordinary handles,
allocated once, that no arena reset reuses, so the graph stays valid while
other flushes run between replays. New inputs are bound by writing into the
captured handles' buffers (see :meth:`Graph.write`) before ``replay()``.
Before its second replay a graph fuses its chains of small tasks into bundles
(``fuse_chains``; :mod:`~hetero_nn.scheduler.bundle`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref

import numpy as np

from ..arena.arena import Arena
from ..arena.handle import Handle, acquire
from ..codelets.codelet import R, REDUX, RW, SCRATCH, Codelet
from ..codelets.pinned import PINNED_VARIANTS
from ..errors import ConfigError, DeviceError, SubmitError
from .devices import make_workers
from .lifetimes import ArenaLayout, Lifetimes, PlainAllocation
from .trace import TaskRecord, TransferRecord, Trace

_perf = time.perf_counter
FEED_EVERY = 8  # measurements a worker buffers before updating the performance model
EXPLORE_SAMPLES = 3  # runs of a variant per footprint before its mean is trusted over the others'


class Runtime:
    """A task runtime over a set of devices.

    Parameters
    ----------
    devices : str
        ``"cpu:2"``, ``"cpu:1,cuda:0"``, ``"cpu"`` (one worker per core).
    policy : str
        ``eager``, ``random``, ``ws``, ``dmda`` or ``heft`` (local executor).
    executor : str or distributed.Client
        ``"local"`` (in place, the project's own), ``"dask"`` (``dask.threaded.get``),
        ``"distributed"`` (a ``LocalCluster`` of processes), ``"distributed=ADDRESS"``,
        or a ``distributed.Client``. Dask executors run codelets pure.
    host_nodes : int
        Split the host into this many memory nodes (CPU workers dealt in turn).
    device_memory : int, str or mapping, optional
        Memory limit of each CUDA node (``"2GiB"``), or ``{node name: limit}``;
        replicas valid elsewhere are evicted to stay under it.
    deterministic : bool, optional
        True (the default, unless ``calibrate``): run, per codelet and device
        kind, one pinned variant, the first of ``variants`` the codelet has (by default
        :data:`~hetero_nn.codelets.pinned.PINNED_VARIANTS`), else its first
        declared one; results are then bit-identical under every policy and
        worker count. False: let the performance model pick among the
        variants (faster on some machines; variants differ in the last bits,
        as cuDNN algorithms do in PyTorch).
    variants : sequence of str, or mapping, optional
        Preferred variant names, e.g. ``("ref",)`` to run the NumPy references
        wherever a codelet has one; or a mapping from codelet name to such a
        sequence, with ``"*"`` for the codelets not named (e.g. ``{"*": ("cpu",),
        "dense_fwd": ("ref",)}``). A codelet with none of its preferred names runs
        as if none were given. Given, they pin even with ``deterministic=False``.
    perfmodel : PerfModel, path, or False
        Where measurements go (default: ``HETERO_NN_CACHE``); False records nothing.
    calibrate : bool
        Explore every variant until each footprint has ``calibrate_samples`` runs
        (StarPU's calibration); otherwise ``EXPLORE_SAMPLES`` runs (3) each. It
        implies ``deterministic=False``; asking for both is a ``ConfigError``.
    trace : bool
        Keep a record of every executed task (see :meth:`trace`).
    fuse_chains : bool
        True (the default): a captured :class:`Graph` fuses, before its second
        replay, the chains of tasks the performance model predicts below the
        measured per-task overhead (:meth:`Graph.fuse_chains`); False: never.
    overlap : bool
        True (the default): with the local executor, tasks start as soon as their
        inputs are ready while the program is still submitting. False: they run
        only at ``wait()``/``fetch()``, as one DAG (for study; ``heft``, the Dask
        executors, captures and runtimes with CUDA workers always work that way).
    arenas : bool
        True (the default): the temporaries of a flush that runs as one DAG share one
        region per memory node, laid out from their lifetimes (see :meth:`release` and
        :mod:`~hetero_nn.scheduler.lifetimes`). False: every temporary is a plain
        allocation of its own, made when a task first uses it (the memory study's
        baseline).

    Examples
    --------
    >>> import numpy as np, hetero_nn as hn
    >>> def scale(x, factor): x *= factor
    >>> cl = hn.Codelet("scale", modes=(hn.RW,), variants={"ref": scale})
    >>> with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
    ...     h = rt.register(np.ones(4))
    ...     for part in h.split(0, 2):
    ...         _ = rt.submit(cl, part, factor=3.0)
    ...     rt.fetch(h)
    array([3., 3., 3., 3.])
    """

    def __init__(self, devices="cpu", policy="eager", executor="local", *, host_nodes: int = 1,
                 device_memory=None,
                 deterministic: bool | None = None, variants=None, perfmodel=None,
                 calibrate: bool = False, calibrate_samples: int = 10, trace: bool = True,
                 seed: int = 0, fuse_chains: bool = True, overlap: bool = True,
                 arenas: bool = True):
        from .policies import make_policy, policy_class

        policy_class(policy)  # unknown names fail before any thread starts
        if deterministic is None:
            deterministic = not calibrate
        elif deterministic and calibrate:
            raise ConfigError("Runtime: calibrate=True explores every variant; it cannot be "
                              "combined with deterministic=True")
        self._lock = threading.Lock()
        self.workers, self.nodes = make_workers(devices, host_nodes, self._lock, device_memory)
        self._transfers: list = []
        for node in self.nodes:
            node.on_copy = self._copied
        self.devices = devices
        self.policy_name = policy
        self.deterministic = bool(deterministic)
        self.preferred = _preferences(
            variants if variants is not None or not deterministic else PINNED_VARIANTS)
        self.calibrate = bool(calibrate)
        self.calibrate_samples = int(calibrate_samples)
        self.seed = seed
        self.tracing = bool(trace)
        self.fuse_chains = bool(fuse_chains)
        if perfmodel is None or perfmodel is True:
            from .perfmodel import PerfModel
            perfmodel = PerfModel()
        elif perfmodel is not False and not hasattr(perfmodel, "record"):
            from .perfmodel import PerfModel
            perfmodel = PerfModel(perfmodel)
        self.perfmodel = perfmodel or None
        self._single_node = len(self.nodes) == 1
        self._ids = itertools.count()
        self._pending: list = []
        self._redux_pending: dict = {}
        self._tracked: list = []
        self._redux_codelets: dict = {}
        self._candidates: dict = {}
        self._eligible: dict = {}
        self._fp_cache: dict = {}
        self._warm: set = set()
        self._measured: list = []
        self._generation = 0
        self._records: list = []
        self._capturing = None
        self._closed = False
        self.arenas = bool(arenas)
        self._plain = None if self.arenas else PlainAllocation()
        self._released: set = set()  # roots released in this flush
        self._collectors: list = []  # lists collecting the temporaries made (collect_temporaries)
        self._streaming = False
        self.executor = self._make_executor(executor, make_policy)
        self.overlap = (bool(overlap) and self.executor_name == "local"
                        and not self.executor.policy.whole_graph
                        and all(w.kind == "cpu" for w in self.workers))
        _live_runtimes.add(self)

    # ------------------------------------------------------------------ executors
    def _make_executor(self, executor, make_policy):
        if isinstance(executor, str) and executor == "local":
            from .local import LocalExecutor
            self.executor_name = "local"
            return LocalExecutor(self, make_policy(self.policy_name, self))
        from .dask_executor import DaskExecutor
        if isinstance(executor, str):
            name, _, address = executor.partition("=")
            if name not in ("dask", "distributed"):
                raise DeviceError(f"executor {executor!r}: expected 'local', 'dask', 'distributed', "
                                  "'distributed=ADDRESS' or a distributed.Client")
            self.executor_name = name
            return DaskExecutor(self, "threads" if name == "dask" else "distributed",
                                address=address or None)
        self.executor_name = "distributed"
        return DaskExecutor(self, "distributed", client=executor)

    # ------------------------------------------------------------------ handles
    def register(self, array, name=None) -> Handle:
        """Register a host NumPy array; its buffer is the handle's host replica (no copy)."""
        self._check_open()
        if not isinstance(array, np.ndarray):
            raise SubmitError(f"register: expected a numpy.ndarray, got {type(array).__name__}")
        h = Handle(array.shape, array.dtype, name, owner=self)
        h._replicas[0] = array
        h.valid = {0}
        return h

    def empty(self, shape, dtype="float32", name=None) -> Handle:
        """A handle with no data yet; its replicas are allocated where it is first used."""
        self._check_open()
        return Handle(shape, dtype, name, owner=self)

    def temporary(self, shape, dtype="float32", name=None) -> Handle:
        """A handle whose replicas come from the node arenas: valid for the next flush only.

        It may be fetched after that flush, until work is submitted again.
        """
        self._check_open()
        return self._temporary(shape, dtype, name)

    def _temporary(self, shape, dtype, name):
        if self._capturing is not None:  # the captured graph's own: outlives arena resets
            h = Handle(shape, dtype, name, owner=self)
            self._capturing._made.add(h)
        else:
            h = Handle(shape, dtype, name, owner=self, temporary=True,
                       generation=self._generation)
        if self._plain is not None:
            h.placed = self._plain
        for made in self._collectors:
            made.append(h)
        return h

    def release(self, *handles):
        """Declare that nothing reads these temporaries after the current flush (StarPU's
        ``starpu_data_invalidate_submit``): in a flush laid out whole, each one's bytes
        serve later temporaries once the last task of this flush that accesses it has
        run (:mod:`~hetero_nn.scheduler.lifetimes`). Tasks may still be submitted on it
        until the flush ends; it must not be fetched after. A flush that streams keeps
        every temporary to its end."""
        capture = self._capturing
        for h in handles:
            if type(h) is not Handle or h.owner is not self:
                raise SubmitError(f"release: {h!r} is not a handle of this Runtime")
            root = h.root
            if not ((root.temporary and root.generation == self._generation)
                    or (capture is not None and root in capture._made)):
                raise SubmitError(f"release: handle {h.name!r} is not a temporary of the "
                                  "current flush")
            self._released.add(root)

    @contextlib.contextmanager
    def collect_temporaries(self):
        """Collect in a list the temporaries made inside the ``with`` block."""
        made: list = []
        self._collectors.append(made)
        try:
            yield made
        finally:
            self._collectors.remove(made)

    # ------------------------------------------------------------------ submission
    def submit(self, codelet: Codelet, *handles, **params):
        """Submit ``codelet`` on ``handles`` (one per mode); ``params`` reach the variant."""
        if self._closed:
            raise SubmitError("submit on a closed Runtime")
        modes = codelet.modes
        if len(handles) != len(modes):
            codelet.check_operands(len(handles))
        if len(handles) > 1:
            _check_overlap(codelet, handles, modes)
        eligible = self._eligible.get(codelet)
        if eligible is None:
            eligible = self._compute_eligible(codelet)
        task = _Task(next(self._ids), codelet, handles, modes, params, _perf())
        task.eligible = eligible
        preds: dict = {}
        redux = False
        generation = self._generation
        redux_pending = self._redux_pending
        i = 0
        for h in handles:
            if type(h) is not Handle or h.owner is not self:
                self._bad_operand(codelet, i, h)
            if h.temporary and h.generation != generation:
                raise SubmitError(f"codelet {codelet.name!r} operand {i}: temporary handle "
                                  f"{h.name!r} belongs to an earlier flush; its arena was reset")
            m = modes[i]
            i += 1
            if m is REDUX:
                redux = True
            elif m is not SCRATCH:
                if redux_pending and h.root in redux_pending:
                    self._combine_family(h.root)
                if h.parent is None and not h.plans:
                    self._depend_root(task, h, m is not R, preds)
                else:
                    self._depend(task, h, m is not R, preds)
        if redux:  # after the other operands, so no combine ever takes this task's own partials
            ops = list(handles)
            keep = {h for h, m in zip(handles, modes) if m is REDUX}
            for i, h in enumerate(handles):
                if modes[i] is REDUX:
                    if h.root in redux_pending:
                        self._combine_family(h.root, keep=keep)
                    partial = self._temporary(h.shape, h.dtype,
                                              f"{h.name}.partial{len(h._redux)}")
                    partial._last_writer = task
                    if not h._redux:
                        redux_pending.setdefault(h.root, []).append(h)
                    h._redux.append((partial, codelet))
                    ops[i] = partial
            task.handles = ops
        pending = self._pending
        if not pending:
            self._begin_flush()
        pending.append(task)
        if preds:
            preds.pop(task, None)  # a handle twice in one task
            task.preds = list(preds)
        if self._streaming:
            self.executor.add(task)
        elif preds:
            task.npred = len(task.preds)
            for p in task.preds:
                p.succ.append(task)
        return task

    def _begin_flush(self):
        """The first submission since a flush ended: decide whether this flush streams;
        streaming, the arenas are reset now (nothing of the previous flush runs)."""
        self._streaming = self.overlap and self._capturing is None
        if self._streaming:
            for node in self.nodes:
                node.arena.reset()

    def _bad_operand(self, codelet, i, h):
        if type(h) is not Handle:
            raise SubmitError(f"codelet {codelet.name!r} operand {i}: expected a Handle, "
                              f"got {type(h).__name__} (register arrays with rt.register)")
        raise SubmitError(f"codelet {codelet.name!r} operand {i}: handle {h.name!r} belongs "
                          "to another Runtime")

    def _compute_eligible(self, codelet):
        kinds = set(codelet.kinds)
        eligible = tuple(w for w in self.workers if w.kind in kinds)
        if not eligible:
            have = sorted({w.kind for w in self.workers})
            raise SubmitError(f"codelet {codelet.name!r} has variants for {sorted(kinds)} but this "
                              f"runtime's devices are {have} ({self.devices!r})")
        self._eligible[codelet] = eligible
        return eligible

    def _depend_root(self, task, h, writes, preds):
        """``_depend`` for a root never split, the common case: O(1) for a reader."""
        lw = h._last_writer
        readers = h._readers
        if lw is None and not readers:
            self._tracked.append(h)
        elif lw is not None:
            preds[lw] = None
        if writes:
            if readers:
                for r in readers:
                    preds[r] = None
                h._readers = []
            h._last_writer = task
        else:
            readers.append(task)

    def _depend(self, task, h, writes, preds):
        """Add to ``preds`` the tasks ``task`` must follow to access ``h``; update the state.

        Every handle of ``h``'s root with state whose box meets ``h``'s conflicts:
        ``task`` follows its last writer, and, when writing, its readers; a
        write then empties the state of the handles it covers.
        """
        conflicting = _conflicting(h)
        for x in conflicting:
            lw = x._last_writer
            if lw is not None:
                preds[lw] = None
            if writes:
                for r in x._readers:
                    preds[r] = None
        own = h._last_writer
        if own is not None:
            preds[own] = None
        if writes:
            for x in conflicting:
                if x.within(h):
                    _set_state(x, None, [], self._tracked)
            readers = h._readers
            if readers:
                for r in readers:
                    preds[r] = None
                h._readers = []
            if own is None and not readers:  # h had no state: count it in its ancestors
                _set_state(h, task, [], self._tracked)
            else:
                h._last_writer = task
        elif own is None and not h._readers:
            _set_state(h, None, [task], self._tracked)
        else:
            h._readers.append(task)

    def _drop_dependency_state(self):
        """Forget the flushed tasks: every dependency is on a task of the same flush."""
        for h in self._tracked:
            h._last_writer = None
            h._readers = []
            h._live_below = 0
            a = h.parent
            while a is not None and a._live_below:  # above a zeroed one, all are zeroed
                a._live_below = 0
                a = a.parent
        self._tracked = []

    # ------------------------------------------------------------------ REDUX
    def _redux_codelet(self, codelet):
        rc = self._redux_codelets.get(codelet)
        if rc is None:
            rc = Codelet(f"{codelet.name}.redux", modes=(RW, R),
                         variants={"ref": codelet.redux, "cuda": codelet.redux})
            self._redux_codelets[codelet] = rc
        return rc

    def _combine_family(self, root, keep=()):
        """Submit the REDUX trees pending on any handle of ``root`` (any plan), in the
        order of their first contribution, but those of the handles in ``keep`` (the
        REDUX operands of the task being submitted)."""
        handles = self._redux_pending.pop(root)
        kept = [x for x in handles if x in keep]
        if kept:
            self._redux_pending[root] = kept
        for x in handles:
            if x not in keep:
                self._combine(x)

    def _combine(self, h):
        parts = [p for p, _ in h._redux]
        self._released.update(parts)  # read by this tree alone
        rc = self._redux_codelet(h._redux[0][1])
        h._redux = []
        step = 1
        while step < len(parts):
            for i in range(0, len(parts) - step, 2 * step):
                self.submit(rc, parts[i], parts[i + step])
            step *= 2
        self.submit(rc, h, parts[0])

    def _combine_all(self):
        while self._redux_pending:
            self._combine_family(next(iter(self._redux_pending)))

    # ------------------------------------------------------------------ variants, perfmodel
    def candidates(self, codelet, kind) -> tuple:
        """Variant names of ``codelet`` that may run on ``kind``, preferred first."""
        key = (codelet, kind)
        c = self._candidates.get(key)
        if c is None:
            names = codelet.kinds.get(kind, ())
            base = codelet.name.partition(".")[0]  # a twin ("<name>.overwrite") runs as its base
            order = self.preferred.get(codelet.name,
                                       self.preferred.get(base, self.preferred.get("*", ())))
            preferred = tuple(n for n in order if n in names)
            c = preferred if preferred else names
            if self.deterministic or preferred:
                c = c[:1]
            self._candidates[key] = c
        return c

    def footprint(self, task):
        """``(footprint, size)`` of a task for the performance model (cached).

        As StarPU's default footprint, it covers the operands' shapes and
        dtypes only: parameters such as a learning rate or a step count change
        every step without changing the cost (stride and kernel size show in
        the output's shape).
        """
        fp = task._fp
        if fp is None:
            handles = task.handles
            if len(handles) == 1:  # the common case, without building a list
                key = (task.codelet, handles[0].footprint)
            else:
                key = (task.codelet, *[h.footprint for h in handles])
            fp = self._fp_cache.get(key)
            if fp is None:
                fp = ("|".join(key[1:]),
                      task.codelet.work([h.shape for h in handles], task.params))
                self._fp_cache[key] = fp
            task._fp = fp
        return fp

    def choose_variant(self, task, kind):
        """The variant to run: the only one, one measured fewer than ``EXPLORE_SAMPLES``
        times on this footprint (explore; ``calibrate_samples`` when calibrating), or
        the one with the lowest predicted time."""
        cands = self.candidates(task.codelet, kind)
        if len(cands) == 1 or self.perfmodel is None:
            return cands[0]
        fp, size = self.footprint(task)
        pm, name = self.perfmodel, task.codelet.name
        need = self.calibrate_samples if self.calibrate else EXPLORE_SAMPLES
        best, best_t = cands[0], None
        for v in cands:
            if pm.count(name, v, kind, fp) < need:
                return v
            t = pm.predict(name, v, kind, fp, size)
            if best_t is None or (t is not None and t < best_t):
                best, best_t = v, t
        return best

    def predict(self, task, kind):
        """``(variant, seconds or None)`` the model predicts for ``task`` on ``kind``."""
        if task.__class__ is Bundle:
            return task.predict(self, kind)
        v = self.choose_variant(task, kind)
        if self.perfmodel is None:
            return v, None
        fp, size = self.footprint(task)
        return v, self.perfmodel.predict(task.codelet.name, v, kind, fp, size)

    def record(self, task, kind):
        """Keep a finished task's run time for the performance model; every
        ``FEED_EVERY`` runs (and at the end of a flush) they go to the model in one
        locked update, so workers rarely contend on it and exploration still
        adapts within a flush."""
        if task.frees is not None:  # arenas=False: drop what this task was the last to use
            self._plain.finished(task)
        if self.perfmodel is not None and task.error is None:
            measured = self._measured
            measured.append((task, kind))
            if len(measured) >= FEED_EVERY:
                self._feed_perfmodel()

    def _feed_perfmodel(self):
        """Hand the flush's measurements to the model. The first run of each variant on
        each footprint in this process is a warm-up and is not kept: Numba compiles once
        per signature (a new dtype or number of dimensions), worker buffers grow once
        per shape."""
        measured, self._measured = self._measured, []
        runs = []
        for task, kind in measured:
            fp, size = self.footprint(task)
            wkey = (task.codelet, task.variant, fp)
            if wkey not in self._warm:
                self._warm.add(wkey)
                continue
            runs.append((task.codelet.name, task.variant, kind, fp, size, task.t_end - task.t_start))
        if runs:
            self.perfmodel.record_many(runs)

    # ------------------------------------------------------------------ execution
    def bind(self, task, worker):
        """Acquire the task's operands on ``worker``'s memory node; returns the arrays."""
        node = worker.node
        arrays = []
        moved = 0
        single = self._single_node
        for h, m in zip(task.handles, task.modes):
            if m is SCRATCH:
                arr = node.arena.empty(h.shape, h.dtype)
            elif single:
                arr = h.replica(node)
            else:
                arr, b = self._acquire(h, node, m.reads, m is not R)
                moved += b
            if m is REDUX:
                task.codelet.init(arr)
            arrays.append(arr)
        task.bytes_in = moved
        return arrays

    def _acquire(self, h, node, reads, writes):
        """``acquire``; the copies it makes report to :meth:`_copied`."""
        return acquire(h, node, self.nodes, reads, writes)

    def _copied(self, src, dst, nbytes, t0, t1):
        """Every copy between memory nodes (called where it ran, e.g. a stream's thread):
        traced per link, and fed to the transfer model."""
        if self.tracing:
            self._transfers.append(TransferRecord(src.name, dst.name, nbytes, t0, t1))
        if self.perfmodel is not None:
            self.perfmodel.record_transfer(src.name, dst.name, nbytes, t1 - t0)

    def prefetch(self, task, node):
        """Bring the task's read operands to ``node`` ahead of its start (dmda), from
        the releasing worker's thread: inside ``node``'s device context, the copies
        on ``node``'s stream, so the task's kernels (same stream) come after them."""
        if self._single_node:
            return
        with node.context():
            for h, m in zip(task.handles, task.modes):
                if m.reads and node.index not in h.valid:
                    self._acquire(h, node, True, False)

    def flush(self):
        """Run every submitted task and return when all have finished (same as :meth:`wait`)."""
        self.wait()

    def wait(self):
        """Combine pending reductions and block until every submitted task has run
        (handing them to the executor first where they were not streamed to it).

        A task that raised is re-raised as :class:`~hetero_nn.errors.TaskError`
        naming the codelet and task; the rest of that graph is cancelled and
        the runtime stays usable.
        """
        self._check_open()
        self._combine_all()
        tasks = self._pending
        if not tasks:
            return
        self._pending = []
        if self._streaming:
            try:
                self.executor.drain()
            finally:
                self._end_flush(tasks)
            return
        lifetimes = self._lay_out(tasks)
        if self._capturing is not None:
            self._capturing._segments.append([(t, t.preds, t.succ) for t in tasks])
            self._capturing._lifetimes.append(lifetimes)
        self._run(tasks, False, lifetimes)

    def _lay_out(self, tasks):
        """The :class:`Lifetimes` of a flush run as one DAG by the local executor, its
        temporaries placed (arena layout, reuse ordered) or tracked (``arenas=False``);
        None where nothing is planned."""
        if self.executor_name != "local":
            return None
        made = None if self._capturing is None else self._capturing._made
        generation = self._generation

        def plannable(root):
            if root._replicas:  # allocated by an earlier flush of this capture
                return False
            return (root.temporary and root.generation == generation) or (
                made is not None and root in made)

        lifetimes = Lifetimes(tasks, plannable, self._released)
        if not lifetimes.roots:
            return None
        if self._plain is not None:
            self._plain.track(lifetimes)
            return lifetimes
        graph = self._capturing
        take = ((lambda node, n: node.arena.empty((max(n, 1),), np.uint8)) if graph is None
                else graph._region)
        lifetimes.layout = layout = ArenaLayout(lifetimes, take)
        for root in lifetimes.roots:
            root.placed = layout
        return lifetimes

    def _run(self, tasks, planned, lifetimes=None):
        """Run a closed DAG on the executor (``planned``: a replay; a static policy keeps
        its plan), then end the flush."""
        for node in self.nodes:
            node.arena.reset()
        if lifetimes is not None and self._plain is not None:
            self._plain.begin(lifetimes)
        try:
            if planned:
                self.executor.run(tasks, planned=True)
            else:
                self.executor.run(tasks)
        finally:
            self._end_flush(tasks)

    def _end_flush(self, tasks):
        """After ``tasks`` ran: dependency state dropped, the arenas' generation ended,
        measurements and records kept."""
        self._drop_dependency_state()
        self._released.clear()
        if self._plain is not None:
            self._plain.forget_flush(self._generation)
        self._generation += 1
        if self._measured:
            self._feed_perfmodel()
        if self.tracing:
            self._records.extend(_record(t) for t in traced(tasks) if t.t_start)  # not cancelled
        for t in tasks:
            t.done = True
            t.preds = ()
            t.succ = ()

    def capture(self) -> "Graph":
        """Record the tasks flushed inside a ``with`` block as a :class:`Graph` to replay.

        Work submitted before the block is flushed first; what is still pending at
        the end of the block is flushed (and recorded) when it closes. The README's
        *The runtime in ten lines* shows it.
        """
        if self._capturing is not None:
            raise SubmitError("capture: this Runtime is already capturing a graph")
        self.wait()
        return Graph(self)

    def _replay(self, graph):
        self._check_open()
        self.wait()  # work submitted since comes first, as in program order
        ids = self._ids
        now = _perf()
        planned, graph._planned = graph._planned, True
        for segment, lifetimes in zip(graph._segments, graph._lifetimes):
            tasks = []
            for t, preds, succ in segment:
                t.rearm(next(ids), now)  # fresh ids in the same (topological) order
                if t.__class__ is Bundle:
                    t.rearm_members(ids, now)
                t.preds = preds
                t.succ = succ
                t.npred = len(preds)
                tasks.append(t)
            self._run(tasks, planned, lifetimes)

    def fetch(self, handle: Handle, copy: bool = False):
        """Wait, then return ``handle``'s data as a coherent host NumPy array.

        Without ``copy`` the array is the host replica itself (StarPU's acquire):
        read it before submitting more work on the handle.
        """
        if type(handle) is not Handle or handle.owner is not self:
            raise SubmitError(f"fetch: {handle!r} is not a handle of this Runtime")
        self.wait()
        if handle.temporary and handle.generation < self._generation - 1:
            raise SubmitError(f"fetch: temporary handle {handle.name!r} belongs to an earlier "
                              "flush; its arena was reset")
        arr = self.host_replica(handle)
        return arr.copy() if copy else arr

    def host_replica(self, handle):
        """``handle``'s replica on the host node, made coherent (no wait: see :meth:`fetch`)."""
        if self._single_node:
            return handle.replica(self.nodes[0])
        return acquire(handle, self.nodes[0], self.nodes, True, False)[0]

    def trace(self, clear: bool = False) -> Trace:
        """The records of executed tasks (see :class:`~hetero_nn.scheduler.trace.Trace`)."""
        t = Trace(list(self._records), [w.name for w in self.workers],
                  transfers=list(self._transfers))
        if clear:
            self._records.clear()
            self._transfers.clear()
        return t

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (handles of a closed runtime cannot be used)."""
        return self._closed

    def arena_stats(self) -> dict:
        """Per memory node: the temporaries arena's statistics."""
        return {n.name: n.arena.stats for n in self.nodes}

    # ------------------------------------------------------------------ lifetime
    def _check_open(self):
        if self._closed:
            raise SubmitError("this Runtime is closed")

    def close(self):
        """Join the workers, release executors, save the performance models."""
        if self._closed:
            return
        self._closed = True
        try:
            self.executor.close()
            for node in self.nodes:
                node.close()
        finally:
            if self.perfmodel is not None:
                try:
                    self.perfmodel.save()
                except OSError:
                    pass
            _live_runtimes.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Runtime(devices={self.devices!r}, policy={self.policy_name!r}, "
                f"executor={self.executor_name!r}, workers={[w.name for w in self.workers]})")


def _preferences(variants) -> dict:
    """``{codelet name or "*": (variant, ...)}`` from a sequence or a mapping."""
    if not variants:
        return {}
    if isinstance(variants, str):
        return {"*": (variants,)}
    if hasattr(variants, "items"):
        return {name: (v,) if isinstance(v, str) else tuple(v) for name, v in variants.items()}
    return {"*": tuple(variants)}


def _check_overlap(codelet, handles, modes):
    """Refuse a task that writes a region it also reaches through another handle.

    In place the two arrays would alias, in the pure Dask graph they would not:
    the result would depend on the executor. (One handle twice is fine.)
    """
    for i, a in enumerate(handles):
        if type(a) is not Handle:
            continue  # the operand check names it
        for j in range(i + 1, len(handles)):
            b = handles[j]
            if b is a or type(b) is not Handle:
                continue
            if (modes[i].writes or modes[j].writes) and a.overlaps(b):
                raise SubmitError(
                    f"codelet {codelet.name!r}: operands {i} ({a.name!r}, {modes[i].value}) and "
                    f"{j} ({b.name!r}, {modes[j].value}) overlap and one of them is written; "
                    "pass disjoint handles")


def _conflicting(h) -> list:
    """The handles of ``h``'s root, other than ``h``, that hold dependency state and
    whose boxes meet ``h``'s: ancestors; descendants through every plan; and below
    each ancestor's other plans, the handles whose ranges meet ``h``'s (siblings of
    one plan are disjoint and skipped)."""
    out = []
    child, a = h, h.parent
    while a is not None:
        if a._last_writer is not None or a._readers:
            out.append(a)
        if len(a.plans) > 1 and a._live_below > child._live_below + (
                child._last_writer is not None or bool(child._readers)):  # state beside the path
            for plan in a.plans.values():
                if plan is not child.plan:
                    _tracked_meeting(plan, h.box, out)
        child, a = a, a.parent
    if h._live_below:
        for plan in h.plans.values():
            _tracked_meeting(plan, h.box, out)
    return out


def _tracked_meeting(plan, box, out):
    """Append to ``out`` the handles with state below ``plan`` whose boxes meet ``box``."""
    for c in plan.meeting(box):
        if not all(c0 < b1 and b0 < c1 for (c0, c1), (b0, b1) in zip(c.box, box)):
            continue
        if c._last_writer is not None or c._readers:
            out.append(c)
        if c._live_below:
            for p in c.plans.values():
                _tracked_meeting(p, box, out)


def _set_state(h, writer, readers, tracked):
    """Give ``h`` dependency state (or none), keeping the ``_live_below`` counts of
    its ancestors and the list of handles to clear at the end of the flush."""
    had = h._last_writer is not None or bool(h._readers)
    has = writer is not None or bool(readers)
    h._last_writer = writer
    h._readers = readers
    if has != had:
        step = 1 if has else -1
        if has:
            tracked.append(h)
        a = h.parent
        while a is not None:
            a._live_below += step
            a = a.parent


def _record(t):
    w = t.worker
    if w is None or isinstance(w, str):  # not run, or run by a Dask worker
        worker, device, node = w or "", "cpu", "host0"
    else:
        worker, device, node = w.name, w.device, w.node.name
    preds = t.preds
    deps = tuple([p.id for p in preds]) if preds else ()
    # positional, in TaskRecord's field order (task_id, codelet, variant, worker, device,
    # node, submit, ready, start, end, bytes_in, deps, error): one per task, keep it cheap
    return TaskRecord(t.id, t.codelet.name, t.variant or "", worker, device, node, t.t_submit,
                      t.t_ready, t.t_start, t.t_end, t.bytes_in, deps, t.error)


class Graph:
    """The tasks of a :meth:`Runtime.capture` block, to run again with :meth:`replay`.

    A context manager: entering starts recording on its runtime, leaving flushes
    what is pending and stops. ``replay()`` runs the recorded flushes in order,
    as ``wait()`` runs one, and returns when they are done. The task parameters
    are those given at capture: a value that changes per step must live in a
    handle's data, not in a parameter.
    """

    def __init__(self, runtime):
        self.runtime = runtime
        self._segments: list = []
        self._closed = False
        self._planned = True  # False after fusion: a static policy plans the new tasks
        self.replays = 0
        self.bundles = None  # the BundleReport of fuse_chains, once decided
        self._made: set = set()  # temporaries made while capturing: the graph's own
        self._lifetimes: list = []  # per segment, its Lifetimes (or None)
        self._arenas: dict = {}  # node index -> the Arena holding this graph's regions

    def __enter__(self):
        self.runtime._capturing = self
        return self

    def __exit__(self, exc_type, *exc):
        rt = self.runtime
        try:
            if exc_type is None:
                rt.wait()
                self._closed = True
        finally:
            rt._capturing = None
        return False

    def _region(self, node, nbytes):
        """``nbytes`` of this graph's own arena on ``node``: a segment's layout region."""
        arena = self._arenas.get(node.index)
        if arena is None:
            arena = self._arenas.setdefault(
                node.index, Arena(f"{node.name}.graph", xp=node.arena.xp,
                                  block_bytes=1 << 16))  # a region over 64 KiB: its own block
        return arena.empty((max(nbytes, 1),), np.uint8)

    def arena_stats(self) -> dict:
        """Per memory node the graph's temporaries are on, its arena's statistics."""
        nodes = {n.index: n.name for n in self.runtime.nodes}
        return {nodes[i]: a.stats for i, a in sorted(self._arenas.items())}

    @property
    def num_tasks(self) -> int:
        """Tasks recorded (REDUX trees included)."""
        return sum(len(s) for s in self._segments)

    def write(self, handle, array):
        """Bind a new input: copy ``array`` into ``handle``'s host buffer (a registered
        handle the graph reads), made the only valid replica."""
        rt = self.runtime
        if type(handle) is not Handle or handle.owner is not rt or handle.parent is not None:
            raise SubmitError(f"Graph.write: {handle!r} is not a root handle of this Runtime")
        if tuple(np.shape(array)) != tuple(handle.shape):
            raise SubmitError(f"Graph.write: handle {handle.name!r} has shape {handle.shape}, "
                              f"got an array of shape {np.shape(array)}")
        rt.wait()
        np.copyto(rt.host_replica(handle), array, casting="same_kind")
        handle.valid = {0}

    def replay(self):
        """Run the recorded tasks again (same operands, parameters and dependencies)."""
        if not self._closed:
            raise SubmitError("Graph.replay: the capture has not completed (replay after the "
                              "with block, which must not have raised)")
        if self.bundles is None and self.replays and self.runtime.fuse_chains:
            self.fuse_chains()
        self.runtime._replay(self)
        self.replays += 1

    def fuse_chains(self, overhead=None):
        """Fuse the chains of tasks predicted below the per-task overhead into bundles
        (:mod:`~hetero_nn.scheduler.bundle`); returns and keeps the decision as
        :attr:`bundles` (a :class:`~hetero_nn.scheduler.bundle.BundleReport`).

        ``overhead``: seconds per task to compare with; by default the overhead
        measured over the graph's last run. Decided once: a second call is refused.
        """
        if not self._closed:
            raise SubmitError("Graph.fuse_chains: the capture has not completed")
        if self.bundles is not None:
            raise SubmitError("Graph.fuse_chains: this graph's chains were already decided")
        self.runtime.wait()
        self.bundles = fuse_chains(self, overhead)
        if self.bundles.chains:
            self._planned = False
        return self.bundles

    def __repr__(self):
        return f"Graph({self.num_tasks} tasks in {len(self._segments)} flushes, " \
               f"{self.replays} replays)"


from .bundle import Bundle, fuse_chains, traced  # noqa: E402
from .task import Task as _Task  # noqa: E402

_live_runtimes: "weakref.WeakSet[Runtime]" = weakref.WeakSet()
