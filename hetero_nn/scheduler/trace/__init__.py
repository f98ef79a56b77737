"""Traces: what ran where and when (:mod:`.records`, the records, and :mod:`.views`,
the views people read them through), the bounded buffer a long run streams them through (:mod:`.buffer`), and the Gantt chart
(:mod:`.gantt`)."""

from .records import MemoryRecord, TaskRecord, TransferRecord, dispatch_gaps
from .views import Trace

__all__ = ["MemoryRecord", "TaskRecord", "Trace", "TransferRecord", "dispatch_gaps"]
