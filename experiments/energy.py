"""Energy: joules per image of hetero_nn and of PyTorch training the same model on the
same batches, read from the machine's counters (:mod:`hetero_nn.energy`).

Each side (hetero_nn at granularity ``--g`` on ``--devices``; PyTorch's twin of the
same network with the same initial weights and as many threads as hetero_nn has CPU
workers, float32, SGD with momentum: ``benchmarks/step_timing.py``'s sides) takes
``--warmup`` untimed steps, then ``--steps`` steps on the seeded synthetic batches
of ``--shape`` inside an :class:`~hetero_nn.energy.EnergyMeter`. The sides run one
after the other, never side by side: RAPL and NVML count the whole package, DRAM or
GPU, not one process. An idle interval of ``--idle-seconds`` is metered too, so a
reader can see the machine's floor; no figure is corrected by it.

Where the machine has no counter (this development machine: no ``/sys/class/powercap``,
no NVIDIA driver), every ``joules`` is ``null`` and ``reason`` says why; nothing is
estimated. Output: ``experiments/results/energy-<UTC time>.json`` and a copy as
``energy-latest.json`` with the git commit, versions, machine, command line, options,
the counters found and one row per side. ``docs/energy.md`` says how to read them.

Examples::

    python experiments/energy.py                                  # lenet5, 200 steps
    python experiments/energy.py --model resnet-small --shape 3 32 32 --batch 128
    python experiments/energy.py --devices cpu:1,cuda:1 --steps 500   # on a GPU machine
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from step_timing import Parser, make_side, synthetic_batches  # noqa: E402

sys.path.insert(0, str(HERE))
import _results  # noqa: E402

from hetero_nn.cli.options import positive_int  # noqa: E402


def metered_run(side, spec, args, meter) -> dict:
    """``--warmup`` steps, then ``--steps`` steps inside ``meter``: the side's row."""
    shape, batch = tuple(spec["shape"]), spec["batch"]
    side.run(synthetic_batches(shape, batch, args.warmup, 1), timed=False)
    t0 = time.perf_counter()
    meter.start()
    side.run(synthetic_batches(shape, batch, args.steps, 2), timed=False)
    reading = meter.stop()
    seconds = time.perf_counter() - t0
    images = args.steps * batch
    return {"side": spec["kind"], "config": side.label, "steps": args.steps, "images": images,
            "seconds": seconds, "images_per_s": images / seconds,
            "energy": reading.to_json(images)}


def sides(args) -> list[dict]:
    common = {"model": args.model, "shape": list(args.shape), "batch": args.batch}
    cpus = sum(int(part.partition(":")[2] or 1) for part in args.devices.split(",")
               if part.startswith("cpu"))
    out = [{"kind": "hetero_nn", "g": args.g, "fuse": True, "workers": max(cpus, 1),
            "devices": args.devices, "policy": args.policy, "cache": args.cache, **common}]
    if not args.no_torch:
        out.append({"kind": "pytorch", "threads": max(cpus, 1), **common})
    return out


def parse(argv):
    import hetero_nn as hn
    p = Parser(prog="energy.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="lenet5", choices=list(hn.models.MODELS))
    p.add_argument("--shape", nargs=3, type=positive_int, default=[1, 28, 28],
                   metavar=("C", "H", "W"))
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--g", type=positive_int, default=2, help="hetero_nn's granularity")
    p.add_argument("--devices", default="cpu:2", help="hetero_nn's devices (default cpu:2)")
    p.add_argument("--policy", default="dmda")
    p.add_argument("--steps", type=positive_int, default=200, help="metered steps per side")
    p.add_argument("--warmup", type=positive_int, default=5, help="untimed steps per side")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="seconds of idle machine metered (0: none)")
    p.add_argument("--poll-seconds", type=float, default=30.0,
                   help="how often the counters are read while a side runs")
    p.add_argument("--no-torch", action="store_true", help="hetero_nn only")
    p.add_argument("--results", default=str(HERE / "results"), help="where the JSON goes")
    args = p.parse_args(argv)
    if args.idle_seconds < 0:
        p.error(f"--idle-seconds: expected a non-negative number, got {args.idle_seconds}")
    try:
        hn.build_model(args.model, tuple(args.shape), 10)
        hn.Runtime(devices=args.devices, perfmodel=False).close()
    except hn.HeteroNNError as exc:
        p.error(f"--model/--shape/--devices: {exc}")
    if args.g > args.batch:
        p.error(f"--g {args.g} is larger than --batch {args.batch}")
    return args


def main(argv=None) -> int:
    import tempfile

    from hetero_nn.energy import EnergyMeter

    args = parse(argv)
    if not args.no_torch and _results.torch_missing("energy.py",
                                                    "give --no-torch to meter hetero_nn alone"):
        return 2
    started = datetime.now(timezone.utc)
    meter = EnergyMeter(poll_seconds=args.poll_seconds)
    idle = None
    if args.idle_seconds:
        meter.start()
        time.sleep(args.idle_seconds)
        idle = meter.stop().to_json()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetero_nn-energy-") as cache:
        args.cache = cache
        for spec in sides(args):
            side = make_side(spec)
            try:
                rows.append(metered_run(side, spec, args, meter))
            finally:
                side.close()
    options = {k: v for k, v in vars(args).items() if k != "cache"}
    document = {**_results.head("energy", started, argv, options),
                "counters": [{"name": c.name, "source": c.source} for c in meter.counters],
                "unavailable": list(meter.unavailable), "idle": idle, "rows": rows}
    path = _results.write(document, args.results, "energy", started)
    for row in rows:
        e = row["energy"]
        what = (f"{e['joules']:.1f} J, {1e3 * e['joules_per_image']:.2f} mJ/image"
                if e["joules"] is not None else f"no reading: {e['reason']}")
        print(f"{row['config']}: {row['images_per_s']:.0f} images/s, {what}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
