"""Data-parallel training on a Dask cluster: bit-identity with one process, a lost worker, errors.

LeNet-5 on 256 real MNIST images, 2 epochs of batch 64 at granularity 4 (the CLI's
pinned variants): ``--cluster local:2`` ends with the bytes of ``--devices cpu:2``,
straight through and resumed after one epoch; a worker process SIGKILLed mid-epoch
changes nothing; an unreachable scheduler is one line and exit 2, in bounded time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed")

import hetero_nn as hn  # noqa: E402
from hetero_nn.cli import main  # noqa: E402
from hetero_nn.training.cluster import blocks, connect, partition_starts  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATA = Path(os.environ.get("HETERO_NN_DATA") or SHARED)
needs_mnist = pytest.mark.skipif(not (DATA / "mnist").is_dir(),
                                 reason=f"real MNIST not found in {DATA}")
REPO = Path(__file__).resolve().parents[1]
RUN = ["train", "--data-dir", str(DATA), "--limit", "256", "--batch-size", "64",
       "--granularity", "4", "--epochs", "2", "-q"]


def _weights(path):
    with np.load(path) as f:
        return {k[len("model/"):]: f[k] for k in f.files if k.startswith("model/")}


def _same_bytes(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final weights of ``--devices cpu:2`` (one process)."""
    out = tmp_path_factory.mktemp("cpu2")
    assert main([*RUN, "--devices", "cpu:2", "--out", str(out)]) == 0
    return _weights(out / "checkpoint-final.npz")


def test_blocks_deal_contiguous_even_runs_of_partitions():
    for g in range(1, 17):
        for workers in range(1, 6):
            bl = blocks(g, workers)
            assert len(bl) == min(workers, g)
            assert [first for first, _ in bl] == [sum(p for _, p in bl[:i]) for i in range(len(bl))]
            assert sum(parts for _, parts in bl) == g
            assert max(p for _, p in bl) - min(p for _, p in bl) <= 1
    assert partition_starts(10, 4) == [0, 3, 6, 8, 10]  # numpy.array_split's sizes
    assert [len(p) for p in np.array_split(np.arange(10), 4)] == [3, 3, 2, 2]


@pytest.fixture(scope="module")
def cluster():
    """Two single-core worker processes shared by the tests below (starting them costs seconds)."""
    with connect("local:2") as c:
        yield c


@needs_mnist
def test_cluster_local2_is_bit_identical_to_devices_cpu2(reference, tmp_path):
    out = tmp_path / "cluster"
    assert main([*RUN, "--cluster", "local:2", "--out", str(out)]) == 0
    _same_bytes(_weights(out / "checkpoint-final.npz"), reference)


@needs_mnist
def test_cluster_run_resumed_after_one_epoch_ends_with_the_same_bytes(reference, cluster,
                                                                      tmp_path):
    address = cluster.client.scheduler.address  # joining a running scheduler: tcp://HOST:PORT
    first = [a if a != "2" else "1" for a in RUN]  # --epochs 1
    assert main([*first, "--cluster", address, "--out", str(tmp_path)]) == 0
    assert main(["train", "--out", str(tmp_path), "--resume", "--epochs", "2", "-q",
                 "--cluster", address]) == 0
    _same_bytes(_weights(tmp_path / "checkpoint-final.npz"), reference)


@needs_mnist
def test_sigkilled_worker_loses_nothing(reference, cluster):
    train = hn.datasets.load("mnist", "train", data_dir=DATA, limit=256)
    model = hn.build_model("lenet5", train.input_shape, train.num_classes, seed=0)
    killed = []

    def on_step(trainer, _loss):
        if trainer.global_step == 3:  # kill one worker while step 4 runs
            pids = sorted(trainer.cluster.client.run(os.getpid).values())
            killed.append(pids[0])
            threading.Timer(0.01, os.kill, (pids[0], signal.SIGKILL)).start()

    with (hn.Runtime(devices="cpu:1", deterministic=True,
                     perfmodel=False, trace=False) as rt,
          hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.02, momentum=0.9), runtime=rt,
                     batch_size=64, granularity=4, seed=0, cluster=cluster) as trainer):
        trainer.fit(train, epochs=2, verbose=0, on_step=on_step)
        assert trainer.global_step == 8
        time.sleep(0.1)
        with pytest.raises(ProcessLookupError):
            os.kill(killed[0], 0)
    _same_bytes({k: v for k, v in model.state_dict().items()}, reference)


def test_unreachable_cluster_is_one_line_exit_2_in_bounded_time():
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hetero_nn", "train", "--dataset", "synthetic",
                           "--limit", "64", "--cluster", "tcp://127.0.0.1:1",
                           "--connect-timeout", "2"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetero-nn: error: --cluster"), proc.stderr
    assert "tcp://127.0.0.1:1" in lines[0]
    assert elapsed < 30


@pytest.mark.parametrize("layer", [hn.BatchNorm2D(6), hn.Dropout(0.25)], ids=["batchnorm", "dropout"])
def test_models_with_batch_statistics_or_dropout_are_refused_before_connecting(layer):
    model = hn.Sequential(hn.Conv2D(1, 6, 3), layer, hn.ReLU(), hn.Flatten(), hn.Dense(6 * 26 * 26, 10))
    with pytest.raises(hn.errors.ConfigError, match=type(layer).__name__):
        hn.Trainer(model, granularity=2, cluster="tcp://127.0.0.1:1")  # never dialled
