"""Spiking networks: training steps against snnTorch, the event-driven dense layer's
crossover, and recomputation through time.

Three parts (``--parts``, all by default), float32 throughout:

``steps``
    One training step of ``snn-mlp`` and ``snn-conv`` (``--models``; batch ``--batch``,
    ``--time-steps`` T, encodings ``--encodings``), Adam (lr 5e-4) on the membrane
    cross-entropy summed over the steps: hetero_nn on ``cpu:W`` workers (``--workers``,
    BLAS held to one thread per worker by the runtime) at each ``--granularities`` g,
    with the performance model active in a private cache (so it picks the dense or the
    event-driven variant of the layers fed by spikes), and once more with the dense
    variant pinned (``events off``: the sparse variant's gain is the ratio of the two);
    against snnTorch's ``snn.Leaky`` (fast-sigmoid surrogate) twin with the same
    weights, ``torch.set_num_threads(W)``, stepping through time as snnTorch does
    (``--snntorch-layout same``: the layers before ``Repeat`` once, as hetero_nn's model
    runs them; ``tutorial``: every layer at every step, as snnTorch's tutorials write it;
    a rate-coded twin draws with ``snntorch.spikegen.rate`` inside the step). Rows: step
    time, images per second, the ratio to snnTorch, and the spike rates the layers fed by
    spikes measured.
``sparse``
    The crossover rate: ``spike_dense_fwd`` + ``spike_dense_bwd_params`` on one worker
    thread for each of ``snn-mlp``'s dense layers (rows ``batch * T``) at each
    ``--rates`` input spike rate, their ``cpu`` (dense) and ``cpu:events`` variants
    against the BLAS dense codelets a Dense layer runs otherwise (``dense_fwd`` +
    ``dense_bwd_params``, ``ref``); the crossover is the rate (interpolated) below which
    the event-driven variant is faster.
``recompute``
    ``LIF(recompute=k)`` for k in ``--recompute`` on every spiking LIF: the arena's high
    water over one step (bytes; the step submitted, not replayed, so its temporaries come
    from the arena) and the step time (replayed, as training runs).

Timing: ``--warmup`` untimed steps per configuration, then ``--rounds`` interleaved
rounds of ``--steps`` timed steps (every configuration in turn per round, so the load of
a shared machine spreads over all); figures are medians over the rounds. Batches are
sparse strokes of intensity in [0, 1] (seeded), or the first MNIST training images with
``--data-dir`` (the spike rates then are those of real digits). ``--json`` writes every
row with the git commit, versions and machine. Examples::

    python benchmarks/bench_spiking.py --json spiking.json
    python benchmarks/bench_spiking.py --parts steps --models snn-mlp --batch 16 \\
        --time-steps 5 --rounds 1 --steps 1 --warmup 1
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_timing import REPO, Parser, interleave  # noqa: E402  (puts the checkout first)

from hetero_nn.cli.options import positive_int  # noqa: E402

LR = 5e-4
SHAPE = (1, 28, 28)


# --------------------------------------------------------------------------- data

@functools.lru_cache(maxsize=1)
def mnist(data_dir):
    import hetero_nn as hn
    from hetero_nn.snn_models import intensities
    data = hn.datasets.load("mnist", "train", data_dir=data_dir)
    intensities(data)
    return data


def batches(spec, seed, n):
    """``n`` batches ``(x in [0, 1], labels)``: MNIST's first training images (offset by
    the seed) with a data directory, else seeded sparse strokes."""
    batch = spec["batch"]
    if spec.get("data_dir"):
        data = mnist(spec["data_dir"])
        start = (seed * n * batch) % (len(data) - n * batch)
        return [data.batch(np.arange(start + i * batch, start + (i + 1) * batch))
                for i in range(n)]
    rng = np.random.default_rng(seed)
    return [(np.where(rng.random((batch, *SHAPE)) < 0.2, rng.random((batch, *SHAPE)),
                      0.0).astype(np.float32), rng.integers(0, 10, batch)) for _ in range(n)]


def build(spec):
    import hetero_nn as hn
    model = hn.build_model(spec["model"], SHAPE, 10, seed=0, encoding=spec["encoding"],
                           time_steps=spec["time_steps"])
    for layer in model:
        if isinstance(layer, hn.layers.LIF) and layer.output == "spikes":
            layer.recompute = spec.get("recompute", 1)
    return model


# --------------------------------------------------------------------------- sides

class HeteroSide:
    """hetero_nn training the spiking model of ``spec`` (see the module docstring)."""

    def __init__(self, spec):
        import hetero_nn as hn
        from hetero_nn.codelets.pinned import PINNED_VARIANTS
        from hetero_nn.codelets.spike_dense import SAME_BITS
        self.spec = spec
        events = spec.get("events", True)
        self.label = (f"hetero_nn g={spec['g']}" + ("" if events else " events off")
                      + (f" recompute={spec['recompute']}" if spec.get("recompute", 1) > 1
                         else ""))
        variants = None
        if not events:  # the dense variant only, where the model could choose
            variants = {**PINNED_VARIANTS, **{name: (SAME_BITS[0],) for name in (
                "spike_dense_fwd", "spike_dense_fwd_nobias", "spike_dense_bwd_params",
                "spike_dense_bwd_weight")}}
        self.model = build(spec)
        self.rt = hn.Runtime(devices=f"cpu:{spec['workers']}", perfmodel=spec["cache"],
                             variants=variants)
        self.trainer = hn.Trainer(self.model, hn.losses.MembraneCrossEntropy(),
                                  hn.optim.Adam(lr=LR), self.rt, batch_size=spec["batch"],
                                  granularity=spec["g"])
        self.rounds, self.kernels, self.timed = [], {}, 0

    def run(self, seed, n, timed):
        data = batches(self.spec, seed, n)
        steps = []
        for x, y in data:
            self.rt.trace(clear=True)
            t0 = time.perf_counter()
            self.trainer.train_step(x, y)
            steps.append(time.perf_counter() - t0)
            if timed:
                self.timed += 1
                for r in self.rt.trace(clear=True):
                    key = f"{r.codelet}/{r.variant}"
                    self.kernels[key] = self.kernels.get(key, 0.0) + r.end - r.start
        if timed:
            self.rounds.append(statistics.median(steps))

    def summary(self):
        rates = [s.rate for s in (getattr(m, "spike_input", None) for m in self.model.modules())
                 if s is not None]
        return {"config": self.label, "step_s": statistics.median(self.rounds),
                "input_spike_rates": rates,
                "kernels_ms": {k: 1e3 * v / self.timed for k, v in sorted(self.kernels.items())}}

    def close(self):
        self.trainer.close()
        self.rt.close()


class SnnTorchSide:
    """snnTorch (``snn.Leaky`` twin, same weights) stepping through time."""

    def __init__(self, spec):
        import torch
        sys.path.insert(0, str(REPO / "tests"))
        from snn_twins import snn_twin
        self.torch, self.spec = torch, spec
        torch.set_num_threads(spec["threads"])
        self.label = f"snntorch {spec['threads']} thread(s), {spec['layout']} layout"
        self.twin = snn_twin(build(spec), "float32", once=spec["layout"] == "same")
        self.opt = torch.optim.Adam(self.twin.parameters(), lr=LR)
        self.rounds = []

    def run(self, seed, n, timed):
        torch = self.torch
        from snntorch import spikegen
        torch.set_num_threads(self.spec["threads"])
        steps = []
        for x, y in batches(self.spec, seed, n):
            t0 = time.perf_counter()
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            spikes = None
            if self.spec["encoding"] == "rate":
                spikes = spikegen.rate(x, num_steps=self.spec["time_steps"]).transpose(0, 1)
            self.opt.zero_grad()
            out, _ = self.twin(x, spikes)
            loss = sum(torch.nn.functional.cross_entropy(out[:, t], y)
                       for t in range(out.shape[1]))
            loss.backward()
            self.opt.step()
            loss.item()
            steps.append(time.perf_counter() - t0)
        if timed:
            self.rounds.append(statistics.median(steps))

    def summary(self):
        return {"config": self.label, "step_s": statistics.median(self.rounds)}

    def close(self):
        pass


class Runner:
    """A side behind :func:`step_timing.interleave`'s interface."""

    def __init__(self, side):
        self.side = side

    def run(self, seed, n, timed):
        self.side.run(seed, n, timed)

    def summary(self):
        return self.side.summary()

    def close(self):
        self.side.close()


