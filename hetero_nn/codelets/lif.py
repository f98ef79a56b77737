"""Leaky integrate-and-fire codelets: the time scan of one batch partition, forward and back.

This module owns the neuron of :class:`hetero_nn.layers.LIF` and every variant of it:

=====================  ==============================================================
codelet                operands (access mode)
=====================  ==============================================================
lif_fwd                inp (R), beta (R), threshold (R), spikes (W), states (W)
lif_fwd_membrane       inp (R), beta (R), threshold (R), membrane (W)
lif_bwd                inp (R), states (R), dout (R), beta (R), threshold (R), dinp (W)
lif_bwd_params         ``lif_bwd``'s operands, then dbeta (REDUX), dthreshold (REDUX)
lif_bwd_beta           ``lif_bwd``'s operands, then dbeta (REDUX)
lif_bwd_threshold      ``lif_bwd``'s operands, then dthreshold (REDUX)
=====================  ==============================================================

Parameters: ``reset`` ("subtract" or "zero"), ``recompute`` (k >= 1), and for the
backward ``output`` ("spikes" or "membrane") and ``slope``.

The equations (snnTorch 1.0's ``snn.Leaky`` with ``reset_delay=True`` and the fast-sigmoid
surrogate), per neuron, for ``t = 1..T``, ``U[0] = 0``, ``b = clamp(beta, 0, 1)``::

    R[t] = U[t-1] > thr                        (no gradient flows through R)
    U[t] = (b * U[t-1] + I[t]) - R[t] * thr    reset="subtract"
    U[t] = b * ((1 - R[t]) * U[t-1]) + I[t]    reset="zero"
    S[t] = U[t] > thr,   dS[t]/dU[t] := 1 / (slope * |U[t] - thr| + 1)**2

written with the same operations in the same order as snnTorch, so a float32 scan
gives snnTorch's bits. Backward through time, with ``G[T+1] = 0``::

    G[t] = dL/dS[t] * dS[t]/dU[t] + G[t+1] * b * M[t+1]     (output="spikes")
    G[t] = dL/dU[t]               + G[t+1] * b * M[t+1]     (output="membrane")
    dL/dI[t] = G[t]
    dL/db   = sum_t G[t] * M[t] * U[t-1]          (0 where beta is outside [0, 1])
    dL/dthr = -sum_t G[t] * R[t]  (subtract)  - sum_t dL/dS[t] * dS[t]/dU[t]  (spikes)

with ``M[t] = 1`` (subtract) or ``1 - R[t]`` (zero).

Layout through time: ``inp``, ``spikes``/``membrane``, ``dout`` and ``dinp`` are ``(n, T,
*features)`` (batch first: the partition axis); a task scans the whole time axis of its
partition. ``states`` holds the membrane every ``recompute`` steps: ``(n, ceil(T / k),
*features)``, entry ``j`` being ``U`` at the end of the ``j``-th run of ``k`` steps
(``U[min((j + 1) k, T)]``; with ``k = 1`` every ``U[t]``). The backward scan takes the runs
last to first, recomputes the membranes inside a run from the entry before it (zero for
the first) and the input, with the forward's own step function, so ``recompute=k`` gives
the bits of ``k = 1``. For ``output="membrane"`` the output is the membrane itself and the
backward reads it as ``states`` with ``recompute=1``.

Variants: ``ref`` (NumPy over ``(n, features)`` per time step, the equations as written),
``cpu`` (Numba, one pass per sample with the features innermost; the forward and the
recomputation share one inlined step function) and ``cuda`` (``ref``'s code against the
array module of the operands: CuPy on a GPU, NumPy in CI). The scans of all three give
the same bits; ``dbeta`` and ``dthreshold`` are sums, equal to rounding (each task adds
its total, accumulated in float64, into the REDUX partial).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import require_contiguous
from ._jit import jit, jit_inline
from .codelet import REDUX, R, W, Codelet
from .prepared import from_calls
from .reduce import add_redux, zero_init
from .xp import array_module

__all__ = ["lif_fwd", "lif_fwd_membrane", "lif_bwd", "lif_bwd_params", "lif_bwd_beta",
           "lif_bwd_threshold", "lif_bwd_codelet", "RESETS", "OUTPUTS", "checkpoints"]

RESETS = ("subtract", "zero")
OUTPUTS = ("spikes", "membrane")


def checkpoints(time_steps: int, recompute: int) -> int:
    """How many membranes the forward keeps per neuron: ``ceil(T / k)``."""
    return -(-int(time_steps) // int(recompute))


def _seq(a):
    """``(n, T, *features)`` seen as ``(n, T, F)`` (a view for the arena's buffers)."""
    return a.reshape(a.shape[0], a.shape[1], -1)


def _scalars(beta, threshold, dtype, xp=np):
    """``(clamp(beta, 0, 1), threshold, beta inside [0, 1])`` in ``dtype``: host floats
    under NumPy, 0-d device arrays under another array module (no host sync)."""
    if xp is not np:
        b = beta.reshape(()).astype(dtype)
        return (xp.minimum(xp.maximum(b, dtype.type(0)), dtype.type(1)),
                threshold.reshape(()).astype(dtype), (b >= 0) & (b <= 1))
    b = dtype.type(float(beta))
    return dtype.type(min(max(b, dtype.type(0)), dtype.type(1))), dtype.type(float(threshold)), \
        bool(0 <= b <= 1)


def _check(name, inp, *outputs, states=None, recompute=1):
    for o in outputs:
        if o.shape != inp.shape:
            raise ValueError(f"{name}: operand of shape {o.shape} does not match the input "
                             f"{inp.shape} (n, T, ...)")
    if inp.ndim < 3:
        raise ValueError(f"{name}: expected (n, T, features...), got shape {inp.shape}")
    if states is not None:
        want = (inp.shape[0], checkpoints(inp.shape[1], recompute), *inp.shape[2:])
        if states.shape != want:
            raise ValueError(f"{name}: states of shape {states.shape}, expected {want} for "
                             f"recompute={recompute}")


def _check_params(reset, recompute, output="spikes"):
    if reset not in RESETS:
        raise ValueError(f"reset must be one of {RESETS}, got {reset!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if int(recompute) < 1:
        raise ValueError(f"recompute must be >= 1, got {recompute!r}")


# --------------------------------------------------------------------------- ref and cuda (xp)

def _step_xp(xp, u, i, b, thr, subtract):
    """One membrane update of ``(n, F)`` neurons: the equations of the module docstring."""
    r = (u > thr).astype(u.dtype)
    if subtract:
        return (b * u + i) - r * thr
    return b * ((1 - r) * u) + i


def _fwd_xp(xp, inp, beta, threshold, out, states, reset, recompute, spikes):
    _check_params(reset, recompute)
    _check("lif_fwd", inp, out, states=states, recompute=recompute)
    b, thr, _ = _scalars(beta, threshold, out.dtype, xp)
    x, y = _seq(inp), _seq(out)
    n, T, F = x.shape
    s = None if states is None else _seq(states)
    k = int(recompute)
    u = xp.zeros((n, F), dtype=out.dtype)
    for t in range(T):
        u = _step_xp(xp, u, x[:, t], b, thr, reset == "subtract")
        y[:, t] = (u > thr) if spikes else u
        if s is not None and ((t + 1) % k == 0 or t == T - 1):
            s[:, t // k] = u


def _bwd_xp(xp, inp, states, dout, beta, threshold, dinp, sums, reset, recompute, output,
            slope):
    """The backward scan; adds ``(dL/dbeta, dL/dthreshold)`` into the float64 ``sums``."""
    _check_params(reset, recompute, output)
    _check("lif_bwd", inp, dout, dinp, states=states, recompute=recompute)
    dtype = dinp.dtype
    b, thr, _ = _scalars(beta, threshold, dtype, xp)
    slope = dtype.type(slope)
    subtract, spikes, k = reset == "subtract", output == "spikes", int(recompute)
    x, s, dy, dx = _seq(inp), _seq(states), _seq(dout), _seq(dinp)
    n, T, F = x.shape
    g = xp.zeros((n, F), dtype=dtype)
    dbeta, dthr = xp.zeros((), xp.float64), xp.zeros((), xp.float64)  # one host sync, at the end
    for j in range(s.shape[1] - 1, -1, -1):
        t0, t1 = j * k, min((j + 1) * k, T)
        u = [xp.zeros((n, F), dtype=dtype) if j == 0 else s[:, j - 1]]
        for t in range(t0, t1 - 1):  # the membranes inside the run, as the forward made them
            u.append(_step_xp(xp, u[-1], x[:, t], b, thr, subtract))
        u.append(s[:, j])
        for t in range(t1 - 1, t0 - 1, -1):
            now, before = u[t - t0 + 1], u[t - t0]
            if spikes:
                den = slope * xp.abs(now - thr) + 1
                d = dy[:, t] / (den * den)
            else:
                d = dy[:, t]
            carry = g * b
            if not subtract:
                carry = carry * (1 - (now > thr).astype(dtype))
            g = d + carry
            dx[:, t] = g
            fired = (before > thr).astype(dtype)
            dbeta += (g * (before if subtract else (1 - fired) * before)).sum(dtype=xp.float64)
            if subtract:
                dthr -= (g * fired).sum(dtype=xp.float64)
            if spikes:
                dthr -= d.sum(dtype=xp.float64)
    sums[0] += dbeta
    sums[1] += dthr


def _fwd_ref(inp, beta, threshold, out, states, *, reset="subtract", recompute=1):
    _fwd_xp(np, inp, beta, threshold, out, states, reset, recompute, True)


def _fwd_membrane_ref(inp, beta, threshold, out, *, reset="subtract", recompute=1):
    _fwd_xp(np, inp, beta, threshold, out, None, reset, 1, False)


def _fwd_cuda(inp, beta, threshold, out, states, *, reset="subtract", recompute=1):
    _fwd_xp(array_module(inp, out), inp, beta, threshold, out, states, reset, recompute, True)


def _fwd_membrane_cuda(inp, beta, threshold, out, *, reset="subtract", recompute=1):
    _fwd_xp(array_module(inp, out), inp, beta, threshold, out, None, reset, 1, False)


# --------------------------------------------------------------------------- cpu (Numba)

@jit_inline
def _step_cpu(u, i, b, thr, subtract, one, zero):
    """:func:`_step_xp` for one neuron, the same operations in the same order."""
    r = one if u > thr else zero
    if subtract:
        return (b * u + i) - r * thr
    return b * ((one - r) * u) + i


@jit
def _fwd_cpu(x, b, thr, y, s, subtract, spikes, k):
    n, T, F = x.shape
    one, zero = y.dtype.type(1), y.dtype.type(0)
    u = np.empty(F, dtype=y.dtype)
    for i in range(n):
        u[:] = zero
        for t in range(T):
            for f in range(F):
                v = _step_cpu(u[f], x[i, t, f], b, thr, subtract, one, zero)
                u[f] = v
                if spikes:
                    y[i, t, f] = one if v > thr else zero
                else:
                    y[i, t, f] = v
            if s.shape[1] > 0 and ((t + 1) % k == 0 or t == T - 1):
                j = t // k
                for f in range(F):
                    s[i, j, f] = u[f]


@jit
def _bwd_cpu(x, s, dy, b, thr, slope, dx, subtract, spikes, k, sums):
    """The backward scan per sample; ``sums`` (float64[2]) gets dbeta and dthreshold."""
    n, T, F = x.shape
    m = s.shape[1]
    one, zero = dx.dtype.type(1), dx.dtype.type(0)
    u = np.empty((k + 1, F), dtype=dx.dtype)   # the membranes of one run, U before it first
    g = np.empty(F, dtype=dx.dtype)            # G[t + 1] per neuron
    sb = np.zeros(F, dtype=np.float64)         # per-neuron partial sums: the feature loop
    st = np.zeros(F, dtype=np.float64)         # stays free of loop-carried dependencies
    for i in range(n):
        g[:] = zero
        for j in range(m - 1, -1, -1):
            t0 = j * k
            t1 = min(t0 + k, T)
            for f in range(F):
                u[0, f] = zero if j == 0 else s[i, j - 1, f]
            for t in range(t0, t1 - 1):
                q = t - t0
                for f in range(F):
                    u[q + 1, f] = _step_cpu(u[q, f], x[i, t, f], b, thr, subtract, one, zero)
            for f in range(F):
                u[t1 - t0, f] = s[i, j, f]
            for t in range(t1 - 1, t0 - 1, -1):
                q = t - t0 + 1
                for f in range(F):
                    now = u[q, f]
                    before = u[q - 1, f]
                    if spikes:
                        den = slope * abs(now - thr) + one
                        d = dy[i, t, f] / (den * den)
                    else:
                        d = dy[i, t, f]
                    carry = g[f] * b
                    if not subtract:
                        carry = carry * (one - (one if now > thr else zero))
                    gu = d + carry
                    g[f] = gu
                    dx[i, t, f] = gu
                    fired = one if before > thr else zero
                    if subtract:
                        sb[f] += gu * before
                        st[f] -= gu * fired
                    else:
                        sb[f] += gu * ((one - fired) * before)
                    if spikes:
                        st[f] -= d
    sums[0] += sb.sum()
    sums[1] += st.sum()


@jit
def _fwd_cpu_operands(x, beta, threshold, y, s, subtract, spikes, k):
    """:func:`_fwd_cpu` with beta and threshold read from their operands (one element
    each) as :func:`_scalars` reads them: a replay binds the arrays, not their values."""
    zero, one = y.dtype.type(0), y.dtype.type(1)
    b = y.dtype.type(np.float64(beta[0]))
    if b < zero:
        b = zero
    elif b > one:
        b = one
    _fwd_cpu(x, b, y.dtype.type(np.float64(threshold[0])), y, s, subtract, spikes, k)


@from_calls
def lif_fwd_cpu(view, inp, beta, threshold, out, states, *, reset="subtract", recompute=1):
    """``lif_fwd``'s one Numba call; compiled in a replay."""
    _check_params(reset, recompute)
    _check("lif_fwd", inp, out, states=states, recompute=recompute)
    require_contiguous("lif_fwd", out=out, states=states)
    return [(_fwd_cpu_operands, (_seq(view(inp)), view(beta).reshape(1),
                                 view(threshold).reshape(1), _seq(out), _seq(states),
                                 reset == "subtract", True, int(recompute)))]


@from_calls
def lif_fwd_membrane_cpu(view, inp, beta, threshold, out, *, reset="subtract", recompute=1):
    """``lif_fwd_membrane``'s one Numba call; compiled in a replay."""
    _check_params(reset, 1)
    _check("lif_fwd_membrane", inp, out)
    require_contiguous("lif_fwd_membrane", out=out)
    return [(_fwd_cpu_operands, (_seq(view(inp)), view(beta).reshape(1),
                                 view(threshold).reshape(1), _seq(out),
                                 np.empty((0, 0, 0), out.dtype), reset == "subtract", False, 1))]


def _bwd_cpu_sums(inp, states, dout, beta, threshold, dinp, sums, reset, recompute, output,
                  slope):
    _check_params(reset, recompute, output)
    _check("lif_bwd", inp, dout, dinp, states=states, recompute=recompute)
    require_contiguous("lif_bwd", dinp=dinp)
    dtype = dinp.dtype
    b, thr, _ = _scalars(beta, threshold, dtype)
    c = np.ascontiguousarray
    _bwd_cpu(_seq(c(inp)), _seq(c(states)), _seq(c(dout)), b, thr, dtype.type(slope),
             _seq(dinp), reset == "subtract", output == "spikes", int(recompute), sums)


# --------------------------------------------------------------------------- codelets

def _scan_flops(inp, *others, **params):
    return 8.0 * math.prod(inp)


lif_fwd = Codelet(
    "lif_fwd", modes=(R, R, R, W, W),
    variants={"ref": _fwd_ref, "cpu": lif_fwd_cpu, "cuda": _fwd_cuda}, flops=_scan_flops)
"""The forward scan, spikes out, membranes kept every ``recompute`` steps."""

lif_fwd_membrane = Codelet(
    "lif_fwd_membrane", modes=(R, R, R, W),
    variants={"ref": _fwd_membrane_ref, "cpu": lif_fwd_membrane_cpu,
              "cuda": _fwd_membrane_cuda}, flops=_scan_flops)
"""The forward scan with the membrane as output (a readout layer)."""


def _bwd_variant(scan, grads):
    """A backward variant that adds the scan's sums into the REDUX operands ``grads`` names
    (``"beta"``, ``"threshold"``), after the six operands ``lif_bwd`` has."""
    def variant(inp, states, dout, beta, threshold, dinp, *partials, reset="subtract",
                recompute=1, output="spikes", slope=25.0):
        xp = array_module(inp, dout, dinp)
        sums = xp.zeros(2)
        scan(inp, states, dout, beta, threshold, dinp, sums, reset, recompute, output, slope)
        inside = _scalars(beta, threshold, dinp.dtype, xp)[2]
        for name, partial in zip(grads, partials):
            value = xp.where(inside, sums[0], 0.0) if name == "beta" else sums[1]
            partial[...] += value.astype(partial.dtype)
    variant.__name__ = f"{getattr(scan, '__name__', 'scan')}_{'_'.join(grads) or 'input'}"
    return variant


def _bwd_ref_sums(inp, states, dout, beta, threshold, dinp, sums, *args):
    _bwd_xp(np, inp, states, dout, beta, threshold, dinp, sums, *args)


def _bwd_cuda_sums(inp, states, dout, beta, threshold, dinp, sums, *args):
    _bwd_xp(array_module(inp, dout, dinp), inp, states, dout, beta, threshold, dinp, sums, *args)


def lif_bwd_codelet(grads=()):
    """The backward codelet giving the gradients of the parameters ``grads`` (a subset of
    ``("beta", "threshold")``, in that order) besides the input gradient."""
    return _BWD[tuple(grads)]


def _make_bwd(name, grads):
    return Codelet(
        name, modes=(R, R, R, R, R, W) + (REDUX,) * len(grads),
        variants={v: _bwd_variant(scan, grads) for v, scan in (
            ("ref", _bwd_ref_sums), ("cpu", _bwd_cpu_sums), ("cuda", _bwd_cuda_sums))},
        init=zero_init if grads else None, redux=add_redux if grads else None,
        flops=lambda inp, *others, **params: 12.0 * math.prod(inp) * (
            1 + (params.get("recompute", 1) > 1)))


lif_bwd = _make_bwd("lif_bwd", ())
"""Backward through time: the input gradient."""
lif_bwd_params = _make_bwd("lif_bwd_params", ("beta", "threshold"))
"""Backward through time: the input gradient, and dbeta and dthreshold (REDUX, 0-d)."""
lif_bwd_beta = _make_bwd("lif_bwd_beta", ("beta",))
"""Backward through time: the input gradient and dbeta (REDUX, 0-d)."""
lif_bwd_threshold = _make_bwd("lif_bwd_threshold", ("threshold",))
"""Backward through time: the input gradient and dthreshold (REDUX, 0-d)."""

_BWD = {(): lif_bwd, ("beta", "threshold"): lif_bwd_params, ("beta",): lif_bwd_beta,
        ("threshold",): lif_bwd_threshold}
