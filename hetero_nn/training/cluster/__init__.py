"""Data-parallel training over Dask: the client (:mod:`.client`), the messages it and the
ranks exchange (:mod:`.messages`), the ranks' side (:mod:`.rank`), the group of workers
(:mod:`.group`), the reductions between ranks (:mod:`.exchange`) over persistent comms
(:mod:`.endpoint`), and the cluster's simulation (:mod:`.planner`)."""

from .client import Cluster, connect

__all__ = ["Cluster", "connect"]
