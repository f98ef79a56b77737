"""Choosing the granularity from the performance models: ``granularity="auto"``.

This module owns the decision a :class:`~hetero_nn.training.trainer.Trainer` makes when
its granularity is ``"auto"``: how many partitions to split a batch into, whether
the model submits fused codelets, and, where the models say it pays, another
granularity for some of the model's blocks (``Sequential.granularities``).

Policy
------
1. *Candidates*: ``g`` in 1, 2, 4, ... up to ``min(batch, 4 * workers)`` (or the
   caller's list), each with fusion on and off where the model has ``fuse``.
2. *Calibration*: per candidate (in :func:`~.granularity_family.calibration_order`:
   the first always, the others while ``CALIBRATION_BUDGET`` seconds and
   ``CALIBRATION_STEPS`` steps last; past them, a
   candidate is predicted by shape families, or left out where a task of it has
   none), real training steps on the batch (weights,
   optimizer state, running statistics and dropout steps are put back after)
   until every task of the step's graph has been measured and its shape family has
   at least ``CALIBRATION_SAMPLES`` measurements (any size, any layer) of the
   variant it runs on some worker kind of the runtime (one of the footprint, where
   another step would end past the budget); the first step of each candidate
   (capture, compilation: Numba compiles once per signature, first touch of the
   memory) feeds neither the models nor the overhead, nor does the first
   configuration's second (``FIRST_UNTIMED``: the decision's first replay, whose
   kernels ran 1.2-1.35x their later times in two traced ResNet-18 runs at load 7-9,
   `docs/granularity.md`). The other steps run on the path the trained steps will
   run on (:mod:`~hetero_nn.simulation.paths`: submitted, replayed through the executor,
   or compiled by the replay engine), and give that path's costs. Submitted or
   replayed through the executor: the per-task overhead ``dispatch`` is the
   median, over the tasks of those steps, of the time from a task's worker
   being free and its inputs ready to its start
   (:func:`~hetero_nn.scheduler.trace.records.dispatch_gaps`; the median, so that a
   thread the OS preempted does not count as the runtime's cost). Compiled:
   ``dispatch`` and the ``handoff`` of an edge between workers are
   :func:`~hetero_nn.simulation.paths.path_costs` of those steps. A replayed step's
   host time (writing the batch, the replay call, reading the loss) is the
   smallest, per candidate, of a step's wall time less its flushes'
   (:func:`~hetero_nn.simulation.paths.flush_seconds`), the median over candidates.
3. *Prediction*: the graph a step submits at that candidate is captured without
   running it and replayed in virtual time on the runtime's workers
   (:func:`~hetero_nn.simulation.simulate.simulate`), with run times from the
   performance model (a footprint never measured: its shape family's,
   :class:`~.granularity_family.FamilyModel`): under the runtime's policy with ``dispatch`` per task, or,
   on the compiled path, on the engine's fixed schedule with ``dispatch`` and
   ``handoff``; where most calibration steps ran every task on one thread (the
   engine's serial mode, chosen when other load on the cores made its parallel
   replays slower: ``PathCosts.serial``), on one worker, as those steps will run.
   A uniform configuration's graph is captured once, for the check of its families
   or its calibration, and serves its prediction. A step the trainer replays (the step cache's rule,
   :meth:`~hetero_nn.training.step_cache.StepCache.replays`) costs the replay's
   host time; one it submits costs the host's measured submission time.
4. *Choice*: the smallest ``g`` (fused before unfused) whose prediction is within
   ``TOLERANCE`` of the lowest (fewer tasks for the same predicted speed).
5. *Per block* (:mod:`.granularity_blocks`): from that choice, one greedy pass over
   the model's blocks in order estimates every other candidate ``g`` for the block
   alone from the uniform candidates' costed graphs, and simulates the best estimate
   only where it would lower the predicted step below the best so far divided by
   ``TOLERANCE``; the simulation keeps it or not. Every footprint such an assignment
   runs was calibrated in 2 or has a shape family there (a block at ``g`` runs the
   tasks it runs when the whole model is at ``g``), so this costs a simulation for
   some blocks, and no real step.
6. *Measurement*: ``MEASURED_STEPS`` consecutive real steps of the chosen
   configuration, after ``WARMUP_STEPS`` (capture, the replay engine's binding and
   its second plan): the steady step of training at it.
7. *Re-check* (:mod:`~hetero_nn.training.recheck`): that measure against the
   prediction and against measured steps of every other candidate, interleaved;
   another candidate that measures more than 10 % faster replaces the choice, and is
   measured as in 6 (one warm-up step: it ran the rounds). The measured step time
   recorded beside the prediction is that steady median, not the interleaved
   rounds', whose steps each follow another configuration's.

Steps 2-6 choose from the models alone; step 7 is the one place wall-clock timings
of candidates decide, and only against a choice the models made.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..layers.base import keeping_state
from ..simulation.paths import PathCosts, step_path
from ..simulation.simulate import Platform, assign_costs, capture, simulate
from ..scheduler.perfmodel.model import PerfModel
from .granularity_blocks import block_seconds, per_block
from .granularity_family import (CALIBRATION_BUDGET, CALIBRATION_STEPS, FamilyModel,
                                 calibration_order, family_of)
from .recheck import _name, describe, recheck

__all__ = ["GranularityDecision", "choose_granularity", "CALIBRATION_SAMPLES", "TOLERANCE"]

CALIBRATION_SAMPLES = 3   # measured runs per (codelet, variant, footprint) before predicting
TOLERANCE = 1.05          # the smallest g within 5 % of the best prediction wins

PER_WORKER = 4            # candidates up to 4 partitions per worker
MEASURED_STEPS = 3
FIRST_UNTIMED = 2         # the first configuration's capture and first replay feed no model
WARMUP_STEPS = 3
_perf = time.perf_counter


@dataclass
class GranularityDecision:
    """What ``granularity="auto"`` chose and why (``Trainer.granularity_decision``).

    ``candidates``: one row per uniform configuration, ``{"granularity", "fuse",
    "predicted_seconds", "tasks"}``; ``blocks``: the per-block trials, ``{"layer",
    "block", "granularity", "estimated_seconds", "predicted_seconds", "kept"}``
    (``predicted_seconds`` None where the estimate did not pay for a simulation:
    :mod:`.granularity_blocks`); ``granularity``, ``fuse``
    and ``layer_granularity`` (per layer of the model, or None when every block runs
    at ``granularity``) the choice; ``predicted_seconds`` and ``measured_seconds``
    its step time, predicted and measured (the median of ``MEASURED_STEPS``
    consecutive steps of the final configuration after its warm-up: the steady step
    that training at it gets, not the re-check's interleaved rounds);
    ``predicted_codelets`` the choice's predicted seconds per step by codelet (its
    tasks' busy time in its simulated schedule); ``phase_seconds`` where the decision's
    time went (``calibration``, ``predictions`` of the uniform candidates and the family
    checks before them, ``per_block``, ``measure``, ``recheck``); ``recheck`` the
    re-check of the models' choice against measured steps
    (:func:`~hetero_nn.training.recheck.recheck`), None where none ran;
    ``calibrated`` the ``[g, fuse]`` calibrated, in order, ``calibration_seconds``
    their time (their steps, and the capture of their graphs; the other candidates'
    graphs are captured after it, with the predictions), ``left_out`` those that were
    not candidates (past the budget with a task of no shape family;
    :mod:`.granularity_family`); ``serial`` whether the predictions ran on one worker
    (the engine replayed the calibration on one thread).
    """

    granularity: int
    fuse: bool | None
    layer_granularity: tuple | None
    predicted_seconds: float
    measured_seconds: float
    candidates: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    dispatch_seconds: float = 0.0
    handoff_seconds: float = 0.0
    path: str = "submitted"
    policy: str = ""
    platform: str = ""
    calibration_steps: int = 0
    seconds: float = 0.0
    recheck: dict | None = None
    calibrated: list | None = None
    calibration_seconds: float = 0.0
    left_out: list = field(default_factory=list)
    serial: bool = False
    predicted_codelets: dict = field(default_factory=dict)
    phase_seconds: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"granularity": self.granularity, "fuse": self.fuse,
                "layer_granularity": None if self.layer_granularity is None
                else list(self.layer_granularity),
                "predicted_seconds": self.predicted_seconds,
                "measured_seconds": self.measured_seconds,
                "candidates": self.candidates, "blocks": self.blocks,
                "dispatch_seconds": self.dispatch_seconds,
                "handoff_seconds": self.handoff_seconds, "path": self.path,
                "policy": self.policy,
                "platform": self.platform, "calibration_steps": self.calibration_steps,
                "seconds": self.seconds, "recheck": self.recheck,
                "calibrated": self.calibrated, "calibration_seconds": self.calibration_seconds,
                "left_out": self.left_out, "serial": self.serial,
                "predicted_codelets": self.predicted_codelets,
                "phase_seconds": self.phase_seconds}

    def format(self) -> str:
        """The decision as a few lines: the candidates' predictions, the choice, the measure."""
        handoff = (f", handoff {1e6 * self.handoff_seconds:.1f} us"
                   if self.path == "compiled" else "")
        path = f"{self.path}, serial replays" if self.serial else self.path
        lines = [f"granularity auto ({self.platform}, {self.policy}, {path}, dispatch "
                 f"{1e6 * self.dispatch_seconds:.1f} us/task{handoff}, "
                 f"{self.calibration_steps} calibration steps, {self.seconds:.1f} s):"]
        if self.calibrated is not None and len(self.calibrated) < len(self.candidates):
            lines.append(f"  calibrated {len(self.calibrated)} of {len(self.candidates)} "
                         f"configurations in {self.calibration_seconds:.1f} s, the others "
                         f"predicted by shape family")
        if self.left_out:
            lines.append(f"  left out (no shape family, past the calibration budget): "
                         + ", ".join(_name({"granularity": g, "fuse": f, "layer_granularity": None})
                                    for g, f in self.left_out))
        for row in self.candidates:
            fuse = "" if row["fuse"] is None else (" fused" if row["fuse"] else " unfused")
            lines.append(f"  g={row['granularity']}{fuse}: predicted "
                         f"{1e3 * row['predicted_seconds']:.3f} ms/step, {row['tasks']} tasks")
        for row in self.blocks:
            if row["kept"]:
                lines.append(f"  layer {row['layer']} ({row['block']}) at g={row['granularity']}:"
                             f" predicted {1e3 * row['predicted_seconds']:.3f} ms/step")
        layers = "" if self.layer_granularity is None else \
            f", per layer {list(self.layer_granularity)}"
        fuse = "" if self.fuse is None else f", fuse={self.fuse}"
        lines.append(f"  chosen g={self.granularity}{fuse}{layers}: predicted "
                     f"{1e3 * self.predicted_seconds:.3f} ms, measured "
                     f"{1e3 * self.measured_seconds:.3f} ms per step")
        if self.recheck is not None:
            lines.insert(-1, describe(self.recheck))
        return "\n".join(lines)


def choose_granularity(trainer, x, y, candidates=None, per_layer=True) -> GranularityDecision:
    """Decide ``trainer``'s granularity (and fusion, and per-block g) on the batch ``(x, y)``.

    Sets ``trainer.granularity``, ``model.fuse`` and ``model.granularities`` to the
    choice and returns the :class:`GranularityDecision` (the module docstring says
    how). The model's weights, buffers, dropout steps and the optimizer's state are
    as they were before.
    """
    t_start = _perf()
    rt, model = trainer.runtime, trainer.model
    x = np.ascontiguousarray(x, dtype=trainer.dtype)
    y = np.zeros(len(x), np.int64) if y is None else np.asarray(y, np.int64)
    if candidates is None:
        limit = max(1, min(len(x), PER_WORKER * len(rt.workers)))
        candidates = [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]
    candidates = sorted({trainer.check_granularity(g) for g in candidates})
    fuses = (True, False) if hasattr(model, "fuse") else (None,)
    configs = [(g, f) for g in candidates for f in fuses]
    platform = Platform(name=str(rt.devices), workers=_worker_counts(rt))
    path = step_path(trainer)
    replayed = path != "submitted"
    with _models_for(rt), _restoring(trainer):
        trainer.granularity = candidates[0]
        trainer.prepare(x)  # built and bound before the state to restore is read
        with _state_kept(trainer):
            runs, steps, calibrated, left_out = [], 0, [], []
            step_graphs = _StepGraphs(trainer, x, y, replayed)
            t_calibration = _perf()
            kinds = [k for k, n in platform.workers.items() if n]
            order = calibration_order(configs, len(rt.workers))
            for g, fuse in order:
                slowest = max((t for run in runs for t, _ in run), default=0.0)
                left = CALIBRATION_STEPS - steps
                if calibrated and (left < 2 or _perf() - t_calibration + 2 * slowest
                                   > CALIBRATION_BUDGET):
                    break  # this one and the rest: predicted by their shape families
                _configure(trainer, g, fuse, None)
                # the first leaves the second its two steps (a first one and a timed one)
                most = left - 2 if not calibrated and len(order) > 1 else left
                steps += _calibrate(trainer, x, y, platform, runs, step_graphs,
                                    t_calibration + CALIBRATION_BUDGET, max(2, most),
                                    untimed=1 if calibrated else FIRST_UNTIMED)
                calibrated.append([g, fuse])
            t_predictions = _perf()
            calibration_seconds = t_predictions - t_calibration
            for g, fuse in order[len(calibrated):]:  # or left out where a task has no family
                _configure(trainer, g, fuse, None)
                if not FamilyModel(rt).covers(step_graphs()[-1].graphs, kinds):
                    left_out.append([g, fuse])
            configs = [c for c in configs if list(c) not in left_out]
            costs = PathCosts.measure(path, runs)
            family = FamilyModel(rt)
            serial = costs.serial and len(kinds) == 1  # the engine's replays on one thread
            machine = replace(platform, workers={kinds[0]: 1}) if serial else platform

            schedules = {}

            def predict(g, fuse, layers):
                _configure(trainer, g, fuse, layers)
                graphs = step_graphs(replayed, costs.host or 0.0)
                r = simulate(graphs, machine, rt.policy_name, rt, dispatch=costs.dispatch,
                             partial=True, engine=path == "compiled", handoff=costs.handoff,
                             models=family)
                schedules[g, fuse, layers] = r.schedule
                return r.step_seconds, r.tasks

            rows = []
            for g, fuse in configs:
                seconds, tasks = predict(g, fuse, None)
                rows.append({"granularity": g, "fuse": fuse, "predicted_seconds": seconds,
                             "tasks": tasks})
            best = min(r["predicted_seconds"] for r in rows)
            chosen = next(r for r in rows if r["predicted_seconds"] <= TOLERANCE * best)
            g, fuse = chosen["granularity"], chosen["fuse"]
            predicted, layers, trials = chosen["predicted_seconds"], None, []
            t_blocks = _perf()
            if per_layer and hasattr(model, "granularities") and len(candidates) > 1:

                def uniform(h):  # the blocks' predicted seconds at (h, fuse)
                    _configure(trainer, h, fuse, None)
                    graphs = step_graphs()[-1].graphs
                    assign_costs(graphs, machine, rt, models=family)
                    return block_seconds(model, graphs, step_graphs.handles(), costs.dispatch)

                _configure(trainer, g, fuse, None)  # the blocks of the chosen fusion
                layers, predicted, trials = per_block(
                    model, g, fuse, candidates, predicted, predict, uniform,
                    sum(machine.workers.values()), TOLERANCE)
            _configure(trainer, g, fuse, layers)
            t_measure = _perf()
            measured = _measure(trainer, x, y)
            t_recheck = _perf()
            checked = recheck(trainer, x, y, (g, fuse, layers, predicted), rows,
                              measured, _configure, WARMUP_STEPS)
            final = checked["final"]
            g, fuse, layers = final["granularity"], final["fuse"], final["layer_granularity"]
            layers = None if layers is None else tuple(layers)
            predicted = final["predicted_seconds"]
            if checked["switched"]:  # its steady steps, after the re-check's rounds
                measured = _measure(trainer, x, y, warmup=1)
            by_codelet = _by_codelet(schedules.get((g, fuse, layers)))
            phases = {"calibration": calibration_seconds,
                      "predictions": t_blocks - t_predictions,
                      "per_block": t_measure - t_blocks, "measure": t_recheck - t_measure,
                      "recheck": _perf() - t_recheck}
    return GranularityDecision(g, fuse, layers, predicted, measured, rows, trials,
                               costs.dispatch, costs.handoff, path, rt.policy_name,
                               platform.name, steps, _perf() - t_start, checked, calibrated,
                               calibration_seconds, left_out, serial, by_codelet, phases)


def _by_codelet(schedule) -> dict:
    """``{codelet: seconds per step}`` of a simulated schedule (its tasks' busy time)."""
    busy: dict = {}
    for _, name, _, start, end in schedule or ():
        busy[name] = busy.get(name, 0.0) + end - start
    return dict(sorted(busy.items(), key=lambda kv: -kv[1]))


def _configure(trainer, g, fuse, layers):
    trainer.granularity = g
    model = trainer.model
    if fuse is not None:
        model.fuse = fuse
    if hasattr(model, "granularities"):
        model.granularities = layers


def _calibrate(trainer, x, y, platform, runs, step_graphs, deadline=float("inf"),
               most=CALIBRATION_STEPS, untimed=1):
    """Real steps at the trainer's configuration (``most`` at most, the first ``untimed``
    of them, and at least one timed) until the models know every task of its graph
    (:func:`_known`), or, where another step would end past ``deadline``, have measured
    each footprint once (a task that runs once a step, the last layer's optimizer step,
    would otherwise cost three steps of a model that takes seconds a step); appends
    ``[(wall seconds, records), ...]`` of its timed steps to ``runs``, returns the steps
    run."""
    rt = trainer.runtime
    graph = step_graphs()[-1].graphs
    tasks = {(t.codelet, t.footprint) for flushed in graph for t in flushed}
    kinds = [k for k, n in platform.workers.items() if n]
    # the calibration's records in a buffer of their own, unbounded (the runtime's keeps
    # only its last flushes); they join the runtime's trace afterwards if it is on
    with rt.tracing_apart() as trace:
        # capture, compilation (Numba compiles per signature), first touch, the decision's
        # first replay: measured into a model of their own, dropped (so each footprint's
        # first run in the process, which the runtime never records, is one of theirs)
        with rt.measuring(PerfModel(load=False, save_every=None)):
            for _ in range(untimed):
                trainer.train_step(x, y)
        timed = []
        steps = untimed
        while steps < max(most, untimed + 1):
            before = len(trace)
            t0 = _perf()
            trainer.train_step(x, y)
            timed.append((_perf() - t0, trace.records()[before:]))
            steps += 1
            samples = 1 if _perf() + timed[-1][0] > deadline else CALIBRATION_SAMPLES
            counts = _family_counts(rt, {c.name for c, _ in tasks})
            if all(_known(rt, c, fp, kinds, counts, samples) for c, fp in tasks):
                break
    runs.append(timed)
    return steps


def _known(rt, codelet, footprint, kinds, counts, samples=CALIBRATION_SAMPLES) -> bool:
    """Whether, on some worker kind, every candidate variant has measured ``footprint``
    and ``samples`` runs of its shape family (any size, any layer: ``counts``, of
    :func:`_family_counts`; what one family's footprints taught serves the others)."""
    pm = rt.perfmodel
    family = family_of(footprint)
    return any(kind in codelet.kinds and all(
        pm.count(codelet.name, v, kind, footprint) >= 1
        and counts.get((codelet.name, v, kind, family), 0) >= samples
        for v in rt.candidates(codelet, kind)) for kind in kinds)


def _family_counts(rt, names) -> dict:
    """``{(codelet, variant, kind, family): measurements}`` of the codelets ``names``."""
    counts: dict = {}
    for name in names:
        for row in rt.perfmodel.entries(name):
            key = (name, row["variant"], row["kind"], family_of(row["footprint"]))
            counts[key] = counts.get(key, 0) + row["count"]
    return counts


class _StepGraphs:
    """The graphs one training step flushes at the trainer's configuration, captured
    without running (the last two of three: each starts where the one before left the
    data; on one memory node, where no data moves, the second of two, or one where the
    steps are ``replayed``: its graph is the second's, task for task, and only a
    submitted step's time needs a second submission, the first one's being slower). A
    uniform configuration's are captured once and serve its calibration or the check of
    its families, and its prediction; a replayed step's host time is ``host``, a
    submitted one's the fastest of its captured submissions."""

    def __init__(self, trainer, x, y, replayed=False):
        self.trainer, self.x, self.y, self.replayed = trainer, x, y, replayed
        self._kept: dict = {}  # (g, fuse) -> (steps, submission seconds, handles)
        self._handles: dict = {}  # of the last capture: real handle -> its graphs' handle

    def __call__(self, replayed=False, host=0.0):
        trainer = self.trainer
        model = trainer.model
        layers = getattr(model, "granularities", None)
        key = (trainer.granularity, getattr(model, "fuse", None))
        got = self._kept.get(key) if layers is None else None
        if got is None:
            rt = trainer.runtime

            def submit():
                trainer.submit_step(self.x, self.y)
                rt.wait()

            handles: dict = {}
            count = 3 if len(rt.nodes) > 1 else 1 if self.replayed else 2
            steps = capture(rt, submit, steps=count, handles=handles)[count > 1:]
            got = (steps, min(s.submit_seconds for s in steps), handles)
            if layers is None:
                self._kept[key] = got
        steps, submitted, self._handles = got
        for s in steps:
            s.submit_seconds = host if replayed else submitted
        return steps

    def handles(self) -> dict:
        """The map of real handles to those of the graphs returned last."""
        return self._handles


def _measure(trainer, x, y, warmup=WARMUP_STEPS) -> float:
    """The median of ``MEASURED_STEPS`` consecutive steps after ``warmup`` (capture, or the
    first submission, of the configuration; replayed, the engine's binding and its
    second plan): the steady step a training run at this configuration gets."""
    for _ in range(warmup):
        trainer.train_step(x, y)
    times = []
    for _ in range(MEASURED_STEPS):
        t0 = _perf()
        trainer.train_step(x, y)
        times.append(_perf() - t0)
    return statistics.median(times)


def _worker_counts(rt) -> dict:
    counts: dict = {}
    for w in rt.workers:
        counts[w.kind] = counts.get(w.kind, 0) + 1
    return counts


@contextlib.contextmanager
def _models_for(rt):
    """The runtime's performance model, or one held in memory for the decision when the
    runtime records none (``perfmodel=False``); it is dropped after."""
    if rt.perfmodel is not None:
        yield rt.perfmodel
        return
    with rt.measuring(PerfModel(load=False)) as model:  # never saved: only this decision reads it
        yield model


@contextlib.contextmanager
def _restoring(trainer):
    """Put back the trainer's granularity, fusion and per-layer g if the block raises."""
    model = trainer.model
    before = (trainer.granularity, getattr(model, "fuse", None),
              getattr(model, "granularities", None))
    try:
        yield
    except BaseException:
        _configure(trainer, *before)
        raise


@contextlib.contextmanager
def _state_kept(trainer):
    """Run real steps in the block, then put back every state they changed: weights,
    buffers, dropout steps, optimizer state and step count, the trainer's counters;
    the graphs captured meanwhile are dropped (they hold the handles replaced)."""
    model, opt = trainer.model, trainer.optimizer
    weights, state = model.state_dict(), opt.state_dict()
    counters = (trainer.last_correct, trainer.last_grad_norm, trainer.graphs_captured)
    with keeping_state(model):
        try:
            yield
        finally:
            model.load_state_dict(weights)
            opt.load_state_dict(state)
            trainer.last_correct, trainer.last_grad_norm, trainer.graphs_captured = counters
            trainer.unbind()  # fresh handles at the next batch, valid on the host

