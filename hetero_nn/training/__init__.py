"""Training: the trainer and what it is made of.

This package owns the :class:`Trainer` (the epoch loop, :mod:`.trainer`), its step
cache with the one replay rule (:mod:`.step_cache`), the batch loader
(:mod:`.loader`), the run's progress (:mod:`.progress`), checkpoints
(:mod:`.checkpoint`), the ``granularity="auto"`` decision (:mod:`.granularity`),
data-parallel training over Dask (:mod:`.cluster`: the client, the group of workers,
the ranks, the reductions between them, their messages, and the cluster's simulation)
and pipelines (:mod:`.pipeline`: the stages, PipeDream, and the stages across Dask
workers). It builds on layers, the scheduler, the simulator and the optimizers, and
knows nothing of argument parsing (that is :mod:`hetero_nn.cli`).
"""

from . import checkpoint
from .checkpoint import load_model
from .model_file import save_model
from .trainer import HISTORY_KEYS, Trainer

__all__ = ["Trainer", "HISTORY_KEYS", "checkpoint", "load_model", "save_model"]
