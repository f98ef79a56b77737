"""The runtime's front end by concern: the methods a program calls on a
:class:`~hetero_nn.scheduler.runtime.Runtime`, which inherits them (the options, the
executors and the runtime's life stay in :mod:`~hetero_nn.scheduler.runtime`; the handle
methods are :mod:`~hetero_nn.scheduler.handles`' ``RuntimeHandles``).

- :mod:`~hetero_nn.scheduler.front.submission`: ``submit`` and what it does per task
  (operands checked, dependencies inferred, the task handed to the flush), and
  ``add_dependency``;
- :mod:`~hetero_nn.scheduler.front.synchronisation`: the synchronisation points
  (``wait``, ``fetch``, ``capture``) and what a program asks between them (``trace``,
  ``param``, the modes ``recording``, ``measuring``, ``tracing_apart``,
  ``combining_with``; the memory statistics).
"""
