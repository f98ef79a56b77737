"""The scheduler: task submission, dependencies, the Dask graph, executors, policies,
performance models and traces."""

from .perfmodel.model import PerfModel
from .policies.policies import POLICIES
from .capture import Graph
from .runtime import Runtime
from .study import StudyOptions
from .task import Task
from .trace import TaskRecord, Trace

__all__ = ["Graph", "PerfModel", "POLICIES", "Runtime", "StudyOptions", "Task", "TaskRecord", "Trace"]
