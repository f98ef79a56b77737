"""Training: the trainer and what it is made of.

This package owns the :class:`Trainer` (the epoch loop, :mod:`.trainer`), its step
cache with the one replay rule (:mod:`.step_cache`), the batch loader
(:mod:`.loader`), the run's progress (:mod:`.progress`), checkpoints
(:mod:`.checkpoint`), the ``granularity="auto"`` decision (:mod:`.granularity`) and
data-parallel training over Dask (:mod:`.cluster`, with :mod:`.group`, :mod:`.rank`,
:mod:`.exchange`, :mod:`.endpoint`, :mod:`.cluster_io`, and its simulation,
:mod:`.planner`), and pipelines (:mod:`.pipeline`; across Dask workers,
:mod:`.stage_cluster` and :mod:`.stage_rank`). It builds on layers, the scheduler
and the optimizers, and knows nothing of argument parsing (that is :mod:`hetero_nn.cli`).
"""

from . import checkpoint
from .checkpoint import load_model
from .model_file import save_model
from .trainer import HISTORY_KEYS, Trainer

__all__ = ["Trainer", "HISTORY_KEYS", "checkpoint", "load_model", "save_model"]
