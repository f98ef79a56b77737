"""Optimizers, gradient clipping and learning-rate schedules, reached as ``torch.optim``'s
are (``hn.optim.SGD``, ``hn.optim.StepLR``): the optimizers in
:mod:`~hetero_nn.optim.optimizers`, the schedules (which read them) in
:mod:`~hetero_nn.optim.lr_scheduler`."""

from .optimizers import (OPTIMIZERS, SGD, Adam, AdamW, Optimizer, clip_grad_norm,
                         submit_clip_grad_norm)
from .lr_scheduler import SCHEDULES, CosineAnnealingLR, LRScheduler, OneCycleLR, StepLR

__all__ = ["OPTIMIZERS", "SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm",
           "submit_clip_grad_norm", "SCHEDULES", "CosineAnnealingLR", "LRScheduler",
           "OneCycleLR", "StepLR"]
