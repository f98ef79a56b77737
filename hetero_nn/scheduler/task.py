"""Tasks: one codelet applied to handles, a node of the task DAG.

The runtime fills ``preds``/``succ``/``npred`` at submission from the access
modes; an executor decrements ``npred`` as predecessors finish, and a policy
places the task when it reaches zero. Times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations


class Task:
    """A submitted codelet instance. Plain state, mutated by the runtime and one executor."""

    __slots__ = ("id", "codelet", "handles", "modes", "params", "preds", "succ", "npred", "done",
                 "eligible", "variant", "worker", "t_submit", "t_ready", "t_start", "t_end",
                 "bytes_in", "predicted", "priority", "assigned", "error", "_fp", "frees")

    def __init__(self, task_id, codelet, handles, modes, params, t_submit):
        self.id = task_id
        self.codelet = codelet
        self.handles = handles      # operands after REDUX partial substitution
        self.modes = modes
        self.params = params
        self.preds: list[Task] = []
        self.succ: list[Task] = []
        self.npred = 0
        self.done = False
        self.eligible = ()          # workers that have a variant for this codelet
        self.variant = None
        self.worker = None
        self.t_submit = t_submit
        self.t_ready = 0.0
        self.t_start = 0.0
        self.t_end = 0.0
        self.bytes_in = 0
        self.predicted = 0.0        # policy's predicted run time (dmda, heft)
        self.priority = 0.0         # heft's upward rank
        self.assigned = None        # heft's static worker
        self.error = None
        self._fp = None             # cached (footprint, size) for the perfmodel
        self.frees = None           # released roots to report when done (Runtime(arenas=False))

    def rearm(self, task_id, now):
        """Reset the per-run state for a replay: a fresh id, not done, no variant, worker,
        error, times or bytes (dependencies are the replay's to set)."""
        self.id = task_id
        self.done = False
        self.variant = self.worker = self.error = None
        self.t_submit = now
        self.t_ready = self.t_start = self.t_end = 0.0
        self.bytes_in = 0

    @property
    def key(self) -> str:
        """The task's key in the Dask graph."""
        return f"{self.codelet.name}-{self.id}"

    def __repr__(self):
        return f"Task({self.codelet.name}#{self.id})"
