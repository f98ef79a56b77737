"""The ``hetero-nn`` command: one module per subcommand.

This package owns what a user of the command meets::

    hetero-nn train                       # lenet5 on MNIST, 3 epochs, SGD(0.02, momentum 0.9)
    hetero-nn train --dataset cifar10 --model cifar-small --epochs 5 --out runs/c10
    hetero-nn train --out runs/c10 --resume               # continue a killed run
    hetero-nn evaluate --checkpoint runs/c10/checkpoint-final.npz
    hetero-nn datasets list [--verify] | download mnist [--mirror URL]
    hetero-nn perfmodel [codelet]
    hetero-nn models [--summary MODEL]
    hetero-nn simulate --model lenet5 --policy heft [--platform FILE]
    hetero-nn trace runs/c10 --gantt gantt.png --stats    # a run's trace (train --trace)
    hetero-nn plot runs/c10 runs/c10-adam -o curves.png   # loss, accuracy, images/s per epoch

Each subcommand is a module with ``add_parser(sub)`` and ``command(args)``
(:mod:`.train`, :mod:`.evaluate`, :mod:`.datasets`, :mod:`.perfmodel`,
:mod:`.models`, :mod:`.simulate`, :mod:`.trace`, :mod:`.plot`); the option types and
shared option groups are in
:mod:`.options`, the runtime, Dask client and cluster a command runs on in
:mod:`.connect`, a run's output folder and Ctrl-C handling in :mod:`.run_folder`.
``hetero-nn`` alone, or ``hetero-nn datasets`` alone, prints its usage (exit 0).

Errors: a bad option, missing dataset files, a device that is not there, a
checkpoint that does not fit, an ``--out`` that cannot be written, a Dask scheduler
that does not answer within ``--connect-timeout``, a codelet with no performance
model for ``simulate``: one line ``hetero-nn: error: ...`` on stderr, exit status 2.
Training that diverges, a failing task or download, a lost cluster: one line, exit
status 1. A file that cannot be written (a full disk, a file-size limit) or read: one
line naming it, exit status 1; what was on disk stays whole. Ctrl-C (SIGINT) or SIGTERM
ends a run at the end of the step in progress, with a checkpoint there: one line
``hetero-nn: interrupted: stopped at ..., saved in ...; resume with: ...``, exit status
130 (143 for SIGTERM); a second signal stops at once (Dask's worker processes ignore
SIGINT and its logs are silenced while the run shuts down; see
:class:`~hetero_nn.cli.run_folder.Interrupts`). Warnings (a damaged performance model set
aside, one that cannot be saved) are one line each, ``hetero-nn: warning: ...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from ..errors import ArenaError, ClusterError, HeteroNNError, TaskError, TrainingDiverged
from . import datasets, evaluate, models, perfmodel, plot, simulate, trace, train
from .options import PROG, Parser, one_line
from .run_folder import version
from ..datasets import DownloadError

__all__ = ["main", "build_parser", "PROG"]

#: The subcommands, in the order ``hetero-nn --help`` lists them.
_COMMANDS = {"train": train, "evaluate": evaluate, "datasets": datasets,
             "perfmodel": perfmodel, "simulate": simulate, "models": models, "trace": trace,
             "plot": plot}
_RUN_ERRORS = (TrainingDiverged, TaskError, ArenaError, ClusterError)


def build_parser() -> argparse.ArgumentParser:
    """The ``hetero-nn`` argument parser, one subparser per module of this package."""
    parser = Parser(prog=PROG, description="Task-based heterogeneous CNN training "
                                            "(StarPU-style codelets over Dask).")
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    """Run ``hetero-nn`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            parser = build_parser()
            args = parser.parse_args(argv)
            if args.command is None:
                print(parser.format_help(), end="")
                return 0
            return _COMMANDS[args.command].command(args)
    except (*_RUN_ERRORS, DownloadError) as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except HeteroNNError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`hetero-nn perfmodel | head`)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        return 141  # 128 + SIGPIPE, as a shell reports it
    except OSError as exc:  # a full disk, a file-size limit: the file, and why
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{PROG}: error: {where}{exc.strerror or one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        detail = getattr(exc, "detail", "")
        print(f"{PROG}: interrupted" + (f": {detail}" if detail else ""), file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings while a command runs: one line each, without the source line."""
    print(f"{PROG}: warning: {one_line(message)}", file=sys.stderr)
