"""Whole training steps equal to PyTorch's, and bit-identical under every scheduling policy.

Two networks on 28x28 inputs -- LeNet-5 and a small ``conv 4@3x3 -> pool -> dense``
-- start from the same weights as a ``torch.nn.Sequential`` of the same layers (copied
through ``state_dict``) and see the same seeded batches (a random mix of normal,
image-like, sparse and shifted inputs; random labels). After 10 SGD or Adam steps
the losses, the weights and the optimizer's buffers equal PyTorch's (float64,
relative error <= 1e-9) at granularity 1, 3 and 8 under every policy; at a given
granularity every policy gives the same bits (REDUX trees have a fixed shape).
The models run fused (the default: ``Conv2D, ReLU, MaxPool2D`` and ``Dense, ReLU`` as
one task each); one test runs them unfused (``fuse=False``), one with a granularity
per block (``Sequential.granularities``).
``variants=("ref",)`` pins the NumPy references (unless a test names others; the
default pinned table is checked in test_reproducible.py) and ``perfmodel=False``
keeps the runs from writing caches. A float32
run with the performance model active (variants explored and mixed) stays within
1e-4 of PyTorch's float32.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

import hetero_nn as hn
from helpers import rel_err
from twins import torch_twin

torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against it need it")

POLICIES = ("eager", "random", "ws", "dmda", "heft")
GRANULARITIES = (1, 3, 8)
INPUT_SHAPE = (1, 28, 28)
BATCH = 16
STEPS = 10  # 100 in the slow test_long_run_float64_lenet: the agreement does not drift
SEED = 2024
REL_F64 = 1e-9
REL_F32 = 1e-4


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """PyTorch on one thread: the runtime's two workers already take both cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- networks

def lenet5():
    return hn.Sequential(
        hn.Conv2D(1, 6, 5, padding=2), hn.ReLU(), hn.MaxPool2D(2),
        hn.Conv2D(6, 16, 5), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
        hn.Dense(400, 120), hn.ReLU(), hn.Dense(120, 84), hn.ReLU(), hn.Dense(84, 10))


def small_net():
    return hn.Sequential(hn.Conv2D(1, 4, 3), hn.ReLU(), hn.MaxPool2D(2), hn.Flatten(),
                         hn.Dense(676, 10))


NETS = {"lenet5": lenet5, "small": small_net}


@functools.lru_cache(maxsize=None)
def initial_state(net: str, dtype: str):
    """The seeded initial weights of ``net`` built for ``dtype`` (PyTorch key names)."""
    hn.manual_seed(SEED)
    model = NETS[net]()
    model.build(INPUT_SHAPE, dtype)
    return model.state_dict()


def fresh_model(net, dtype):
    model = NETS[net]()
    model.build(INPUT_SHAPE, dtype)
    model.load_state_dict(initial_state(net, dtype))
    return model


@functools.lru_cache(maxsize=None)
def batches(dtype: str, steps: int, batch: int = BATCH):
    """Seeded batches, each drawn from one of four input kinds at random, random labels."""
    rng = np.random.default_rng(SEED + steps)
    out = []
    for _ in range(steps):
        shape = (batch, *INPUT_SHAPE)
        kind = rng.integers(4)
        if kind == 0:    # standard normal
            x = rng.standard_normal(shape)
        elif kind == 1:  # image-like intensities in [0, 1)
            x = rng.random(shape)
        elif kind == 2:  # sparse strokes on a zero background, as MNIST digits
            x = np.where(rng.random(shape) < 0.2, rng.random(shape), 0.0)
        else:            # shifted and scaled, as unnormalised data
            x = 3.0 * rng.standard_normal(shape) + 1.0
        y = rng.integers(0, 10, batch)
        x = x.astype(dtype)
        x.flags.writeable = False
        y.flags.writeable = False
        out.append((x, y))
    return tuple(out)


# --------------------------------------------------------------------------- optimizers

