"""``hetero-nn trace RUN --roofline``: each codelet's GFLOP/s in a traced run, and its share
of the machine's sgemm rate (a roofline per codelet).

Policy
------
Time comes from the trace: the summed durations of each codelet's task records.
FLOPs come from the tasks' shapes: the run's model is rebuilt from its checkpoint, and
one training step and one evaluation batch at the run's batch size, granularity and
dtype are captured without running (:func:`hetero_nn.simulation.simulate.capture`);
each task's FLOPs are its codelet's ``flops(*shapes, **params)``. A codelet's FLOPs in
the trace are its trace task count times its mean FLOPs per captured task. Codelets
with no FLOP count (copies, reductions, element-wise work) are left out: they are
bandwidth-bound, and a roofline of arithmetic says nothing of them.

The reference is sgemm on one thread (a worker runs one task on one core): float32
products of 512x512 by 512x4096 matrices through NumPy's BLAS, the best of three,
measured once and stored in the cache directory (``sgemm.json`` under
``HETERO_NN_CACHE``, with the machine and NumPy it was measured with), read by later
calls on the same machine.
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import CheckpointError, ConfigError
from ..fileio import atomic_write_text
from ..scheduler.perfmodel.model import default_cache_dir
from ..scheduler.runtime import Runtime
from ..simulation.simulate import capture
from ..snn_models import spiking_loss
from ..training import Trainer
from ..training.checkpoint import CHECKPOINT_NAME, FINAL_NAME, read_checkpoint, rebuild_model

__all__ = ["SGEMM_FILE", "codelet_flops", "roofline_rows", "format_roofline", "sgemm_rate"]

SGEMM_FILE = "sgemm.json"
_SGEMM_SHAPE = (512, 512, 4096)


def _machine() -> dict:
    return {"machine": platform.node(), "processor": platform.processor() or platform.machine(),
            "numpy": np.__version__}


def sgemm_rate(cache_dir=None, measure: bool = False) -> float:
    """One thread's sgemm rate in GFLOP/s: the stored figure for this machine, or
    measured now (and stored) when there is none or ``measure`` is set."""
    path = Path(cache_dir or default_cache_dir()) / SGEMM_FILE
    if not measure and path.is_file():
        try:
            doc = json.loads(path.read_text())
            if {k: doc.get(k) for k in _machine()} == _machine():
                return float(doc["gflops"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # measured again below
    m, k, n = _SGEMM_SHAPE
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    best = float("inf")
    with threadpool_limits(1, user_api="blas"):
        a @ b
        for _ in range(3):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    gflops = 2.0 * m * k * n / best / 1e9
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**_machine(), "gflops": gflops,
                                            "shape": list(_SGEMM_SHAPE)}) + "\n")
    except OSError:
        pass  # a cache that cannot be written: measured again next time
    return gflops


def _checkpoint(folder):
    for name in (FINAL_NAME, CHECKPOINT_NAME):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    raise ConfigError(f"--roofline: no {FINAL_NAME} or {CHECKPOINT_NAME} in {folder}: the "
                      "FLOPs come from the run's model (train with --out)")


def codelet_flops(folder) -> dict:
    """``{codelet: (tasks, flops)}`` of one training step and one evaluation batch of the
    run in ``folder``, captured without running (module docstring)."""
    path = _checkpoint(folder)
    try:
        ckpt = read_checkpoint(path)
        model = rebuild_model(ckpt)
    except CheckpointError as exc:
        raise ConfigError(f"--roofline: {exc}") from None
    batch = int(ckpt.config.get("batch_size", 64))
    g = min(int(ckpt.config.get("granularity") or 1), batch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.input_shape)).astype(model.dtype)
    y = rng.integers(0, model.output_shape[-1], batch)
    loss = spiking_loss(ckpt.config.get("model", {}).get("name"))
    counts = defaultdict(lambda: [0, 0.0])
    with Runtime(devices="cpu:1", trace=False, perfmodel=False) as rt:
        trainer = Trainer(model, loss, runtime=rt, batch_size=batch, granularity=g)
        for submit in (lambda: trainer.train_step(x, y), lambda: trainer.evaluate_batch(x, y)):
            step = capture(rt, submit, steps=2)[-1]  # the first binds the model
            for graph in step.graphs:
                for t in graph:
                    if t.codelet.flops is not None:
                        counts[t.codelet.name][0] += 1
                        counts[t.codelet.name][1] += t.size
    return {name: (n, flops) for name, (n, flops) in counts.items()}


def roofline_rows(trace, flops: dict, rate: float) -> list[dict]:
    """Per codelet of ``trace`` with a FLOP count: tasks, GFLOP, seconds, GFLOP/s and the
    share of ``rate`` (GFLOP/s), most time first; a last row ``"total"``."""
    seconds, tasks = defaultdict(float), defaultdict(int)
    for r in trace.records:
        if r.codelet in flops:
            seconds[r.codelet] += r.duration
            tasks[r.codelet] += 1
    rows = []
    for name in sorted(seconds, key=seconds.get, reverse=True):
        n, total = flops[name]
        gflop = tasks[name] * total / n / 1e9
        rows.append({"codelet": name, "tasks": tasks[name], "gflop": gflop,
                     "seconds": seconds[name]})
    total = {"codelet": "total", "tasks": sum(tasks.values()),
             "gflop": sum(r["gflop"] for r in rows), "seconds": sum(seconds.values())}
    for row in [*rows, total]:
        row["gflops"] = row["gflop"] / row["seconds"] if row["seconds"] > 0 else 0.0
        row["share"] = row["gflops"] / rate
    return [*rows, total] if rows else []


def format_roofline(rows, rate: float) -> str:
    lines = [f"roofline: sgemm on one thread {rate:.1f} GFLOP/s "
             f"({SGEMM_FILE} in the cache directory)",
             f"{'codelet':36s} {'tasks':>6s} {'GFLOP':>9s} {'seconds':>9s} {'GFLOP/s':>8s} "
             f"{'of sgemm':>8s}"]
    for r in rows:
        lines.append(f"{r['codelet']:36s} {r['tasks']:6d} {r['gflop']:9.3f} {r['seconds']:9.4f} "
                     f"{r['gflops']:8.1f} {r['share']:8.0%}")
    if not rows:
        lines.append("(no task of a codelet with a FLOP count in this trace)")
    return "\n".join(lines)
