"""Pipelines: a model cut into stages (:mod:`.stages`), PipeDream's weight stashing
(:mod:`.pipedream`), a stage's passes (:mod:`.passes`), and the stages across Dask workers (:mod:`.stage_cluster`, the
client's side, and :mod:`.stage_rank`, the workers')."""

from .stages import (SCHEDULES, Pipeline, Stage, balanced_cut, block_costs, schedule_order,
                     schedule_span)

__all__ = ["SCHEDULES", "Pipeline", "Stage", "balanced_cut", "block_costs", "schedule_order",
           "schedule_span"]
