"""The submission path's shortcuts (issue 34, docs/benchmarks.md "Submission's calls per
task"): each case where a shortcut must not apply still runs as the general path does.

- the local executor binds a pinned codelet's operands as the host replicas themselves
  (no ``Binder.bind``) only where they are plain: ``SCRATCH`` and ``REDUX`` operands, and
  a handle with no host replica yet, still get theirs;
- a ``nogil`` kernel is called through its compiled trampoline directly where it has no
  parameters (with them, ``tests/test_timing.py``);
- a streaming flush hands its tasks to the executor's ``add`` itself, and the flush after
  it (a capture) keeps its tasks for ``wait()`` again;
- automatic capture's record of a new shape, made inline in ``submit``, still replays the
  shape's third occurrence.
"""

import numba
import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, REDUX, RW, SCRATCH, W

TIMEOUT = 30.0  # a hang ends in a TaskError (Runtime(wait_timeout=))


@numba.njit(nogil=True)
def _increment_nogil(x):
    for i in range(x.shape[0]):
        x[i] += 1.0


def _add(x, value=1.0):
    x += value


def _through_scratch(x, tmp):
    tmp[...] = x * 2.0  # the scratch buffer: the operand's shape, the worker's own
    x[...] = tmp + 1.0


def _count(x, acc):
    acc += x.sum()


INCREMENT = hn.Codelet("fast_nogil_increment", modes=(RW,), variants={"cpu": _increment_nogil})
ADD = hn.Codelet("fast_add", modes=(RW,), variants={"ref": _add})
SCRATCHED = hn.Codelet("fast_scratch", modes=(RW, SCRATCH), variants={"ref": _through_scratch})
def _zero(a):
    a.fill(0.0)


def _sum_into(a, b):
    a += b


COUNT = hn.Codelet("fast_count", modes=(R, REDUX), variants={"ref": _count}, init=_zero,
                   redux=_sum_into)
FILL = hn.Codelet("fast_fill", modes=(W,), variants={"ref": lambda x: x.fill(5.0)})


def _runtime(**options):
    return hn.Runtime(devices="cpu:2", perfmodel=False, wait_timeout=TIMEOUT, **options)


@pytest.mark.slow  # compiles a kernel and its trampoline (about 2 s; the layer tests run
def test_a_nogil_kernel_without_parameters_runs_through_its_trampoline():  # such kernels)
    with _runtime() as rt:
        h = rt.register(np.zeros(4))
        for _ in range(3):
            rt.submit(INCREMENT, h)          # the first decides; then the trampoline, directly
        np.testing.assert_array_equal(rt.fetch(h), [3.0] * 4)
        records = list(rt.trace())
        assert len(records) == 3 and all(r.end >= r.start > 0 for r in records)


def test_operands_that_are_not_plain_replicas_still_bind_through_the_binder():
    with _runtime() as rt:
        x = rt.register(np.arange(4.0))
        made = rt.empty((4,), "float64")     # no host replica until a task binds it
        acc = rt.register(np.zeros(1))
        scratch = rt.empty((4,), "float64")  # one handle: each task gets a private buffer
        for _ in range(2):                   # the second run of each: decisions cached
            rt.submit(SCRATCHED, x, scratch)
            rt.submit(FILL, made)
        for part in x.split(0, 2):
            rt.submit(COUNT, part, acc)
        np.testing.assert_array_equal(rt.fetch(x), [3.0, 7.0, 11.0, 15.0])
        np.testing.assert_array_equal(rt.fetch(made), [5.0] * 4)
        np.testing.assert_array_equal(rt.fetch(acc), [36.0])


def test_a_capture_after_a_streaming_flush_keeps_its_tasks_for_wait():
    with _runtime(auto_capture=False) as rt:
        h = rt.register(np.zeros(4))
        rt.submit(ADD, h)                    # streams: handed to the executor's add
        assert rt.streaming
        rt.wait()
        with rt.capture() as graph:
            first = rt.submit(ADD, h)
            second = rt.submit(ADD, h)
            rt.add_dependency(first, second)  # refused while a flush streams
            assert not first.done()
        assert graph.num_tasks == 2
        graph.replay()
        rt.submit(ADD, h)                    # streams again
        assert rt.streaming
        np.testing.assert_array_equal(rt.fetch(h), [6.0] * 4)


def test_a_new_shape_recorded_inline_is_replayed_at_its_third_occurrence():
    with _runtime() as rt:
        parts = rt.register(np.zeros(8)).split(0, 4)
        actions = []
        for _ in range(4):
            for p in parts:
                rt.submit(ADD, p, value=0.5)
            rt.wait()
            notes = rt.trace(clear=True).metadata.get("auto_capture", [])
            actions.append(notes[-1]["action"] if notes else "submitted")
        assert actions == ["submitted", "captured", "replayed", "replayed"]
        np.testing.assert_array_equal(rt.fetch(parts[0].parent), [2.0] * 8)
