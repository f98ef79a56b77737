"""Shared fixtures: a private perfmodel cache for the whole session, one Dask cluster.

``HETERO_NN_CACHE`` is pointed at a temporary directory before any test runs, so
no test reads performance models measured elsewhere or writes to ``~/.cache``.
The ``dist_client`` fixture starts one ``distributed.LocalCluster`` of two
single-threaded worker processes for the whole session (starting one costs
seconds); tests give it to ``Runtime(executor=client)``, which never closes a
client it did not make.
"""

import os
import shutil
import tempfile

import pytest

# Set at import time: modules may build a PerfModel while being collected.
_CACHE = tempfile.mkdtemp(prefix="hetero_nn-test-cache-")
os.environ["HETERO_NN_CACHE"] = _CACHE


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)


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
