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
from helpers import same_bytes, small_run  # noqa: E402
from hetero_nn.cli import main  # noqa: E402
from hetero_nn.training.cluster.client import (WORKER_REFRESH, blocks, connect,  # noqa: E402
                                        partition_starts)

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
    same_bytes(_weights(out / "checkpoint-final.npz"), reference)


@needs_mnist
def test_cluster_run_resumed_after_one_epoch_ends_with_thesame_bytes(reference, cluster,
                                                                      tmp_path):
    address = cluster.client.scheduler.address  # joining a running scheduler: tcp://HOST:PORT
    first = [a if a != "2" else "1" for a in RUN]  # --epochs 1
    assert main([*first, "--cluster", address, "--out", str(tmp_path)]) == 0
    assert main(["train", "--out", str(tmp_path), "--resume", "--epochs", "2", "-q",
                 "--cluster", address]) == 0
    same_bytes(_weights(tmp_path / "checkpoint-final.npz"), reference)


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
    same_bytes({k: v for k, v in model.state_dict().items()}, reference)


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


def _stateful_model(seed=0):
    """Batch norm (statistics over the whole batch), dropout (masks keyed by the sample's
    place in the batch) and a plain conv layer (gradients written in place first)."""
    hn.manual_seed(seed)
    return hn.Sequential(hn.Conv2D(1, 4, 3), hn.BatchNorm2D(4), hn.ReLU(), hn.MaxPool2D(2),
                         hn.Flatten(), hn.Dropout(0.25, seed=seed + 1), hn.Dense(4 * 5 * 5, 16),
                         hn.ReLU(), hn.Dense(16, 10))


def _stateful_run(cluster, batch, g, epochs=2):
    """Two epochs of the stateful model with augmentation, a one-cycle schedule (lr and
    momentum per step) and clipping; returns the final state and the per-epoch losses."""
    data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=3 * batch - 5)
    model = _stateful_model()
    optimizer = hn.optim.SGD(lr=0.05, momentum=0.9)
    steps = epochs * -(-len(data) // batch)
    schedule = hn.optim.OneCycleLR(optimizer, max_lr=0.2, total_steps=steps)
    augment = hn.transforms.Compose([hn.transforms.RandomCrop(12, padding=2),
                                     hn.transforms.RandomHorizontalFlip()])
    with (hn.Runtime(devices="cpu:1" if cluster else "cpu:2", perfmodel=False,
                     trace=False) as rt,
          hn.Trainer(model, optimizer=optimizer, runtime=rt, batch_size=batch, granularity=g,
                     scheduler=schedule, clip_grad_norm=1.0, augment=augment,
                     cluster=cluster) as trainer):
        history = trainer.fit(data, epochs=epochs, verbose=0)
        state = {**model.state_dict(), **{f"opt/{k}": v["momentum_buffer"] for k, v in
                                          optimizer.state_dict()["state"].items()}}
        return state, [(h["train_loss"], h["train_accuracy"]) for h in history], \
            trainer.last_grad_norm


@pytest.mark.parametrize("batch,g", [(32, 4), (30, 3), (17, 5)])
def test_batchnorm_dropout_augmentation_and_schedules_as_one_process(cluster, batch, g):
    """The last batch of each epoch is short (3 * batch - 5 samples); g=3 and g=5 on two
    workers deal uneven blocks (the first partition in place on rank 0 only)."""
    want = _stateful_run(None, batch, g)
    got = _stateful_run(cluster, batch, g)
    same_bytes(got[0], want[0])
    assert got[1] == want[1] and got[2] == want[2]


def test_a_joining_worker_gets_the_state_and_a_share_from_the_next_step():
    import distributed

    want = small_run(None)
    with (distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=40) as lc,
          distributed.Client(lc) as client):
        cluster = connect(client)
        sizes = []

        def on_step(trainer, _loss):
            sizes.append(len(trainer.cluster.group))
            if trainer.global_step == 2:
                lc.scale(2)
                client.wait_for_workers(2, timeout=60)
                time.sleep(3 * WORKER_REFRESH)  # the cluster's look at the scheduler

        got = small_run(cluster, on_step)
        cluster.close()
    same_bytes(got, want)
    assert sizes[:2] == [1, 1] and sizes[-1] == 2, sizes


def _boom(x):
    raise ValueError("boom on a worker")


class _Exploding(hn.layers.base.Layer):
    """An identity whose forward task raises (on the cluster's workers)."""

    def forward(self, rt, xs):
        codelet = hn.Codelet("test_boom", modes=(hn.R,), variants={"ref": _boom})
        for x in xs:
            rt.submit(codelet, x)
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys


def test_a_task_failing_on_a_worker_is_one_error_and_the_cluster_stays_usable(cluster):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    try:
        hn.manual_seed(0)
        model = hn.Sequential(_Exploding(), hn.Flatten(), hn.Dense(144, 10))
        data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=64)
        with (hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=32, granularity=2,
                         cluster=cluster) as trainer):
            with pytest.raises(hn.errors.TaskError, match="boom on a worker") as info:
                trainer.fit(data, epochs=1, verbose=0)
            assert "\n" not in str(info.value)
            assert trainer.global_step == 0
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    same_bytes(small_run(cluster), small_run(None))


def test_array_batches_step_as_one_process(cluster):
    """``train_step(x, y)`` with arrays (the client sends each worker its samples)."""
    data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=96)
    states = []
    for c in (None, cluster):
        model = hn.build_model("dahl-basic", data.input_shape, data.num_classes, seed=3)
        with (hn.Runtime(devices="cpu:1" if c else "cpu:2", perfmodel=False, trace=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=48, granularity=3, cluster=c) as t):
            losses = [t.train_step(*data.batch(np.arange(i, i + 48))) for i in (0, 48, 0)]
            t.sync()
            states.append((model.state_dict(), losses))
    same_bytes(states[1][0], states[0][0])
    assert states[1][1] == states[0][1]


def test_granularity_auto_chosen_per_worker(cluster):
    """Each worker chooses for its share; the run's granularity is their sum, and the
    weights are those of one process at that granularity and fusion."""
    data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=128)
    model = hn.build_model("dahl-basic", data.input_shape, data.num_classes, seed=0)
    with (hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=64, granularity="auto",
                     cluster=cluster) as trainer):
        trainer.fit(data, epochs=1, verbose=0)
        decision = trainer.granularity_decision
        g, fuse = trainer.granularity, model.fuse
    assert g >= 2 and "2 workers chose" in decision.platform and decision.granularity == g
    reference = hn.build_model("dahl-basic", data.input_shape, data.num_classes, seed=0)
    reference.fuse = fuse
    with (hn.Runtime(devices="cpu:2", perfmodel=False, trace=False) as rt,
          hn.Trainer(reference, runtime=rt, batch_size=64, granularity=g) as trainer):
        trainer.fit(data, epochs=1, verbose=0)
    same_bytes(model.state_dict(), reference.state_dict())
