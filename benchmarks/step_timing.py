"""Timed training steps, hetero_nn against PyTorch: the measuring core that
``benchmarks/bench_training.py`` and ``experiments/granularity.py`` share.

A *side* is one configuration under test, described by a spec (a plain dict, so it
can cross a process boundary):

- ``{"kind": "hetero_nn", "model", "shape", "batch", "g", "fuse", "workers", "cache"}``
  (and optionally ``"policy"``, default ``"dmda"``):
  ``hn.build_model(model, shape, 10, seed=0)`` (``model.fuse = fuse``) trained by a
  :class:`~hetero_nn.Trainer` (SGD, lr 0.01, momentum 0.9; capture and replay, the
  Trainer's default) on ``Runtime(devices="cpu:W", policy=policy, perfmodel=cache)``,
  with ``batch`` split into ``g`` partitions (BLAS is held to one thread per worker by
  the runtime);
- ``{"kind": "pytorch", "model", "shape", "batch", "threads", "twin"}``: the same
  network with the same initial weights (``tests/twins.py``'s ``torch_twin``), float32,
  ``torch.set_num_threads(threads)``, the same optimizer; ``twin`` (optional) is a file
  :func:`save_twin` wrote, so a process that loads it never imports hetero_nn.

Timing policy (:func:`interleave`): every side takes ``warmup`` untimed steps, then
``rounds`` rounds of ``steps`` timed steps; round r times every side in turn on the
same seeded synthetic batches (:func:`synthetic_batches`), so load on a shared machine
spreads over all of them. A side's step time is the median over the rounds of each
round's median.

Per hetero_nn step, from the runtime's trace (outside the timed region): the number
of tasks, each worker's busy seconds (idle workers count 0), the *overhead* -- step
wall time minus the busiest worker's busy time: what the runtime costs over the
critical worker -- and each worker's *utilisation*, its busy share of the step's wall
time. Summaries give their medians over the timed steps, and the kernel milliseconds
per step of every (codelet, variant) that ran.

Where a side runs: :class:`Local` in this process; :class:`Remote` in a child process
of its own (this file run as a script, driven over a pipe one request at a time, so
rounds still interleave), which adds the child's peak resident set size
(``ru_maxrss``) once the side was built (``setup_rss_mib``) and at the end
(``peak_rss_mib``). The child generates each batch just before its step, so peak RSS
holds one batch, not a round's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# The checkout this file lives in is the one measured (not an installed hetero_nn).
for _path in (str(REPO / "tests"), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

LR, MOMENTUM = 0.01, 0.9
CLASSES = 10


# ---------------------------------------------------------------------------------------
# command lines
# ---------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2 (option
    types: ``hetero_nn.cli.options``', e.g. ``positive_int``)."""

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------

def synthetic_batches(shape, batch, n, seed):
    """``n`` batches of ``batch`` standard-normal float32 images of ``shape`` and int64
    labels in ``[0, 10)``, from ``numpy.random.default_rng(seed)``, one at a time."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield (rng.standard_normal((batch, *shape), dtype=np.float32),
               rng.integers(0, CLASSES, batch).astype(np.int64))


@functools.lru_cache(maxsize=1)
def _round_batches(shape, batch, n, seed):
    """One round's batches, kept while the sides of this process take their turn."""
    return tuple(synthetic_batches(shape, batch, n, seed))


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (``ru_maxrss``: KiB on Linux)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


# ---------------------------------------------------------------------------------------
# sides
# ---------------------------------------------------------------------------------------

