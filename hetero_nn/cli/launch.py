"""The options of ``hetero-nn train`` that say where and how a run goes, kept for ``--resume``.

This module owns the launch options -- devices, policy, executor, cluster, pipeline,
tracing, checkpoint frequency (:data:`LAUNCH_OPTIONS`; ``--quiet`` is this terminal's,
never carried) -- as a run records
them and as ``--resume`` takes them back.

Policy: the train parser's defaults for these options are ``UNSET``
(:func:`defer_defaults`), so a value the user gave can be told from one left out.
:func:`resolve_launch` fills each option left out from the resumed run's record
(``run["launch"]`` in the checkpoint's config) when there is one, else from its
default, and records the result in ``run["launch"]``; an option given again wins.
:func:`taken_from_run` is the one line that says what a resume took from the run.
``run["sessions"]`` lists each session of the run (global step it started at, devices,
policy, executor), so ``metrics.json`` says what ran where when a resume changed them.
"""

from __future__ import annotations

from .options import UNSET

#: The launch options (``args`` attributes): they never change the numbers.
LAUNCH_OPTIONS = ("devices", "policy", "executor", "connect_timeout", "cluster",
                  "cluster_threads", "cluster_devices", "pipeline", "stage_devices",
                  "pipeline_schedule", "checkpoint_every", "trace", "trace_steps")
#: Their defaults, read from the parser by :func:`defer_defaults`.
LAUNCH_DEFAULTS: dict = {}


def defer_defaults(parser) -> None:
    """Set the launch options' defaults of ``parser`` to UNSET, keeping the real ones in
    :data:`LAUNCH_DEFAULTS`."""
    for name in LAUNCH_OPTIONS:
        LAUNCH_DEFAULTS.setdefault(name, parser.get_default(name))
    parser.set_defaults(**{name: UNSET for name in LAUNCH_OPTIONS})


def flag(name, value) -> str:
    """``name`` with ``value`` as the command line gives it (``--trace``, ``--devices cpu:2``)."""
    option = "--" + name.replace("_", "-")
    if value is True:
        return option
    if value is False:
        return "--no-" + name.replace("_", "-")
    return f"{option} {','.join(value) if isinstance(value, list) else value}"


def resolve_launch(args, run, saved_run=None) -> list[str]:
    """Fill ``args``' launch options left out: from ``saved_run["launch"]`` (a resumed
    run's), else their defaults; record them in ``run["launch"]`` and this session in
    ``run["sessions"]``. Returns the flags taken from the saved run that differ from the
    defaults (what a resume carried over)."""
    saved = (saved_run or {}).get("launch") or {}
    taken = []
    for name in LAUNCH_OPTIONS:
        if getattr(args, name, UNSET) is not UNSET:
            continue
        if name in saved:
            value = saved[name]
            if value != LAUNCH_DEFAULTS.get(name):
                taken.append(flag(name, value))
        else:
            value = LAUNCH_DEFAULTS.get(name)
        setattr(args, name, value)
    run["launch"] = {name: getattr(args, name) for name in LAUNCH_OPTIONS}
    run["sessions"] = list((saved_run or {}).get("sessions") or [])
    return taken


def note_session(run, rt, global_step) -> None:
    """Append this session (its first global step, devices, policy, executor) to
    ``run["sessions"]``."""
    run["sessions"].append({"global_step": global_step, "devices": str(rt.devices),
                            "policy": rt.policy_name, "executor": rt.executor_name})


def result_flags(run, given, options, optimizer_defaults) -> list[str]:
    """The flags of the options that change the numbers a resume took from ``run`` (not
    ``given``) whose values are not what the command would choose without them."""
    flags = []
    for key, _, default in options:
        value = run.get(key)
        if key in given or value is None or value == default:
            continue
        if default is None and optimizer_defaults.get(run["optimizer"], {}).get(key) == value:
            continue
        flags.append(flag(key, value))
    return flags


def taken_from_run(where, flags) -> str:
    """The line a resume prints: where it resumes and which options it took from the run."""
    kept = " ".join(flags) if flags else "no option but the defaults"
    return f"resuming {where} with the run's {kept} (give an option again to change it)"