OPTIMIZERS = {  # name: (hetero_nn recipe, torch.optim constructor), same arguments
    "sgd-momentum": (lambda: hn.optim.SGD(lr=0.05, momentum=0.9),
                     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "sgd-nesterov-wd": (lambda: hn.optim.SGD(lr=0.03, momentum=0.8, nesterov=True, weight_decay=1e-3),
                        lambda ps: torch.optim.SGD(ps, lr=0.03, momentum=0.8, nesterov=True,
                                                   weight_decay=1e-3)),
    "adam": (lambda: hn.optim.Adam(lr=2e-3),
             lambda ps: torch.optim.Adam(ps, lr=2e-3)),
}
EXTRA_OPTIMIZERS = {  # slow extras
    "sgd-plain": (lambda: hn.optim.SGD(lr=0.1),
                  lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd-dampening-wd": (lambda: hn.optim.SGD(lr=0.05, momentum=0.5, dampening=0.3, weight_decay=1e-2),
                         lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, dampening=0.3,
                                                    weight_decay=1e-2)),
    "adam-betas-wd": (lambda: hn.optim.Adam(lr=5e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=1e-2),
                      lambda ps: torch.optim.Adam(ps, lr=5e-3, betas=(0.8, 0.95), eps=1e-6,
                                                  weight_decay=1e-2)),
}
ALL_OPTIMIZERS = {**OPTIMIZERS, **EXTRA_OPTIMIZERS}


# --------------------------------------------------------------------------- runs

class Run:
    """What a training run leaves: per-step losses, weights, optimizer buffers."""

    def __init__(self, losses, weights, buffers, variants=None, workers=()):
        self.losses = np.asarray(losses, dtype=np.float64)
        self.weights = weights            # {"0.weight": array, ...}
        self.buffers = buffers            # {("0.weight", "exp_avg"): array, ...}
        self.variants = variants or {}    # {codelet: {variant names run}}
        self.workers = set(workers)       # the workers that ran tasks

    def digests(self) -> dict:
        """SHA-256 of every array's bytes: equal digests mean bit-identical results."""
        items = {"losses": self.losses, **self.weights,
                 **{f"{p}.{b}": a for (p, b), a in self.buffers.items()}}
        return {k: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                for k, a in items.items()}


@functools.lru_cache(maxsize=None)
def torch_run(net, opt, dtype="float64", steps=STEPS) -> Run:
    model = fresh_model(net, dtype)
    twin = torch_twin(model, dtype)
    names = dict(twin.named_parameters())
    optimizer = ALL_OPTIMIZERS[opt][1](twin.parameters())
    losses = []
    for x, y in batches(dtype, steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x.copy())),
                                               torch.from_numpy(y.copy()))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = {k: v.detach().numpy().copy() for k, v in twin.state_dict().items()}
    buffers = {(name, b): t.numpy().copy() for name, p in names.items()
               for b, t in optimizer.state[p].items() if b != "step" and t is not None}
    return Run(losses, weights, buffers)


def hn_run(net, opt, granularity, policy, dtype="float64", steps=STEPS, *, variants=None,
           deterministic=True, perfmodel=False, fuse=True, granularities=None) -> Run:
    model = fresh_model(net, dtype)
    model.fuse = fuse
    model.granularities = granularities
    with hn.Runtime(devices="cpu:2", policy=policy, deterministic=deterministic,
                    perfmodel=perfmodel,
                    variants=variants or (("ref",) if deterministic else None)) as rt:
        trainer = hn.Trainer(model, hn.losses.SoftmaxCrossEntropy(), ALL_OPTIMIZERS[opt][0](),
                             rt, batch_size=BATCH, granularity=granularity, dtype=dtype)
        losses = [trainer.train_step(x, y) for x, y in batches(dtype, steps)]
        weights = model.state_dict()
        state = trainer.optimizer.state_dict()["state"]
        ran, workers = {}, set()
        for record in rt.trace():
            ran.setdefault(record.codelet, set()).add(record.variant)
            workers.add(record.worker)
    buffers = {(p, b): a for p, st in state.items() for b, a in st.items()}
    return Run(losses, weights, buffers, ran, workers)


_DIGESTS: dict = {}  # (net, opt, granularity, policy, variants) -> Run.digests()


def hn_digests(net, opt, granularity, policy, variants=None) -> dict:
    key = (net, opt, granularity, policy, variants)
    if key not in _DIGESTS:
        _DIGESTS[key] = hn_run(net, opt, granularity, policy, variants=variants).digests()
    return _DIGESTS[key]


def compare(run: Run, ref: Run, rel: float, label: str) -> list[str]:
    """Every loss, weight and optimizer buffer of ``run`` whose error exceeds ``rel``."""
    problems = []
    assert run.losses.shape == ref.losses.shape
    loss_err = float(np.max(np.abs(run.losses - ref.losses) / np.abs(ref.losses)))
    if not loss_err <= rel:
        problems.append(f"{label}: losses differ by {loss_err:.3g} (first step "
                        f"{run.losses[0]!r} vs torch {ref.losses[0]!r})")
    assert run.weights.keys() == ref.weights.keys()
    for name, expected in ref.weights.items():
        assert run.weights[name].shape == expected.shape, name
        err = rel_err(run.weights[name], expected)
        if not err <= rel:
            problems.append(f"{label}: weight {name} differs by {err:.3g}")
    assert run.buffers.keys() == ref.buffers.keys()
    for key, expected in ref.buffers.items():
        err = rel_err(run.buffers[key], expected)
        if not err <= rel:
            problems.append(f"{label}: optimizer buffer {key} differs by {err:.3g}")
    return problems