class HeteroSide:
    """A hetero_nn configuration: a runtime, a trainer, and what its steps measured."""

    def __init__(self, spec):
        import hetero_nn as hn
        self.spec = spec
        g, fuse = spec["g"], spec["fuse"]
        policy = spec.get("policy", "dmda")
        self.label = f"hetero_nn g={g} {'fused' if fuse else 'unfused'}" + (
            "" if policy == "dmda" else f" {policy}")
        self.model = hn.build_model(spec["model"], tuple(spec["shape"]), CLASSES, seed=0)
        self.model.fuse = fuse
        self.rt = hn.Runtime(devices=f"cpu:{spec['workers']}", policy=policy,
                             perfmodel=spec.get("cache"))
        try:
            self.trainer = hn.Trainer(self.model, runtime=self.rt, batch_size=spec["batch"],
                                      optimizer=hn.optim.SGD(lr=LR, momentum=MOMENTUM),
                                      granularity=g)
        except BaseException:
            self.rt.close()
            raise
        self.rounds, self.steps, self.overheads, self.tasks = [], [], [], []
        self.busy_shares: dict[str, list[float]] = {}
        self.kernels: dict[tuple[str, str], float] = {}  # seconds over the timed steps

    def run(self, data, timed=True):
        """One step per batch of ``data``; ``timed`` steps are measured as one round."""
        start = len(self.steps)
        for x, y in data:
            self.rt.trace(clear=True)
            t0 = time.perf_counter()
            self.trainer.train_step(x, y)
            wall = time.perf_counter() - t0
            if not timed:
                continue
            trace = self.rt.trace(clear=True)
            busy = dict.fromkeys(trace.workers, 0.0)
            for r in trace:
                busy[r.worker] += r.end - r.start
                key = (r.codelet, r.variant)
                self.kernels[key] = self.kernels.get(key, 0.0) + (r.end - r.start)
            self.steps.append(wall)
            self.overheads.append(wall - max(busy.values(), default=0.0))
            self.tasks.append(len(trace))
            for worker, seconds in busy.items():
                self.busy_shares.setdefault(worker, []).append(seconds / wall)
        if timed and len(self.steps) > start:
            self.rounds.append(statistics.median(self.steps[start:]))

    def summary(self) -> dict:
        step = statistics.median(self.rounds)
        over = statistics.median(self.overheads)
        return {"config": self.label, "step_s": step, "tasks": int(statistics.median(self.tasks)),
                "overhead_s": over, "overhead_share": over / step,
                "utilisation": {w: statistics.median(v) for w, v in self.busy_shares.items()},
                # kernel ms per step by codelet and variant: which variants ran
                "kernels_ms": {f"{k[0]}/{k[1]}": 1e3 * t / len(self.steps)
                               for k, t in sorted(self.kernels.items())}}

    def close(self):
        self.trainer.close()
        self.rt.close()


class TorchSide:
    """The PyTorch twin of a built-in model, with the same initial weights and optimizer."""

    def __init__(self, spec):
        import torch
        self.torch = torch
        self.spec = spec
        self.threads = spec["threads"]
        self.label = f"pytorch {self.threads} thread{'s' if self.threads > 1 else ''}"
        if spec.get("twin"):
            self.twin = torch.load(spec["twin"], weights_only=False)
        else:
            self.twin = _make_twin(spec)
        self.opt = torch.optim.SGD(self.twin.parameters(), lr=LR, momentum=MOMENTUM)
        self.rounds, self.steps = [], []

    def run(self, data, timed=True):
        torch = self.torch
        torch.set_num_threads(self.threads)
        start = len(self.steps)
        for x, y in data:
            t0 = time.perf_counter()
            self.opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.twin(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            self.opt.step()
            loss.item()
            if timed:
                self.steps.append(time.perf_counter() - t0)
        if timed and len(self.steps) > start:
            self.rounds.append(statistics.median(self.steps[start:]))

    def summary(self) -> dict:
        return {"config": self.label, "step_s": statistics.median(self.rounds)}

    def close(self):
        pass


def _make_twin(spec):
    import hetero_nn as hn
    from twins import torch_twin
    return torch_twin(hn.build_model(spec["model"], tuple(spec["shape"]), CLASSES, seed=0),
                      "float32")


def save_twin(spec, path) -> str:
    """Write the PyTorch twin of ``spec``'s model (``torch.save``) to ``path``; return it."""
    import torch
    torch.save(_make_twin(spec), path)
    return str(path)


def make_side(spec):
    if spec["kind"] == "hetero_nn":
        return HeteroSide(spec)
    if spec["kind"] == "pytorch":
        return TorchSide(spec)
    raise ValueError(f"unknown side kind {spec['kind']!r}")


# ---------------------------------------------------------------------------------------
# where a side runs
# ---------------------------------------------------------------------------------------

class Local:
    """A side in this process; the sides of one round share its batches."""

    def __init__(self, spec):
        self.spec = spec
        self.side = make_side(spec)

    def run(self, seed, n, timed):
        data = _round_batches(tuple(self.spec["shape"]), self.spec["batch"], n, seed)
        self.side.run(data, timed)

    def summary(self) -> dict:
        return self.side.summary()

    def close(self):
        self.side.close()


class Remote:
    """A side in a child process of its own (for its peak RSS), one request at a time.

    The child starts at once; its first reply (the side built, its RSS then) is read
    with the first request, so children made one after the other build their sides
    side by side. Requests and replies are JSON lines on the child's stdin and on a copy
    of its stdout taken before the child points file descriptor 1 at stderr (so nothing
    else it prints can break the protocol). A child that fails replies
    ``{"error": line}``, raised here as RuntimeError.
    """

    def __init__(self, spec):
        self.spec = spec
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._ready = None

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"{self.spec['kind']} side process exited ({code}) "
                               f"without replying; spec {self.spec}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.spec['kind']} side process: {reply['error']}")
        return reply

    def _ask(self, request) -> dict:
        if self._ready is None:
            self._ready = self._reply()
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def run(self, seed, n, timed):
        self._ask({"op": "run", "seed": seed, "n": n, "timed": timed})

    def summary(self) -> dict:
        summary = self._ask({"op": "summary"})
        summary["setup_rss_mib"] = self._ready["setup_rss_mib"]
        return summary

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        self.proc.stdout.close()


