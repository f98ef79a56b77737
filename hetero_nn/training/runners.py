"""What runs a trainer's steps besides its own runtime: the choice the ``Trainer``'s
``pipeline=`` and ``cluster=`` options make.

Without either, the trainer submits or replays each step on its runtime. With
``pipeline=``, a :class:`~hetero_nn.training.pipeline.stages.Pipeline` runs the step's
stages on groups of the runtime's workers, or, with ``cluster=`` too, a
:class:`~hetero_nn.training.pipeline.stage_cluster.StagePipeline` runs a stage per Dask
worker. With ``cluster=`` alone the step runs data-parallel on the ranks of a
:class:`~hetero_nn.training.cluster.client.Cluster`. This module sits above
:mod:`~hetero_nn.training.cluster` and :mod:`~hetero_nn.training.pipeline` (whose
workers build trainers of their own), so the trainer reaches them through it only.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..layers import RateEncode
from .cluster.client import Cluster, connect
from .pipeline.stage_cluster import StagePipeline, connect_stages
from .pipeline.stages import Pipeline

__all__ = ["connect_trainer", "make_pipeline"]


def make_pipeline(model, pipeline, stage_devices, schedule, cluster):
    """The trainer's :class:`~hetero_nn.training.pipeline.stages.Pipeline` for its options, or None without ``pipeline``."""
    if pipeline is None:
        if stage_devices is not None:
            raise ConfigError("stage_devices is given without pipeline=")
        return None
    if cluster is not None:  # a stage per Dask worker
        return StagePipeline(model, pipeline, schedule, stage_devices)
    return Pipeline(model, pipeline, stage_devices, schedule)


def connect_trainer(trainer, spec) -> tuple[Cluster, bool]:
    """``(cluster, owned)`` for ``Trainer(cluster=spec)``: refuses what a cluster cannot
    train like one process, then connects (``owned``: made here, so the trainer closes it)."""
    model = trainer.model
    if getattr(model, "granularities", None) is not None:
        raise ConfigError("cluster: the model has per-layer granularities; a cluster "
                          "worker runs its share at the trainer's granularity")
    if any(isinstance(m, RateEncode) for m in model.modules()):  # draws per whole batch
        raise ConfigError("cluster: the model has RateEncode layers, whose random draws "
                          "count the samples of the whole batch, not one worker's block; "
                          "train it with --devices")
    if trainer.pipeline is not None:  # a stage per worker
        return connect_stages(trainer, spec)
    return connect(spec), not isinstance(spec, Cluster)
