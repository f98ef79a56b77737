"""Shared fixtures: a private perfmodel cache for the whole session, one Dask cluster.

``HETERO_NN_CACHE`` is pointed at a temporary directory before any test runs, so
no test reads performance models measured elsewhere or writes to ``~/.cache``.
The ``dist_client`` fixture starts one ``distributed.LocalCluster`` of two
single-threaded worker processes for the whole session (starting one costs
seconds); tests give it to ``Runtime(executor=client)``, which never closes a
client it did not make.

Hypothesis: the default run loads the ``ci`` profile, derandomized with no example
database, under each test's own settings (its budget, its deadline): the same
examples every run, so CI passes or fails on the code, not on the draw (a property
test that set no ``derandomize`` drew fresh examples in CI before, and failed on a
rare cancellation once). The slow run
(``-m slow``, or any run with ``--hypothesis-profile random``) loads the ``random``
profile and runs *every* property test as well, on fresh random examples
(``derandomize=False``) with a fixed budget of :data:`RANDOM_EXAMPLES` each, so
the long run explores what the short one never draws; a failure prints the blob
that reproduces it (``@reproduce_failure``).

Strict CuPy rules: unless ``HETERO_NN_STRICT_XP=0``, every ``cuda`` variant the suite
calls (on ``cuda-emu``, or directly on NumPy arrays) runs through the strict CuPy
stand-in (:mod:`hetero_nn.codelets.strict_xp`): an implicit device -> host conversion
or an unordered accumulation in a variant fails the test that reached it.

Numba's cache, warmed beside the tests: when the session holds convolution tests,
``tests/warm_kernels.py`` compiles the convolution kernels at ``nice 19`` in a background
process (the other core, while the first tests run); the tests load what it wrote
instead of compiling it (its docstring; ``HETERO_NN_WARM=0`` turns it off).

``--ulp-report FILE`` writes, at the end of the session, the largest distance in
units in the last place that each named :func:`helpers.assert_ulp` call saw, per
codelet and dtype (markdown for ``.md``, else JSON): the table of docs/codelets.md.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

#: Examples each property test draws in the slow run (``random`` profile).
RANDOM_EXAMPLES = 100

settings.register_profile("random", derandomize=False, database=None, deadline=None,
                          max_examples=RANDOM_EXAMPLES, print_blob=True)
settings.register_profile("ci", derandomize=True, database=None)

# Set at import time: modules may build a PerfModel while being collected.
_CACHE = tempfile.mkdtemp(prefix="hetero_nn-test-cache-")
os.environ["HETERO_NN_CACHE"] = _CACHE


def pytest_addoption(parser):
    parser.addoption("--ulp-report", metavar="FILE", default=None,
                     help="write the largest ULP distance per codelet and dtype seen by "
                          "assert_ulp (markdown for .md, else JSON)")


def _slow_run(config) -> bool:
    """Whether ``-m`` selects the slow tests (the last ``-m`` wins over addopts')."""
    expression = (config.getoption("markexpr") or "").replace(" ", "")
    return "slow" in expression and "notslow" not in expression


def _random_profile(config) -> bool:
    explicit = config.getoption("hypothesis_profile", default=None)
    return explicit == "random" or (explicit is None and _slow_run(config))


def pytest_configure(config):
    # before the test modules are imported: their @settings inherit the loaded profile
    settings.load_profile("random" if _random_profile(config) else "ci")
    _start_warming(config)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the property tests join the slow run
def pytest_collection_modifyitems(config, items):
    if not _random_profile(config):
        return
    profile = settings.get_profile("random")
    for item in items:
        test = getattr(item, "obj", None)
        if not getattr(test, "is_hypothesis_test", False):
            continue
        item.add_marker(pytest.mark.slow)
        if not getattr(test, "_random_profile_applied", False):
            # the test's own settings (derandomize, budget) give way to the profile's
            own = getattr(test, "_hypothesis_internal_use_settings", None)
            test._hypothesis_internal_use_settings = settings(
                own, derandomize=False, database=None, max_examples=profile.max_examples,
                print_blob=True)
            test._random_profile_applied = True


def pytest_sessionfinish(session):
    path = session.config.getoption("ulp_report")
    if not path:
        return
    from helpers import ULP_SEEN

    table: dict = {}
    for (name, dtype), ulps in sorted(ULP_SEEN.items()):
        table.setdefault(name, {})[dtype] = ulps
    path = Path(path)
    if path.suffix == ".md":
        lines = ["| codelet | float32 (ULP) | float64 (ULP) |", "|---|---:|---:|"]
        for name, row in table.items():
            cells = [f"{row[d]:.3g}" if d in row else "-" for d in ("float32", "float64")]
            lines.append(f"| `{name}` | {cells[0]} | {cells[1]} |")
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


#: Test files whose kernels tests/warm_kernels.py compiles.
_WARMED = ("test_codelets_conv", "test_codelets_depthwise", "test_bench_conv_options")
_warming: list = []


def _runs_warmed_tests(config) -> bool:
    """Whether the session's paths hold a test file of ``_WARMED`` (a folder holding one,
    or the file itself); known before collection, which takes the first 20 s."""
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.name.startswith(_WARMED) or (
                path.is_dir() and any(path.rglob(f"{_WARMED[0]}*.py"))):
            return True
    return False


def _start_warming(config):
    """Start tests/warm_kernels.py in the background where it pays (module docstring)."""
    if os.environ.get("HETERO_NN_WARM", "1") == "0" or config.option.collectonly \
            or not _runs_warmed_tests(config):
        return
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(filter(None, [str(here.parent), os.environ.get("PYTHONPATH")]))
    _warming.append(subprocess.Popen(
        [sys.executable, str(here / "warm_kernels.py")], cwd=here.parent,
        env={**os.environ, "PYTHONPATH": path}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(19)))


def pytest_unconfigure(config):
    for process in _warming:  # the session ended first: what it wrote stays valid
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _strict_cuda_variants():
    """Every ``cuda`` variant under the strict CuPy stand-in (module docstring)."""
    if os.environ.get("HETERO_NN_STRICT_XP", "1") == "0":
        yield
        return
    from hetero_nn.codelets.strict_xp import checking
    with checking():
        yield


@pytest.fixture(scope="session")
def perfmodel_cache():
    """The session's ``HETERO_NN_CACHE`` directory."""
    return _CACHE


@pytest.fixture(scope="session")
def dist_client():
    """A ``distributed.Client`` over 2 worker processes with 1 thread each (session-wide)."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def cupy():
    """CuPy on a GPU, for the ``cuda`` tests; the test is skipped where there is none."""
    from hetero_nn.codelets.xp import cupy_or_none

    module = cupy_or_none()
    if module is None:
        pytest.skip("CuPy with a GPU is not available")
    return module


@pytest.fixture(scope="module")
def one_torch_thread():
    """PyTorch on one thread for a module's tests: the runtime's two workers take both cores."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
