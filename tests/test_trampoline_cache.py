"""Generated code is checked: a trampoline module under the cache directory is imported
only if it is exactly what this process would write (its header: the source's hash, the
Numba and llvmlite versions); anything else is written again, never run."""

from __future__ import annotations

import hashlib
import sys

import numba
import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.codelets.prepared import prepares
from hetero_nn.scheduler.engine import trampoline
from hetero_nn.scheduler.engine.trampoline import CompiledCall, module_text
from hetero_nn.codelets._jit import jit


@jit
def _double(x):
    for i in range(x.shape[0]):
        x[i] *= 2.0


def _module_of(source):
    key = hashlib.sha1((trampoline._GENERATOR + source).encode()).hexdigest()[:20]
    name = f"hetero_nn_trampoline_{key}"
    return name, trampoline.default_cache_dir() / "trampolines" / f"{name}.py"


def test_the_module_header_names_the_source_hash_and_the_compiler_versions():
    text = module_text("def trampoline(block):\n    return 0\n")
    header = text.split("\n", 1)[0]
    assert header.startswith("# hetero_nn trampoline sha256=")
    assert f"numba={numba.__version__}" in header and "llvmlite=" in header


def test_a_tampered_trampoline_module_is_rebuilt_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path))
    x = np.ones(4)
    call = CompiledCall(_double, (x,))
    source = call.trampoline.source
    name, path = _module_of(source)
    sys.modules.pop(name, None)  # (made by an earlier test: its module is elsewhere)
    trampoline._compile(source)
    assert path.read_text() == module_text(source)  # written under the cache directory
    for tampered in (path.read_text().replace(f"numba={numba.__version__}", "numba=0.1"),
                     "raise RuntimeError('a tampered trampoline module ran')\n"
                     + path.read_text()):
        path.write_text(tampered)
        sys.modules.pop(name, None)  # as a new process would
        cfunc = trampoline._compile(source)  # rebuilt: the RuntimeError never runs
        assert cfunc.address and path.read_text() == module_text(source)
    assert call() == 0 and x.tolist() == [2.0] * 4


def _broken_prepare(buffers, x):
    raise ValueError("a prepare that fails")


@prepares(_broken_prepare)
def _double_ref(x):
    x *= 2.0


def test_a_prepare_that_raises_warns_once_and_the_task_runs_as_python():
    codelet = hn.Codelet("trampoline_broken_prepare", modes=(hn.RW,),
                         variants={"cpu": _double_ref})
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        h = rt.register(np.ones(4))
        with pytest.warns(RuntimeWarning, match="trampoline_broken_prepare.*prepare raised "
                                                "ValueError: a prepare that fails") as caught:
            with rt.capture() as graph:  # bound at the capture's end (its compilation)
                for part in h.split(0, 2):
                    rt.submit(codelet, part)
            graph.replay()
        assert len([w for w in caught if "broken_prepare" in str(w.message)]) == 1
        assert rt.fetch(h).tolist() == [4.0] * 4
