"""The strict CuPy stand-in (``hetero_nn.codelets.strict_xp``) and every ``cuda`` variant
under it: no implicit host conversion, no unordered accumulation, the ``ref`` twin's
results, and the launches and syncs of a training step counted.

The operands are those of real training steps: ``benchmarks/gpu/variants.py`` trains
its zoo of models (every layer kind, fused and unfused, four optimizers, five losses)
on ``cpu:1`` and records each codelet's ``ref`` calls; each recorded call then runs the
``cuda`` variant on :class:`DeviceArray` copies under :func:`checking`.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import hetero_nn as hn
from helpers import REPO, within
from hetero_nn.codelets import strict_xp
from hetero_nn.codelets.strict_xp import DeviceArray, StrictError, checking, counters, strict
from hetero_nn.codelets.xp import array_module

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import variants as recorded  # noqa: E402  (benchmarks/gpu/variants.py)


def dev(a):
    return strict.asarray(np.asarray(a))


# --------------------------------------------------------------------------- the stand-in

@pytest.mark.parametrize("convert", [float, int, bool, lambda a: a.tolist(), lambda a: a.item(),
                                     np.asarray, lambda a: list(a)],
                         ids=["float", "int", "bool", "tolist", "item", "np.asarray", "iter"])
def test_implicit_host_conversions_raise_and_are_counted(convert):
    a = dev([1.5, 2.5]).sum()
    before = counters.implicit
    with pytest.raises(StrictError, match="implicit|__array__"):
        convert(a if convert is not np.asarray else dev([1.0]))
    assert counters.implicit == before + 1


def test_explicit_copies_are_syncs_and_reductions_stay_on_the_device():
    a = dev(np.arange(6.0).reshape(2, 3))
    total = a.sum()
    assert isinstance(total, DeviceArray) and total.shape == ()
    before = counters.snapshot()
    assert strict.asnumpy(total) == 15.0 and total.get() == 15.0
    assert counters.syncs == before["syncs"] + 2


def test_host_arrays_do_not_mix_with_device_arrays():
    a = dev(np.ones(3))
    for mix in (lambda: a + np.ones(3), lambda: strict.where(a > 0, np.ones(3), a),
                lambda: a.__setitem__(slice(None), np.zeros(3))):
        with pytest.raises(StrictError, match="host numpy.ndarray"):
            mix()
    assert np.array_equal((a + 1.0).get(), [2, 2, 2])  # Python scalars are fine


@pytest.mark.parametrize("scatter", [lambda t, i, v: strict.add.at(t, i, v),
                                     lambda t, i, v: np.add.at(t, i, v),
                                     lambda t, i, v: strict.bincount(i, weights=v)],
                         ids=["xp.add.at", "np.add.at", "bincount-weights"])
def test_unordered_accumulations_are_refused(scatter):
    before = counters.unordered
    with pytest.raises(StrictError, match="unordered"):
        scatter(dev(np.zeros(4)), dev(np.array([0, 1, 1])), dev(np.ones(3)))
    assert counters.unordered == before + 1


def test_launches_are_counted_and_array_module_finds_the_stand_in():
    a = dev(np.ones((4, 4)))
    assert array_module(a) is strict and array_module(np.ones(1)) is np
    before = counters.launches
    b = strict.exp(a) * 2.0
    a[1:3] = b[1:3]
    c = a.reshape(-1)  # a view: no launch
    assert counters.launches == before + 3 and c.shape == (16,)


def test_a_guarded_variant_writes_into_the_callers_arrays():
    def double_cuda(x, y):
        xp = array_module(x, y)
        assert xp is strict
        y[...] = xp.multiply(x, 2)
    x, y = np.arange(3.0), np.zeros(3)
    strict_xp.guard(double_cuda, "double")(x, y)
    assert np.array_equal(y, [0, 2, 4]) and counters.variants["double"] >= 1


def test_the_unordered_check_can_fail():
    """A ``cuda`` variant that scatters with ``add.at`` is caught (the check is not vacuous)."""
    def scatter_cuda(dy, index, dx):
        xp = array_module(dy, index, dx)
        dx[...] = 0
        xp.add.at(dx, index, dy)
    cl = hn.Codelet("planted_scatter", modes=(hn.R, hn.R, hn.W), variants={"cuda": scatter_cuda})
    with pytest.raises(StrictError, match="unordered"):
        strict_xp.guard(cl.variants["cuda"])(np.ones(3), np.array([0, 0, 1]), np.zeros(2))


# --------------------------------------------------------------------------- every variant

_RECORD = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
import variants
rec = variants.record(True)
with open(sys.argv[2], "wb") as f:
    pickle.dump({key: (cl.name, arrays, params)
                 for key, (cl, arrays, params) in rec.records.items()}, f)
"""


