"""A parallel replay's threads run on cores of their own (``engine/cores.py``): bound for
the replay where they are no more than the cores, the calling thread's affinity given
back after; ``StudyOptions(bind_threads=False)`` leaves placement to the OS."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.scheduler.engine.cores import HAVE_BINDING
from helpers import within

pytestmark = pytest.mark.skipif(
    not HAVE_BINDING or len(os.sched_getaffinity(0)) < 2,
    reason="needs sched_setaffinity/sched_getcpu and two cores")


def _affinity_in_a_replay(study):
    seen = []

    def probe(x):
        seen.append((threading.get_ident(), frozenset(os.sched_getaffinity(0))))
    cl = hn.Codelet("probe_affinity", modes=(hn.RW,), variants={"ref": probe})
    with hn.Runtime(devices="cpu:2", perfmodel=False, study=study) as rt:
        h = rt.register(np.zeros(8))
        with rt.capture() as graph:
            for part in h.split(0, 8):
                rt.submit(cl, part)
        for seg in graph._compiled.segments:  # one thread per worker, whatever was measured
            if seg.contention is not None:
                seg.contention.mode, seg.contention.countdown = "parallel", 10 ** 9
        seen.clear()  # the capture run's: not a replay
        graph.replay()
        caller = frozenset(os.sched_getaffinity(0))
    return seen, caller


def test_a_parallel_replay_binds_its_threads_to_cores_of_their_own_and_gives_the_callers_back():
    before = frozenset(os.sched_getaffinity(0))
    seen, caller = within(60, _affinity_in_a_replay, hn.StudyOptions())
    masks = {thread: mask for thread, mask in seen}
    assert len(masks) == 2, "the replay ran on one thread"
    assert all(len(m) == 1 for m in masks.values()), masks
    assert len(set(masks.values())) == 2 and set().union(*masks.values()) <= before
    assert caller == before == frozenset(os.sched_getaffinity(0))
    seen, _ = within(60, _affinity_in_a_replay, hn.StudyOptions(bind_threads=False))
    assert {mask for _, mask in seen} == {before}
