"""Pipeline stages across Dask workers (training/pipeline/stage_rank.py, stage_cluster.py): one stage
per worker process, activations and gradients sent point to point; GPipe and 1F1B
bit-identical to a local ``cpu:1`` trainer without a pipeline at the same granularity
(LeNet-5 and resnet-small, float64, 2 and 3 stages), the state pulled back from every stage, the bubble
per stage in metrics.json, one-line refusals, and a SIGKILLed stage worker that fails
the step with a ClusterError instead of hanging; ``pipeline_schedule="pipedream"``
equal to the in-process pipedream run, through a checkpoint resumed by a new trainer."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

pytest.importorskip("distributed")

import hetero_nn as hn  # noqa: E402
from hetero_nn.errors import ClusterError, ConfigError  # noqa: E402
from hetero_nn.training.cluster.client import connect  # noqa: E402
from helpers import within  # noqa: E402

SHAPES = {"lenet5": (1, 28, 28), "resnet-small": (3, 12, 12)}
LIMIT = 180  # seconds any one run below may take before the test fails as hung


@pytest.fixture(scope="module")
def cluster():
    """Two single-core worker processes shared by the tests (starting them costs seconds)."""
    with connect("local:2") as c:
        yield c


def train(name, g=4, steps=3, cluster=None, replay=True, **options):
    """Float64 SGD steps on a seeded batch: on a local ``cpu:1`` runtime, or with the
    stages on ``cluster``'s workers. Returns the state (pulled), losses and the pipeline."""
    model = hn.build_model(name, SHAPES[name], 10, seed=0, dtype="float64")
    if callable(options.get("pipeline")):  # stages given from the model's layers
        options["pipeline"] = options["pipeline"](model.layers)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, *SHAPES[name]))
    y = rng.integers(0, 10, 16)
    if cluster is not None:
        options["cluster"] = cluster
    with (hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=16, granularity=g, replay=replay,
                     optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), **options) as trainer):
        losses = [trainer.train_step(x, y) for _ in range(steps)]
        trainer.sync()
        return {"state": model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "losses": losses, "pipeline": trainer.pipeline}


def assert_bits(a, b):
    assert list(a["state"]) == list(b["state"])
    for key in a["state"]:
        assert np.array_equal(a["state"][key], b["state"][key]), key
    for key, buffers in a["optimizer"]["state"].items():
        for name, value in buffers.items():
            assert np.array_equal(value, b["optimizer"]["state"][key][name]), (key, name)
    assert a["losses"] == b["losses"]


@pytest.fixture(scope="module")
def lenet_reference():
    return within(LIMIT, train, "lenet5")


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_lenet_two_stages_on_two_workers_is_bit_identical(cluster, lenet_reference, schedule):
    run = within(LIMIT, lambda: train("lenet5", cluster=cluster.client, pipeline=2,
                                      pipeline_schedule=schedule))
    assert_bits(lenet_reference, run)
    pipe = run["pipeline"]
    described = pipe.describe()
    assert described["schedule_run"] == schedule and described["across"] == "dask workers"
    workers = [s["workers"] for s in described["stages"]]
    assert sorted(w for ws in workers for w in ws) == cluster.workers  # a stage per worker
    for stage in described["stages"]:
        assert 0 <= stage["bubble"] < 1
    bubble = pipe.bubble()
    assert bubble["ideal"] == 1 / 5 and bubble["micro_batches"] == 4
    assert 0 <= bubble["bubble"] < 1 and len(bubble["stage_bubbles"]) == 2
    assert bubble["overhead_free"] <= bubble["bubble"] and bubble["stage_imbalance"] >= 1


def test_given_stages_and_submitted_steps_are_bit_identical(cluster, lenet_reference):
    """The Cluster object itself given (its client, its workers' devices)."""
    run = within(LIMIT, lambda: train("lenet5", cluster=cluster, replay=False,
                                      pipeline=lambda layers: [layers[:6], layers[6:]]))
    assert_bits(lenet_reference, run)
    assert [s["blocks"][0] for s in run["pipeline"].describe()["stages"]] == \
        ["ConvReLUPool", "Flatten"]


def test_resnet_small_leaves_the_order_to_batch_norm_and_is_bit_identical(cluster):
    reference = within(LIMIT, train, "resnet-small", 2)
    run = within(LIMIT, lambda: train("resnet-small", 2, cluster=cluster.client, pipeline=2))
    assert_bits(reference, run)
    assert run["pipeline"].schedule_run.startswith("dataflow (batch norm in stage 0")


def test_three_stages_on_three_workers_are_bit_identical(lenet_reference):
    """A middle stage receives activations and sends gradients both ways."""
    resnet = within(LIMIT, train, "resnet-small", 2)
    with connect("local:3") as three:
        lenet = within(LIMIT, lambda: train("lenet5", cluster=three.client, pipeline=3))
        staged = within(LIMIT, lambda: train("resnet-small", 2, cluster=three.client,
                                             pipeline=3, pipeline_schedule="gpipe"))
    assert_bits(lenet_reference, lenet)
    assert_bits(resnet, staged)
    assert len(lenet["pipeline"].stages) == 3 == len(staged["pipeline"].stages)