class _Records:
    """The zoo's recorded ``ref`` calls, made in a fresh interpreter: what this process's
    earlier tests left behind (variants already prepared, fusion choices) cannot change
    which codelets the zoo reaches."""

    def __init__(self, calls):
        codelets = recorded.all_codelets()
        self.records = {key: (codelets[name], arrays, params)
                        for key, (name, arrays, params) in calls.items()}
        self.originals = {name: cl.variants["ref"] for name, cl in codelets.items()
                          if "ref" in cl.variants}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "calls.pkl"
    subprocess.run([sys.executable, "-c", _RECORD, str(REPO / "benchmarks" / "gpu"), str(out)],
                   cwd=REPO, check=True, timeout=240)
    with open(out, "rb") as f:
        return _Records(pickle.load(f))


def test_every_recorded_cuda_variant_runs_strict_and_equals_its_ref_twin(records):
    counters.reset()
    failures, reached = [], set()
    with checking():
        for (name, _, _), (cl, arrays, params) in records.records.items():
            expect = [a.copy() if hasattr(a, "shape") else a for a in arrays]
            records.originals[name](*expect, **params)
            got = [a.copy() if hasattr(a, "shape") else a for a in arrays]
            try:
                cl.variants["cuda"](*got, **params)
            except StrictError as exc:
                failures.append(f"{name}: {exc}")
                continue
            reached.add(name)
            for mode, e, g in zip(cl.modes or (None,) * len(arrays), expect, got):
                if mode is hn.SCRATCH or not hasattr(e, "shape"):
                    continue
                tol = {"float64": 1e-12, "float32": 1e-5}.get(e.dtype.name, 0)
                scale = max(float(np.max(np.abs(e), initial=0)), 1e-300) if e.dtype.kind == "f" else 1
                err = np.max(np.abs(g.astype(float) - e.astype(float)), initial=0) / scale
                if not err <= tol:
                    failures.append(f"{name}: operand differs from ref by {err:.3g}")
    assert not failures, "\n".join(failures)
    assert counters.implicit == 0 and counters.unordered == 0
    every = set(strict_xp.all_cuda_codelets())
    print(f"cuda variants exercised strict: {len(reached & every)} of {len(every)}")
    assert len(reached & every) >= 95, sorted(every - reached)


def test_maxpool_backward_on_a_device_is_the_ref_twins_bits_with_overlapping_windows():
    from hetero_nn.codelets import pool
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 9))
    kw = {"kernel_size": 3, "stride": 1, "padding": 1}  # overlapping: up to 9 windows share
    y, arg = np.empty((2, 3, 9, 9)), np.empty((2, 3, 9, 9), np.int64)
    pool.maxpool2d_fwd.variants["ref"](x, y, arg, **kw)
    dy = rng.standard_normal(y.shape)
    ref = np.empty_like(x)
    pool.maxpool2d_bwd.variants["ref"](dy, arg, ref)
    with checking():
        for geometry in (kw, {}):  # the masked adds, and the ordered scatter in rounds
            dx = np.full_like(x, np.nan)
            pool.maxpool2d_bwd.variants["cuda"](dy, arg, dx, **geometry)
            assert np.array_equal(dx, ref), geometry


# --------------------------------------------------------------------------- a training step

def lenet_step_counts(batch=64):
    """Launches and syncs inside the ``cuda`` variants of one LeNet-5 step on ``cuda-emu:1``."""
    from hetero_nn.models import build_model
    model = build_model("lenet5", (1, 28, 28), 10, dtype="float32", seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with checking(), hn.Runtime(devices="cuda-emu:1", perfmodel=False) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(),
                             hn.optim.SGD(lr=0.01, momentum=0.9), rt, batch_size=batch)
        trainer.train_step(x, y)  # the first step: graphs built, momentum first step
        counters.reset()
        trainer.train_step(x, y)
        return counters.snapshot(), sum(counters.variants.values())


def test_a_lenet5_step_on_the_emulated_device_has_no_host_sync_and_few_launches():
    """Issue 29's goal: <= 60 kernel launches and 0 host syncs per LeNet-5 step at batch 64
    (541 launches originally; each whole-operation kernel of kernels_cuda*.py counts one)."""
    counts, tasks = within(120, lenet_step_counts)
    print(f"LeNet-5 step, batch 64, cuda-emu: {counts} over {tasks} tasks; by kernel: "
          f"{dict(counters.kernels)}")
    assert counts["syncs"] == 0 and counts["implicit"] == 0 and counts["unordered"] == 0
    assert tasks <= counts["launches"] <= 60
