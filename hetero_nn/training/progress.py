"""The progress of a training run: the running sums of an epoch and how they are shown.

This module owns the *progress* dict :meth:`~hetero_nn.training.trainer.Trainer.fit`
keeps for the epoch in progress (and a checkpoint stores, see
:mod:`hetero_nn.training.checkpoint`): ``loss_sum`` (summed loss times batch size),
``correct``, ``samples``, ``seconds`` (training time), and ``warmup_samples``,
``warmup_seconds``: the first step of the process (kernel compilation), timed apart
so that ``images_per_second`` measures the steady state. It also owns the epoch's
record in the history (with the joules its steps used, where counters exist: see
:mod:`hetero_nn.energy`), the tqdm bar and the one line printed per epoch.
"""

from __future__ import annotations

import sys

from ..errors import TrainingDiverged

__all__ = ["new_progress", "add_step", "epoch_record", "energy_total", "format_epoch",
           "position", "last_checkpoint", "diverged"]


def new_progress() -> dict:
    """The progress of an epoch with no step done."""
    return {"loss_sum": 0.0, "correct": 0, "samples": 0, "seconds": 0.0,
            "warmup_samples": 0, "warmup_seconds": 0.0}


def add_step(progress, loss, correct, samples, seconds, warmup=False) -> None:
    """Count one step of ``samples`` samples, mean loss ``loss``, into ``progress``;
    ``warmup``: it is the first step of the process, timed apart."""
    progress["loss_sum"] += loss * samples
    progress["correct"] += correct
    progress["samples"] += samples
    progress["seconds"] += seconds
    if warmup:
        progress["warmup_seconds"] += seconds
        progress["warmup_samples"] += samples


def epoch_record(progress, epoch, steps, granularity, energy=None) -> dict:
    """The history record of the finished epoch ``epoch`` (1-based) from its progress;
    ``test_loss`` and ``test_accuracy`` None, ``eval_seconds`` 0 until validated.

    ``energy`` (an :class:`~hetero_nn.energy.EnergyReading` of the epoch's training
    steps run in this process) gives ``energy_joules`` and ``joules_per_image``, both
    None with ``energy_reason`` saying why where no counter was read."""
    p = progress
    seconds = p["seconds"]
    timed_seconds = seconds - p["warmup_seconds"]
    timed_samples = p["samples"] - p["warmup_samples"]
    if timed_samples <= 0 or timed_seconds <= 0:  # an epoch of the warm-up step alone
        timed_seconds, timed_samples = seconds, p["samples"]
    return {"epoch": epoch,
            "train_loss": p["loss_sum"] / p["samples"],
            "train_accuracy": p["correct"] / p["samples"],
            "test_loss": None, "test_accuracy": None,
            "seconds": seconds,
            "images_per_second": timed_samples / timed_seconds if timed_seconds > 0 else None,
            "warmup_seconds": p["warmup_seconds"],
            "eval_seconds": 0.0, "samples": p["samples"], "steps": steps,
            "granularity": granularity,
            "energy_joules": None if energy is None else energy.joules,
            "joules_per_image": None if energy is None else energy.per_image(p["samples"]),
            "energy_reason": "not metered" if energy is None else energy.reason}


def energy_total(history) -> dict:
    """The energy of the epochs of ``history``: ``joules`` (their sum), ``joules_per_image``
    and ``reason``; the figures are None, with the first epoch's reason, where any epoch
    has no reading (a partial sum would understate the run), and with no epoch."""
    missing = [r for r in history if r.get("energy_joules") is None]
    if missing or not history:
        reason = missing[0].get("energy_reason") if missing else "no epoch finished"
        return {"joules": None, "joules_per_image": None, "reason": reason or "not metered"}
    joules = sum(r["energy_joules"] for r in history)
    images = sum(r["samples"] for r in history)
    return {"joules": joules, "joules_per_image": joules / images if images else None,
            "reason": None}


def running(progress) -> str:
    """The epoch so far, for the bar: mean loss, accuracy, images per second."""
    n = progress["samples"]
    rate = n / progress["seconds"] if progress["seconds"] > 0 else 0.0
    return (f"loss {progress['loss_sum'] / n:.4f}  acc {progress['correct'] / n:.2%}  "
            f"{rate:.0f} img/s")


def progress_bar(total, initial, desc, disable, unit="batch", **options):
    """A tqdm bar of ``total`` ``unit`` on stderr, or None when ``disable`` (``options``:
    tqdm's, e.g. ``unit_scale``). The one place the package loads tqdm."""
    if disable:
        return None
    from tqdm import tqdm  # tqdm loads with the first bar (10-40 ms at start-up)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                leave=False, dynamic_ncols=True, mininterval=0.2, **options)


def format_epoch(record, epochs=None) -> str:
    """One line for a finished epoch: train and test loss and accuracy, time, speed."""
    of = f"/{epochs}" if epochs else ""
    line = (f"epoch {record['epoch']}{of}: train loss {record['train_loss']:.4f} "
            f"acc {record['train_accuracy']:.2%}")
    if record.get("test_accuracy") is not None:
        line += f" | test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.2%}"
    ips = record.get("images_per_second")
    line += f" | {record['seconds']:.1f} s" + (f", {ips:.0f} img/s" if ips else "")
    return line


def print_epoch(record, epochs):
    print(format_epoch(record, epochs), file=sys.stderr, flush=True)


def position(epoch, step, global_step) -> str:
    """Where a run stands, in words: ``step 5 of epoch 2`` or ``the end of epoch 1``."""
    where = f"the end of epoch {epoch}" if step == 0 and epoch > 0 else \
        f"step {step} of epoch {epoch + 1}"
    return f"{where}, global step {global_step}"


def last_checkpoint(trainer) -> str:
    """Where ``trainer``'s run's last good checkpoint is, for error messages."""
    last = trainer.last_checkpoint
    if last is None and trainer._checkpoint_dir is not None:
        return f"no checkpoint was written in {trainer._checkpoint_dir} yet"
    if last is None:
        return "no checkpoint was written (give checkpoint_dir= or --out to keep one)"
    return (f"the last good checkpoint is {last['path']} (after "
            f"{position(last['epoch'], last['step'], last['global_step'])})")


def diverged(trainer, loss, epoch, b, epochs, num_batches) -> TrainingDiverged:
    """The error of a run whose loss ``loss`` at step ``b`` of ``epoch`` is not finite."""
    where = (f"epoch {epoch + 1}/{epochs}, step {b + 1}/{num_batches} (global step "
             f"{trainer.global_step + 1})")
    return TrainingDiverged(f"training diverged: the loss is {loss} at {where}; "
                            f"{last_checkpoint(trainer)}")
