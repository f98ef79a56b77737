"""Pipeline parallelism (training/pipeline/stages.py): GPipe and 1F1B bit-identical to the same
training without a pipeline at the same granularity (LeNet-5 and resnet-small, float64,
2 and 3 stages), every stage's tasks on its workers (CPU and emulated GPU), the
schedule's order on each stage, the balanced cut, the bubble from the trace, and one-line
errors for bad options."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero_nn as hn
from hetero_nn.errors import ConfigError
from hetero_nn.training.pipeline.stages import balanced_cut
from helpers import within

SHAPES = {"lenet5": (1, 28, 28), "resnet-small": (3, 12, 12)}


def train(name, devices="cpu:2", g=4, steps=3, replay=True, policy="dmda", **options):
    model = hn.build_model(name, SHAPES[name], 10, seed=0, dtype="float64")
    if callable(options.get("pipeline")):  # stages given from the model's layers
        options["pipeline"] = options["pipeline"](model.layers)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, *SHAPES[name]))
    y = rng.integers(0, 10, 16)
    with (hn.Runtime(devices=devices, policy=policy, perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=16, granularity=g, replay=replay,
                     optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), **options) as trainer):
        losses = [trainer.train_step(x, y) for _ in range(steps)]
        trace = rt.trace()
        pipe = trainer.pipeline
        return {"state": model.state_dict(), "losses": losses, "trace": trace,
                "graphs": list(trainer.graphs.values()),
                "bubble": pipe.bubble(trace) if pipe else None,
                "describe": pipe.describe() if pipe else None, "pipeline": pipe}


def assert_bits(a, b):
    assert list(a["state"]) == list(b["state"])
    for key in a["state"]:
        np.testing.assert_array_equal(a["state"][key], b["state"][key], err_msg=key)
    assert a["losses"] == b["losses"]


@pytest.fixture(scope="module")
def lenet_reference():
    return train("lenet5")


@pytest.mark.parametrize("stages,devices,schedule,replay", [
    (2, "cpu:2", "1f1b", True), (2, "cpu:2", "gpipe", True), (3, "cpu:3", "1f1b", True),
    (3, "cpu:3", "gpipe", False), (2, "cpu:2", "1f1b", False)])
def test_lenet_bit_identical(lenet_reference, stages, devices, schedule, replay):
    run = train("lenet5", devices, pipeline=stages, pipeline_schedule=schedule, replay=replay)
    assert_bits(lenet_reference, run)
    described = run["describe"]
    assert len(described["stages"]) == stages and described["schedule_run"] == schedule
    bubble = run["bubble"]
    assert 0 <= bubble["bubble"] < 1 and bubble["ideal"] == (stages - 1) / (4 + stages - 1)


@pytest.mark.parametrize("stages", [2, 3])
def test_resnet_bit_identical_and_batch_norm_leaves_the_order_to_the_data(stages):
    reference = train("resnet-small", "cpu:3", g=2)
    run = train("resnet-small", "cpu:3", g=2, pipeline=stages)
    assert_bits(reference, run)
    assert run["describe"]["schedule_run"].startswith("dataflow (batch norm in stage 0")


def stage_of_records(run):
    """Per stage, the trace records of its tasks in the last step."""
    pipe = run["pipeline"]
    by_id = {r.task_id: r for r in run["trace"]}
    return [[by_id[t.id] for ops in stage for op in ops for t in op if t.id in by_id]
            for stage in pipe.ops]


def test_stages_on_a_cpu_and_an_emulated_gpu():
    def halves(layers):
        return [layers[:6], layers[6:]]

    options = dict(pipeline=halves, stage_devices=["cpu:1", "cuda-emu:1"])
    first = train("lenet5", "cpu:1,cuda-emu:1", **options)
    again = train("lenet5", "cpu:1,cuda-emu:1", policy="random", **options)
    reference = train("lenet5", "cpu:2")
    # every task of a stage ran on its device: the placement, so the bits, are fixed
    workers = [{r.worker for r in records} for records in stage_of_records(first)]
    assert workers == [{"cpu0"}, {"cuda-emu0"}]
    assert_bits(first, again)
    balanced = train("lenet5", "cpu:1,cuda-emu:1", pipeline=2,
                     stage_devices=["cpu:1", "cuda-emu:1"])
    assert balanced["describe"]["imbalance"] >= 1
    for key, value in reference["state"].items():  # CUDA variants round differently
        np.testing.assert_allclose(first["state"][key], value, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("policy", ["eager", "ws"])
def test_every_policy_keeps_a_stage_on_its_workers(lenet_reference, policy):
    """Runtime.placing gives each task of a stage worker= its stage's workers: the
    placement constraint every policy honours, eager and ws among workers of one kind."""
    run = train("lenet5", "cpu:2", policy=policy,
                pipeline=lambda layers: [layers[:3], layers[3:]])
    assert_bits(lenet_reference, run)
    workers = [{r.worker for r in records} for records in stage_of_records(run)]
    assert workers == [{"cpu0"}, {"cpu1"}]


def test_given_stages_and_the_schedule_order_on_each_stage(lenet_reference):
    for schedule in ("gpipe", "1f1b"):
        model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0, dtype="float64")
        layers = model.layers
        rng = np.random.default_rng(1)
        x, y = rng.standard_normal((16, 1, 28, 28)), rng.integers(0, 10, 16)
        with (hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=16, granularity=4,
                         optimizer=hn.optim.SGD(lr=0.05, momentum=0.9),
                         pipeline=[layers[:3], layers[3:]], pipeline_schedule=schedule) as t):
            losses = [t.train_step(x, y) for _ in range(3)]
            trace, pipe = rt.trace(), t.pipeline
        assert losses == lenet_reference["losses"]
        by_id = {r.task_id: r for r in trace}
        fops, bops = pipe.ops[0]
        spans = [(min(by_id[t.id].start for t in op), max(by_id[t.id].end for t in op))
                 for op in fops + bops]
        f_end = max(end for _, end in spans[:4])
        b_start = min(start for start, _ in spans[4:])
        if schedule == "gpipe":  # stage 0: every forward before any backward
            assert f_end <= b_start
        else:  # 1f1b on stage 0 of 2: F0, then F1 before B0, B0 before F2
            f2_start = spans[2][0]
            b0_end = spans[4][1]
            assert b0_end <= f2_start


def test_bad_options_are_one_line():
    model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0)
    layers = model.layers
    with hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=False) as rt:
        x, y = np.zeros((8, 1, 28, 28), np.float32), np.zeros(8, np.int64)
        cases = [
            (dict(pipeline=2, pipeline_schedule="zigzag"), "pipeline_schedule must be one of"),
            (dict(pipeline="two"), "pipeline must be a number of stages"),
            (dict(stage_devices=["cpu:1"]), "stage_devices is given without pipeline="),
            (dict(pipeline=2, stage_devices=["cpu:1"]), "stage_devices: 1 entries for 2 stages"),
        ]
        for options, message in cases:
            with pytest.raises(ConfigError, match=message):
                hn.Trainer(model, runtime=rt, batch_size=8, **options)
        step_cases = [
            (dict(pipeline=3), "3 stages need at least 3 workers"),
            (dict(pipeline=2, stage_devices=["cpu:1", "cuda:1"]), r"stage_devices\[1\]"),
            (dict(pipeline=[layers[:1], layers[1:]]), "inside a fused block"),
            (dict(pipeline=[layers[3:], layers[:3]]), "should start with layer 0"),
            (dict(pipeline=[layers[:3], layers[3:5]]), "hold 5 of the model's 12 layers"),
        ]
        for options, message in step_cases:
            with hn.Trainer(model, runtime=rt, batch_size=8, **options) as t:
                with pytest.raises(ConfigError, match=message):
                    t.train_step(x, y)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=2, max_size=8), st.integers(1, 4))
def test_balanced_cut_is_optimal(costs, count):
    count = min(count, len(costs))
    bounds, slowest = balanced_cut([costs] * count, count)
    assert [a for a, _ in bounds] == [0] + [b for _, b in bounds[:-1]] and bounds[-1][1] == len(costs)
    assert all(a < b for a, b in bounds)
    assert slowest == pytest.approx(max(sum(costs[a:b]) for a, b in bounds))
    best = min(max(sum(costs[a:b]) for a, b in zip((0, *cut), (*cut, len(costs))))
               for cut in itertools.combinations(range(1, len(costs)), count - 1))
    assert slowest == pytest.approx(best)


def test_placing_and_add_dependency_refuse_what_they_cannot_do():
    from hetero_nn.errors import SubmitError
    from hetero_nn.codelets.reduce import fill_zero

    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        with pytest.raises(SubmitError, match="none of \\['gpu7'\\] is a worker"):
            with rt.placing(["gpu7"]):
                pass
        h = rt.temporary((4,), "float64")
        with rt.placing(["cpu1"]) as tasks:
            a = rt.submit(fill_zero, h)
        assert tasks == [a] and a.eligible == (rt.workers[1],)
        b = rt.submit(fill_zero, h)  # a flush that streams: too late to order
        with pytest.raises(SubmitError, match="streams its tasks"):
            rt.add_dependency(a, b)
        rt.wait()
    with hn.Runtime(devices="cpu:1,cuda-emu:1", perfmodel=False) as rt:
        only_cpu = hn.Codelet("only_cpu", modes=(hn.W,), variants={"ref": lambda x: None})
        with pytest.raises(SubmitError, match="none of them has a variant"):
            with rt.placing(["cuda-emu0"]):
                rt.submit(only_cpu, rt.temporary((2,), "float64"))


def test_cli_records_the_stages_and_the_measured_bubble(tmp_path):
    import json

    from test_cli import DATA

    from hetero_nn.cli import main
    if not (DATA / "mnist").is_dir():
        pytest.skip("the MNIST files are not in the shared datasets")
    out = tmp_path / "run"
    assert main(["train", "--dataset", "mnist", "--data-dir", str(DATA), "--limit", "256",
                 "--batch-size", "32", "--granularity", "4", "--devices", "cpu:2", "--policy",
                 "dmda", "--pipeline", "2", "--pipeline-schedule", "gpipe", "--epochs", "1",
                 "--out", str(out), "--quiet"]) == 0
    pipeline = json.loads((out / "metrics.json").read_text())["pipeline"]
    assert [s["workers"] for s in pipeline["stages"]] == [["cpu0"], ["cpu1"]]
    assert pipeline["schedule_run"] == "gpipe" and pipeline["ideal_bubble"] == 0.2
    assert 0 <= pipeline["bubble"] < 1 and pipeline["steps_measured"] == 7
    assert 0 <= pipeline["overhead_free_bubble"] < 1 and pipeline["stage_imbalance"] >= 1


def test_a_checkpointed_block_in_an_ordered_pipeline_keeps_its_temporaries():
    """Releases would lay bytes out by submission order, which 1F1B contradicts: the
    dependencies they add could close a cycle with the schedule's. A step of a model
    whose blocks release (Checkpoint, Sequential) finishes, bit-identical (in a daemon
    thread, so a deadlock fails the test instead of hanging the suite)."""
    from hetero_nn.layers import Checkpoint

    def model():
        net = hn.Sequential(hn.Flatten(), Checkpoint(hn.Sequential(hn.Dense(48, 32), hn.ReLU(),
                                                                   hn.Dense(32, 32))),
                            hn.ReLU(), hn.Dense(32, 10))
        net.build((3, 4, 4), "float64")
        net.reset_parameters(np.random.default_rng(0))
        return net

    results = {}

    def run(name, **options):
        net = model()
        rng = np.random.default_rng(1)
        x, y = rng.standard_normal((16, 3, 4, 4)), rng.integers(0, 10, 16)
        with (hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=False) as rt,
              hn.Trainer(net, runtime=rt, batch_size=16, granularity=4, **options) as t):
            results[name] = ([t.train_step(x, y) for _ in range(2)], net.state_dict())

    def both():
        run("plain")
        run("piped", pipeline=2, pipeline_schedule="1f1b")

    within(120, both)  # a dependency cycle would hang the pipelined step
    assert results["plain"][0] == results["piped"][0]
    for key, value in results["plain"][1].items():
        np.testing.assert_array_equal(results["piped"][1][key], value)


def test_an_order_against_submission_runs_and_a_cycle_is_one_error():
    """add_dependency on a task submitted later: the flush hands the tasks over in a
    topological order (here b, then a, on one worker); a cycle is a TaskError, not a hang."""
    from hetero_nn.codelets.reduce import add, fill_zero
    from hetero_nn.errors import TaskError

    with hn.Runtime(devices="cpu:1", perfmodel=False, overlap=False) as rt:
        x, y = rt.register(np.ones(3)), rt.register(np.ones(3))
        a = rt.submit(fill_zero, x)
        b = rt.submit(add, y, y)
        rt.add_dependency(b, a)
        rt.wait()
        records = sorted(rt.trace(), key=lambda r: r.start)
        assert [r.task_id for r in records] == [b.id, a.id] and b.id in records[1].deps
        c = rt.submit(fill_zero, x)
        d = rt.submit(add, x, y)  # reads what c wrote
        rt.add_dependency(d, c)

        def flush():
            with pytest.raises(TaskError, match="closed a cycle"):
                rt.wait()
        within(30, flush)
        assert rt.fetch(y).tolist() == [2.0, 2.0, 2.0]  # the runtime goes on


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "pipedream"])
def test_pipelined_steps_replay_on_the_compiled_engine(lenet_reference, schedule):
    """Every schedule replays through the compiled engine (no fallback), each stage's
    tasks on its worker; 1f1b and gpipe keep the bits."""
    from hetero_nn.scheduler.engine.replay import unavailable

    run = within(180, lambda: train("lenet5", pipeline=lambda layers: [layers[:3], layers[3:]],
                                    pipeline_schedule=schedule))
    assert unavailable(run["pipeline"].runtime) is None
    graphs = run["graphs"]
    assert graphs and all(g._compiled is not None and g.replays == 2 for g in graphs)
    workers = [{r.worker for r in records} for records in stage_of_records(run)]
    assert workers == [{"cpu0"}, {"cpu1"}]
    if schedule != "pipedream":
        assert_bits(lenet_reference, run)


@settings(max_examples=30, deadline=None)
@given(stages=st.integers(1, 5), micro=st.integers(1, 10), schedule=st.sampled_from(
    ["gpipe", "1f1b", "pipedream"]), forward=st.floats(0.1, 5), ratio=st.floats(0.5, 3))
def test_the_overhead_free_bubble_of_equal_stages_is_the_ideal(stages, micro, schedule,
                                                                forward, ratio):
    """With equal stages the overhead-free span gives (P-1)/(M+P-1), for every schedule."""
    from hetero_nn.training.pipeline.stages import schedule_span

    seconds = [[[forward] * micro, [forward * ratio] * micro] for _ in range(stages)]
    span = schedule_span(schedule, seconds)
    busy = stages * micro * forward * (1 + ratio)
    assert 1 - busy / (stages * span) == pytest.approx((stages - 1) / (micro + stages - 1))


def test_the_overhead_free_bubble_counts_an_unequal_cut():
    """A stage twice as slow: the overhead-free span is the slow stage's work after the
    fill; a real step reports it beside the measured bubble."""
    from hetero_nn.training.pipeline.stages import schedule_span

    seconds = [[[1.0] * 4, [2.0] * 4], [[2.0] * 4, [4.0] * 4]]
    span = schedule_span("1f1b", seconds)
    assert span == pytest.approx(3 + 4 * 6)  # stage 0's first forward, then stage 1 busy
    run = train("lenet5", pipeline=lambda layers: [layers[:3], layers[3:]],
                pipeline_schedule="1f1b")
    bubble = run["bubble"]
    assert 0 <= bubble["overhead_free"] < 1 and bubble["stage_imbalance"] >= 1
