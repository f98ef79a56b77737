"""Shared by the GPU acceptance stages: which device to use, the model zoo, result lines.

Every stage runs on a real GPU (``cuda:0``, CuPy) when one is there and on the
emulated device (``cuda-emu``, NumPy) otherwise, so the whole acceptance run can be
dry-run in CI. A stage prints one ``PASS``/``FAIL``/``SKIP`` line per check and
ends with a summary line; its exit status is 1 if any check failed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hetero_nn as hn  # noqa: E402
from hetero_nn.codelets.xp import cupy_or_none  # noqa: E402

REL = {"float64": 1e-10, "float32": 1e-4}  # a variant against its ref twin
REL_STEP = 1e-9                               # a float64 training run against PyTorch's


def gpu():
    """CuPy when a GPU is visible (and ``HETERO_NN_GPU_EMULATE`` is unset), else ``None``."""
    if os.environ.get("HETERO_NN_GPU_EMULATE"):
        return None
    return cupy_or_none()


def device_specs(cp) -> dict:
    """The device specs the stages compare: the GPU alone, and the CPU cores beside it."""
    ncpu = max(1, min(16, os.cpu_count() or 1))
    if cp is None:
        return {"gpu": "cuda-emu:1", "mixed": "cpu:1,cuda-emu:1", "cpu": "cpu:1"}
    return {"gpu": "cuda:0", "mixed": f"cpu:{ncpu},cuda:0", "cpu": f"cpu:{ncpu}"}


def zoo_model(name: str):
    """``(layers, input shape)`` of a model the stages train: the built-in ones, and
    ``zoo`` (one of every other layer kind the built-in ones do not use)."""
    if name == "zoo":
        layers = [hn.Conv2D(3, 6, 3, padding=1), hn.BatchNorm2D(6), hn.Hardswish(),
                  hn.AvgPool2D(2), hn.Conv2D(6, 8, 3, stride=2, padding=1), hn.SiLU(),
                  hn.MaxPool2D(3, stride=1), hn.Dropout2d(0.25), hn.AdaptiveAvgPool2d(2),
                  hn.Flatten(), hn.Dense(32, 24), hn.LayerNorm(24), hn.GELU(), hn.Dropout(0.3),
                  hn.Dense(24, 16), hn.LeakyReLU(0.1), hn.Dense(16, 12), hn.Tanh(),
                  hn.Dense(12, 12), hn.Sigmoid(), hn.Dense(12, 10), hn.ReLU6(),
                  hn.Dense(10, 10)]
        return hn.Sequential(*layers), (3, 12, 12)
    if name == "zoo-b":  # depthwise and bias-free convolutions, batch norm over partitions,
        # log-softmax for NLL
        return hn.Sequential(hn.Conv2D(3, 3, 3, groups=3), hn.Conv2D(3, 6, 3, bias=False),
                             hn.BatchNorm2D(6), hn.ReLU(), hn.Conv2D(6, 6, 3, groups=6, bias=False), hn.Flatten(),
                             hn.Dense(6 * 6 * 6, 16, bias=False), hn.ReLU(), hn.Dense(16, 10),
                             hn.LogSoftmax()), (3, 12, 12)
    if name == "zoo-c":  # a first fused Dense+ReLU, LayerNorm without bias, softmax into MSE
        return hn.Sequential(hn.Flatten(), hn.Dense(3 * 6 * 6, 16), hn.ReLU(),
                             hn.LayerNorm(16, bias=False), hn.Dense(16, 10), hn.Softmax()), (3, 6, 6)
    if name == "snn-learn":  # learnt beta and threshold, bias-free event-driven dense
        from hetero_nn.layers import LIF, RateEncode
        return hn.Sequential(RateEncode(3, seed=1), hn.Flatten(), hn.Dense(64, 16, bias=False),
                             LIF(0.9, learn_beta=True, learn_threshold=True),
                             hn.Dense(16, 16, bias=False), LIF(0.8, learn_threshold=True),
                             hn.Dense(16, 10), LIF(0.9, output="membrane", learn_beta=True)
                             ), (1, 8, 8)
    if name in ("snn-mlp", "snn-conv"):
        from hetero_nn.models import MODELS
        shape = (1, 8, 8) if name == "snn-mlp" else (1, 16, 16)
        options = {"time_steps": 3, "encoding": "rate" if name == "snn-mlp" else "direct",
                   "rate_seed": 1}
        return hn.Sequential(*MODELS[name](shape, 10, **options)), shape
    name, shape = model_shape(name)
    from hetero_nn.models import MODELS
    return hn.Sequential(*MODELS[name](shape, 10)), shape


SHAPES = {"lenet5": (1, 28, 28), "dahl-basic": (1, 28, 28), "cifar-small": (3, 32, 32),
          "resnet-small": (3, 32, 32), "resnet18": (3, 32, 32),
          "dahl-basic-512": (1, 512, 512)}  # issue 32's dahl-basic on 512x512 images


def model_shape(name: str) -> tuple[str, tuple]:
    """``(built-in model name, sample shape)`` of a benchmark model name."""
    return ("dahl-basic" if name == "dahl-basic-512" else name), SHAPES[name]


def batch(shape, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(dtype)
    y = rng.integers(0, 10, n)
    return x, y


class Checks:
    """PASS/FAIL/SKIP lines and the stage's exit status."""

    def __init__(self, stage):
        self.stage = stage
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        self.t0 = time.perf_counter()

    def line(self, status, what, detail=""):
        self.counts[status] += 1
        print(f"{status} {self.stage}: {what}{' -- ' + detail if detail else ''}", flush=True)

    def check(self, ok, what, detail=""):
        self.line("PASS" if ok else "FAIL", what, detail)
        return ok

    def done(self) -> int:
        c = self.counts
        print(f"SUMMARY {self.stage}: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped "
              f"in {time.perf_counter() - self.t0:.1f} s", flush=True)
        return 1 if c["FAIL"] else 0


def rel_err(a, b, floor=0.0) -> float:
    """Largest |a - b| over the largest |b|, or ``floor`` if larger (the size of the terms
    a sum cancelled from); NaN in the same places counts as equal."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    same_nan = np.isnan(a) & np.isnan(b)
    if np.any(np.isnan(a) != np.isnan(b)):
        return float("inf")
    a, b = np.where(same_nan, 0, a), np.where(same_nan, 0, b)
    if not a.size:
        return 0.0
    scale = max(float(np.max(np.abs(b))), floor, np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - b))) / scale