def timed_rows(specs, args, reference_label="snntorch"):
    runners = []
    try:
        for spec in specs:
            side = SnnTorchSide(spec) if spec["kind"] == "snntorch" else HeteroSide(spec)
            runners.append(Runner(side))
        interleave(runners, args.warmup, args.rounds, args.steps)
        summaries = [r.summary() for r in runners]
    finally:
        for r in runners:
            r.close()
    reference = next((s["step_s"] for s in summaries if s["config"].startswith(reference_label)),
                     summaries[0]["step_s"])
    for s, spec in zip(summaries, specs):
        s.update(model=spec["model"], encoding=spec["encoding"], batch=spec["batch"],
                 time_steps=spec["time_steps"], step_ms=1e3 * s["step_s"],
                 images_per_s=spec["batch"] / s["step_s"], ratio=reference / s["step_s"])
    return summaries


# --------------------------------------------------------------------------- parts

def part_steps(args, cache):
    rows = []
    for model in args.models:
        for encoding in args.encodings:
            common = {"model": model, "encoding": encoding, "batch": args.batch,
                      "time_steps": args.time_steps, "data_dir": args.data_dir}
            specs = [{"kind": "snntorch", "threads": args.workers, "layout": layout, **common}
                     for layout in args.snntorch_layout]
            for g in args.granularities:
                for events in (True, False):
                    specs.append({"kind": "hetero_nn", "g": g, "events": events,
                                  "workers": args.workers, "cache": cache, **common})
            rows += timed_rows(specs, args)
            print_rows(rows[-len(specs):], f"{model}, {encoding} encoding")
    return rows


