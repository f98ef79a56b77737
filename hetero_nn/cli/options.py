"""The ``hetero-nn`` parser's building blocks: option types and option groups.

This module owns how an option's value is checked (each type names what it
expected in its message) and the option groups several commands share (runtime,
cluster). A bad value ends in :class:`UsageError`, which :func:`hetero_nn.cli.main`
prints as one line ``hetero-nn: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import math

from ..errors import HeteroNNError
from ..scheduler.devices import parse_devices

PROG = "hetero-nn"
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds to reach a distributed=ADDRESS scheduler
UNSET = None  # an option not given on the command line


class UsageError(HeteroNNError):
    """A command line argparse refused (unknown option, bad value)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised instead of printed."""

    def error(self, message):
        raise UsageError(message)


# ---------------------------------------------------------------------------------------
# Option types: each names the option in its message
# ---------------------------------------------------------------------------------------

def _number(text, kind, accept, expected):
    """``kind(text)`` if it converts and ``accept`` takes it, else an error naming ``expected``."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text):
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text):
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def granularity(text):
    if text == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', "
                                         f"got {text!r}") from None


def positive_float(text):
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a positive number")


def fraction(text):
    return _number(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def devices(text):
    try:
        parse_devices(text)
    except HeteroNNError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def executor(text):
    name, sep, address = text.partition("=")
    if name not in ("local", "dask", "distributed") or (sep and (name != "distributed"
                                                                 or not address)):
        raise argparse.ArgumentTypeError(f"expected 'local', 'dask', 'distributed' or "
                                         f"'distributed=ADDRESS', got {text!r}")
    return text


def input_shape(text):
    parts = text.replace(",", "x").split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected C x H x W such as 3x32x32, got {text!r}")
    return tuple(int(p) for p in parts)


def non_negative_float(text):
    return _number(text, float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")


# ---------------------------------------------------------------------------------------
# Option groups and messages shared by several commands
# ---------------------------------------------------------------------------------------

def add_runtime_options(parser, policies):
    """``--devices``, ``--policy``, ``--executor``, ``--connect-timeout`` (train, evaluate)."""
    group = parser.add_argument_group("runtime")
    group.add_argument("--devices", type=devices, default="cpu",
                       help="workers, e.g. 'cpu:2' or 'cpu:1,cuda:0' (default: one per core)")
    group.add_argument("--policy", choices=sorted(policies), default="eager",
                       help="scheduling policy (default: eager)")
    group.add_argument("--executor", type=executor, default="local",
                       help="local, dask, distributed or distributed=ADDRESS (default: local)")
    group.add_argument("--connect-timeout", type=positive_float,
                       default=DEFAULT_CONNECT_TIMEOUT, metavar="SECONDS",
                       help="give up on a distributed=ADDRESS or --cluster scheduler that does "
                            "not answer "
                            f"within this time (default: {DEFAULT_CONNECT_TIMEOUT:g})")


def add_pipeline_options(parser):
    """``--pipeline``, ``--stage-devices``, ``--pipeline-schedule`` (train)."""
    group = parser.add_argument_group("pipeline (stages on their own workers; see "
                                      "docs/pipeline.md)")
    group.add_argument("--pipeline", type=positive_int, metavar="P",
                       help="cut the model into P stages balanced from the performance models "
                            "(with --cluster: a stage per Dask worker)")
    group.add_argument("--stage-devices", metavar="LIST",
                       type=lambda text: [part.strip() for part in text.split(",")],
                       help="each stage's devices, e.g. 'cpu:1,cuda-emu:1' (default: the "
                            "workers in equal groups)")
    group.add_argument("--pipeline-schedule", choices=("1f1b", "gpipe", "pipedream"),
                       default="1f1b",
                       help="order of each stage's micro-batches (default: 1f1b); pipedream: "
                            "asynchronous, an update per micro-batch, weight stashing (not "
                            "equal to synchronous training)")


def add_cluster_options(parser):
    """``--cluster``, ``--cluster-threads``, ``--cluster-devices`` (train)."""
    group = parser.add_argument_group("cluster (data-parallel over Dask; see docs/cluster.md)")
    group.add_argument("--cluster", metavar="SPEC",
                       help="compute gradients on Dask workers: 'local:N' (N worker processes "
                            "here) or a scheduler address 'tcp://HOST:PORT'")
    group.add_argument("--cluster-threads", type=positive_int, default=1, metavar="N",
                       help="cores of each worker's runtime (default: 1)")
    group.add_argument("--cluster-devices", type=devices, metavar="SPEC",
                       help="each worker's devices instead, e.g. 'cpu:2'")



def dataset_error(name, exc) -> HeteroNNError:
    """``exc`` with ``--dataset NAME:`` in front, the dataset named once."""
    text = str(exc)
    if text.startswith(f"{name}: "):
        text = text[len(name) + 2:]
    return type(exc)(f"--dataset {name}: {text}")


def one_line(exc) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