def test_cli_pipeline_on_a_cluster_records_the_bubble_per_stage(cluster, tmp_path):
    from hetero_nn.cli import main

    """Straight through on cpu:1; on the cluster, one epoch, then resumed for the second
    (the state pulled into the checkpoint, pushed back to the stages)."""
    run = ["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "16",
           "--granularity", "4", "--quiet"]
    local, staged = tmp_path / "local", tmp_path / "staged"
    assert within(LIMIT, main, [*run, "--epochs", "2", "--devices", "cpu:1",
                                "--out", str(local)]) == 0
    stages = ["--cluster", cluster.client.scheduler.address, "--pipeline", "2",
              "--pipeline-schedule", "gpipe", "--out", str(staged)]
    assert within(LIMIT, main, [*run, "--epochs", "1", *stages]) == 0
    assert within(LIMIT, main, ["train", "--resume", "--epochs", "2", "--quiet", *stages]) == 0
    with np.load(local / "checkpoint-final.npz") as a, \
            np.load(staged / "checkpoint-final.npz") as b:
        keys = [k for k in a.files if k.startswith(("model/", "optimizer/"))]
        assert keys and all(np.array_equal(a[k], b[k]) for k in keys)
    pipeline = json.loads((staged / "metrics.json").read_text())["pipeline"]
    assert pipeline["schedule_run"] == "gpipe" and pipeline["ideal_bubble"] == 0.2
    assert 0 <= pipeline["bubble"] < 1 and pipeline["steps_measured"] == 3
    assert 0 <= pipeline["overhead_free_bubble"] <= pipeline["bubble"]
    assert all(0 <= s["bubble"] < 1 for s in pipeline["stages"])


def test_what_the_stages_cannot_train_is_refused_in_one_line(cluster):
    model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0)
    cases = [({"pipeline": 3}, "3 stages need 3 Dask workers"),
             ({"pipeline": 2, "stage_devices": ["cpu:1", "cpu:1"]}, "stage_devices"),
             ({"pipeline": 2, "clip_grad_norm": 1.0}, "clip_grad_norm"),
             ({"pipeline": 2, "granularity": "auto"}, "granularity='auto'")]
    for options, words in cases:
        options = {"granularity": 4, **options}
        with hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt:
            with pytest.raises(ConfigError) as info:
                within(LIMIT, lambda: hn.Trainer(model, runtime=rt, batch_size=16,
                                                 cluster=cluster.client, **options))
        message = str(info.value)
        assert words in message and "\n" not in message, message


def test_a_task_failing_on_the_last_stage_fails_the_step_not_the_first_stage_wait(cluster):
    """Labels out of range fail the loss on the last stage: the first stage, waiting for
    gradients, is told and gives up; the step raises the loss's error, and the next step
    (the client still held the run) trains."""
    from hetero_nn.errors import TaskError

    model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0)
    x = np.zeros((16, *SHAPES["lenet5"]), np.float32)
    with (hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=16, granularity=4, cluster=cluster.client,
                     pipeline=2) as trainer):
        with pytest.raises(TaskError, match=r"label 12 of row 0 is outside \[0, 10\)"):
            within(LIMIT, trainer.train_step, x, np.full(16, 12))
        assert np.isfinite(within(LIMIT, trainer.train_step, x, np.zeros(16, np.int64)))


def test_sigkilled_stage_worker_fails_the_step_with_a_cluster_error(tmp_path):
    """Its own two workers: one of them is killed."""
    data = hn.datasets.load("synthetic", "train", image_size=28, num_samples=160)
    model = hn.build_model("lenet5", data.input_shape, data.num_classes, seed=0)
    killed = []

    def on_step(trainer, _loss):
        if trainer.global_step == 3:  # the last stage's worker dies before step 4
            address = trainer.pipeline.stages[-1].workers[0]
            pid = trainer.cluster.client.run(os.getpid, workers=[address])[address]
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)

    def fit():
        with (connect("local:2") as c,
              hn.Runtime(devices="cpu:1", perfmodel=False, trace=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=16, granularity=4, cluster=c,
                         pipeline=2) as trainer):
            trainer.fit(data, epochs=3, verbose=0, on_step=on_step, checkpoint_dir=tmp_path,
                        checkpoint_every=2)

    with pytest.raises(ClusterError) as info:
        within(LIMIT, fit)
    message = str(info.value)
    # seen by step 4's command, or first by the client's look at the workers, which pulls
    # the state before forming a group again: either way the run stops
    assert killed and ("pipeline stage(s) [1] lost in step 4" in message
                       or "a pipeline stage's worker was lost" in message), message
    assert f"the last good checkpoint is {tmp_path / 'checkpoint.npz'}" in message, message