def part_recompute(args, cache):
    import hetero_nn as hn
    rows = []
    for model in args.models:
        common = {"model": model, "encoding": "direct", "batch": args.batch,
                  "time_steps": args.time_steps, "data_dir": args.data_dir}
        specs = [{"kind": "hetero_nn", "g": args.granularities[0], "workers": args.workers,
                  "cache": cache, "recompute": k, **common} for k in args.recompute]
        timed = timed_rows(specs, args, reference_label="hetero_nn")
        for spec, row in zip(specs, timed):
            model_k = build(spec)
            with hn.Runtime(devices=f"cpu:{args.workers}", perfmodel=False) as rt:
                trainer = hn.Trainer(model_k, hn.losses.MembraneCrossEntropy(), runtime=rt,
                                     batch_size=args.batch, granularity=spec["g"], replay=False)
                trainer.train_step(*batches(spec, 0, 1)[0])
                row["arena_high_water_bytes"] = sum(n.arena.stats.high_water for n in rt.nodes)
            row["recompute"] = spec["recompute"]
        rows += timed
        print_rows(timed, f"{model}, recompute", extra="arena_high_water_bytes")
    return rows


def part_sparse(args):
    from threadpoolctl import threadpool_limits

    from hetero_nn.codelets.dense import dense_bwd_params, dense_fwd
    from hetero_nn.codelets.spike_dense import spike_dense_bwd_params, spike_dense_fwd

    layers = [(784, 1000), (1000, 10)] if "snn-mlp" in args.models else [(784, 1000)]
    rows_n = args.batch * args.time_steps
    rng = np.random.default_rng(0)
    cases = {"events": (spike_dense_fwd, spike_dense_bwd_params, "cpu:events"),
             "dense": (spike_dense_fwd, spike_dense_bwd_params, "cpu"),
             "blas": (dense_fwd, dense_bwd_params, "ref")}
    rows = []
    with threadpool_limits(1):
        for n_in, n_out in layers:
            w = rng.standard_normal((n_out, n_in)).astype(np.float32)
            b = np.zeros(n_out, np.float32)
            dy = rng.standard_normal((rows_n, n_out)).astype(np.float32)
            y, dw, db = np.empty((rows_n, n_out), np.float32), np.zeros_like(w), np.zeros_like(b)
            count = np.zeros((), np.int64)
            for rate in args.rates:
                x = (rng.random((rows_n, n_in)) < rate).astype(np.float32)
                times = {k: [] for k in cases}

                def once(k):
                    fwd, bwd, v = cases[k]
                    extra = (count,) if fwd is spike_dense_fwd else ()
                    kw = {"rate": rate} if fwd is spike_dense_fwd else {}
                    t0 = time.perf_counter()
                    fwd.variants[v](x, w, b, y, *extra, **kw)
                    bwd.variants[v](x, dy, dw, db, **kw)
                    return time.perf_counter() - t0

                for k in cases:
                    for _ in range(args.warmup):
                        once(k)
                for _ in range(args.rounds):
                    for k in cases:
                        times[k].append(statistics.median(once(k) for _ in range(args.steps)))
                row = {"layer": f"{n_in}->{n_out}", "rows": rows_n, "rate": rate,
                       **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}}
                rows.append(row)
                print(f"  {row['layer']:>9} rate {rate:5.3f}: " + "  ".join(
                    f"{k} {row[f'{k}_ms']:8.2f} ms" for k in cases), flush=True)
    crossovers = {}
    for layer in {r["layer"] for r in rows}:
        mine = [r for r in rows if r["layer"] == layer]
        crossovers[layer] = {k: crossover(mine, k) for k in ("dense", "blas")}
        print(f"  {layer}: events faster below rate {crossovers[layer]['dense']} (vs the dense "
              f"variant), {crossovers[layer]['blas']} (vs BLAS)")
    return rows, crossovers


