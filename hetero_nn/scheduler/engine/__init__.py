"""The compiled replay engine: a captured graph bound to its buffers and replayed by a
compiled dispatch loop, with no Python between tasks.

:mod:`.executor` is the engine as an executor (``CompiledExecutor``, the runtime's
``compiled``, called as the other executors are), :mod:`.replay` the engine's front
(``CompiledGraph``, and the rule for which path serves a runtime), :mod:`.segment` one
compiled flush, :mod:`.bound` a task bound to its buffers, :mod:`.data_plan` the transfer
schedule, :mod:`.dispatch` the compiled loop, :mod:`.trampoline` the native entry points
and :mod:`.intrinsics` the low-level operations they use.
"""