def training_moved(run: Run, net, dtype):
    """Guard against vacuous agreement: the weights did change during the run."""
    start = initial_state(net, dtype)
    return all(rel_err(run.weights[k], start[k]) > 1e-3 for k in start)


# --------------------------------------------------------------------------- float64 vs torch

CASES = [(net, opt, g, policy) for net in NETS for opt in OPTIMIZERS
         for g in GRANULARITIES for policy in POLICIES]


@pytest.mark.parametrize("net, opt, granularity, policy", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_training_steps_equal_torch(net, opt, granularity, policy):
    ref = torch_run(net, opt)
    run = hn_run(net, opt, granularity, policy)
    problems = compare(run, ref, REL_F64, f"{net}/{opt}/g={granularity}/{policy}")
    assert not problems, "\n".join(problems)
    assert training_moved(run, net, "float64")
    assert run.variants["conv2d_relu_pool_fwd"] == {"ref"}  # deterministic: one variant each
    if granularity == 8:  # partitions did run side by side: identity is not trivial
        assert run.workers == {"cpu0", "cpu1"}, run.workers
    _DIGESTS[(net, opt, granularity, policy, None)] = run.digests()


@pytest.mark.parametrize("net, opt, granularity",
                         [(n, o, g) for n in NETS for o in OPTIMIZERS for g in GRANULARITIES])
def test_policies_give_bit_identical_results(net, opt, granularity):
    first = hn_digests(net, opt, granularity, POLICIES[0])
    for policy in POLICIES[1:]:
        other = hn_digests(net, opt, granularity, policy)
        differ = [k for k in first if first[k] != other[k]]
        assert not differ, f"{policy} differs from {POLICIES[0]} in {differ}"


@pytest.mark.parametrize("variants", [("cpu:direct", "cpu"), ("cpu:im2col", "cpu")],
                         ids=["direct", "im2col"])
def test_numba_variants_train_like_torch_and_identically_under_every_policy(variants):
    """The Numba kernels (conv ``cpu:direct`` or ``cpu:im2col``, ``cpu`` elsewhere) in a
    whole LeNet-5 training run: equal to PyTorch, the same bits under every policy."""
    steps = 10
    ref = torch_run("lenet5", "adam", "float64", steps)
    first = None
    for policy in POLICIES:
        run = hn_run("lenet5", "adam", 3, policy, "float64", steps, variants=variants)
        assert run.variants["conv2d_relu_pool_fwd"] == {variants[0]}  # fused (the default)
        assert run.variants["dense_fwd"] == {"cpu"} and run.variants["dense_relu_bwd"] == {"cpu"}
        problems = compare(run, ref, REL_F64, f"{variants}/{policy}")
        assert not problems, "\n".join(problems)
        digests = run.digests()
        if first is None:
            first = digests
        differ = [k for k in first if first[k] != digests[k]]
        assert not differ, f"{policy} differs from {POLICIES[0]} in {differ}"


@pytest.mark.parametrize("granularity", [1, 3])
def test_unfused_training_equals_torch_and_is_identical_under_every_policy(granularity):
    """``fuse=False`` (every layer's own tasks): PyTorch's results, one set of bits."""
    ref = torch_run("lenet5", "sgd-momentum")
    first = None
    for policy in POLICIES:
        run = hn_run("lenet5", "sgd-momentum", granularity, policy, fuse=False)
        assert "conv2d_fwd" in run.variants and "conv2d_relu_pool_fwd" not in run.variants
        problems = compare(run, ref, REL_F64, f"unfused/g={granularity}/{policy}")
        assert not problems, "\n".join(problems)
        first = first or run.digests()
        assert run.digests() == first, f"{policy} differs from {POLICIES[0]}"


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_per_layer_granularity_trains_like_torch_and_identically_under_every_policy(fuse):
    """Convolutions at g = 3 and 4, the dense tail at g = 1, the batch at g = 2: each
    block re-splits the batch with its own plan, forward and backward."""
    layers = (3, 3, 3, 4, 4, 4, 1, 1, 1, 1, 1, 1)
    ref = torch_run("lenet5", "sgd-momentum")
    first = None
    for policy in POLICIES:
        run = hn_run("lenet5", "sgd-momentum", 2, policy, fuse=fuse, granularities=layers)
        problems = compare(run, ref, REL_F64, f"per-layer/fuse={fuse}/{policy}")
        assert not problems, "\n".join(problems)
        assert run.workers == {"cpu0", "cpu1"}, run.workers
        first = first or run.digests()
        assert run.digests() == first, f"{policy} differs from {POLICIES[0]}"


def test_granularity_changes_only_the_last_bits():
    """Different granularities sum the gradient in different trees: equal to rounding."""
    runs = [hn_run("small", "sgd-momentum", g, "eager") for g in (1, 2, 5, 16)]
    for run in runs[1:]:
        assert not compare(run, runs[0], REL_F64, "granularity")


# --------------------------------------------------------------------------- float32

@pytest.mark.parametrize("net", list(NETS))
def test_float32_with_perfmodel_active_matches_torch_float32(net, tmp_path):
    """Variants explored by the performance model (ref, direct, im2col mixed in one run).

    SGD, not Adam: Adam divides by the root of the squared gradient, so in float32 its
    update of a weight whose gradient nearly cancels is noise-sized in any library
    (PyTorch float32 against float64 differs by ~1e-3 after six Adam steps).
    """
    steps = 6
    ref = torch_run(net, "sgd-nesterov-wd", "float32", steps)
    run = hn_run(net, "sgd-nesterov-wd", 2, "dmda", "float32", steps, deterministic=False,
                 perfmodel=tmp_path / "perfmodel")
    problems = compare(run, ref, REL_F32, f"{net}/float32")
    assert not problems, "\n".join(problems)
    assert all(w.dtype == np.float32 for w in run.weights.values())
    assert len(run.variants["conv2d_relu_pool_fwd"]) >= 2, run.variants["conv2d_relu_pool_fwd"]
    assert (tmp_path / "perfmodel").exists()  # the model was written where it was told


def test_float32_differs_from_float64():
    """The float32 comparison is not a float64 run in disguise."""
    f32 = hn_run("small", "sgd-momentum", 1, "eager", "float32", 4)
    f64 = hn_run("small", "sgd-momentum", 1, "eager", "float64", 4)
    assert f32.weights["0.weight"].dtype == np.float32
    err = rel_err(f32.weights["4.weight"], f64.weights["4.weight"])
    assert 0 < err < REL_F32


# --------------------------------------------------------------------------- sanity of the check

def test_comparison_detects_a_wrong_hyperparameter():
    """A run with a slightly different learning rate is caught by the 1e-9 comparison."""
    ref = torch_run("small", "sgd-momentum")
    model = fresh_model("small", "float64")
    with hn.Runtime(devices="cpu:2", deterministic=True, perfmodel=False) as rt:
        trainer = hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05 * (1 + 1e-6), momentum=0.9),
                             runtime=rt, batch_size=BATCH, granularity=1, dtype="float64")
        losses = [trainer.train_step(x, y) for x, y in batches("float64", STEPS)]
        run = Run(losses, model.state_dict(), {})
    ref_no_buffers = Run(ref.losses, ref.weights, {})
    assert compare(run, ref_no_buffers, REL_F64, "perturbed")


# --------------------------------------------------------------------------- slow extras

@pytest.mark.slow
@pytest.mark.parametrize("opt", list(EXTRA_OPTIMIZERS))
@pytest.mark.parametrize("net", list(NETS))
def test_more_optimizer_settings_equal_torch(net, opt):
    ref = torch_run(net, opt)
    first = None
    for g in GRANULARITIES:
        for policy in POLICIES:
            run = hn_run(net, opt, g, policy)
            problems = compare(run, ref, REL_F64, f"{net}/{opt}/g={g}/{policy}")
            assert not problems, "\n".join(problems)
            if policy == POLICIES[0]:
                first = run.digests()
            else:
                assert run.digests() == first, f"{policy} differs from {POLICIES[0]} at g={g}"


@pytest.mark.slow
def test_long_run_float64_lenet():
    """100 Adam steps at granularity 4: the agreement does not drift."""
    ref = torch_run("lenet5", "adam", "float64", 100)
    run = hn_run("lenet5", "adam", 4, "heft", "float64", 100)
    problems = compare(run, ref, 1e-8, "lenet5/100 steps")
    assert not problems, "\n".join(problems)
