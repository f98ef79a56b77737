"""A training run's output folder, the facts it records, and Ctrl-C during a run.

This module owns the files of ``hetero-nn train --out DIR``, every one written
under a temporary name and renamed: ``metrics.json`` (config, devices, the
variants that ran per codelet, per-epoch metrics, final test accuracy; rewritten
after every epoch), ``metrics.csv``, ``trace.json`` (Chrome trace of the last
``--trace-steps`` steps, with ``--trace``), ``checkpoint.npz`` (every
``--checkpoint-every`` steps and every epoch end) and ``checkpoint-final.npz`` (the
end of training). The folder is checked before anything is loaded or trained
(:func:`check_out`): one that cannot be written is refused, and so is one holding
another run's files unless the run resumed is that folder's own (``--resume``, or
``--resume DIR/checkpoint.npz``) or the run replaces it (``--overwrite``, which
removes those files first). ``--resume FILE --out DIR`` with FILE elsewhere is a new
run in DIR as far as DIR is concerned: refused there with the same message, unless
``--overwrite``.

A folder that holds a run always holds a checkpoint that loads: the run writes
``checkpoint.npz`` (its state at the start, step 0 or the state resumed) before any
other file, and every write is atomic (:mod:`hetero_nn.fileio`), so a run killed at
any moment, even inside a write, leaves a folder that ``--resume`` continues bit for
bit. Temporary files a killed run left behind are removed when the next run starts.

It also owns the facts a result file records about where it was made
(:func:`environment`: versions, machine, git commit; experiments and benchmarks use
it too) and the signal handling of a run (:class:`Interrupts`): SIGINT (Ctrl-C) and
SIGTERM end a run at the end of the step in progress, after writing a checkpoint
there, with one line that gives the exact command that resumes it
(:func:`resume_command`); a second signal stops the run at once (every file on disk
stays whole: the write it interrupts is abandoned, its temporary removed). The Dask
worker processes a command starts ignore SIGINT (:func:`ignoring_sigint`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numba
import numpy

from ..errors import ConfigError, TrainingDiverged
from ..training.progress import energy_total
from .. import __version__
from .launch import LAUNCH_DEFAULTS, LAUNCH_OPTIONS, flag
from ..fileio import atomic_write_text
from ..scheduler.trace.views import Trace
from ..training import HISTORY_KEYS
from ..training.checkpoint import CHECKPOINT_NAME, FINAL_NAME, remove_stale_temporaries

#: The files of a run in its --out folder besides its checkpoints (another run's refuse
#: a new run there).
RUN_FILES = ("metrics.json", "metrics.csv", "trace.json")


# ---------------------------------------------------------------------------------------
# Run facts: versions, machine, commit
# ---------------------------------------------------------------------------------------

def version() -> str:
    return __version__


def git_commit(path=None) -> str | None:
    """The commit of the git checkout holding ``path`` (default: this package), or None."""
    where = Path(path) if path else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                           capture_output=True, text=True, timeout=10)
    return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def environment() -> dict:
    """Versions of the stack and a description of the machine, for result files."""
    versions = {"hetero_nn": version(), "python": platform.python_version(),
                "numpy": numpy.__version__, "numba": numba.__version__}
    for name in ("dask", "distributed", "torch", "cupy"):
        module = sys.modules.get(name)
        if module is None and name in ("dask", "distributed"):
            try:
                module = __import__(name)
            except ImportError:
                module = None
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    machine = {"hostname": platform.node(), "platform": platform.platform(),
               "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count()}
    try:
        machine["sched_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return {"git_commit": git_commit(), "versions": versions, "machine": machine}


# ---------------------------------------------------------------------------------------
# The output folder
# ---------------------------------------------------------------------------------------

def check_out(out, *, resuming, overwrite) -> list[Path]:
    """Refuse an ``--out`` that cannot be written or holds another run; return that run's files.

    ``resuming``: the run continues the checkpoint of this very folder (its files are
    the run's own). Runs before any data is loaded or any step trained, and writes
    nothing that stays: writing is tried in the folder, or in its nearest existing
    parent when it is not there yet (a probe file, created and removed), so read-only
    mounts and immutable folders are caught for root too. Nothing of an earlier run
    is touched.
    """
    if out is None:
        return []
    path = Path(out)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "exists and is not a folder" if existing == path else f"{existing} is not a folder"
        raise ConfigError(f"--out {out}: {where}")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".hetero_nn-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None

    names = (*RUN_FILES, CHECKPOINT_NAME, FINAL_NAME)
    found = [path / name for name in names if (path / name).exists()]
    if found and not resuming and not overwrite:
        raise ConfigError(f"--out {out} holds another run ({', '.join(p.name for p in found)}); "
                          "continue it with --resume, or pass --overwrite to replace it")
    return [] if resuming else found


def resumes_own(out, checkpoint_path) -> bool:
    """Whether ``checkpoint_path`` is in the folder ``out`` (resuming that folder's run)."""
    return out is not None and Path(checkpoint_path).resolve().parent == Path(out).resolve()


def worker_facts(rt) -> list[dict]:
    return [{"name": w.name, "kind": w.kind, "node": w.node.name} for w in rt.workers]


class RunFiles:
    """The output directory of a training run: metrics.json, metrics.csv, trace.json."""

    def __init__(self, out, run, rt, env, trainer):
        self.dir = Path(out) if out else None
        self.run, self.rt, self.env, self.trainer = run, rt, env, trainer
        self.t0 = time.perf_counter()
        #: {codelet: {variant: tasks}}: what actually ran, from the runtime's task records.
        self.variants_run: dict[str, dict[str, int]] = {}
        self.bubbles: list[dict] = []  # per pipelined step, Pipeline.bubble of its records
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.dir, RUN_FILES)  # a killed run's half-written files

    def count_variants(self, records) -> None:
        """Add the variants of ``records`` (TaskRecords) to :attr:`variants_run`."""
        for r in records:
            per_codelet = self.variants_run.setdefault(r.codelet, {})
            per_codelet[r.variant] = per_codelet.get(r.variant, 0) + 1

    def document(self, status, error=None) -> dict:
        t = self.trainer
        history = t.history
        last = history[-1] if history else {}
        return {"status": status, "error": error, "config": self.run,
                "devices": {"spec": str(self.rt.devices), "workers": worker_facts(self.rt),
                            "policy": self.rt.policy_name, "executor": self.rt.executor_name,
                            "deterministic": self.rt.deterministic,
                            "variants": list(self.rt.preferred)},
                "variants_run": {c: dict(sorted(v.items()))
                                 for c, v in sorted(self.variants_run.items())},
                "cluster": t.cluster.facts() if t.cluster is not None else None,
                "granularity": t.granularity,
                "granularity_decision": None if t.granularity_decision is None
                else t.granularity_decision.to_json(),
                "epochs": history,
                "test_accuracy": last.get("test_accuracy"), "test_loss": last.get("test_loss"),
                "train_seconds": sum(r["seconds"] for r in history),
                "wall_seconds": time.perf_counter() - self.t0,
                "global_step": t.global_step, "energy": energy_total(history),
                "pipeline": self.pipeline_facts(), **self.env}

    def count_bubble(self, records) -> None:
        """Keep the bubble fraction of a pipelined step from its task records."""
        pipeline = self.trainer.pipeline
        if pipeline is not None and pipeline.ops:
            bubble = pipeline.bubble(Trace(records))
            if bubble is not None:
                self.bubbles.append(bubble)

    def pipeline_facts(self) -> dict | None:
        """The stages, the schedule and the measured bubble (median over the steps after
        the first: capture and compilation), or None without a pipeline."""
        pipeline = self.trainer.pipeline
        if pipeline is None:
            return None
        kept = self.bubbles[1:] or self.bubbles

        def median(key):
            values = [b[key] for b in kept if b[key] is not None]
            return statistics.median(values) if values else None

        return {**pipeline.describe(), "bubble": median("bubble"),
                "ideal_bubble": self.bubbles[-1]["ideal"] if self.bubbles else None,
                "overhead_free_bubble": median("overhead_free"),
                "stage_imbalance": median("stage_imbalance"),
                "steps_measured": len(kept)}

    def write_metrics_after(self, exc) -> None:
        """The metrics of a run that ``exc`` ended (diverged, interrupted, failed); a
        failure to write them (the disk that filled up) never hides ``exc``."""
        status = ("diverged" if isinstance(exc, TrainingDiverged) else
                  "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        try:
            self.write_metrics(status, " ".join(str(exc).split()) or type(exc).__name__)
        except OSError:
            pass

    def write_metrics(self, status, error=None):
        if self.dir is None:
            return
        atomic_write_text(self.dir / "metrics.json",
                          json.dumps(self.document(status, error), indent=2) + "\n")
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(HISTORY_KEYS)
        for record in self.trainer.history:
            writer.writerow(["" if record.get(k) is None else record[k] for k in HISTORY_KEYS])
        atomic_write_text(self.dir / "metrics.csv", buf.getvalue())


# ---------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------

@contextmanager
def ignoring_sigint():
    """SIGINT ignored in the block, in the main thread: worker processes started in it
    inherit the disposition, so Ctrl-C reaches this process alone (which prints one
    line and closes them). Elsewhere than the main thread, a plain block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Interrupted(KeyboardInterrupt):
    """A run ended by a signal: ``signum``, and ``detail``, what was kept and how to go
    on (one line). :func:`hetero_nn.cli.main` prints it and exits with ``128 + signum``."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(detail)
        self.signum, self.detail = signum, detail


class Interrupts:
    """SIGINT and SIGTERM during a run: noted by the handler, acted on at the next step
    boundary.

    A KeyboardInterrupt raised wherever the main thread happens to be can land in a
    Dask callback that swallows it (the run goes on) or in the middle of a graph
    submission; raised from :meth:`check` (called between steps) it always ends the
    run cleanly, after the caller's ``at_boundary`` (which writes the checkpoint and
    says how to resume). A second signal raises :class:`Interrupted` at once. While
    the interrupted run shuts down, the logs of Dask (its client and cluster
    closing) are silenced, so the user sees one line. With ``defer=False`` (no step
    boundary to wait for) only the logs are silenced.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, defer: bool = True):
        self.signum = None  # the first signal received, once there is one
        self._defer = defer
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self):
        if self._defer and threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def _note(self, signum, _frame):
        if self.signum is not None:  # the second: stop now
            raise Interrupted(signum, "stopped at once by a second signal; the files written "
                                      "so far are whole")
        self.signum = signum

    def check(self, at_boundary=None) -> None:
        """Raise :class:`Interrupted` if a signal came since the run began, after
        ``at_boundary()`` (whose string is the message's detail)."""
        if self.signum is not None:
            raise Interrupted(self.signum, at_boundary() if at_boundary is not None else "")

    def __exit__(self, kind, _exc, _tb):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            for name in ("distributed", "tornado", "asyncio"):
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        return False


def resume_command(args) -> str:
    """The command line that continues the run of ``args`` from its folder's checkpoint
    (which holds the options; those of where and how it ran are repeated when given,
    :mod:`.launch`)."""
    words = ["hetero-nn", "train", "--out", str(args.out), "--resume"]
    for name in LAUNCH_OPTIONS:
        value = getattr(args, name, None)
        if value is not None and value != LAUNCH_DEFAULTS.get(name):
            words += flag(name, value).split(" ", 1)
    return shlex.join(words + (["--quiet"] if getattr(args, "quiet", False) else []))
