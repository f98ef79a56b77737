"""Pipeline parallelism against data parallelism on the same workers: images/s and the
measured bubble.

For each model (``--models``), stage count P (``--stages``) and granularity g
(``--granularities``, the micro-batches), on ``cpu:P`` under ``dmda``: hetero_nn
trained with ``Trainer(pipeline=P, pipeline_schedule=...)`` for each schedule
(``--schedules``), and without a pipeline (data parallelism over the same P workers,
at the same g). Every side takes ``--warmup`` untimed steps then ``--steps`` timed
ones on the same seeded synthetic batch (float32, SGD with momentum, capture and
replay); a side's step time is the median. Per pipelined step the bubble is measured
from the trace (``Pipeline.bubble``: idle share of the stage workers over the
pipeline's span) beside the ideal ``(P - 1) / (M + P - 1)`` and the overhead-free
bubble (the schedule run on the step's measured operation times, no overhead), with
the cut's predicted imbalance and the measured one (slowest stage over the mean).

The built-in models fuse into a few unequal blocks that no cut balances, so
``--models`` also offers ``mlp-uniform``, a study model with a cut that does:
``Flatten, Linear(784, 512), ReLU``, then eight ``Linear(512, 512), ReLU`` blocks and
``Linear(512, 10)`` on MNIST-shaped input (the first block, with no input gradient,
costs about half of the others). ``--schedules`` may add ``pipedream``
(asynchronous: its rows' speed is not that of the same training).

With ``--cluster SPEC`` (``local:N`` or a scheduler address) the sides run on the Dask
workers instead: data parallelism is ``Trainer(cluster=...)`` over the workers, a
pipeline is ``Trainer(cluster=..., pipeline=P)`` with stage ``s`` in worker ``s``'s
process (activations and gradients sent point to point), each worker's runtime on
``cpu:1``; the bubble is measured by the stages from their own traces (the rows' ``
stage_bubbles``). ``P`` must not exceed the workers.

Output: ``experiments/results/pipeline-<UTC time>.json`` (and ``pipeline-latest.json``)
with the provenance and one row per side. ``docs/pipeline.md`` says how to read it.

Examples::

    python experiments/pipeline.py                      # lenet5, 2 and 3 stages, g 4 8 16
    python experiments/pipeline.py --models lenet5 --stages 2 --granularities 4 --steps 2
    python experiments/pipeline.py --cluster local:2 --stages 2   # across 2 Dask workers
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
from _results import SHAPES as BUILT_IN  # noqa: E402
from step_timing import LR, MOMENTUM, Parser, synthetic_batches  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402

SHAPES = {**BUILT_IN, "mlp-uniform": (1, 28, 28)}


def build(name):
    """The model ``name``: a built-in one, or the study's ``mlp-uniform`` (docstring)."""
    import hetero_nn as hn

    if name != "mlp-uniform":
        return hn.build_model(name, SHAPES[name], 10, seed=0)
    hidden = [layer for _ in range(8) for layer in (hn.Linear(512, 512), hn.ReLU())]
    model = hn.Sequential([hn.Flatten(), hn.Linear(784, 512), hn.ReLU(), *hidden,
                           hn.Linear(512, 10)])
    model.build(SHAPES[name], "float32")
    model.reset_parameters(np.random.default_rng(0))
    return model


