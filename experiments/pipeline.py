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
pipeline's span) beside the ideal ``(P - 1) / (M + P - 1)``, and the cut's predicted
imbalance (slowest stage over the mean) is recorded.

Output: ``experiments/results/pipeline-<UTC time>.json`` (and ``pipeline-latest.json``)
with the provenance and one row per side. ``docs/pipeline.md`` says how to read it.

Examples::

    python experiments/pipeline.py                      # lenet5, 2 and 3 stages, g 4 8 16
    python experiments/pipeline.py --models lenet5 --stages 2 --granularities 4 --steps 2
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
from _results import SHAPES  # noqa: E402
from step_timing import LR, MOMENTUM, Parser, synthetic_batches  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402


def run_side(name, stages, g, schedule, args) -> dict:
    """One side's row: ``schedule`` None is data parallelism on the same workers."""
    import hetero_nn as hn

    model = hn.build_model(name, SHAPES[name], 10, seed=0)
    x, y = next(synthetic_batches(SHAPES[name], args.batch, 1, 3))
    pipeline = {} if schedule is None else {"pipeline": stages, "pipeline_schedule": schedule}
    with (hn.Runtime(devices=f"cpu:{stages}", policy="dmda", perfmodel=args.cache) as rt,
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
               "step_ms": 1e3 * step, "images_per_s": args.batch / step}
        if trainer.pipeline is not None:
            measured = [b["bubble"] for b in bubbles if b is not None]
            described = trainer.pipeline.describe()
            row.update(bubble=statistics.median(measured) if measured else None,
                       ideal_bubble=(stages - 1) / (g + stages - 1),
                       imbalance=described["imbalance"], schedule_run=described["schedule_run"],
                       cut=described["stages"])
    return row


def parse(argv):
    p = Parser(prog="pipeline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lenet5"], choices=list(SHAPES))
    p.add_argument("--stages", nargs="+", type=positive_int, default=[2, 3])
    p.add_argument("--granularities", nargs="+", type=positive_int, default=[4, 8, 16])
    p.add_argument("--schedules", nargs="+", choices=("1f1b", "gpipe"), default=["1f1b", "gpipe"])
    p.add_argument("--batch", type=positive_int, default=256)
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per side")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per side")
    p.add_argument("--results", default=str(HERE / "results"), help="where the JSON goes")
    args = p.parse_args(argv)
    if max(args.granularities) > args.batch:
        p.error(f"--granularities {max(args.granularities)} is larger than --batch {args.batch}")
    return args


def main(argv=None) -> int:
    import tempfile

    args = parse(argv)
    started = datetime.now(timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetero_nn-pipeline-") as cache:
        args.cache = cache
        for name in args.models:
            for stages in args.stages:
                for g in args.granularities:
                    for schedule in (None, *args.schedules):
                        row = run_side(name, stages, g, schedule, args)
                        rows.append(row)
                        bubble = row.get("bubble")
                        print(f"{name} P={stages} g={g} {row['side']}: "
                              f"{row['images_per_s']:.0f} images/s"
                              + ("" if bubble is None else
                                 f", bubble {bubble:.2f} (ideal {row['ideal_bubble']:.2f})"))
    options = {k: v for k, v in vars(args).items() if k != "cache"}
    document = {**_results.head("pipeline", started, argv, options), "rows": rows}
    print(f"wrote {_results.write(document, args.results, 'pipeline', started)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
