"""Variant choice and the performance model's feed: which function runs a task, and
what its run teaches the model.

Policy
------
A pinned runtime (the default, ``deterministic=True``) runs per codelet and device
kind one variant: the first of the preferred names the codelet has (by default
:data:`~hetero_nn.codelets.pinned.PINNED_VARIANTS`), else its first declared one, so
results are the same bits under every policy and worker count. With
``deterministic=False`` the performance model chooses among the candidates: a
variant measured fewer than ``EXPLORE_SAMPLES`` times on the task's footprint
(``calibrate_samples`` when calibrating) runs first (exploration), then the one
with the lowest predicted time.

A task's footprint, as StarPU's default one, covers its operands' shapes and
dtypes only: parameters such as a learning rate or a step count change every step
without changing the cost (stride and kernel size show in the output's shape). A
codelet whose cost depends on a parameter, or on its data, says so with its
``footprint`` callback (StarPU's), whose value joins the footprint
(``"64:<f8|taskbench=64"``; a spike rate, say). A runtime pinned by the default
table keeps, beside its pinned variant, the variants the codelet declares to give the
same bits (``Codelet.same_bits``), and the model chooses among those; a table given
with ``variants=`` is taken as it is.

Measurements: a worker keeps each finished task's run time in a list of its own;
every ``FEED_EVERY`` runs, and at the end of a flush, they go to the model in one
locked update, so workers rarely contend on it. A run of a codelet with several
candidate variants goes to the model at once, so exploration adapts within a flush. The
first run of each (codelet, variant, footprint) in the process is a warm-up and is
not kept: Numba compiles once per signature, worker buffers grow once per shape.

State
-----
``_candidates``: (codelet, kind) -> variant names, preferred first;
``_fp_cache``: (codelet, operand footprints) -> (footprint, size), at most ``FP_CACHE_SIZE``;
``_measured``: per worker (and one for the runtime's own thread), (task, kind)
runs not yet given to the model (the local executor appends a pinned codelet's runs to its
worker's list itself, :meth:`Variants.record` inline); ``_warm``: the (codelet, variant, footprint) whose
warm-up run was seen; ``pinned``: kind -> {codelet: variant} for the codelets with
one candidate, which executors read instead of calling :meth:`Variants.choose`. The model itself is the
runtime's ``perfmodel`` (read at each use: :meth:`Variants.measuring` gives it another for a
block).
"""

from __future__ import annotations

import contextlib
import threading

from ..codelets.pinned import PINNED_VARIANTS

FEED_EVERY = 32  # measurements a worker buffers before updating the performance model
EXPLORE_SAMPLES = 3  # runs of a variant per footprint before its mean is trusted over the others'
FP_CACHE_SIZE = 4096  # (codelet, operand footprints) keys kept; then the cache starts again


