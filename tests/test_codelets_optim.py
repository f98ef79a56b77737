"""Optimizer codelets against torch.optim.SGD and torch.optim.Adam, run for several
steps with the same gradients over a grid of hyper-parameters."""

import numpy as np
import pytest

from hetero_nn.codelets.strict_xp import guard
from hetero_nn.codelets import optim
from helpers import assert_ulp, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

TOL = {np.float64: 1e-10, np.float32: 1e-4}
#: Largest distance from torch in ULPs of each result's largest magnitude.
ULPS = 8
DTYPES = [np.float64, np.float32]
N_STEPS = 5


def problem(seed, dtype, shape=(7, 19)):
    """A parameter and one gradient per step."""
    rng = np.random.default_rng(seed)
    param = rng.standard_normal(shape).astype(dtype)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(N_STEPS)]
    return param, grads


def config_id(config):
    return "-".join(f"{k}={v}" for k, v in config.items())


def sgd_hyper(config, first):
    """The ``hyper`` operand of an SGD config (lr, momentum) on a first step or a later one."""
    return optim.sgd_hyper(config["lr"], config["momentum"], first)


def fixed(config):
    """The parameters of an SGD config that stay task parameters."""
    return {k: config[k] for k in ("dampening", "weight_decay", "nesterov")}


SGD_CONFIGS = [
    dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(lr=0.05, momentum=0.0, dampening=0.0, weight_decay=1e-2, nesterov=False),
    dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(lr=0.03, momentum=0.8, dampening=0.3, weight_decay=5e-3, nesterov=False),
    dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=True),
    dict(lr=0.2, momentum=0.5, dampening=0.0, weight_decay=1e-1, nesterov=True),
]


def torch_sgd(param, grads, config):
    p = torch.from_numpy(param.copy())
    opt = torch.optim.SGD([p], foreach=False, **config)
    for g in grads:
        p.grad = torch.from_numpy(g)
        opt.step()
    buf = opt.state[p].get("momentum_buffer")
    return p.numpy(), None if buf is None else buf.numpy()


@pytest.mark.parametrize("config", SGD_CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(optim.sgd_step.variants))
def test_sgd_matches_torch(variant, dtype, config):
    param, grads = problem(1, dtype)
    expected_param, expected_buf = torch_sgd(param, grads, config)

    p = param.copy()
    buf = np.full_like(param, np.nan)  # overwritten on the first step
    for step, g in enumerate(grads):
        optim.sgd_step.variants[variant](p, g, buf, sgd_hyper(config, step == 0),
                                         **fixed(config))
    assert p.dtype == dtype
    assert rel_err(p, expected_param) <= TOL[dtype]
    assert_ulp(p, expected_param, ULPS, floor="scale", name="sgd_step")
    if config["momentum"] != 0:
        assert rel_err(buf, expected_buf) <= TOL[dtype]
        assert_ulp(buf, expected_buf, ULPS, floor="scale", name="sgd_step")

    if config["momentum"] == 0:
        p = param.copy()
        for g in grads:
            optim.sgd_step_plain.variants[variant](p, g, optim.sgd_hyper(config["lr"]),
                                                    weight_decay=config["weight_decay"])
        assert rel_err(p, expected_param) <= TOL[dtype]
        assert_ulp(p, expected_param, ULPS, floor="scale", name="sgd_step_plain")


ADAM_CONFIGS = [
    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2),
    dict(lr=5e-2, betas=(0.3, 0.9), eps=1e-3, weight_decay=0.0),  # lerp weight >= 0.5
    dict(lr=1e-1, betas=(0.5, 0.5), eps=1e-8, weight_decay=1e-1),
]


def torch_adam(param, grads, config):
    p = torch.from_numpy(param.copy())
    opt = torch.optim.Adam([p], foreach=False, **config)
    for g in grads:
        p.grad = torch.from_numpy(g)
        opt.step()
    state = opt.state[p]
    return p.numpy(), state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()


