"""What a command runs on: the runtime, the Dask client and the cluster its options ask for.

This module turns ``--devices``, ``--policy``, ``--executor``, ``--connect-timeout``
and ``--cluster*`` into objects, each closed by the command's ``ExitStack``, and
names the option at fault when one cannot be had: a device that is not there, a
scheduler that does not answer within ``--connect-timeout`` (one line, exit status
2, instead of a long hang and a traceback at the first step).
"""

from __future__ import annotations

import sys

from ..errors import ConfigError
from .options import DEFAULT_CONNECT_TIMEOUT, PROG
from .run_folder import ignoring_sigint


def make_runtime(devices, policy, executor, *, deterministic=True, calibrate=False, trace=False,
                 trace_flushes=None):
    """The Runtime the CLI trains on; a failing device or executor names its option.
    Its trace keeps every flush (``trace_flushes=None``): the commands take the records
    step by step with ``trace(clear=True)``, so it never grows past a step or a pass."""
    from ..errors import DeviceError
    from ..scheduler.runtime import Runtime

    try:
        return Runtime(devices=devices, policy=policy, executor=executor,
                       deterministic=deterministic,
                       calibrate=calibrate, trace=trace, trace_flushes=trace_flushes)
    except DeviceError as exc:
        option = "--executor" if "executor" in str(exc) else "--devices"
        raise DeviceError(f"{option}: {exc}") from None
    except (OSError, TimeoutError) as exc:  # a distributed scheduler that cannot be reached
        raise ConfigError(f"--executor {executor}: {type(exc).__name__}: {exc}") from None


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
    from ..scheduler.devices import parse_devices

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
    from ..training.cluster.client import connect
    from ..training.pipeline.stage_cluster import StageCluster

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