def crossover(rows, other):
    """The rate (interpolated) where the event-driven time meets ``other``'s; None when
    one is faster at every rate measured."""
    rows = sorted(rows, key=lambda r: r["rate"])
    diff = [(r["rate"], r["events_ms"] - r[f"{other}_ms"]) for r in rows]
    for (r0, d0), (r1, d1) in zip(diff, diff[1:]):
        if d0 <= 0 < d1:
            return r0 + (r1 - r0) * (-d0) / (d1 - d0)
    return None


def print_rows(rows, title, extra=None):
    print(f"{title}:")
    for r in rows:
        line = (f"  {r['config']:45s} {r['step_ms']:9.1f} ms  {r['images_per_s']:8.1f} img/s  "
                f"x{r['ratio']:.2f}")
        if r.get("input_spike_rates"):
            line += "  rates " + ",".join(f"{x:.3f}" for x in r["input_spike_rates"] if x)
        if extra:
            line += f"  {extra} {r.get(extra)}"
        print(line, flush=True)


def main(argv=None) -> int:
    p = Parser(prog="bench_spiking.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", choices=("steps", "sparse", "recompute"),
                   default=["steps", "sparse", "recompute"])
    p.add_argument("--models", nargs="+", choices=("snn-mlp", "snn-conv"),
                   default=["snn-mlp", "snn-conv"])
    p.add_argument("--encodings", nargs="+", choices=("direct", "rate"),
                   default=["direct", "rate"])
    p.add_argument("--batch", type=positive_int, default=128)
    p.add_argument("--time-steps", type=positive_int, default=25)
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--granularities", type=positive_int, nargs="+", default=[2])
    p.add_argument("--snntorch-layout", nargs="+", choices=("same", "tutorial"),
                   default=["same", "tutorial"])
    p.add_argument("--rates", type=float, nargs="+",
                   default=[0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
    p.add_argument("--recompute", type=positive_int, nargs="+", default=[1, 5, 25])
    p.add_argument("--warmup", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--data-dir", help="time on MNIST's first training images from here")
    p.add_argument("--json", help="write the rows, with provenance, to this file")
    args = p.parse_args(argv)
    try:
        import snntorch  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        if "steps" in args.parts:
            p.error("snnTorch and PyTorch are needed for --parts steps (pip install snntorch)")

    from hetero_nn.cli.run_folder import environment
    from hetero_nn.fileio import atomic_write_text

    document = {"benchmark": "spiking", "command": [sys.executable, *sys.argv], **environment(),
                "options": vars(args)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hetero_nn-bench-spiking-") as cache:
        if "steps" in args.parts:
            document["steps"] = part_steps(args, cache)
        if "sparse" in args.parts:
            document["sparse"], document["crossover_rate"] = part_sparse(args)
        if "recompute" in args.parts:
            document["recompute"] = part_recompute(args, cache)
    document["wall_seconds"] = time.perf_counter() - t0
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