@pytest.mark.parametrize("config", ADAM_CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(optim.adam_step.variants))
def test_adam_matches_torch(variant, dtype, config):
    param, grads = problem(2, dtype)
    expected = torch_adam(param, grads, config)

    p = param.copy()
    exp_avg, exp_avg_sq = np.zeros_like(param), np.zeros_like(param)
    beta1, beta2 = config["betas"]
    for step, g in enumerate(grads, start=1):
        optim.adam_step.variants[variant](p, g, exp_avg, exp_avg_sq,
                                          optim.adam_hyper(config["lr"], beta1, beta2, step),
                                          eps=config["eps"], weight_decay=config["weight_decay"])
    for actual, wanted in zip((p, exp_avg, exp_avg_sq), expected):
        assert actual.dtype == dtype
        assert rel_err(actual, wanted) <= TOL[dtype]
        assert_ulp(actual, wanted, ULPS, floor="scale", name="adam_step")


@pytest.mark.parametrize("variant", sorted(optim.adam_step.variants))
def test_adam_rejects_step_zero(variant):
    a = np.zeros(3)
    if variant == "cuda":  # on a device the check would be a host sync: NaN parameters instead
        param = np.ones(3)
        with np.errstate(divide="ignore", invalid="ignore"):
            guard(optim.adam_step.variants[variant])(param, a.copy(), a.copy(), a.copy(),
                                                     optim.adam_hyper(0.1, 0.9, 0.999, 0))
        assert np.isnan(param).all()
        return
    with pytest.raises(ValueError, match="step counts from 1"):
        optim.adam_step.variants[variant](a, a.copy(), a.copy(), a.copy(),
                                          optim.adam_hyper(0.1, 0.9, 0.999, 0))


def test_cpu_variants_refuse_non_contiguous_state():
    """An in-place update through a copy would be lost: the wrapper must say so."""
    param = np.zeros((4, 6))[:, ::2]
    grad = np.ones((4, 3))
    with pytest.raises(ValueError, match="C-contiguous"):
        optim.sgd_step_plain.variants["cpu"](param, grad, optim.sgd_hyper(0.1))
    with pytest.raises(ValueError, match="one shape"):
        optim.sgd_step_plain.variants["cpu"](np.zeros(3), np.zeros(4), optim.sgd_hyper(0.1))


@pytest.mark.parametrize("variant", sorted(optim.sgd_step.variants))
def test_strided_gradient_is_read_correctly(variant):
    rng = np.random.default_rng(6)
    param = rng.standard_normal((5, 4))
    grad = rng.standard_normal((4, 5)).T
    expected, _ = torch_sgd(param, [np.ascontiguousarray(grad)], dict(lr=0.5))
    p = param.copy()
    optim.sgd_step_plain.variants[variant](p, grad, optim.sgd_hyper(0.5))
    assert rel_err(p, expected) <= 1e-15


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_variants_on_cupy_match_ref(dtype, cupy):
    param, grads = problem(3, dtype)
    sgd = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3, nesterov=False)
    host = [param.copy(), np.zeros_like(param)]
    dev = [cupy.asarray(param), cupy.zeros(param.shape, dtype)]
    for step, g in enumerate(grads):
        hyper = sgd_hyper(sgd, step == 0)
        optim.sgd_step.variants["ref"](host[0], g, host[1], hyper, **fixed(sgd))
        optim.sgd_step.variants["cuda"](dev[0], cupy.asarray(g), dev[1], cupy.asarray(hyper),
                                        **fixed(sgd))
    for h, d in zip(host, dev):
        assert rel_err(cupy.asnumpy(d), h) <= TOL[dtype]

    adam = dict(eps=1e-8, weight_decay=1e-2)
    host = [param.copy(), np.zeros_like(param), np.zeros_like(param)]
    dev = [cupy.asarray(param), cupy.zeros(param.shape, dtype), cupy.zeros(param.shape, dtype)]
    for step, g in enumerate(grads, start=1):
        hyper = optim.adam_hyper(1e-2, 0.9, 0.99, step)
        optim.adam_step.variants["ref"](host[0], g, *host[1:], hyper, **adam)
        optim.adam_step.variants["cuda"](dev[0], cupy.asarray(g), *dev[1:], cupy.asarray(hyper),
                                         **adam)
    for h, d in zip(host, dev):
        assert rel_err(cupy.asnumpy(d), h) <= TOL[dtype]
