"""``granularity="auto"`` beside a busy neighbour: is its choice within 10% of the best?

Issue 30's goal: on a machine with a busy neighbour process, ``granularity="auto"``
chooses a configuration within 10% of the best measured one, for LeNet-5 and
dahl-basic. This benchmark starts that neighbour itself (a Python process spinning on
one core, ``os.sched_setaffinity``; ended when the benchmark ends), then per model:

1. *auto*: a Trainer with ``granularity="auto"`` (``Runtime(devices, policy)`` with a
   performance model of its own, empty: the decision calibrates it) decides on one
   synthetic batch (``Trainer.tune_granularity``): the models' choice and its prediction,
   the re-check on measured steps, the final choice;
2. *every candidate*: each configuration the decision considered (g x fusion, and the
   chosen per-layer mix if any) as a trainer of its own (``benchmarks/step_timing.py``,
   SGD, capture and replay, sharing the decision's performance model), ``--warmup``
   untimed steps each, then ``--rounds`` interleaved rounds of ``--steps`` steps (round r
   times every configuration in turn, so the neighbour and other load fall on all);
   a configuration's step time is the median of its rounds' medians;
3. *verdict*: the chosen configuration's measured step over the best one's; within the
   goal when at most ``1 + --within`` (1.10).

It prints a line per model (predicted, chosen, best, ratio) with the load average, and
``--json`` writes every measured configuration with the decision and provenance.

Issue 28's goal (ResNet-18: calibration <= 10 s or five steps, whichever is less; the
chosen configuration's predicted step within 15% of its measured one) reads the decision
and the training after it: ``--models resnet18-tv`` (the torchvision layout of
``bench_models.py``) or ``resnet18`` (the CIFAR layout) with ``--decision-only`` prints
the calibration's seconds and steps, the chosen configuration's predicted step, the
decision's own measure of it (``MEASURED_STEPS`` consecutive steps after its warm-up)
and the *steady* step: the same trainer then trains on ``--warmup`` untimed and
``--steps`` timed synthetic batches, as a training run after the decision does (its
first step binds and captures afresh), the median of the timed ones. It also prints,
per codelet, the predicted seconds per step (the choice's simulated schedule) beside
the steady steps' traced ones: where the prediction misses. No neighbour when
``--no-neighbour``. Examples::

    python benchmarks/bench_auto_granularity.py --json auto.json
    python benchmarks/bench_auto_granularity.py --models dahl-basic --rounds 2 --steps 2
    python benchmarks/bench_auto_granularity.py --models resnet18-tv --policy eager \
        --no-neighbour --decision-only
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timing import Local, Parser, interleave, synthetic_batches  # noqa: E402
from bench_training import model_shape, write_json  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402

SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def neighbour(enabled=True):
    """A Python process spinning on the last core this process may use (its Popen;
    None when ``enabled`` is false), killed at the end of the block."""
    if not enabled:
        yield None
        return
    core = max(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        os.sched_setaffinity(proc.pid, {core})
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _label(g, fuse, layers=None) -> str:
    fused = "" if fuse is None else (" fused" if fuse else " unfused")
    return f"g={g}{fused}" + ("" if layers is None else f" per layer {list(layers)}")


RESNETS = {"resnet18": (3, 32, 32), "resnet18-tv": (3, 32, 32)}  # issue 28's goal


def build(name, shape):
    """The model ``name`` for samples of ``shape``, seeded (``resnet18-tv``:
    ``bench_models.resnet18_torchvision``)."""
    import hetero_nn as hn
    from step_timing import CLASSES
    if name != "resnet18-tv":
        return hn.build_model(name, shape, CLASSES, seed=0)
    from bench_models import resnet18_torchvision
    hn.manual_seed(0)
    model = resnet18_torchvision(CLASSES)
    model.build(shape, "float32")
    return model


def decide(name, shape, args, cache):
    """``granularity="auto"`` on one synthetic batch of ``name``: its decision, its
    seconds, and (``--decision-only``) the steady steps after it (:func:`steady`)."""
    import hetero_nn as hn
    from hetero_nn.scheduler.perfmodel.model import PerfModel
    from step_timing import LR, MOMENTUM
    model = build(name, shape)
    x, y = next(synthetic_batches(shape, args.batch, 1, 0))
    with hn.Runtime(devices=args.devices, policy=args.policy,
                    perfmodel=PerfModel(cache)) as rt:
        trainer = hn.Trainer(model, runtime=rt, batch_size=args.batch, granularity="auto",
                             optimizer=hn.optim.SGD(lr=LR, momentum=MOMENTUM))
        t0 = time.perf_counter()
        trainer.tune_granularity(x, y)
        seconds = time.perf_counter() - t0
        after = None
        if args.decision_only:
            after = steady(trainer, shape, args)
            after["repredicted_s"], after["repredicted_codelets_s"] = repredicted(
                trainer, x, y, after.pop("runs"))
        rt.perfmodel.save()  # the candidates' trainers start from the same calibration
        trainer.close()
    return trainer.granularity_decision, seconds, after


def steady(trainer, shape, args) -> dict:
    """Train on at the chosen configuration: ``--warmup`` untimed then ``--steps`` timed
    steps on fresh synthetic batches; ``{"step_s": median, "steps_s", "codelets_s":
    {codelet: traced busy seconds per timed step}, "workers": the workers that ran
    tasks}`` (one where the engine replayed on one thread)."""
    rt = trainer.runtime
    batches = synthetic_batches(shape, args.batch, args.warmup + args.steps, 1)
    walls, busy, workers, runs = [], {}, set(), []
    for i, (x, y) in enumerate(batches):
        rt.trace(clear=True)
        t0 = time.perf_counter()
        trainer.train_step(x, y)
        wall = time.perf_counter() - t0
        if i < args.warmup:
            continue
        walls.append(wall)
        records = list(rt.trace(clear=True))
        runs.append((wall, records))
        for r in records:
            busy[r.codelet] = busy.get(r.codelet, 0.0) + r.end - r.start
            workers.add(r.worker)
    return {"step_s": statistics.median(walls), "steps_s": walls,
            "codelets_s": {k: v / len(walls) for k, v in busy.items()},
            "workers": sorted(workers), "runs": [runs]}


def repredicted(trainer, x, y, runs):
    """The chosen configuration predicted again as the decision predicts it, from the
    performance models as the steady steps left them (they fed the runtime's models:
    each footprint's median of its last runs) and those steps' path costs:
    ``(step seconds, {codelet: seconds})``. Beside the decision's prediction it tells
    the calibration's samples (first replays, the load of that minute) from the
    simulation's model of a step."""
    from hetero_nn.simulation.paths import PathCosts, step_path
    from hetero_nn.simulation.simulate import Platform, capture, simulate
    from hetero_nn.training.granularity_family import FamilyModel
    rt = trainer.runtime
    path = step_path(trainer)
    costs = PathCosts.measure(path, runs)
    workers = {}
    for w in rt.workers:
        workers[w.kind] = workers.get(w.kind, 0) + 1
    if costs.serial and len(workers) == 1:
        workers = {kind: 1 for kind in workers}
    steps = capture(rt, lambda: (trainer.submit_step(x, y), rt.wait()), steps=2)[1:]
    for step in steps:
        if path != "submitted":
            step.submit_seconds = costs.host or 0.0
    r = simulate(steps, Platform(name=str(rt.devices), workers=workers), rt.policy_name, rt,
                 dispatch=costs.dispatch, partial=True, engine=path == "compiled",
                 handoff=costs.handoff, models=FamilyModel(rt))
    busy = {}
    for _, name, _, start, end in r.schedule:
        busy[name] = busy.get(name, 0.0) + end - start
    return r.step_seconds, busy


def measure(name, shape, configs, args, cache) -> list[float]:
    """Step seconds of each ``(g, fuse, layers)`` in ``configs``, interleaved."""
    runners = []
    try:
        for g, fuse, layers in configs:
            runner = Local({"kind": "hetero_nn", "model": name, "shape": list(shape),
                            "batch": args.batch, "g": g, "fuse": bool(fuse),
                            "workers": None, "devices": args.devices, "policy": args.policy,
                            "cache": cache})
            runner.side.model.granularities = layers
            runners.append(runner)
        interleave(runners, args.warmup, args.rounds, args.steps)
        return [r.summary()["step_s"] for r in runners]
    finally:
        for r in runners:
            r.close()


def bench(name, args) -> dict:
    """Decide, then measure every candidate (``--decision-only``: none); the model's row."""
    shape = RESNETS[name] if name in RESNETS else model_shape(name, args.image_size)
    if args.image_size and name in RESNETS:
        shape = (3, args.image_size, args.image_size)
    with tempfile.TemporaryDirectory(prefix="bench-auto-") as cache:
        decision, seconds, after = decide(name, shape, args, cache)
        if args.decision_only:
            return decision_row(name, shape, args, decision, seconds, after)
        configs = [(r["granularity"], r["fuse"], None) for r in decision.candidates]
        configs += [(g, f, None) for g, f in decision.left_out]  # past auto's budget: measured too
        chosen = (decision.granularity, decision.fuse, decision.layer_granularity)
        if chosen not in configs:  # a per-layer mix: measured beside the uniform ones
            configs.append(chosen)
        steps = measure(name, shape, configs, args, cache)
    measured = [{"config": _label(*c), "granularity": c[0], "fuse": c[1],
                 "layer_granularity": None if c[2] is None else list(c[2]), "step_ms": 1e3 * s}
                for c, s in zip(configs, steps)]
    chosen_row = measured[configs.index(chosen)]
    best = min(measured, key=lambda r: r["step_ms"])
    models = decision.recheck["chosen_by_models"]
    by_models = next((r for r in measured if (r["granularity"], r["fuse"], r["layer_granularity"])
                      == (models["granularity"], models["fuse"], models["layer_granularity"])),
                     None)
    ratio = chosen_row["step_ms"] / best["step_ms"]
    return {"model": name, "shape": list(shape), "batch": args.batch,
            "devices": args.devices, "policy": args.policy,
            "predicted_ms": 1e3 * models["predicted_seconds"],
            "models_choice": _label(models["granularity"], models["fuse"],
                                    models["layer_granularity"]),
            "models_choice_ms": None if by_models is None else by_models["step_ms"],
            "switched": decision.recheck["switched"],
            "chosen": chosen_row["config"], "chosen_ms": chosen_row["step_ms"],
            "chosen_predicted_ms": 1e3 * decision.predicted_seconds,
            "best": best["config"], "best_ms": best["step_ms"],
            "chosen_over_best": ratio, "within": ratio <= 1 + args.within,
            "decision_seconds": seconds, "decision": decision.to_json(),
            "measured": measured, "loadavg": list(os.getloadavg())}


def decision_row(name, shape, args, decision, seconds, after) -> dict:
    """Issue 28's figures: the calibration's cost, the chosen configuration's predicted
    step, the decision's measure and the steady step after it (``after``: :func:`steady`),
    and per codelet the predicted and the steady steps' traced seconds."""
    ratio = decision.measured_seconds / decision.predicted_seconds
    predicted = decision.predicted_codelets
    again = after["repredicted_codelets_s"]
    codelets = [{"codelet": c, "predicted_ms": 1e3 * predicted.get(c, 0.0),
                 "repredicted_ms": 1e3 * again.get(c, 0.0),
                 "measured_ms": 1e3 * after["codelets_s"].get(c, 0.0)}
                for c in sorted(set(predicted) | set(after["codelets_s"]),
                                key=lambda c: -after["codelets_s"].get(c, 0.0))]
    return {"model": name, "shape": list(shape), "batch": args.batch,
            "devices": args.devices, "policy": args.policy,
            "chosen": _label(decision.granularity, decision.fuse, decision.layer_granularity),
            "calibration_seconds": decision.calibration_seconds,
            "calibration_steps": decision.calibration_steps,
            "calibrated": decision.calibrated, "left_out": decision.left_out,
            "chosen_predicted_ms": 1e3 * decision.predicted_seconds,
            "chosen_ms": 1e3 * decision.measured_seconds, "measured_over_predicted": ratio,
            "steady_ms": 1e3 * after["step_s"],
            "steady_over_predicted": after["step_s"] / decision.predicted_seconds,
            "repredicted_ms": 1e3 * after["repredicted_s"],
            "steady_over_repredicted": after["step_s"] / after["repredicted_s"],
            "steady_steps_ms": [1e3 * s for s in after["steps_s"]], "codelets": codelets,
            "steady_workers": after["workers"], "serial_predicted": decision.serial,
            "per_block_simulations": sum(r["predicted_seconds"] is not None
                                         for r in decision.blocks),
            "decision_seconds": seconds, "decision": decision.to_json(),
            "loadavg": list(os.getloadavg())}


def format_row(row) -> str:
    if "calibration_seconds" in row:  # --decision-only
        lines = [f"{row['model']:<10} calibration {row['calibration_seconds']:.1f} s in "
                 f"{row['calibration_steps']} steps ({len(row['calibrated'])} configurations); "
                 f"chosen {row['chosen']}: predicted {row['chosen_predicted_ms']:.1f} ms, "
                 f"decision's measure {row['chosen_ms']:.1f} ms "
                 f"({row['measured_over_predicted']:.2f}), steady step "
                 f"{row['steady_ms']:.1f} ms (steady/predicted "
                 f"{row['steady_over_predicted']:.2f}); predicted again from the steady steps' "
                 f"models {row['repredicted_ms']:.1f} ms (steady/that "
                 f"{row['steady_over_repredicted']:.2f}); per-block simulations "
                 f"{row['per_block_simulations']}; decision {row['decision_seconds']:.1f} s "
                 f"[load {row['loadavg'][0]:.2f}]",
                 "  decision's seconds: " + ", ".join(
                     f"{k} {v:.1f}" for k, v in row["decision"]["phase_seconds"].items()),
                 "  codelet                              predicted ms  again ms  steady ms"]
        lines += [f"  {c['codelet']:<36} {c['predicted_ms']:12.1f} {c['repredicted_ms']:9.1f} "
                  f"{c['measured_ms']:10.1f}" for c in row["codelets"][:12]]
        return "\n".join(lines)
    models = "" if not row["switched"] else \
        f" (models chose {row['models_choice']}, re-check switched)"
    return (f"{row['model']:<10} predicted {row['predicted_ms']:.2f} ms; chosen "
            f"{row['chosen']} {row['chosen_ms']:.2f} ms{models}; best {row['best']} "
            f"{row['best_ms']:.2f} ms; chosen/best {row['chosen_over_best']:.2f} "
            f"({'within' if row['within'] else 'NOT within'} goal) "
            f"[load {row['loadavg'][0]:.2f}]")


def main(argv=None) -> int:
    p = Parser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lenet5", "dahl-basic"],
                   choices=["lenet5", "dahl-basic", "cifar-small", *RESNETS])
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--image-size", type=positive_int, default=None,
                   help="square images of this side (default: the model's own)")
    p.add_argument("--devices", default="cpu:2")
    p.add_argument("--policy", default="dmda")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=5)
    p.add_argument("--within", type=float, default=0.10,
                   help="the goal: chosen within this share of the best (default 0.10)")
    p.add_argument("--no-neighbour", action="store_true",
                   help="do not start the busy neighbour process")
    p.add_argument("--decision-only", action="store_true",
                   help="measure no candidate: the decision's calibration, its chosen "
                        "configuration's predicted and measured step, and the steady step "
                        "of training on after it (--warmup, then --steps timed; issue 28's "
                        "goal)")
    p.add_argument("--json", help="write the rows, with provenance, to this file")
    args = p.parse_args(argv)
    rows = []
    with neighbour(not args.no_neighbour) as proc:
        core = None if proc is None else min(os.sched_getaffinity(proc.pid))
        where = "no neighbour" if core is None else f"neighbour spinning on core {core}"
        print(f"{Path(__file__).name}: {where}, {args.devices}, {args.policy}, batch "
              f"{args.batch}", flush=True)
        for name in args.models:
            rows.append(bench(name, args))
            print(format_row(rows[-1]), flush=True)
    if args.json:
        for row in rows:
            row["neighbour_core"] = core
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
