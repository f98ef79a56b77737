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
with no FLOP count (copies, reductions) are left out. Batch norm and the element-wise
codelets do count theirs and keep their rows, but they are bandwidth-bound: their share
of sgemm says how far they are from arithmetic's limit, not from their own.

The step sums (issue 28's goal, "summed over the step") add the rows of the dense
convolutions' codelets by pass: the forward (``conv2d*_fwd*``, fused ones included) and
the backward (``conv2d*_bwd*``: input and weight gradients). Depthwise convolutions are
left out (not GEMM-shaped; their rows stay). A trace ``train --trace`` wrote says how
many of its records are the training steps' (``step_tasks``): the rows and sums then
cover those steps, not the validation pass that ends the run.

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

__all__ = ["SGEMM_FILE", "codelet_flops", "conv_pass", "format_roofline", "model_flops",
           "roofline_rows", "sgemm_rate", "step_records", "step_sums"]

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
    loss = spiking_loss(ckpt.config.get("model", {}).get("name"))
    return model_flops(model, loss, batch, g)


def model_flops(model, loss, batch: int, granularity: int, evaluate: bool = True) -> dict:
    """``{codelet: (tasks, flops)}`` of one training step of ``model`` (and one evaluation
    batch if ``evaluate``) at ``batch`` images in ``granularity`` partitions, captured
    without running on a runtime of its own (``loss`` None: the trainer's default)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.input_shape)).astype(model.dtype)
    y = rng.integers(0, model.output_shape[-1], batch)
    counts = defaultdict(lambda: [0, 0.0])
    with Runtime(devices="cpu:1", trace=False, perfmodel=False) as rt:
        trainer = Trainer(model, loss, runtime=rt, batch_size=batch, granularity=granularity)
        steps = [lambda: trainer.train_step(x, y)]
        if evaluate:
            steps.append(lambda: trainer.evaluate_batch(x, y))
        for submit in steps:
            step = capture(rt, submit, steps=2)[-1]  # the first binds the model
            for graph in step.graphs:
                for t in graph:
                    if t.codelet.flops is not None:
                        counts[t.codelet.name][0] += 1
                        counts[t.codelet.name][1] += t.size
    return {name: (n, flops) for name, (n, flops) in counts.items()}


def conv_pass(codelet: str) -> str | None:
    """``"forward"`` or ``"backward"`` for a dense convolution's codelet, else None."""
    if "conv2d" not in codelet or "depthwise" in codelet:
        return None
    return "forward" if "_fwd" in codelet else "backward" if "_bwd" in codelet else None


def step_records(trace) -> tuple[list, str]:
    """The training steps' records of ``trace`` and a line saying what they cover: the
    first ``step_tasks`` records where ``train --trace`` said so, else every record."""
    n = trace.metadata.get("step_tasks")
    if not isinstance(n, int) or not 0 < n <= len(trace.records):
        return list(trace.records), f"every task of the trace ({len(trace.records)})"
    steps = trace.metadata.get("global_steps") or ["?", "?"]
    left = len(trace.records) - n
    return (list(trace.records[:n]), f"training steps {steps[0]}..{steps[1]} ({n} tasks"
            + (f"; the validation pass's {left} left out)" if left else ")"))


def roofline_rows(records, flops: dict, rate: float) -> list[dict]:
    """Per codelet of ``records`` (task records) with a FLOP count: tasks, GFLOP, seconds,
    GFLOP/s and the share of ``rate`` (GFLOP/s), most time first; a last row ``"total"``."""
    seconds, tasks = defaultdict(float), defaultdict(int)
    for r in records:
        if r.codelet in flops:
            seconds[r.codelet] += r.duration
            tasks[r.codelet] += 1
    rows = []
    for name in sorted(seconds, key=seconds.get, reverse=True):
        n, total = flops[name]
        gflop = tasks[name] * total / n / 1e9
        rows.append(_rated({"codelet": name, "tasks": tasks[name], "gflop": gflop,
                            "seconds": seconds[name]}, rate))
    return [*rows, _summed("total", rows, rate)] if rows else []


def _summed(name, rows, rate) -> dict:
    return _rated({"codelet": name, "tasks": sum(r["tasks"] for r in rows),
                   "gflop": sum(r["gflop"] for r in rows),
                   "seconds": sum(r["seconds"] for r in rows)}, rate)


def _rated(row, rate) -> dict:
    row["gflops"] = row["gflop"] / row["seconds"] if row["seconds"] > 0 else 0.0
    row["share"] = row["gflops"] / rate
    return row


def step_sums(rows, rate: float) -> list[dict]:
    """The dense convolutions' rows of :func:`roofline_rows` summed by pass (module
    docstring): rows ``"conv forward"`` and ``"conv backward"``, where the trace has them."""
    return [_summed(f"conv {p}", chosen, rate) for p in ("forward", "backward")
            if (chosen := [r for r in rows if conv_pass(r["codelet"]) == p])]


def format_roofline(rows, rate: float, sums=(), covers: str | None = None) -> str:
    lines = [f"roofline: sgemm on one thread {rate:.1f} GFLOP/s "
             f"({SGEMM_FILE} in the cache directory)"]
    if covers:
        lines.append(f"over {covers}")
    lines.append(f"{'codelet':36s} {'tasks':>6s} {'GFLOP':>9s} {'seconds':>9s} {'GFLOP/s':>8s} "
                 f"{'of sgemm':>8s}")
    for r in rows:
        lines.append(_line(r))
    if not rows:
        lines.append("(no task of a codelet with a FLOP count in this trace)")
    if sums:
        lines.append("step sums of the convolutions (backward: input and weight gradients):")
        lines += [_line(r) for r in sums]
    return "\n".join(lines)


def _line(r) -> str:
    return (f"{r['codelet']:36s} {r['tasks']:6d} {r['gflop']:9.3f} {r['seconds']:9.4f} "
            f"{r['gflops']:8.1f} {r['share']:8.0%}")
