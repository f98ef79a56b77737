"""Performance models: per codelet, variant and worker kind, what a task costs
(:mod:`.model`, over the statistics of :mod:`.history`, kept in the files of
:mod:`.files`)."""

from .model import FORMAT_VERSION, PerfModel, PerfModelWarning, default_cache_dir

__all__ = ["FORMAT_VERSION", "PerfModel", "PerfModelWarning", "default_cache_dir"]
