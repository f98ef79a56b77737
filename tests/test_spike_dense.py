"""The dense layer on spikes: event-driven and dense variants with the same bits, chosen by
the performance model from the measured spike rate.

- every CPU variant of the spike_dense codelets gives the same bits (spikes, scaled
  spikes, any values), equal to NumPy's GEMM to rounding, with the nonzero count;
- a pinned runtime keeps both CPU variants as candidates (only these: other codelets keep
  one), and the rate enters the tasks' footprint;
- a trainer measures each spike-fed layer's input rate after every step (the count over
  the inputs, as NumPy counts them), and training with the performance model choosing
  variants per task gives the bits of training with none.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero_nn as hn
from hetero_nn.codelets.dense import dense_fwd
from hetero_nn.scheduler.task import Task
from hetero_nn.codelets.spike_dense import (rate_bucket, spike_dense_bwd_params,
                                            spike_dense_bwd_weight, spike_dense_fwd,
                                            spike_dense_fwd_nobias)
from helpers import rel_err

VARIANTS = ("ref", "cpu", "cpu:events", "cuda")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), i=st.integers(1, 40), o=st.integers(1, 12),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), scale=st.sampled_from([1.0, 1.4]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_cpu_variants_give_the_same_bits(n, i, o, density, scale, dtype, seed):
    rng = np.random.default_rng(seed)
    x = ((rng.random((n, i)) < density) * scale).astype(dtype)
    x[rng.random((n, i)) < 0.02] = rng.standard_normal()  # not only spikes: any values
    w, b = rng.standard_normal((o, i)).astype(dtype), rng.standard_normal(o).astype(dtype)
    dy = rng.standard_normal((n, o)).astype(dtype)
    results = {}
    for v in VARIANTS:
        y, count = np.full((n, o), np.nan, dtype), np.zeros((), np.int64)
        spike_dense_fwd.variants[v](x, w, b, y, count, rate=0.25)
        y0, count0 = np.full((n, o), np.nan, dtype), np.zeros((), np.int64)
        spike_dense_fwd_nobias.variants[v](x, w, y0, count0, rate=None)
        dw, db, dw0 = np.ones_like(w), np.ones_like(b), np.ones_like(w)  # REDUX: they add
        spike_dense_bwd_params.variants[v](x, dy, dw, db, rate=0.25)
        spike_dense_bwd_weight.variants[v](x, dy, dw0, rate=0.25)
        assert int(count) == int(count0) == np.count_nonzero(x)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        terms = float((abs(x) @ abs(w).T).max(initial=0.0))  # what cancels into a sum
        assert rel_err(y, x @ w.T + b, terms) <= tol and rel_err(y0, x @ w.T, terms) <= tol
        terms = float((abs(dy).T @ abs(x)).max(initial=0.0))
        assert rel_err(dw, 1 + dy.T @ x, terms) <= tol and rel_err(db, 1 + dy.sum(0)) <= tol
        results[v] = (y, y0, dw, db, dw0)
    for v in ("cpu", "cpu:events"):
        for a, r in zip(results[v], results["ref"]):
            assert np.array_equal(a, r), v


def test_rate_buckets_and_the_candidates_of_a_pinned_runtime():
    assert [rate_bucket(r) for r in (None, 0.0, 0.011, 0.13, 0.3, 0.9)] == \
        [None, 2 ** -7, 2 ** -7, 0.125, 0.25, 1.0]
    with hn.Runtime(devices="cpu:1") as rt:
        assert rt.candidates(spike_dense_fwd, "cpu") == ("cpu:events", "cpu")
        assert rt.candidates(hn.codelets.reduce.overwriting(spike_dense_fwd), "cpu") == \
            ("cpu:events", "cpu")
        assert rt.candidates(dense_fwd, "cpu") == ("cpu:blas",)
        handles = [rt.register(np.zeros(s, np.float32)) for s in ((4, 8), (3, 8), (3,), (4, 3))]
        handles.append(rt.register(np.zeros((), np.int64)))
        prints = [rt.footprint(Task(i, spike_dense_fwd, handles, spike_dense_fwd.modes,
                                    {"rate": rate}, 0.0))
                  for i, rate in enumerate((0.125, 0.25, None))]
        assert [p[0].rsplit("|", 1)[1] for p in prints] == [
        "spike_dense_fwd=0.125", "spike_dense_fwd=0.25", "spike_dense_fwd=None"]
        assert prints[0][1] == 0.5 * prints[1][1] == 0.125 * prints[2][1]  # work: rate * 2NIO


def snn(seed=0):
    hn.manual_seed(seed)
    return hn.Sequential(hn.layers.RateEncode(10, seed=1), hn.Flatten(), hn.Dense(64, 32),
                         hn.layers.LIF(0.9), hn.Dense(32, 10),
                         hn.layers.LIF(0.9, output="membrane"))


def run(perfmodel, steps=6):
    model = snn()
    rng = np.random.default_rng(0)
    with hn.Runtime(devices="cpu:2", perfmodel=perfmodel) as rt:
        trainer = hn.Trainer(model, hn.losses.MembraneCrossEntropy(), hn.optim.Adam(lr=1e-2), rt,
                             batch_size=12, granularity=3)
        losses, rates = [], []
        for _ in range(steps):
            x = rng.random((12, 1, 8, 8))
            losses.append(trainer.train_step(x, rng.integers(0, 10, 12)))
            rates.append((model[2].spike_input.rate, model[4].spike_input.rate))
        ran = {(r.codelet, r.variant) for r in rt.trace().records}
    return np.array(losses), model.state_dict(), rates, ran, x


def test_rates_are_measured_and_variants_chosen_per_task_keep_the_bits(tmp_path):
    losses, state, rates, ran, x = run(perfmodel=False)
    assert ("spike_dense_fwd.overwrite", "cpu:events") in ran and ("dense_bwd_input", "cpu:blas") in ran
    assert all(0.0 < r < 1.0 for pair in rates for r in pair)
    assert abs(rates[-1][0] - np.clip(x, 0, 1).mean()) < 0.05  # RateEncode fires at x
    chosen = run(perfmodel=hn.PerfModel(tmp_path))
    variants = {v for c, v in chosen[3] if c.startswith("spike_dense") and "redux" not in c}
    assert variants == {"cpu", "cpu:events"}  # the model explored both
    assert np.array_equal(chosen[0], losses)
    assert all(np.array_equal(chosen[1][k], state[k]) for k in state)
