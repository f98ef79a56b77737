"""AdamW and gradient-clipping codelets against torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_ (every variant, float64 and float32)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hetero_nn.codelets import optim  # noqa: E402
from helpers import assert_ulp, rel_err  # noqa: E402

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of each result's largest magnitude.
ULPS = 8
DTYPES = [np.float64, np.float32]
ADAMW_CONFIGS = [
    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),   # torch's defaults
    dict(lr=5e-2, betas=(0.3, 0.9), eps=1e-3, weight_decay=0.1),      # lerp weight >= 0.5
    dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0),
]


@pytest.mark.parametrize("config", ADAMW_CONFIGS, ids=lambda c: f"lr={c['lr']}-wd={c['weight_decay']}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(optim.adamw_step.variants))
def test_adamw_matches_torch(variant, dtype, config):
    rng = np.random.default_rng(7)
    param = rng.standard_normal((6, 11)).astype(dtype)
    grads = [rng.standard_normal(param.shape).astype(dtype) for _ in range(5)]
    tp = torch.from_numpy(param.copy())
    topt = torch.optim.AdamW([tp], foreach=False, **config)
    p = param.copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    beta1, beta2 = config["betas"]
    lr = config["lr"]
    for step, g in enumerate(grads, start=1):
        lr *= 0.9  # a schedule: the codelet reads lr every step
        topt.param_groups[0]["lr"] = lr
        tp.grad = torch.from_numpy(g)
        topt.step()
        optim.adamw_step.variants[variant](p, g, m, v, optim.adam_hyper(lr, beta1, beta2, step),
                                           eps=config["eps"], weight_decay=config["weight_decay"])
    state = topt.state[tp]
    for actual, wanted in ((p, tp), (m, state["exp_avg"]), (v, state["exp_avg_sq"])):
        assert actual.dtype == dtype
        assert rel_err(actual, wanted.numpy()) <= TOL[dtype]
        assert_ulp(actual, wanted.numpy(), ULPS, floor="scale", name="adamw_step")


def test_adamw_differs_from_adam_with_l2():
    """Decoupled decay is not Adam's L2 term (the check above would catch a swap)."""
    p1, p2 = np.ones(4), np.ones(4)
    g = np.full(4, 0.5)
    hyper = optim.adam_hyper(0.1, 0.9, 0.999, 1)
    optim.adamw_step.variants["cpu"](p1, g, np.zeros(4), np.zeros(4), hyper, weight_decay=0.5)
    optim.adam_step.variants["cpu"](p2, g, np.zeros(4), np.zeros(4), hyper, weight_decay=0.5)
    assert np.abs(p1 - p2).min() > 1e-3


@pytest.mark.parametrize("max_norm", [0.3, 1e3])  # clipping, and a factor clamped to 1
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(optim.sum_squares.variants))
def test_clip_codelets_match_torch(variant, dtype, max_norm):
    rng = np.random.default_rng(8)
    grads = [rng.standard_normal(s).astype(dtype) for s in ((4, 3, 3, 3), (4,), (10, 36), (10,))]
    params = [torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype, requires_grad=True)
              for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.from_numpy(g.copy())
    expected_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)

    total = np.zeros((), dtype)
    for g in grads:
        optim.sum_squares.variants[variant](g, total)
    assert total.dtype == dtype
    assert rel_err(np.sqrt(total), expected_norm.numpy()) <= TOL[dtype]
    assert_ulp(np.sqrt(total), expected_norm.numpy(), ULPS, name="sum_squares")  # the norm
    ours = [g.copy() for g in grads]
    for g in ours:
        optim.clip_scale.variants[variant](g, total, max_norm=max_norm)
    for g, p in zip(ours, params):
        assert g.dtype == dtype
        assert rel_err(g, p.grad.numpy()) <= TOL[dtype]
        assert_ulp(g, p.grad.numpy(), ULPS, floor="scale", name="clip_scale")
    if max_norm < 1:
        assert np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in ours)) \
            == pytest.approx(max_norm, rel=1e-5)


def test_clip_scale_cpu_refuses_a_strided_gradient():
    with pytest.raises(ValueError, match="C-contiguous"):
        optim.clip_scale.variants["cpu"](np.ones((4, 6))[:, ::2], np.ones(()), max_norm=1.0)


@pytest.mark.cuda
def test_adamw_and_clip_cuda_on_cupy_match_ref(cupy):
    rng = np.random.default_rng(9)
    p = rng.standard_normal(50)
    g = rng.standard_normal(50)
    host = [p.copy(), np.zeros(50), np.zeros(50)]
    dev = [cupy.asarray(p), cupy.zeros(50), cupy.zeros(50)]
    hyper = optim.adam_hyper(1e-2, 0.9, 0.99, 1)
    kw = dict(eps=1e-8, weight_decay=1e-2)
    optim.adamw_step.variants["ref"](host[0], g, *host[1:], hyper, **kw)
    optim.adamw_step.variants["cuda"](dev[0], cupy.asarray(g), *dev[1:], cupy.asarray(hyper), **kw)
    for h, d in zip(host, dev):
        assert rel_err(cupy.asnumpy(d), h) <= 1e-12
    total_h, total_d = np.zeros(()), cupy.zeros(())
    optim.sum_squares.variants["ref"](g, total_h)
    optim.sum_squares.variants["cuda"](cupy.asarray(g), total_d)
    gh, gd = g.copy(), cupy.asarray(g)
    optim.clip_scale.variants["ref"](gh, total_h, max_norm=0.5)
    optim.clip_scale.variants["cuda"](gd, total_d, max_norm=0.5)
    assert rel_err(cupy.asnumpy(gd), gh) <= 1e-12
