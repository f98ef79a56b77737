"""Study switches: the runtime's options that exist for experiments and tests.

A user's constructor holds what a user sets (devices, policy, executor, models, trace);
the switches that turn the runtime's own machinery off, to measure what it brings or to
pin down a behaviour in a test, live in one :class:`StudyOptions` that
``Runtime(study=...)`` takes (``hn.StudyOptions``). The old keywords (``overlap=``,
``arenas=``, ``replay_engine=``, ``fuse_chains=``) are still accepted and override it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError

REPLAY_ENGINES = ("compiled", "executor")


@dataclass(frozen=True)
class StudyOptions:
    """The runtime's study switches, each on by default (see ``Runtime``'s docstring).

    ``overlap``: tasks start while the program still submits (False: only at
    ``wait()``, as one DAG). ``arenas``: a flush's temporaries share one region per
    memory node laid out from their lifetimes (False: one allocation per temporary).
    ``replay_engine``: ``"compiled"`` replays through the compiled engine where it
    serves the runtime, ``"executor"`` through the executor and policy.
    ``fuse_chains``: a captured graph fuses its chains of small tasks into bundles.
    ``gil_handoff``: from the first compiled replay to ``close()``, the interpreter's
    switch interval is lowered so the engine's threads get the interpreter lock back at
    once beside a thread that holds it
    (:class:`~hetero_nn.scheduler.engine.contention.QuickHandoffs`).
    ``bind_threads``: a parallel replay binds each of its threads to a core of its own
    where they are no more than the cores, as StarPU binds its workers (False: the
    operating system places them; :mod:`~hetero_nn.scheduler.engine.cores`).
    ``cut_tries``: a replay that tries one thread per worker against one thread for all
    is stopped once it cannot win, and its tasks left run on the calling thread (False:
    every try runs to its end; :mod:`~hetero_nn.scheduler.engine.contention`).

    >>> options = StudyOptions(overlap=False).with_keywords(arenas=False, replay_engine=None)
    >>> options  # doctest: +NORMALIZE_WHITESPACE
    StudyOptions(overlap=False, arenas=False, replay_engine='compiled', fuse_chains=True,
    gil_handoff=True, bind_threads=True, cut_tries=True)
    """

    overlap: bool = True
    arenas: bool = True
    replay_engine: str = "compiled"
    fuse_chains: bool = True
    gil_handoff: bool = True
    bind_threads: bool = True
    cut_tries: bool = True

    def __post_init__(self):
        if self.replay_engine not in REPLAY_ENGINES:
            raise ConfigError(f"Runtime: replay_engine={self.replay_engine!r}; expected "
                              "'compiled' or 'executor'")

    def with_keywords(self, **given) -> "StudyOptions":
        """These options with the keywords given (not None) in their place."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})
