"""LIF codelets: the time scan against snnTorch, variants and recomputation bit for bit, and
finite differences where no surrogate stands in for a derivative.

- float64, random shapes, values, beta (some outside [0, 1], where it is clamped),
  thresholds, resets, outputs and recompute steps (hypothesis): every variant against the
  float64 twin of ``snn.Leaky`` (tests/snn_twins.py): spikes identical, membranes, input
  gradient, dbeta and dthreshold within 1e-12;
- the three variants give the same bits for the scan and the input gradient, and
  ``recompute=k`` the bits of ``k=1`` (states, outputs, gradients, sums);
- float32, against ``snn.Leaky(spike_grad=fast_sigmoid(25))`` itself: the same bits for
  the spikes, the membranes and the input gradient (the same operations in the same order);
- float64 central differences of the membrane readout (output="membrane"), whose input,
  beta and threshold derivatives involve no surrogate (the reset is a step function held
  fixed under a small perturbation: examples where one flips are discarded).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import lif as L

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")
pytest.importorskip("snntorch", reason="snnTorch is optional; the cross-checks against it need it")

from snn_twins import leaky64_class  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VARIANTS = ("ref", "cpu", "cuda")


def run_fwd(variant, x, beta, thr, reset, output, k):
    """``(out, states)`` of the forward scan (states: the membrane for output="membrane")."""
    out = np.full_like(x, np.nan)
    b, t = np.array(beta, x.dtype), np.array(thr, x.dtype)
    if output == "membrane":
        L.lif_fwd_membrane.variants[variant](x, b, t, out, reset=reset)
        return out, out
    states = np.full((x.shape[0], L.checkpoints(x.shape[1], k), *x.shape[2:]), np.nan, x.dtype)
    L.lif_fwd.variants[variant](x, b, t, out, states, reset=reset, recompute=k)
    return out, states


def run_bwd(variant, x, states, dout, beta, thr, reset, output, k, slope=25.0):
    """``(dx, dbeta, dthreshold)`` of the backward scan."""
    dx = np.full_like(x, np.nan)
    db, dt = np.zeros((), x.dtype), np.zeros((), x.dtype)
    L.lif_bwd_params.variants[variant](x, states, dout, np.array(beta, x.dtype),
                                       np.array(thr, x.dtype), dx, db, dt, reset=reset,
                                       recompute=k, output=output, slope=slope)
    return dx, db, dt


def twin(x, dout, beta, thr, reset, output, slope=25.0, neuron=None):
    """The twin's ``(out, membranes, dx, dbeta, dthreshold)`` (time on axis 1)."""
    xt = torch.from_numpy(x.copy()).requires_grad_()
    if neuron is None:
        neuron = leaky64_class()(beta, thr, slope, reset, True, True)
    mem, outs, mems = None, [], []
    for t in range(x.shape[1]):
        spk, mem = neuron(xt[:, t], mem)
        outs.append(spk if output == "spikes" else mem)
        mems.append(mem)
    out = torch.stack(outs, 1)
    (out.to(xt.dtype) * torch.from_numpy(dout)).sum().backward()
    grad = (lambda p: 0.0 if p.grad is None else p.grad.item())
    return (out.detach().numpy(), torch.stack(mems, 1).detach().numpy(), xt.grad.numpy(),
            grad(neuron.beta), grad(neuron.threshold))


cases = st.fixed_dictionaries({
    "n": st.integers(1, 4), "T": st.integers(1, 12), "features": st.sampled_from([(1,), (5,), (2, 3)]),
    "beta": st.sampled_from([0.0, 0.5, 0.95, 1.0, 1.2, -0.1]),
    "thr": st.sampled_from([0.5, 1.0, 1.7]), "reset": st.sampled_from(L.RESETS),
    "output": st.sampled_from(L.OUTPUTS), "k": st.integers(1, 12), "seed": st.integers(0, 2**32 - 1),
})


@settings(max_examples=60, deadline=None)
@given(case=cases)
def test_float64_scan_equals_the_twin_and_variants_and_recompute_agree(case):
    rng = np.random.default_rng(case["seed"])
    shape = (case["n"], case["T"], *case["features"])
    x = rng.standard_normal(shape) * 0.8 + 0.4
    dout = rng.standard_normal(shape)
    beta, thr, reset, output = case["beta"], case["thr"], case["reset"], case["output"]
    k = 1 if output == "membrane" else min(case["k"], case["T"])
    ref_out, ref_mem, ref_dx, ref_db, ref_dt = twin(x, dout, beta, thr, reset, output)
    first = None
    for variant in VARIANTS:
        out, states = run_fwd(variant, x, beta, thr, reset, output, k)
        dx, db, dt = run_bwd(variant, x, states, dout, beta, thr, reset, output, k)
        if output == "spikes":
            assert np.array_equal(out, ref_out), variant
            last = [min((j + 1) * k, case["T"]) - 1 for j in range(states.shape[1])]
            assert np.array_equal(states, ref_mem[:, last]), variant  # the kept membranes
        else:
            assert np.abs(out - ref_out).max() <= 1e-12 * max(1.0, np.abs(ref_out).max())
        scale = max(1.0, np.abs(ref_dx).max())
        assert np.abs(dx - ref_dx).max() <= 1e-12 * scale, variant
        assert abs(db - ref_db) <= 1e-11 * max(1.0, abs(ref_db)), (variant, db, ref_db)
        assert abs(dt - ref_dt) <= 1e-11 * max(1.0, abs(ref_dt)), (variant, dt, ref_dt)
        if first is None:
            first = (out, dx)
        else:  # the scans of every variant: the same bits
            assert np.array_equal(out, first[0]) and np.array_equal(dx, first[1]), variant
        if output == "spikes" and k > 1:  # recompute=k: the bits of k=1
            out1, states1 = run_fwd(variant, x, beta, thr, reset, output, 1)
            assert np.array_equal(out1, out)
            assert np.array_equal(states1[:, last], states)
            again = run_bwd(variant, x, states1, dout, beta, thr, reset, output, 1)
            for a, b in zip(again, (dx, db, dt)):
                assert np.array_equal(a, b), variant