def test_a_stage_ending_in_a_view_layer_sends_its_unflattened_batch(cluster, lenet_reference):
    """A cut right after Flatten: the stage sends the batch in the layout the next layer
    reads it in one process, and takes its gradient back in its own."""
    run = within(LIMIT, lambda: train("lenet5", cluster=cluster.client,
                                      pipeline=lambda layers: [layers[:7], layers[7:]]))
    assert_bits(lenet_reference, run)


def pipedream(kind, replay, cluster=None, path=None, resume_at=None):
    """LeNet-5 with a Dropout before its last layer, float64, ``pipeline_schedule=
    "pipedream"`` on the stages ``[layers[:3], layers[3:]]``, 3 steps of SGD with momentum
    or Adam: in one process on ``cpu:2`` (a stage per worker), or a stage per worker of
    ``cluster``, where a checkpoint at ``path`` after ``resume_at`` steps is resumed by a
    new trainer. Returns the state, losses, pipeline and the Dropout's count."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((16, *SHAPES["lenet5"])), rng.integers(0, 10, 16))
               for _ in range(3)]
    bounds, losses = [0, *([resume_at] if resume_at else []), 3], []
    for first, end in zip(bounds, bounds[1:]):
        layers = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0, dtype="float64").layers
        model = hn.Sequential([*layers[:-1], hn.Dropout(0.2, seed=3), layers[-1]])
        model.build(SHAPES["lenet5"], "float64")
        optimizer = (hn.optim.SGD(lr=0.05, momentum=0.9) if kind == "sgd"
                     else hn.optim.Adam(lr=1e-3))
        options = {} if cluster is None else {"cluster": cluster}
        with (hn.Runtime(devices="cpu:2" if cluster is None else "cpu:1", perfmodel=False,
                         trace=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=16, granularity=4, replay=replay,
                         optimizer=optimizer, dtype="float64", pipeline_schedule="pipedream",
                         pipeline=[model.layers[:3], model.layers[3:]], **options) as trainer):
            if first:
                trainer.load_checkpoint(path)
            losses += [trainer.train_step(x, y) for x, y in batches[first:end]]
            if path is not None:
                trainer.save_checkpoint(path)  # the state pulled from the stages
            trainer.sync()
    return {"state": model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
            "losses": losses, "pipeline": trainer.pipeline, "dropout": model.layers[-2].steps}


@pytest.mark.parametrize("kind,replay", [("sgd", True), ("adam", False)])
def test_pipedream_across_workers_equals_one_process(cluster, tmp_path, kind, replay):
    """Each stage runs its micro-batches with the versions one process stashes and
    updates its own weights per micro-batch: the weights, optimizer buffers and losses
    equal the in-process run's to the bit; the checkpoint taken after the first step
    brings back the stages' step counts (Adam's bias correction reads them) and the
    Dropout's (its masks), so the new trainer resuming it goes on as one run."""
    one = within(LIMIT, pipedream, kind, replay)
    run = within(LIMIT, pipedream, kind, replay, cluster.client, tmp_path / "run.npz", 1)
    assert_bits(one, run)
    assert run["optimizer"]["steps"] == one["optimizer"]["steps"] == 3 * 4  # per micro-batch
    assert run["dropout"] == one["dropout"] == 3 * 4  # a forward per micro-batch
    pipe = run["pipeline"]
    assert pipe.schedule_run == "pipedream" and len(pipe.stages) == 2
    bubble = pipe.bubble()
    assert bubble["micro_batches"] == 4 and 0 <= bubble["bubble"] < 1


def test_cli_pipedream_on_a_cluster_resumes_with_the_stages_step_counts(cluster, tmp_path):
    """``--pipeline-schedule pipedream`` across the workers, resumed after one epoch: the
    checkpoint counts an optimizer step per micro-batch (2 epochs of 4 steps of 4)."""
    from hetero_nn.cli import main

    run = ["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "16",
           "--granularity", "4", "--quiet"]
    stages = ["--cluster", cluster.client.scheduler.address, "--pipeline", "2",
              "--pipeline-schedule", "pipedream", "--out", str(tmp_path)]
    assert within(LIMIT, main, [*run, "--epochs", "1", *stages]) == 0
    assert within(LIMIT, main, ["train", "--resume", "--epochs", "2", "--quiet", *stages]) == 0
    with np.load(tmp_path / "checkpoint-final.npz") as saved:
        assert int(saved["optimizer/steps"]) == 2 * 4 * 4
    pipeline = json.loads((tmp_path / "metrics.json").read_text())["pipeline"]
    assert pipeline["schedule_run"] == "pipedream" and pipeline["across"] == "dask workers"
    assert 0 <= pipeline["bubble"] < 1
