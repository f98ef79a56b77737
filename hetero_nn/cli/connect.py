"""What a command runs on: the runtime, the Dask client and the cluster its options ask for.

This module turns ``--devices``, ``--policy``, ``--executor``, ``--connect-timeout``
and ``--cluster*`` into objects, each closed by the command's ``ExitStack``, and
names the option at fault when one cannot be had: a device that is not there, a
scheduler that does not answer within ``--connect-timeout`` (one line, exit status
2, instead of a long hang and a traceback at the first step). More CPU workers than
this machine has cores (:func:`warn_oversubscribed`), and ``--devices`` given with
``--cluster`` (where the workers train and this process only evaluates), are each
one warning line.
"""

from __future__ import annotations

import os
import sys
import warnings

from ..errors import ConfigError, DeviceError
from .options import DEFAULT_CONNECT_TIMEOUT, PROG
from .run_folder import ignoring_sigint
from ..scheduler.devices import parse_devices
from ..scheduler.runtime import Runtime
from ..training.cluster.client import connect
from ..training.pipeline.stage_cluster import StageCluster


def make_runtime(devices, policy, executor, *, deterministic=True, calibrate=False, trace=False,
                 trace_flushes=None):
    """The Runtime the CLI trains on; a failing device or executor names its option.
    Its trace keeps every flush (``trace_flushes=None``): the commands take the records
    step by step with ``trace(clear=True)``, so it never grows past a step or a pass."""
    warn_oversubscribed(devices)
    try:
        return Runtime(devices=devices, policy=policy, executor=executor,
                       deterministic=deterministic,
                       calibrate=calibrate, trace=trace, trace_flushes=trace_flushes)
    except DeviceError as exc:
        option = "--executor" if "executor" in str(exc) else "--devices"
        raise DeviceError(f"{option}: {exc}") from None
    except (OSError, TimeoutError) as exc:  # a distributed scheduler that cannot be reached
        raise ConfigError(f"--executor {executor}: {type(exc).__name__}: {exc}") from None


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def warn_oversubscribed(devices, option="--devices") -> None:
    """One warning line when ``devices`` asks for more CPU workers than there are cores:
    each worker is a thread that computes, and more of them than cores only slows a step."""
    workers, have = parse_devices(devices)[0], cores()
    if workers > have:
        warnings.warn(f"{option} {devices}: {workers} CPU workers on {have} cores; the extra "
                      f"workers only slow each step (cpu:{have}, or 'cpu', gives one per core)",
                      stacklevel=2)


def dask_client(executor, devices, stack, timeout=DEFAULT_CONNECT_TIMEOUT):
    """The ``distributed.Client`` of ``--executor distributed[=ADDRESS]``, ready now; else None.

    ``distributed=ADDRESS`` connects at start, so an unreachable scheduler fails within
    ``timeout`` seconds naming the option, not with a long hang and a traceback at
    the first step. ``distributed`` starts the ``LocalCluster`` here (one
    single-threaded worker process per CPU worker, as the runtime would) with SIGINT
    ignored, a disposition its worker processes inherit: Ctrl-C reaches this process
    alone, which prints one line and closes the cluster. Both are closed by ``stack``.
    """
    name, _, address = executor.partition("=")
    if name != "distributed":
        return None
    # distributed: only for --executor distributed (heavy at start-up)
    from distributed import Client, LocalCluster

    if address:
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"--executor {executor}: no Dask scheduler answered at {address} "
                              f"within {timeout:g} s (--connect-timeout): {reason}") from None
        stack.callback(client.close)
        return client

    cpu_workers = parse_devices(devices)[0]
    with ignoring_sigint():
        cluster = LocalCluster(n_workers=max(1, cpu_workers), threads_per_worker=1,
                               processes=True, dashboard_address=":0")  # no port clash
    stack.callback(cluster.close)
    client = Client(cluster, set_as_default=False)
    stack.callback(client.close)
    return client


def connect_cluster(args, stack):
    """The ``--cluster`` the run computes on (None without it), closed by ``stack``; says
    where it is. Worker processes it starts ignore SIGINT, as ``dask_client``'s do."""
    if args.cluster is None:
        if args.cluster_devices is not None or args.cluster_threads != 1:
            raise ConfigError("--cluster-threads and --cluster-devices need --cluster")
        return None
    if args.cluster_devices is not None:
        warn_oversubscribed(args.cluster_devices, "--cluster-devices")
    elif args.devices not in (None, "cpu"):
        warnings.warn(f"--devices {args.devices} with --cluster {args.cluster}: the cluster's "
                      f"workers train, each with --cluster-threads {args.cluster_threads} "
                      "core(s); --devices is this process's, which only evaluates (give "
                      f"--cluster-devices {args.devices} for the workers' devices)", stacklevel=2)

    try:
        with ignoring_sigint():  # --pipeline: a stage per worker
            cluster = connect(args.cluster, threads=args.cluster_threads,
                              devices=args.cluster_devices, timeout=args.connect_timeout,
                              cls=StageCluster if getattr(args, "pipeline", None) else None)
    except ConfigError as exc:
        raise ConfigError(f"--cluster: {exc}") from None
    stack.callback(cluster.close)
    if not args.quiet:
        print(f"{PROG}: {cluster.describe()}", file=sys.stderr, flush=True)
    return cluster
