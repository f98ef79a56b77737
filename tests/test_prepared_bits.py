"""Kernels that took over work a wrapper did in Python give the same bits.

A prepared task cannot compute in Python what changes per step, so some kernels now do
in Numba what the variants did with Python floats or NumPy: Adam's bias corrections
(``pow`` on float64: LLVM must not turn ``x ** 0.5`` into a square root), the dense
bias gradient (NumPy's summation order, pairwise for one column). And a prepared call,
run through its trampoline as the engine runs it, equals the variant called from Python.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import batchnorm, dense, dropout, optim
from hetero_nn.codelets.dense import _column_sums_acc_cpu
from hetero_nn.codelets.prepared import WorkerBuffers, calls_of
from hetero_nn.scheduler.engine.trampoline import CompiledCall


@settings(max_examples=200, deadline=None)
@given(lr=st.floats(1e-6, 1.0), beta1=st.floats(0.0, 0.999), beta2=st.floats(0.5, 0.99999),
       step=st.integers(1, 10 ** 6), weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
       decoupled=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]))
def test_adam_kernel_gives_the_bits_of_python_float_scalars(lr, beta1, beta2, step,
                                                            weight_decay, decoupled, dtype):
    """The ``cpu`` variant (its scalars computed in Numba) against the reference (in
    Python floats, as torch): bit for bit, the state included."""
    rng = np.random.default_rng(step)
    state = [rng.standard_normal(33).astype(dtype) for _ in range(3)]
    state.append(np.abs(rng.standard_normal(33)).astype(dtype))
    hyper = optim.adam_hyper(lr, beta1, beta2, step)
    ref = [a.copy() for a in state]
    cpu = [a.copy() for a in state]
    optim.adam_step.variants["ref"](*ref, hyper, weight_decay=weight_decay, decoupled=decoupled)
    optim.adam_step.variants["cpu"](*cpu, hyper, weight_decay=weight_decay, decoupled=decoupled)
    for a, b in zip(ref, cpu):
        assert a.tobytes() == b.tobytes()


def test_adam_bias_corrections_over_many_steps():
    """Python's ``(1 - beta2 ** step) ** 0.5`` and a square root differ in the last bit
    for about one step count in 2,000: 20,000 consecutive steps would show it."""
    hyper = optim.adam_hyper(1e-3, 0.9, 0.999, 1)
    start = [0.0, 1.0, 0.0, 0.0]  # param 0: the result is the update itself, every bit kept
    ref = [np.array([v]) for v in start]
    cpu = [np.array([v]) for v in start]
    for step in range(1, 20_001):
        hyper[3] = step
        for a, b, v in zip(ref, cpu, start):  # the same state each step: the scalars change
            a[0] = b[0] = v
        optim.adam_step.variants["ref"](*ref, hyper)
        optim.adam_step.variants["cpu"](*cpu, hyper)
        assert ref[0].tobytes() == cpu[0].tobytes(), step


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 700), m=st.integers(1, 5), dtype=st.sampled_from([np.float32,
                                                                          np.float64]),
       seed=st.integers(0, 2 ** 32 - 1))
def test_column_sums_in_numpy_s_order(n, m, dtype, seed):
    """``out += a.sum(axis=0)`` bit for bit, for one column (NumPy's pairwise sum) and
    several (rows in order), with magnitudes that make the order show."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((n, m)) * 10.0 ** rng.integers(-4, 5, (n, m))).astype(dtype)
    out = rng.standard_normal(m).astype(dtype)
    expected = out.copy()
    expected += a.sum(axis=0)
    _column_sums_acc_cpu(a, out)
    assert out.tobytes() == expected.tobytes()


def _through_trampolines(variant, arrays, params):
    """Run ``variant``'s prepared calls on ``arrays`` as the engine does."""
    calls = calls_of(variant, WorkerBuffers(), arrays, params)
    assert calls is not None, f"{variant.__name__} has no prepared calls"
    for kernel, args in calls:
        assert CompiledCall(kernel, args)() == 0


def _cases(rng, dtype):
    """``(codelet, operands, parameters)`` with values the kernels read at run time (a
    hyper row, a momentum, a dropout key)."""
    def normal(*shape):
        return rng.standard_normal(shape).astype(dtype)
    x, w, dy = normal(5, 3, 4, 4), normal(7, 48), normal(5, 7)
    return [
        (dense.dense_fwd, [x, w, normal(7), np.empty((5, 7), dtype)], {}),
        (dense.dense_bwd_params, [x, dy, np.zeros((7, 48), dtype), np.zeros(7, dtype)], {}),
        (optim.adamw_step, [w.copy(), w * 0.5, w * 0.1, w * w,
                            optim.adam_hyper(3e-3, 0.9, 0.999, 17)],
         {"weight_decay": 0.05}),
        (batchnorm.bn_running, [normal(3), np.abs(normal(3)), normal(3), np.abs(normal(3)),
                                np.array([0.3])], {"count": 80}),
        (dropout.dropout_fwd, [x, np.empty_like(x), dropout.key_data(3, 9)],
         {"p": 0.4, "start": 5}),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prepared_calls_equal_the_variant_called_from_python(dtype):
    for codelet, arrays, params in _cases(np.random.default_rng(1), dtype):
        variant = codelet.variants["cpu:blas" if "cpu:blas" in codelet.variants else "cpu"]
        python = [a.copy() for a in arrays]
        variant(*python, **params)
        compiled = [a.copy() for a in arrays]
        _through_trampolines(variant, compiled, params)
        for a, b in zip(python, compiled):
            assert a.tobytes() == b.tobytes(), codelet.name
