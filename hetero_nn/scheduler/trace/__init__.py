"""Traces: what ran where and when (:mod:`.views`, the records and their views), the
bounded buffer a long run streams them through (:mod:`.buffer`), and the Gantt chart
(:mod:`.gantt`)."""

from .views import MemoryRecord, TaskRecord, Trace, TransferRecord

__all__ = ["MemoryRecord", "TaskRecord", "Trace", "TransferRecord"]
