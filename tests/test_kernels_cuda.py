"""The whole-operation CUDA kernels (``hetero_nn.codelets.kernels_cuda``): their sources
compile to PTX (NVRTC), run their ``cuda`` variants against the ``ref`` twins (on the host
by ``tests/cuda_host.py`` where ``g++`` is installed, on a GPU under ``-m cuda``), use
no atomics, and count as one launch each on the strict stand-in.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import re
import sys

import numpy as np
import pytest

import cuda_host
from hetero_nn.codelets import (activation, batchnorm, batchnorm_step, conv, dense, fused,
                                kernels_cuda_bn_step, kernels_cuda_conv, loss, optim, pool)
from hetero_nn.codelets.kernels_cuda import OPTIONS
from hetero_nn.codelets.kernels_cuda_layers import all_kernels as layer_kernels
from hetero_nn.codelets.strict_xp import checking, counters



def all_kernels():
    """Every kernel of the ``kernels_cuda*`` modules, float32 and float64."""
    return layer_kernels() + [factory(dtype)
                              for module in (kernels_cuda_bn_step, kernels_cuda_conv)
                              for factory in module.FACTORIES for dtype in ("float32", "float64")]


# --------------------------------------------------------------------------- NVRTC

def _nvrtc():
    try:
        import nvidia.cuda_nvrtc as wheel
    except ImportError:
        return None
    for folder in wheel.__path__:
        for path in sorted(glob.glob(os.path.join(folder, "lib", "libnvrtc.so*"))):
            if "alt" not in path and "builtins" not in path:
                return ctypes.CDLL(path)
    return None


def test_every_kernel_source_compiles_to_ptx_with_nvrtc():
    lib = _nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not installed (pip install nvidia-cuda-nvrtc-cu12: the test extra)")
    failures = []
    for kernel in all_kernels():
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), kernel.source.encode(),
                                      f"{kernel.name}.cu".encode(), 0, None, None) == 0
        opts = [o.encode() for o in (*OPTIONS, "--gpu-architecture=compute_80")]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ptx = ctypes.c_size_t()
        lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        if status != 0 or ptx.value < 100:
            failures.append(f"{kernel.name}: {log.value.decode()}")
    assert not failures, "\n".join(failures)
    assert len(all_kernels()) >= 16


def test_no_kernel_uses_atomics():
    for kernel in all_kernels():
        assert not re.search(r"\batomic\w*\s*\(", kernel.source), kernel.name


# --------------------------------------------------------------------------- the cases

def _rng():
    return np.random.default_rng(29)


def _optim_cases(dtype):
    rng = _rng()
    p, g, b = (rng.standard_normal(300).astype(dtype) for _ in range(3))
    s = rng.random(300).astype(dtype)
    sgd = optim.sgd_hyper(0.1, 0.9, False)
    for kw in ({}, {"weight_decay": 0.01, "nesterov": True}, {"dampening": 0.1}):
        yield optim.sgd_step, (p, g, b, sgd), kw
    yield optim.sgd_step, (p, g, b, optim.sgd_hyper(0.1, 0.9, True)), {}
    yield optim.sgd_step_plain, (p, g, optim.sgd_hyper(0.05)), {"weight_decay": 0.1}
    adam = optim.adam_hyper(1e-3, 0.9, 0.999, 3)
    yield optim.adam_step, (p, g, b, s, adam), {"weight_decay": 0.01}
    yield optim.adamw_step, (p, g, b, s, adam), {"weight_decay": 0.01}


def _loss_cases(dtype):
    rng = _rng()
    logits = (3 * rng.standard_normal((37, 10))).astype(dtype)
    labels = rng.integers(0, 10, 37)
    for eps in (0.0, 0.1):
        kw = {"batch": 64, "label_smoothing": eps}
        yield loss.softmax_xent, (logits, labels, np.empty_like(logits), np.full((), 0.5, dtype),
                                  np.zeros((), np.int64)), kw
        yield loss.softmax_xent_eval, (logits, labels, np.full((), 0.5, dtype),
                                       np.zeros((), np.int64)), kw


_CONV_GEOMETRIES = [
    ((4, 1, 12, 12), (6, 1, 5, 5), {"padding": 2}),                               # LeNet-like
    ((3, 3, 11, 10), (4, 3, 3, 3), {"stride": 2, "padding": 1, "dilation": (1, 2),
                                    "pool_size": 3, "pool_stride": 1, "pool_padding": 1}),
    ((2, 2, 9, 9), (3, 2, 2, 3), {"pool_size": 3, "pool_stride": 2, "pool_ceil_mode": True}),
]


def _conv_cases(dtype):
    rng = _rng()
    for x_shape, w_shape, kw in _CONV_GEOMETRIES:
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        b = rng.standard_normal(w_shape[0]).astype(dtype)
        conv_kw, pool_kw = fused._split(kw)
        z = fused._conv_shape(x.shape, w.shape, conv_kw)
        pg = pool.pool2d_geometry(z, **pool_kw)
        y = np.empty((*z[:2], pg.out_h, pg.out_w), dtype)
        arg = np.empty(y.shape, np.int64)
        fused.conv2d_relu_pool_fwd.variants["ref"](x, w, b, y, arg, **kw)
        yield fused.conv2d_relu_pool_fwd, (x, w, b, np.empty_like(y), np.empty_like(arg)), kw
        dy = rng.standard_normal(y.shape).astype(dtype)
        dw = rng.standard_normal(w.shape).astype(dtype)
        db = rng.standard_normal(b.shape).astype(dtype)
        yield fused.conv2d_relu_pool_bwd, (x, w, y, arg, dy, np.empty_like(x), dw, db), kw
        yield fused.conv2d_relu_pool_bwd_params, (x, y, arg, dy, dw, db), kw


def _dense_cases(dtype):
    rng = _rng()
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((13, 21), (7, 21), (7,)))
    y = np.maximum(rng.standard_normal((13, 7)), 0).astype(dtype)
    dy = rng.standard_normal((13, 7)).astype(dtype)
    dw, db = rng.standard_normal(w.shape).astype(dtype), rng.standard_normal(b.shape).astype(dtype)
    yield dense.dense_fwd, (x, w, b, np.empty((13, 7), dtype)), {}
    z = x.copy()
    z[0, :4] = [np.nan, -0.0, 0.0, -1.0]
    yield activation.relu_fwd, (z, np.empty_like(z)), {}
    yield activation.relu_bwd, (z, x, np.empty_like(x)), {}
    yield dense.dense_fwd_nobias, (x, w, np.empty((13, 7), dtype)), {}
    yield fused.dense_relu_fwd, (x, w, b, np.empty((13, 7), dtype)), {}
    yield fused.dense_relu_bwd, (x, w, y, dy, np.empty_like(x), dw, db), {}
    yield fused.dense_relu_bwd_params, (x, y, dy, dw, db), {}
    yield dense.dense_bwd_params, (x, dy, dw, db), {}
    yield dense.dense_bwd_weight, (x, dy, dw), {}
    yield dense.dense_bwd_input, (dy, w, np.empty_like(x)), {}


def _bn_cases(dtype):
    rng = _rng()
    x, dy = (rng.standard_normal((5, 3, 7, 6)).astype(dtype) for _ in range(2))
    mean, dotp, sum_dy = (rng.standard_normal(3).astype(dtype) for _ in range(3))
    var = rng.random(3).astype(dtype) + 0.5
    weight, bias = rng.standard_normal((2, 3)).astype(dtype)
    acc = [rng.standard_normal(3).astype(dtype) for _ in range(2)]
    yield batchnorm.bn_sum, (x, acc[0]), {}
    yield batchnorm.bn_sqdev, (x, mean, acc[0]), {}
    yield batchnorm.bn_bwd_sums, (x, dy, mean, *acc), {}
    yield batchnorm.bn_mean, (sum_dy, np.empty(3, dtype)), {"count": 210}
    yield batchnorm.bn_running, (mean, var, *acc, np.array([0.1])), {"count": 210}
    yield batchnorm.bn_fwd, (x, mean, var, weight, bias, np.empty_like(x)), {"eps": 1e-5}
    yield batchnorm.bn_param_grads, (sum_dy, dotp, var, *acc), {"eps": 1e-5}
    for batch_stats in (True, False):
        yield batchnorm.bn_bwd_input, (x, dy, mean, var, weight, sum_dy, dotp, np.empty_like(x)), \
            {"count": 210, "eps": 1e-5, "batch_stats": batch_stats}
    running = [rng.standard_normal(3).astype(dtype), rng.random(3).astype(dtype) + 0.5]
    yield batchnorm_step.bn_train_fwd, (x, weight, bias, *running, np.array([0.1]),
                                        *(np.empty(3, dtype) for _ in range(2)),
                                        np.empty_like(x)), {"count": 210, "eps": 1e-5}
    yield batchnorm_step.bn_train_bwd, (x, dy, mean, var, weight, np.empty_like(x), *acc), \
        {"count": 210, "eps": 1e-5}


_PLAIN_CONV_GEOMETRIES = [
    ((3, 4, 9, 8), (6, 4, 3, 3), {"padding": 1}),                                 # ResNet-like
    ((2, 4, 9, 9), (6, 2, 3, 2), {"stride": 2, "padding": (1, 2), "dilation": (2, 1),
                                  "groups": 2}),
    ((2, 3, 7, 7), (5, 3, 1, 1), {"stride": 2}),                                  # shortcut
]


def _plain_conv_cases(dtype):
    """The plain convolutions: im2col (``conv_im2col``) or col2im (``conv_col2im``) as one
    kernel beside the GEMM."""
    rng = _rng()
    for x_shape, w_shape, kw in _PLAIN_CONV_GEOMETRIES:
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        y = np.empty(conv.conv2d_output_shape(x_shape, w_shape, **kw), dtype)
        dy = rng.standard_normal(y.shape).astype(dtype)
        yield conv.conv2d_fwd_nobias, (x, w, y), kw
        yield conv.conv2d_bwd_input, (dy, w, np.empty_like(x)), kw
        yield conv.conv2d_bwd_weight, (x, dy, rng.standard_normal(w_shape).astype(dtype)), kw


#: Codelets whose float32 host run is marked slow (a g++ build of a kernel is seconds in CI).
_SLOW_HOST_FLOAT32 = {"bn_train_fwd", "bn_train_bwd", "conv2d_fwd_nobias", "conv2d_bwd_input",
                      "conv2d_bwd_weight"}


def _cases(host=False):
    for dtype in (np.float64, np.float32):
        for make in (_optim_cases, _loss_cases, _conv_cases, _dense_cases, _bn_cases,
                     _plain_conv_cases):
            for codelet, arrays, kw in make(dtype):
                slow = host and dtype is np.float32 and codelet.name in _SLOW_HOST_FLOAT32
                yield pytest.param(codelet, arrays, kw, marks=[pytest.mark.slow] if slow else [],
                                   id=f"{codelet.name}-{np.dtype(dtype).name}-{sorted(kw)}")


CASES = list(_cases())
HOST_CASES = list(_cases(host=True))
#: Launches on the stand-in of the plain convolutions: their kernel, the GEMM and (the
#: weight gradient) the add into ``dw``; the max-pool backward's are two kernels.
_STAND_IN_LAUNCHES = {"conv2d_fwd_nobias": 2, "conv2d_bwd_input": 2, "conv2d_bwd_weight": 3}
#: The kernels that do the ``ref`` twin's operations in its order: equal bit for bit.
EXACT = {"sgd_step", "sgd_step_plain", "adam_step", "adamw_step", "bn_fwd", "bn_bwd_input",
         "bn_mean", "bn_running", "bn_param_grads", "relu_fwd", "relu_bwd"}


def _compare(codelet, expect, got, exact=EXACT):
    for e, g in zip(expect, got):
        if not isinstance(e, np.ndarray):
            continue
        g = np.asarray(g)
        if codelet.name in exact or e.dtype.kind != "f":
            assert np.array_equal(e, g, equal_nan=True), codelet.name
            continue
        tol = 1e-12 if e.dtype == np.float64 else 1e-5
        scale = max(float(np.max(np.abs(e), initial=0)), 1e-300)
        err = np.max(np.abs(g.astype(float) - e.astype(float)), initial=0) / scale
        assert err <= tol, f"{codelet.name}: {err:.3g}"


class _HostArray(np.ndarray):
    """A NumPy array that :func:`array_module` takes for a device array of :class:`HostCuda`."""


@contextlib.contextmanager
def _host_device():
    module = cuda_host.HostCuda()
    module.ndarray = _HostArray
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved


@pytest.mark.skipif(cuda_host.CXX is None, reason="no host C++ compiler (g++) to run the "
                                                  "kernel sources on the host")
@pytest.mark.parametrize("codelet, arrays, kw", HOST_CASES)
def test_kernel_sources_run_on_the_host_equal_the_ref_twins(codelet, arrays, kw):
    expect = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    codelet.variants["ref"](*expect, **kw)
    got = [a.copy().view(_HostArray) if isinstance(a, np.ndarray) else a for a in arrays]
    launches = cuda_host.launches
    fn = codelet.variants["cuda"]
    with _host_device():
        getattr(fn, "__wrapped__", fn)(*got, **kw)  # unguarded: the stand-in would wrap got
    assert cuda_host.launches == launches + (2 if "pool_bwd" in codelet.name else 1)  # kernels
    _compare(codelet, expect, [g.view(np.ndarray) if isinstance(g, np.ndarray) else g
                               for g in got])


@pytest.mark.parametrize("codelet, arrays, kw", CASES)
def test_each_kernel_is_one_launch_on_the_strict_stand_in(codelet, arrays, kw):
    expect = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    codelet.variants["ref"](*expect, **kw)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    with checking():
        counters.reset()
        codelet.variants["cuda"](*got, **kw)
        counts = counters.snapshot()
    assert counts["launches"] == _STAND_IN_LAUNCHES.get(
        codelet.name, 2 if "pool_bwd" in codelet.name else 1), counts
    assert counts["implicit"] == counts["unordered"] == counts["syncs"] == 0
    _compare(codelet, expect, got)


@pytest.mark.cuda
@pytest.mark.parametrize("codelet, arrays, kw", CASES)
def test_kernels_on_a_gpu_equal_the_ref_twins(cupy, codelet, arrays, kw):
    expect = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    codelet.variants["ref"](*expect, **kw)
    got = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in arrays]
    fn = codelet.variants["cuda"]
    getattr(fn, "__wrapped__", fn)(*got, **kw)
    got = [cupy.asnumpy(g) if isinstance(g, cupy.ndarray) else g for g in got]
    _compare(codelet, expect, got, EXACT - {"adam_step", "adamw_step"})  # CUDA's pow: 1 ulp
