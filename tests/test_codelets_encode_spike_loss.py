"""Encoding and spiking-loss codelets against torch and snnTorch, every variant.

- ``repeat_fwd``/``repeat_bwd``: torch's ``expand`` and its gradient;
- ``rate_encode``: one set of spikes from every variant and every partitioning, keyed by
  the key, firing at the clamped intensity's rate;
- ``membrane_xent``: ``sum_t cross_entropy(U[:, t], y)`` and its gradient;
  ``spike_count_xent``: snnTorch's ``ce_count_loss`` and its gradient; ``correct`` and
  ``spike_count_argmax``: snnTorch's ``accuracy_rate`` on the spikes.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetero_nn.codelets.dropout import dropout_key
from hetero_nn.codelets.encode import rate_encode, repeat_bwd, repeat_fwd
from hetero_nn.codelets.reduce import overwriting
from hetero_nn.codelets.spike_loss import (membrane_xent, membrane_xent_eval, spike_count_argmax,
                                           spike_count_xent, spike_count_xent_eval)
from helpers import rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")
snntorch = pytest.importorskip("snntorch", reason="snnTorch is optional; its losses are the reference")
from snntorch import functional as SF  # noqa: E402

VARIANTS = ("ref", "cpu", "cuda")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_repeat_is_torchs_expand_and_its_gradient(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 4)).astype(dtype)
    dy = rng.standard_normal((3, 7, 2, 4)).astype(dtype)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    yt = xt.unsqueeze(1).expand(3, 7, 2, 4)
    (yt * torch.from_numpy(dy)).sum().backward()
    for v in VARIANTS:
        y = np.full(dy.shape, np.nan, dtype)
        repeat_fwd.variants[v](x, y)
        assert np.array_equal(y, yt.detach().numpy())
        dx = np.full_like(x, np.nan)
        repeat_bwd.variants[v](dy, dx)
        assert rel_err(dx, xt.grad.numpy()) <= (1e-15 if dtype == np.float64 else 1e-6), v
        if v != "ref":
            ref = np.empty_like(x)
            repeat_bwd.variants["ref"](dy, ref)
            assert np.array_equal(dx, ref), v


def encode(variant, x, key, T, parts=1):
    y = np.full((x.shape[0], T, *x.shape[1:]), np.nan, x.dtype)
    start = 0
    for xp_, yp in zip(np.array_split(x, parts), np.array_split(y, parts)):
        rate_encode.variants[variant](xp_, np.array([key], np.uint64), yp, start=start)
        start += len(xp_)
    return y


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rate_encode_same_spikes_everywhere_at_the_intensitys_rate(dtype):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.random((6, 1, 5, 5)), np.full((1, 1, 5, 5), -0.5),
                        np.full((1, 1, 5, 5), 1.5)]).astype(dtype)
    key = dropout_key(42, 3)
    first = encode("ref", x, key, 25)
    assert set(np.unique(first)) <= {0.0, 1.0}
    for v in VARIANTS:
        for parts in (1, 3, 8):
            assert np.array_equal(encode(v, x, key, 25, parts), first), (v, parts)
    assert not np.array_equal(encode("cpu", x, dropout_key(42, 4), 25), first)
    assert first[6].sum() == 0 and first[7].min() == 1  # clamped to [0, 1]
    big = np.full((400, 10), 0.3, dtype)
    spikes = encode("cpu", big, key, 25)
    assert abs(spikes.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / spikes.size)


def xent_run(codelet, variant, out, labels, parts=1, **params):
    """The loss task per partition (the first one writing in place, the others adding)."""
    grad = len(codelet.modes) == 5
    dout = np.full_like(out, np.nan)
    loss, correct = np.zeros((), out.dtype), np.zeros((), np.int64)
    for i, (o, y, d) in enumerate(zip(np.array_split(out, parts), np.array_split(labels, parts),
                                      np.array_split(dout, parts))):
        c = codelet if i else overwriting(codelet)
        args = (o, y, d, loss, correct) if grad else (o, y, loss, correct)
        c.variants[variant](*args, batch=len(labels), **params)
    return float(loss), int(correct), dout


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_membrane_cross_entropy_is_the_sum_over_steps_with_spike_count_accuracy(dtype):
    rng = np.random.default_rng(2)
    mem = (rng.standard_normal((9, 6, 10)) * 1.5).astype(dtype)
    labels = rng.integers(0, 10, 9)
    mt = torch.from_numpy(mem.copy()).requires_grad_()
    loss = sum(torch.nn.functional.cross_entropy(mt[:, t], torch.from_numpy(labels))
               for t in range(6))
    loss.backward()
    spikes = torch.from_numpy((mem > 1.0).astype(dtype)).transpose(0, 1)  # snnTorch: (T, n, K)
    correct = round(SF.acc.accuracy_rate(spikes, torch.from_numpy(labels)) * 9)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for v in VARIANTS:
        for parts in (1, 3):
            value, count, dmem = xent_run(membrane_xent, v, mem, labels, parts, threshold=1.0)
            assert abs(value - loss.item()) <= tol * loss.item(), (v, parts)
            assert rel_err(dmem, mt.grad.numpy()) <= tol, (v, parts)
            assert count == correct, (v, parts)
            assert xent_run(membrane_xent_eval, v, mem, labels, parts, threshold=1.0)[:2] == \
                (value, count)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spike_count_cross_entropy_is_snntorchs_ce_count_loss(dtype):
    rng = np.random.default_rng(3)
    spikes = (rng.random((9, 8, 10)) < 0.3).astype(dtype)
    labels = rng.integers(0, 10, 9)
    st = torch.from_numpy(spikes.copy()).transpose(0, 1).contiguous().requires_grad_()
    loss = SF.ce_count_loss()(st, torch.from_numpy(labels))
    loss.backward()
    correct = round(SF.acc.accuracy_rate(st.detach(), torch.from_numpy(labels)) * 9)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for v in VARIANTS:
        for parts in (1, 3):
            value, count, dspk = xent_run(spike_count_xent, v, spikes, labels, parts)
            assert abs(value - loss.item()) <= tol * loss.item(), (v, parts)
            assert rel_err(dspk, st.grad.transpose(0, 1).numpy()) <= tol, (v, parts)
            assert count == correct
            assert xent_run(spike_count_xent_eval, v, spikes, labels, parts)[:2] == (value, count)
        pred = np.empty(9, np.int64)
        spike_count_argmax.variants[v](spikes, pred)
        assert np.array_equal(pred, st.detach().sum(0).max(1).indices.numpy())
        spike_count_argmax.variants[v](spikes * 3.0, pred, threshold=1.0)  # as membranes
        assert np.array_equal(pred, st.detach().sum(0).max(1).indices.numpy())


def test_a_bad_label_names_the_codelet_and_the_row():
    out = np.zeros((3, 4, 5))
    for v in VARIANTS:
        if v == "cuda":  # on a device: NaN, flagged there with no host sync (docs/gpu.md)
            continue
        with pytest.raises(ValueError, match="membrane_xent: label 7 of row 1"):
            xent_run(membrane_xent, v, out, np.array([0, 7, 1]), threshold=1.0)