def serve(spec) -> int:
    """The child's side of :class:`Remote`: build the side, answer requests until EOF."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(doc):
        replies.write(json.dumps(doc) + "\n")
        replies.flush()

    try:
        side = make_side(spec)
    except Exception as exc:  # the parent shows it in one line
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    try:
        reply({"setup_rss_mib": peak_rss_mib()})
        shape, batch = tuple(spec["shape"]), spec["batch"]
        for line in iter(sys.stdin.readline, ""):
            request = json.loads(line)
            if request["op"] == "run":
                side.run(synthetic_batches(shape, batch, request["n"], request["seed"]),
                         request["timed"])
                reply({"ok": True})
            elif request["op"] == "summary":
                reply({**side.summary(), "peak_rss_mib": peak_rss_mib()})
    except Exception as exc:
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        side.close()
    return 0


def interleave(runners, warmup, rounds, steps):
    """``warmup`` untimed steps on every runner, then ``rounds`` interleaved rounds of
    ``steps`` timed steps (round r on the batches of seed ``100 + r``)."""
    for runner in runners:
        runner.run(1, warmup, timed=False)
    for r in range(rounds):
        for runner in runners:
            runner.run(100 + r, steps, timed=True)
    _round_batches.cache_clear()


def figures(summary, batch, reference_step) -> dict:
    """A side's summary as a result row's figures: ``config, step_ms, images_per_s,
    ratio`` (``reference_step`` -- PyTorch's -- over this step time), and for hetero_nn
    ``tasks, overhead_ms, overhead_share, utilisation, kernels_ms`` (None for PyTorch)."""
    step, over = summary["step_s"], summary.get("overhead_s")
    return {"config": summary["config"], "step_ms": 1e3 * step, "images_per_s": batch / step,
            "ratio": reference_step / step, "tasks": summary.get("tasks"),
            "overhead_ms": None if over is None else 1e3 * over,
            "overhead_share": summary.get("overhead_share"),
            "utilisation": summary.get("utilisation"), "kernels_ms": summary.get("kernels_ms")}


def utilisation_text(utilisation) -> str:
    """``{"cpu0": 0.91, "cpu1": 0.62}`` as ``"91/62"`` (percent, worker order)."""
    return "/".join(f"{100 * share:.0f}" for share in utilisation.values())


if __name__ == "__main__":
    sys.exit(serve(json.loads(sys.argv[1])))
