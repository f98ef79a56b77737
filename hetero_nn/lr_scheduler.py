"""The learning-rate schedules' former place, kept for the programs that import it: they
live in :mod:`hetero_nn.optim.lr_scheduler` (``hn.optim.StepLR``)."""

from .optim.lr_scheduler import SCHEDULES, CosineAnnealingLR, LRScheduler, OneCycleLR, StepLR

__all__ = ["LRScheduler", "StepLR", "CosineAnnealingLR", "OneCycleLR", "SCHEDULES"]
