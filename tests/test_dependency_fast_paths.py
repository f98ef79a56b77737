"""The dependency inference's shortcut for a child of a root's only plan
(``Dependencies.depend``): each case where the shortcut must not apply still finds
its conflicts, read from the trace's dependency lists."""

import numpy as np

import hetero_nn as hn
from hetero_nn import R, RW, W


def _add(x, value):
    x += value


def _keep(x):
    pass


ADD = hn.Codelet("fast_path_add", modes=(RW,), variants={"ref": _add})
SET = hn.Codelet("fast_path_set", modes=(W,), variants={"ref": lambda x, value: x.fill(value)})
READ = hn.Codelet("fast_path_read", modes=(R,), variants={"ref": _keep})


def _run(size, program):
    """Run ``program(rt, root)`` (one flush: ``{name: task}``) on a root of ``size``
    zeros; returns ``({name: set of names it followed}, the root's values)``."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        root = rt.register(np.zeros(size))
        tasks = program(rt, root)
        rt.wait()
        names = {t.id: name for name, t in tasks.items()}
        deps = {names[r.task_id]: {names[d] for d in r.deps if d in names}
                for r in rt.trace() if r.task_id in names}
        return deps, rt.fetch(root)


def test_children_of_one_plan_are_independent_and_the_root_follows_them_all():
    def program(rt, root):
        parts = root.split(axis=0, n=4)
        tasks = {f"w{i}": rt.submit(SET, p, value=float(i)) for i, p in enumerate(parts)}
        tasks["rw1"] = rt.submit(ADD, parts[1], value=10.0)
        tasks["g"] = rt.submit(ADD, parts[3].split(axis=0, n=2)[1], value=100.0)  # [7:8]
        tasks["p3"] = rt.submit(ADD, parts[3], value=1000.0)  # after its child's writer too
        tasks["root"] = rt.submit(ADD, root, value=1.0)
        return tasks

    deps, out = _run(8, program)
    assert deps["w0"] == deps["w1"] == deps["w2"] == deps["w3"] == set()
    assert deps["rw1"] == {"w1"}
    assert deps["g"] == {"w3"}
    assert deps["p3"] == {"w3", "g"}
    assert deps["root"] == {"w0", "rw1", "w2", "p3"}
    np.testing.assert_array_equal(out, [1, 1, 12, 12, 3, 3, 1004, 1104])


def test_a_root_with_state_orders_its_children():
    def program(rt, root):
        parts = root.split(axis=0, n=2)
        return {"root_w": rt.submit(SET, root, value=2.0),
                "root_r": rt.submit(READ, root),
                "c0": rt.submit(ADD, parts[0], value=1.0),  # after the root's writer and reader
                "c1_r": rt.submit(READ, parts[1])}          # after the root's writer

    deps, out = _run(4, program)
    assert deps["c0"] == {"root_w", "root_r"}
    assert deps["c1_r"] == {"root_w"}
    np.testing.assert_array_equal(out, [3, 3, 2, 2])


def test_a_second_plan_made_in_the_flush_and_a_grandchild():
    def program(rt, root):
        halves = root.split(axis=0, n=2)
        tasks = {"h0": rt.submit(SET, halves[0], value=1.0)}
        quarters = root.split(axis=0, n=4)                       # a second plan: [0:2] .. [6:8]
        tasks["q1_r"] = rt.submit(READ, quarters[1])              # inside halves[0]
        tasks["q2"] = rt.submit(ADD, quarters[2], value=3.0)      # inside halves[1]
        tasks["h0_again"] = rt.submit(ADD, halves[0], value=1.0)  # after the quarter's reader
        grand = halves[1].split(axis=0, n=2)[0]                   # [4:6]
        tasks["g"] = rt.submit(ADD, grand, value=10.0)            # after q2 (another plan)
        tasks["h1"] = rt.submit(ADD, halves[1], value=100.0)      # after the grandchild
        return tasks

    deps, out = _run(8, program)
    assert deps["q1_r"] == {"h0"}
    assert deps["q2"] == set()
    assert deps["h0_again"] == {"h0", "q1_r"}
    assert deps["g"] == {"q2"}
    assert deps["h1"] >= {"g"}
    np.testing.assert_array_equal(out, [2, 2, 2, 2, 113, 113, 100, 100])