def run_side(name, stages, g, schedule, args, client=None) -> dict:
    """One side's row: ``schedule`` None is data parallelism on the same workers (the
    runtime's ``cpu:P``, or the Dask workers of ``client``)."""
    import hetero_nn as hn

    model = build(name)
    x, y = next(synthetic_batches(SHAPES[name], args.batch, 1, 3))
    pipeline = {} if schedule is None else {"pipeline": stages, "pipeline_schedule": schedule}
    if client is not None:
        pipeline["cluster"] = client
    devices = "cpu:1" if client is not None else f"cpu:{stages}"  # the client's: unused
    with (hn.Runtime(devices=devices, policy="dmda", perfmodel=args.cache) as rt,
          hn.Trainer(model, runtime=rt, batch_size=args.batch, granularity=g,
                     optimizer=hn.optim.SGD(lr=LR, momentum=MOMENTUM), **pipeline) as trainer):
        for _ in range(args.warmup):
            trainer.train_step(x, y)
        rt.trace(clear=True)
        times, bubbles = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            times.append(time.perf_counter() - t0)
            trace = rt.trace(clear=True)
            if trainer.pipeline is not None:
                bubbles.append(trainer.pipeline.bubble(trace))
        step = statistics.median(times)
        row = {"model": name, "stages": stages, "g": g, "batch": args.batch,
               "side": "data-parallel" if schedule is None else f"pipeline {schedule}",
               "cluster": args.cluster, "step_ms": 1e3 * step, "images_per_s": args.batch / step}
        if trainer.pipeline is not None:
            measured = [b for b in bubbles if b is not None]
            described = trainer.pipeline.describe()
            row.update(bubble=_median([b["bubble"] for b in measured]),
                       ideal_bubble=(stages - 1) / (g + stages - 1),
                       overhead_free_bubble=_median([b["overhead_free"] for b in measured
                                                     if b.get("overhead_free") is not None]),
                       stage_imbalance=_median([b["stage_imbalance"] for b in measured
                                                if b.get("stage_imbalance") is not None]),
                       imbalance=described["imbalance"], schedule_run=described["schedule_run"],
                       cut=described["stages"])
            if client is not None:
                row["stage_bubbles"] = [_median([b["stage_bubbles"][s] for b in measured])
                                        for s in range(stages)]
    return row


def _median(values):
    return statistics.median(values) if values else None


def _shown(value):
    return "-" if value is None else f"{value:.2f}"


def parse(argv):
    p = Parser(prog="pipeline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lenet5"],
                   choices=list(SHAPES))
    p.add_argument("--stages", nargs="+", type=positive_int, default=[2, 3])
    p.add_argument("--granularities", nargs="+", type=positive_int, default=[4, 8, 16])
    p.add_argument("--schedules", nargs="+", choices=("1f1b", "gpipe", "pipedream"),
                   default=["1f1b", "gpipe"])
    p.add_argument("--batch", type=positive_int, default=256)
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per side")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per side")
    p.add_argument("--results", default=str(HERE / "results"), help="where the JSON goes")
    p.add_argument("--cluster", metavar="SPEC",
                   help="run every side on these Dask workers ('local:N' or an address); "
                        "a stage per worker")
    args = p.parse_args(argv)
    if max(args.granularities) > args.batch:
        p.error(f"--granularities {max(args.granularities)} is larger than --batch {args.batch}")
    count = (args.cluster or "").partition("local:")[2]
    if count.isdigit() and max(args.stages) > int(count):
        p.error(f"--stages {max(args.stages)}: --cluster {args.cluster} has {count} workers, "
                "one per stage")
    return args


def _put_back(name, value):
    import os

    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def main(argv=None) -> int:
    import contextlib
    import os
    import tempfile

    args = parse(argv)
    started = datetime.now(timezone.utc)
    rows = []
    with contextlib.ExitStack() as stack:
        cache = args.cache = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="hetero_nn-pipeline-"))
        client = None
        if args.cluster:
            from hetero_nn.training.cluster.client import connect

            saved = os.environ.get("HETERO_NN_CACHE")  # local workers' models: here, not
            os.environ["HETERO_NN_CACHE"] = cache      # in ~/.cache (they inherit it)
            stack.callback(_put_back, "HETERO_NN_CACHE", saved)
            client = stack.enter_context(connect(args.cluster)).client
        for name in args.models:
            for stages in args.stages:
                for g in args.granularities:
                    for schedule in (None, *args.schedules):
                        row = run_side(name, stages, g, schedule, args, client)
                        rows.append(row)
                        bubble = row.get("bubble")
                        print(f"{name} P={stages} g={g} {row['side']}: "
                              f"{row['images_per_s']:.0f} images/s"
                              + ("" if bubble is None else
                                 f", bubble {bubble:.2f} (ideal {row['ideal_bubble']:.2f}, "
                                 f"overhead-free {_shown(row['overhead_free_bubble'])}, "
                                 f"stage imbalance {_shown(row['stage_imbalance'])})"))
    options = {k: v for k, v in vars(args).items() if k != "cache"}
    document = {**_results.head("pipeline", started, argv, options), "rows": rows}
    print(f"wrote {_results.write(document, args.results, 'pipeline', started)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