class Variants:
    """Variant choice and the performance model's feed for one runtime."""

    def __init__(self, runtime, preferred, deterministic, calibrate, calibrate_samples):
        self.rt = runtime
        self.preferred = preferred
        self._default_table = preferred == PINNED_VARIANTS  # not a table given by the user
        self.deterministic = deterministic
        self.calibrate = calibrate
        self.calibrate_samples = calibrate_samples
        self._candidates: dict = {}
        self._fp_cache: dict = {}
        self._warm: set = set()
        self._lock = threading.Lock()  # the feed: the warm-up set, the model's update
        # per worker (its index), and one more for the runtime's own thread (Dask, sync)
        self._measured: list[list] = [[] for _ in range(len(runtime.workers) + 1)]
        self.pinned: dict = {}  # kind -> {codelet: its only candidate variant}

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
                if self._default_table and c and c[0] in codelet.same_bits:
                    c += tuple(n for n in names if n != c[0] and n in codelet.same_bits)
            self._candidates[key] = c
        return c

    def footprint(self, task):
        """``(footprint, size)`` of a task for the performance model (cached)."""
        fp = task._fp
        if fp is None:
            handles = task.handles
            codelet = task.codelet
            if len(handles) == 1:  # the common case, without building a list
                key = (codelet, handles[0].footprint)
            else:
                key = (codelet, *[h.footprint for h in handles])
            if codelet.footprint is not None:  # the codelet's own: parameters that matter
                extra = codelet.footprint(*[h.shape for h in handles], **task.params)
                key += (f"{codelet.name}={extra}",)
            fp = self._fp_cache.get(key)
            if fp is None:
                fp = ("|".join(key[1:]),
                      task.codelet.work([h.shape for h in handles], task.params))
                if len(self._fp_cache) >= FP_CACHE_SIZE:  # bounded: shapes of a long run
                    self._fp_cache.clear()
                self._fp_cache[key] = fp
            task._fp = fp
        return fp

    def choose(self, task, kind):
        """The variant to run: the only one, one measured fewer than ``EXPLORE_SAMPLES``
        times on this footprint (explore; ``calibrate_samples`` when calibrating), or
        the one with the lowest predicted time."""
        cands = self.candidates(task.codelet, kind)
        if len(cands) == 1:
            self.pinned.setdefault(kind, {})[task.codelet] = cands[0]
            return cands[0]
        pm = self.rt.perfmodel
        if pm is None:
            return cands[0]
        fp, size = self.footprint(task)
        name = task.codelet.name
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
        if task.members is not None:
            return task.predict(self.rt, kind)
        v = self.choose(task, kind)
        pm = self.rt.perfmodel
        if pm is None:
            return v, None
        fp, size = self.footprint(task)
        return v, pm.predict(task.codelet.name, v, kind, fp, size)

    def record(self, task, kind, slot=-1):
        """Keep a finished task's run time for the model (see the module docstring).

        ``slot``: the recording worker's index (each appends to its own list, so no
        measurement is lost to a feed running on another thread); -1 for the
        runtime's own thread."""
        measured = self._measured[slot]
        measured.append((task, kind))
        if len(measured) >= FEED_EVERY or task.codelet not in self.pinned.get(kind, ()):
            self.feed(slot)  # a codelet still choosing between variants learns at once

    def feed(self, slot=None):
        """Hand the measurements of ``slot`` (all slots: None) to the model, warm-up
        runs left out. Thread-safe; an error of the model's update propagates."""
        pm = self.rt.perfmodel
        with self._lock:
            if slot is None:
                measured = [m for ms in self._measured for m in ms]
                for ms in self._measured:
                    ms.clear()
            else:
                measured, self._measured[slot] = self._measured[slot], []
            if pm is None:
                return
            runs = []
            warm = self._warm
            seen = None  # the last key known warm: runs of one key in a row test it once
            for task, kind in measured:
                fp, size = task._fp or self.footprint(task)
                codelet, variant = task.codelet, task.variant
                if seen is None or seen[2] is not fp or seen[0] is not codelet \
                        or seen[1] != variant:
                    seen = (codelet, variant, fp)
                    if seen not in warm:  # _warming(key), inline: a warm-up run, not kept
                        warm.add(seen)
                        seen = None
                        continue
                runs.append((codelet.name, variant, kind, fp, size, task.t_end - task.t_start))
            if runs:
                pm.record_many(runs)

    def feed_replay(self, groups, durations):
        """Hand a compiled replay's measurements to the model, warm-up runs left out as
        :meth:`feed` leaves them: ``groups``, ``((codelet, variant, kind, footprint, size),
        task indices)`` pairs; ``durations``, per task index, nanoseconds."""
        pm = self.rt.perfmodel
        if pm is None:
            return
        with self._lock:
            for (codelet, variant, kind, fp, size), idx in groups:
                skip = 1 if self._warming((codelet, variant, fp)) else 0
                pm.record_array(codelet.name, variant, kind, fp, size, durations, idx, skip)

    def _warming(self, key) -> bool:
        """Whether this is the first run of ``key`` (codelet, variant, footprint) in the
        process, a warm-up the model does not get (now marked seen)."""
        if key in self._warm:
            return False
        self._warm.add(key)
        return True

    @contextlib.contextmanager
    def measuring(self, model):
        """Inside the block the runtime's measurements go to ``model`` (a
        :class:`~hetero_nn.scheduler.perfmodel.PerfModel`; None: nowhere) and its
        predictions come from it (:meth:`Runtime.measuring
        <hetero_nn.scheduler.runtime.Runtime.measuring>`)."""
        rt = self.rt
        previous, rt.perfmodel = rt.perfmodel, model
        try:
            yield model
        finally:
            rt.perfmodel = previous

    def has_measurements(self) -> bool:
        return any(self._measured)


def preferences(variants) -> dict:
    """``{codelet name or "*": (variant, ...)}`` from a sequence or a mapping."""
    if not variants:
        return {}
    if isinstance(variants, str):
        return {"*": (variants,)}
    if hasattr(variants, "items"):
        return {name: (v,) if isinstance(v, str) else tuple(v) for name, v in variants.items()}
    return {"*": tuple(variants)}
