"""The CUDA C kernels of ``hetero_nn.codelets.kernels_cuda`` run on the host, for tests.

No GPU is at hand in CI, and the kernels' NumPy twins state what a kernel computes
without running its source. Where a host C++ compiler is installed (``g++``; the
package itself needs none), this module compiles each kernel's own source as C++
with a few definitions of CUDA's names (``blockIdx``, ``threadIdx``, ``__shared__``,
``__syncthreads`` as a barrier of real threads) and runs its grid on the host,
blocks in turn and the threads of a block concurrently, so a test can compare the
source's results with the ``ref`` twins. ``-ffp-contract=off`` matches NVRTC's
``--fmad=false``; the host's ``exp``/``log``/``pow`` may differ from CUDA's in the
last bit. The definitions and the C++ headers every kernel needs are compiled once per
process into a precompiled header (most of a kernel's build was parsing ``<thread>``
and ``<barrier>``); where ``g++`` cannot use it, it reads the header itself.

:class:`HostCuda` stands where ``cupy`` would: its ``RawKernel`` compiles and runs a
kernel, every other attribute is NumPy's.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import numpy as np

CXX = shutil.which("g++")

_PRELUDE = r"""
#include <cmath>
#include <cstring>
#include <barrier>
#include <thread>
#include <vector>
using namespace std;
struct Dim { long long x; };
static thread_local Dim threadIdx, blockIdx;
static Dim blockDim, gridDim;
static std::barrier<>* block_barrier;
#define __global__
#define __device__
#define __shared__ static
#define __syncthreads() block_barrier->arrive_and_wait()
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
"""

_RUN = r"""
extern "C" void run_grid(long long blocks, long long threads, {params}) {{
    blockDim.x = threads; gridDim.x = blocks;
    for (long long b = 0; b < blocks; ++b) {{
        if (!{threaded}) {{  // no __syncthreads: the block's threads one after another
            for (long long t = 0; t < threads; ++t) {{
                blockIdx.x = b; threadIdx.x = t; {name}({args});
            }}
            continue;
        }}
        std::barrier<> bar(threads);
        block_barrier = &bar;
        std::vector<std::thread> pool;
        for (long long t = 0; t < threads; ++t)
            pool.emplace_back([=] {{ blockIdx.x = b; threadIdx.x = t; {name}({args}); }});
        for (auto& th : pool) th.join();
    }}
}}
"""

_cache: dict = {}
launches = 0
"""Kernels run on the host so far (a test checks that its variant took its kernel)."""


def _signature(source: str, name: str):
    params = source[source.index(name + "(") + len(name) + 1:]
    params = params[:params.index(")")]
    out = []
    for i, p in enumerate(re.sub(r"\s+", " ", params).split(",")):
        p = p.strip()
        kind = (ctypes.c_void_p if "*" in p else ctypes.c_double if "double" in p
                else ctypes.c_longlong)
        out.append((kind, re.sub(r"\w+$", f"a{i}", p)))
    return out


_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-pthread"]
_prelude: list = []  # the folder of prelude.h and its precompiled prelude.h.gch, once made


def _prelude_folder() -> Path:
    """A folder holding ``prelude.h`` (``_PRELUDE``) and, where g++ made it, its
    precompiled form, built with the kernels' own flags (g++ uses it only then)."""
    if not _prelude:
        folder = Path(tempfile.mkdtemp(prefix="cuda_host-prelude-"))
        (folder / "prelude.h").write_text(_PRELUDE)
        subprocess.run([CXX, *_FLAGS, "-x", "c++-header", "-o", str(folder / "prelude.h.gch"),
                        str(folder / "prelude.h")], capture_output=True, timeout=120)
        _prelude.append(folder)
    return _prelude[0]


def _library(kernel):
    key = hashlib.sha1(kernel.source.encode()).hexdigest()
    if key not in _cache:
        sig = _signature(kernel.source, kernel.name)
        text = ('#include "prelude.h"\n' + kernel.source + _RUN.format(
            params=", ".join(decl for _, decl in sig), name=kernel.name,
            threaded=int("__syncthreads" in kernel.source),
            args=", ".join(f"a{i}" for i in range(len(sig)))))
        folder = Path(tempfile.mkdtemp(prefix="cuda_host-"))
        (folder / "k.cpp").write_text(text)
        subprocess.run([CXX, *_FLAGS, "-shared", "-I", str(_prelude_folder()),
                        "-o", str(folder / "k.so"), str(folder / "k.cpp")],
                       check=True, capture_output=True, timeout=120)
        lib = ctypes.CDLL(str(folder / "k.so"))
        lib.run_grid.argtypes = [ctypes.c_longlong, ctypes.c_longlong] + [k for k, _ in sig]
        _cache[key] = (lib, sig)
    return _cache[key]


class _RawKernel:
    def __init__(self, source, name, options=()):
        self.kernel = types.SimpleNamespace(source=source, name=name)

    def __call__(self, grid, block, args):
        global launches
        lib, sig = _library(self.kernel)
        launches += 1
        values = []
        for (kind, _), a in zip(sig, args):
            if kind is ctypes.c_void_p:
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous, type(a)
                values.append(a.ctypes.data)
            else:
                values.append(kind(a.item() if hasattr(a, "item") else a))
        assert len(values) == len(args) == len(sig), (self.kernel.name, len(args), len(sig))
        lib.run_grid(grid[0], block[0], *values)


class HostCuda(types.ModuleType):
    """``cupy`` for :func:`hetero_nn.codelets.kernels_cuda.launch`: kernels compiled for
    and run on the host, NumPy for everything else."""

    def __init__(self):
        super().__init__("cuda_host")
        self.RawKernel = _RawKernel

    def __getattr__(self, name):
        return getattr(np, name)