def snntorch_leaky(beta, thr, reset):
    import snntorch as snn
    from snntorch import surrogate
    return snn.Leaky(beta=torch.tensor(beta, dtype=torch.float32),
                     threshold=torch.tensor(thr, dtype=torch.float32),
                     spike_grad=surrogate.fast_sigmoid(slope=25), reset_mechanism=reset,
                     learn_beta=True, learn_threshold=True)


@pytest.mark.parametrize("output", L.OUTPUTS)
@pytest.mark.parametrize("reset", L.RESETS)
def test_float32_scan_gives_snntorchs_bits(reset, output):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 25, 40)) * 0.8 + 0.4).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    beta, thr = np.float32(0.9), np.float32(1.0)
    ref_out, ref_mem, ref_dx, ref_db, ref_dt = twin(x, dout, beta, thr, reset, output,
                                                    neuron=snntorch_leaky(beta, thr, reset))
    assert 0.05 < (ref_mem > thr).mean() < 0.6  # spiking, not saturated
    for variant in VARIANTS:
        out, states = run_fwd(variant, x, beta, thr, reset, output, 1)
        dx, db, dt = run_bwd(variant, x, states, dout, beta, thr, reset, output, 1)
        assert np.array_equal(out, ref_out), variant
        assert np.array_equal(dx, ref_dx), variant
        assert abs(db - ref_db) <= 1e-5 * abs(ref_db) and abs(dt - ref_dt) <= 1e-5 * max(
            1.0, abs(ref_dt)), (variant, db, ref_db, dt, ref_dt)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), reset=st.sampled_from(L.RESETS),
       beta=st.sampled_from([0.3, 0.8, 0.95]), T=st.integers(1, 10))
def test_membrane_readout_gradients_equal_finite_differences(seed, reset, beta, T):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, T, 3)) * 0.8 + 0.4
    w = rng.standard_normal(x.shape)  # the loss: sum(w * U)
    thr, eps = 1.0, 1e-6

    def loss(x_, beta_, thr_):
        out, _ = run_fwd("ref", x_, beta_, thr_, reset, "membrane", 1)
        return float((w * out).sum()), out

    base, mem = loss(x, beta, thr)
    fired = np.concatenate([np.zeros_like(mem[:, :1]), mem[:, :-1]], 1) > thr

    def central(f):
        (lp, mp), (lm, mm) = f(eps), f(-eps)
        for m in (mp, mm):  # a reset that flips makes the loss jump: no derivative to check
            assume(np.array_equal(np.concatenate([np.zeros_like(m[:, :1]), m[:, :-1]], 1) > thr,
                                  fired))
        return (lp - lm) / (2 * eps)

    dx, db, dt = run_bwd("ref", x, mem, w, beta, thr, reset, "membrane", 1)
    for i in np.ndindex(x.shape):
        def shifted(h, i=i):
            xs = x.copy()
            xs[i] += h
            return loss(xs, beta, thr)
        assert abs(central(shifted) - dx[i]) <= 1e-6 * max(1.0, abs(dx[i]))
    assert abs(central(lambda h: loss(x, beta + h, thr)) - db) <= 1e-6 * max(1.0, abs(db))
    assert abs(central(lambda h: loss(x, beta, thr + h)) - dt) <= 1e-6 * max(1.0, abs(dt))


def test_clamped_beta_has_no_gradient_and_bad_operands_are_named():
    x = np.random.default_rng(1).standard_normal((2, 4, 3))
    out, states = run_fwd("cpu", x, 1.5, 1.0, "subtract", "spikes", 1)
    _, db, _ = run_bwd("cpu", x, states, np.ones_like(x), 1.5, 1.0, "subtract", "spikes", 1)
    assert db == 0.0
    assert np.array_equal(out, run_fwd("cpu", x, 1.0, 1.0, "subtract", "spikes", 1)[0])
    with pytest.raises(ValueError, match=r"lif_fwd: states of shape \(2, 4, 3\), expected "
                                         r"\(2, 2, 3\) for recompute=2"):
        L.lif_fwd.variants["cpu"](x, np.array(0.5), np.array(1.0), np.empty_like(x),
                                  np.empty_like(x), reset="subtract", recompute=2)
    with pytest.raises(ValueError, match="reset must be one of"):
        run_fwd("ref", x, 0.5, 1.0, "none", "spikes", 1)
