"""The runtime's front end: ``Runtime`` takes submissions and synchronisation points
and hands each concern to its module.

Policy
------
Tasks are submitted in program order (StarPU's sequential task flow): layers call
``submit(codelet, *handles, **params)``, the runtime infers the dependencies from
the access modes and hands the task to an executor, which places it on a worker
with a scheduling policy. ``wait()`` / ``fetch()`` are the synchronisation
points. One module per concern, this one holding the options, the executors and the
runtime's life, and wiring the others together:

- :mod:`~hetero_nn.scheduler.front.submission` (``submit``, ``add_dependency``) and
  :mod:`~hetero_nn.scheduler.front.synchronisation` (``wait``, ``fetch``, ``capture``,
  ``trace``, ``param`` and the block modes): the runtime's methods a program calls, by
  concern, which ``Runtime`` inherits;
- :mod:`~hetero_nn.scheduler.handles`: the handle factory (``register``,
  ``empty``, ``temporary``) and the checks on operands;
- :mod:`~hetero_nn.scheduler.dependencies`: dependency inference (per handle the
  last writer and the readers since; conflicts between the boxes of handles of
  one root, across partition plans);
- :mod:`~hetero_nn.scheduler.redux`: REDUX partials and the balanced trees that
  combine them in submission order;
- :mod:`~hetero_nn.scheduler.variants`: which variant runs a task (pinned, or the
  performance model's choice) and the model's feed;
- :mod:`~hetero_nn.scheduler.binding`: operands made coherent on a worker's node;
- :mod:`~hetero_nn.scheduler.lifetimes`: where a flush's temporaries live (one
  region per node laid out from their lifetimes, :meth:`Runtime.release`) or plain
  per-task allocation (``arenas=False``);
- :mod:`~hetero_nn.scheduler.flush`: the flush lifecycle (streaming or a closed
  DAG, generations, trace records);
- :mod:`~hetero_nn.scheduler.capture`: capture and replay (:class:`Graph`);
- executors behind one contract (:mod:`~hetero_nn.scheduler.executors.contract`: local,
  sync, Dask, and the compiled replay engine's) and policies
  (:mod:`~hetero_nn.scheduler.policies`).

State
-----
The components above (``_handles``, ``_dependencies``, ``_reductions``, ``_variants``,
``_binder``, ``_flushes``), each owning its state; ``_eligible``: codelet -> the workers
with a variant for it; ``_ids``: task ids in submission order; ``_lock``: the executor's
lock (policies, queues, releases); ``executor`` and ``compiled``: the executors of flushes
and of compiled replays (:mod:`~hetero_nn.scheduler.executors.contract`); ``_closed``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref

from ..codelets.pinned import PINNED_VARIANTS
from ..errors import ConfigError, DeviceError, SubmitError
from .binding import Binder
from .capture import Graph  # noqa: F401 - cited as runtime.Graph (executors/bundle.py)
from .dependencies import Dependencies
from .devices import make_workers
from .flush import Flushes
from .front.submission import RuntimeSubmission
from .front.synchronisation import RuntimeSynchronisation
from .handles import HandleFactory, RuntimeHandles
from .lifetimes import Temporaries
from .redux import Reductions
from .executors.stalls import WAIT_TIMEOUT, check_wait_timeout
from .study import StudyOptions
from .autocapture import AutoCapture
from .trace.buffer import TRACE_FLUSHES, TraceBuffer
from .variants import Variants, preferences
from .policies.policies import make_policy, policy_class
from .perfmodel.model import PerfModel
from .engine.executor import CompiledExecutor
from .executors.dask import DaskExecutor
from .executors.local import LocalExecutor
from .executors.sync import SyncExecutor


class Runtime(RuntimeSubmission, RuntimeSynchronisation, RuntimeHandles,
              contextlib.AbstractContextManager):
    """A task runtime over a set of devices.

    Parameters
    ----------
    devices : str
        ``"cpu:2"``, ``"cpu:1,cuda:0"``, ``"cpu"`` (one worker per core).
    policy : str
        ``eager``, ``random``, ``ws``, ``dmda`` or ``heft`` (local executor).
    executor : str or distributed.Client
        ``"local"`` (in place, the project's own), ``"sync"`` (each task runs inside
        ``submit``, in the calling thread: for debugging), ``"dask"``
        (``dask.threaded.get``), ``"distributed"`` (a ``LocalCluster`` of processes),
        ``"distributed=ADDRESS"``, or a ``distributed.Client``. Dask executors run
        codelets pure.
    host_nodes : int
        Split the host into this many memory nodes (CPU workers dealt in turn).
    device_memory : int, str or mapping, optional
        Memory limit of each CUDA node (``"2GiB"``), or ``{node name: limit}``;
        replicas valid elsewhere are evicted to stay under it.
    deterministic : bool, optional
        True (the default, unless ``calibrate``): run, per codelet and device kind, one
        pinned variant, the first of ``variants`` the codelet has (by default
        :data:`~hetero_nn.codelets.pinned.PINNED_VARIANTS`), else its first declared one;
        results are then bit-identical under every policy and worker count. False: let the
        performance model pick among the variants (faster on some machines; variants differ
        in the last bits, as cuDNN algorithms do in PyTorch).
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
    trace : bool, str or path
        Keep a record of every executed task (see :meth:`trace`): True keeps the
        last ``trace_flushes`` flushes in memory; a path also streams every record
        to that file (JSON Lines, read by ``Trace.from_json``).
    trace_flushes : int or None
        Flushes the trace keeps in memory (default ``TRACE_FLUSHES``, 100), so a
        long run's memory stays flat; None keeps all (for a caller that empties it
        with ``trace(clear=True)``, as the CLI does every step).
    study : StudyOptions, optional
        The switches that exist for experiments and tests (:mod:`.study`); the four
        below are its fields, still accepted as keywords (they override it).
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
        True (the default): the temporaries of a flush that runs as one DAG share one region
        per memory node, laid out from their lifetimes (:meth:`release`,
        :mod:`~hetero_nn.scheduler.lifetimes`). False: every temporary is a plain allocation
        of its own, made when a task first uses it (the memory study's baseline).
    replay_engine : str
        ``"compiled"`` (the default): ``Graph.replay`` runs bound tasks on fixed worker
        schedules through the compiled dispatch loop (:mod:`~hetero_nn.scheduler.engine.replay`)
        where the runtime allows it (local executor, workers of one kind or ``heft``:
        :func:`~hetero_nn.scheduler.engine.replay.engine_refusal`);
        ``"executor"``: replays go through the executor and policy as flushes do.
    wait_timeout : float or None
        Seconds any wait of the runtime may go without progress (default 600); past it
        the run stops with a ``TaskError`` printing the executor's or the replay
        engine's state (:mod:`~hetero_nn.scheduler.executors.stalls`). None: no limit.
    auto_capture : bool
        True (the default): a flush submitted again in the same shape (codelets, handles,
        modes, parameters; step parameters by name, :meth:`param`) is captured, then
        replayed, with no :meth:`capture` (:mod:`~hetero_nn.scheduler.autocapture`); the
        bits are the same. False: every flush runs as submitted.

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
                 calibrate: bool = False, calibrate_samples: int = 10, trace=True,
                 trace_flushes: int | None = TRACE_FLUSHES,
                 seed: int = 0, study: StudyOptions | None = None, fuse_chains=None,
                 overlap=None, arenas=None, replay_engine=None,
                 wait_timeout: float | None = WAIT_TIMEOUT, auto_capture: bool = True):

        policy_class(policy)  # unknown names fail before any thread starts
        self.study = study = (study or StudyOptions()).with_keywords(
            fuse_chains=fuse_chains, overlap=overlap, arenas=arenas, replay_engine=replay_engine)
        self.replay_engine = study.replay_engine
        self.wait_timeout = check_wait_timeout(wait_timeout)  # every wait's deadline (executors/)
        self.compiled = CompiledExecutor(self)  # replays, where the engine serves (engine/)
        if deterministic is None:
            deterministic = not calibrate
        elif deterministic and calibrate:
            raise ConfigError("Runtime: calibrate=True explores every variant; it cannot be "
                              "combined with deterministic=True")
        # the records of executed tasks and copies (bounded); a bad value or trace path
        # fails here, before any stream thread starts
        self._trace = TraceBuffer(trace_flushes, None if isinstance(trace, bool) else trace)
        self._lock = threading.Lock()
        self.workers, self.nodes = make_workers(devices, host_nodes, self._lock, device_memory)
        self.devices = devices
        self.policy_name = policy
        self.deterministic = bool(deterministic)
        self.preferred = preferences(
            variants if variants is not None or not deterministic else PINNED_VARIANTS)
        self.calibrate = bool(calibrate)
        self.calibrate_samples = int(calibrate_samples)
        self.seed = seed
        self.tracing = bool(trace)
        self._trace.workers = [w.name for w in self.workers]
        for node in self.nodes:  # the emulated streams' waits (scheduler/executors/stalls.py)
            if getattr(node, "stream", None) is not None:
                node.stream.wait_timeout = self.wait_timeout
        self.fuse_chains = bool(study.fuse_chains)
        if perfmodel is None or perfmodel is True:
            perfmodel = PerfModel()
        elif perfmodel is not False and not hasattr(perfmodel, "record"):
            perfmodel = PerfModel(perfmodel)
        self.perfmodel = perfmodel or None
        self._single_node = len(self.nodes) == 1
        self._ids = itertools.count()
        self._eligible: dict = {}
        self._closed = False
        self._constrained = False  # a task was given worker=
        self._handles = HandleFactory(self)
        self._placing = None  # (workers, tasks submitted) of the innermost placing() block
        self.arenas = bool(study.arenas)
        self._temporaries = Temporaries(self, self.arenas)
        self._dependencies = Dependencies()
        self._reductions = Reductions(self)
        self._variants = Variants(self, self.preferred, self.deterministic, self.calibrate,
                                  self.calibrate_samples)
        self._binder = Binder(self)
        self._flushes = Flushes(self)
        self.executor = self._make_executor(executor, make_policy)
        self._auto = AutoCapture(self, auto_capture)
        self.overlap = self.executor_name == "sync" or (
            bool(study.overlap) and self.executor_name == "local"
            and not self.executor.policy.whole_graph
            and all(w.kind == "cpu" for w in self.workers))
        _live_runtimes.add(self)

    # ------------------------------------------------------------------ executors
    def _make_executor(self, executor, make_policy):
        if isinstance(executor, str) and executor == "local":
            self.executor_name = "local"
            return LocalExecutor(self, make_policy(self.policy_name, self))
        if isinstance(executor, str) and executor == "sync":
            self.executor_name = "sync"
            return SyncExecutor(self)
        if isinstance(executor, str):
            name, _, address = executor.partition("=")
            if name not in ("dask", "distributed"):
                raise DeviceError(f"executor {executor!r}: expected 'local', 'sync', 'dask', "
                                  "'distributed', 'distributed=ADDRESS' or a distributed.Client")
            self.executor_name = name
            return DaskExecutor(self, "threads" if name == "dask" else "distributed",
                                address=address or None)
        self.executor_name = "distributed"
        return DaskExecutor(self, "distributed", client=executor)

    # ------------------------------------------------------------------ what executors and policies call
    def candidates(self, codelet, kind) -> tuple:
        """Variant names of ``codelet`` that may run on ``kind``, preferred first."""
        return self._variants.candidates(codelet, kind)

    def footprint(self, task):
        """``(footprint, size)`` of a task for the performance model (cached; see
        :mod:`~hetero_nn.scheduler.variants`)."""
        return self._variants.footprint(task)

    def choose_variant(self, task, kind):
        """The variant to run ``task`` on a worker of ``kind``."""
        return self._variants.choose(task, kind)

    def predict(self, task, kind):
        """``(variant, seconds or None)`` the model predicts for ``task`` on ``kind``."""
        return self._variants.predict(task, kind)

    def record(self, task, kind):
        """Keep a finished task's run time for the performance model (from the runtime's own
        thread; workers record through their own slot) and, allocating per task, drop the
        temporaries it was the last to use."""
        if task.frees is not None:
            self._temporaries.plain.finished(task)
        if self.perfmodel is not None and task.error is None:
            self._variants.record(task, kind)

    def bind(self, task, worker):
        """Acquire the task's operands on ``worker``'s memory node; returns the arrays."""
        return self._binder.bind(task, worker)

    def prefetch(self, task, node):
        """Bring the task's read operands to ``node`` ahead of its start (dmda)."""
        self._binder.prefetch(task, node)

    def host_replica(self, handle):
        """``handle``'s replica on the host node, made coherent (no wait: see :meth:`fetch`)."""
        return self._binder.host_replica(handle)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (handles of a closed runtime cannot be used)."""
        return self._closed
    # ------------------------------------------------------------------ lifetime
    def _check_open(self):
        if self._closed:
            raise SubmitError("this Runtime is closed")

    def close(self):
        """Join the workers, release executors, write registered arrays back, save the perfmodels."""
        if self._closed:
            return
        self._closed = True
        try:
            self.compiled.close()
            self.executor.close()
            self._handles.write_back()  # before the streams close: they copy
            for node in self.nodes:
                node.close()
        finally:
            self._flushes.collector.release()  # a flush left open (a failure) holds it no more
            self._auto.collector.release()  # nor a kept flush never waited for
            if self.perfmodel is not None:
                self.perfmodel.save()  # warns (PerfModelWarning) where it cannot; never raises
            _live_runtimes.discard(self)

    def __exit__(self, *exc):  # __enter__ (self) is AbstractContextManager's
        self.close()

    def __repr__(self):
        return (f"Runtime(devices={self.devices!r}, policy={self.policy_name!r}, "
                f"executor={self.executor_name!r}, workers={[w.name for w in self.workers]})")


_live_runtimes: "weakref.WeakSet[Runtime]" = weakref.WeakSet()
