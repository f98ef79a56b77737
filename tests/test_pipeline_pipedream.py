"""``pipeline_schedule="pipedream"`` (training/pipeline/stages.py): PipeDream's asynchronous
schedule with weight stashing, an update per micro-batch. Checked against an
independent PyTorch implementation of the same algorithm (every stage's weight
versions kept by hand, ``torch.func.functional_call``), replayed against submitted,
the dependency structure that lets a stage run ahead, and the one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.errors import ConfigError
from helpers import within
from twins import torch_twin

SHAPES = {"lenet5": (1, 28, 28), "resnet-small": (3, 12, 12)}
BATCH = 12


def batches(name, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, *SHAPES[name])), rng.integers(0, 10, BATCH))
            for _ in range(steps)]


def optimizer(kind):
    return (hn.optim.SGD(lr=0.05, momentum=0.9) if kind == "sgd"
            else hn.optim.Adam(lr=1e-3))


def train(name, data, stages, g, kind="sgd", replay=True, seed=0):
    """hetero_nn's run: the model before training, its state after, the losses, the
    pipeline (its stages) and the runtime's trace."""
    model = hn.build_model(name, SHAPES[name], 10, seed=seed, dtype="float64")
    initial = model.state_dict()
    with (hn.Runtime(devices=f"cpu:{stages}", policy="dmda", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity=g, replay=replay,
                     optimizer=optimizer(kind), pipeline=stages,
                     pipeline_schedule="pipedream", dtype="float64") as trainer):
        losses = [trainer.train_step(x, y) for x, y in data]
        names = {id(p): n for n, p in model.named_parameters()}
        pipe = trainer.pipeline
        stage_names = [[names[id(p)] for b in pipe.blocks[st.first:st.end]
                        for layer in getattr(b, "layers", (b,)) for m in layer.modules()
                        for p in m.parameters()] for st in pipe.stages]
        return {"model": model, "initial": initial, "state": model.state_dict(),
                "losses": losses, "stages": stage_names, "pipeline": pipe,
                "trace": rt.trace(), "steps": trainer.optimizer.steps}


def torch_pipedream(model, initial, stage_names, data, g, kind):
    """PipeDream with weight stashing in PyTorch, written from the paper: per micro-batch
    ``k``, stage ``s`` runs forward and backward with its weights after
    ``max(0, k - (P - 1 - s))`` of the step's updates; every stage then applies the
    optimizer to the micro-batch's share of the batch's mean loss. Returns the state
    and the losses (each step's: the sum of its micro-batches' shares)."""
    torch = pytest.importorskip("torch", reason="the PipeDream reference is written in PyTorch")
    from torch.func import functional_call

    model.load_state_dict(initial)
    twin = torch_twin(model, "float64")
    live = dict(twin.named_parameters())
    opt = (torch.optim.SGD(live.values(), lr=0.05, momentum=0.9) if kind == "sgd"
           else torch.optim.Adam(live.values(), lr=1e-3))
    count, losses = len(stage_names), []
    for x, y in data:
        xs, ys = np.array_split(x, g), np.array_split(y, g)
        versions = [[{n: live[n].detach().clone() for n in names}] for names in stage_names]
        total = 0.0
        for k in range(g):
            used = {}
            for s, names in enumerate(stage_names):
                version = versions[s][max(0, k - (count - 1 - s))]
                used.update({n: version[n].clone().requires_grad_() for n in names})
            out = functional_call(twin, used, (torch.from_numpy(xs[k]),))
            loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(ys[k]),
                                                     reduction="sum") / len(x)
            loss.backward()
            total += loss.item()
            opt.zero_grad()
            for n, p in live.items():
                p.grad = used[n].grad
            opt.step()
            for s, names in enumerate(stage_names):
                versions[s].append({n: live[n].detach().clone() for n in names})
        losses.append(total)
    return {k: v.detach().numpy() for k, v in twin.state_dict().items()}, losses


@pytest.mark.parametrize("stages,g,kind,replay", [
    (2, 4, "sgd", True), (3, 4, "sgd", True), (2, 3, "adam", True), (3, 6, "adam", False),
    (1, 3, "sgd", True)])
def test_lenet_equals_pytorch_pipedream(stages, g, kind, replay):
    data = batches("lenet5", 3)
    ours = within(180, train, "lenet5", data, stages, g, kind, replay)
    state, losses = torch_pipedream(ours["model"], ours["initial"], ours["stages"], data, g,
                                    kind)
    assert len(ours["stages"]) == stages and ours["steps"] == 3 * g  # an update per micro-batch
    for key, value in ours["state"].items():
        np.testing.assert_allclose(value, state[key], rtol=1e-10, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(ours["losses"], losses, rtol=1e-12)


def test_not_synchronous_training():
    """The stale, stashed versions change the weights: pipedream is not 1f1b."""
    data = batches("lenet5", 2)
    ours = within(180, train, "lenet5", data, 2, 4)
    model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0, dtype="float64")
    with (hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity=4, pipeline=2,
                     optimizer=optimizer("sgd"), dtype="float64") as trainer):
        for x, y in data:
            trainer.train_step(x, y)
    first = next(iter(ours["state"]))
    assert not np.array_equal(ours["state"][first], model.state_dict()[first])


def test_replayed_equals_submitted_with_batch_norm_and_dropout():
    """resnet-small's batch norms (statistics per micro-batch) and a Dropout each register a
    step input per micro-batch; the replayed steps write every one of them. (Stages
    given: a cut balanced from measured times may differ between two runs, and with it
    every stage's staleness.)"""
    def run(replay):
        layers = hn.build_model("resnet-small", SHAPES["resnet-small"], 10, seed=0,
                                dtype="float64").layers
        model = hn.Sequential([*layers[:-1], hn.Dropout(0.2, seed=3), layers[-1]])
        model.build(SHAPES["resnet-small"], "float64")
        with (hn.Runtime(devices="cpu:2", policy="dmda", perfmodel=False) as rt,
              hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity=3, replay=replay,
                         optimizer=optimizer("adam"), pipeline=[model.layers[:3],
                                                                 model.layers[3:]],
                         pipeline_schedule="pipedream", dtype="float64") as trainer):
            losses = [trainer.train_step(x, y) for x, y in batches("resnet-small", 3)]
            assert trainer.pipeline.describe()["schedule_run"] == "pipedream"
            return model.state_dict(), losses, trainer.graphs_captured
    replayed, submitted = within(240, run, True), within(240, run, False)
    assert replayed[2] == 1 and submitted[2] == 0
    assert replayed[1] == submitted[1]
    for key in replayed[0]:
        np.testing.assert_array_equal(replayed[0][key], submitted[0][key], err_msg=key)


def test_a_stage_runs_ahead_of_the_backward():
    """Stage 0's forward of micro-batch k+1 waits for no task of the last stage's backward
    of k (it reads a stashed version), but for that of k-1 and for its own backward, update
    and copy of k-1 (they made the version it reads):
    read off the dependencies the trace records."""
    data = batches("lenet5", 1)
    ours = within(180, train, "lenet5", data, 2, 4, "sgd", False)
    ops, deps = ours["pipeline"].ops, {r.task_id: r.deps for r in ours["trace"]}

    def ancestors(tasks):
        seen, todo = set(), [t.id for t in tasks]
        while todo:
            for d in deps[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    for k in range(1, 3):
        before = ancestors(ops[0][0][k + 1])
        assert not {t.id for t in ops[1][1][k]} & before
        assert {t.id for t in ops[1][1][k - 1]} & before
        assert {t.id for t in ops[0][1][k - 1]} <= before  # its backward, update and copy
    bubble = ours["pipeline"].bubble(ours["trace"])
    assert bubble["micro_batches"] == 4 and 0 <= bubble["bubble"] < 1


def test_clip_grad_norm_is_refused():
    model = hn.build_model("lenet5", SHAPES["lenet5"], 10, seed=0)
    x, y = batches("lenet5", 1)[0]
    with (hn.Runtime(devices="cpu:2", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=BATCH, granularity=4, pipeline=2,
                     pipeline_schedule="pipedream", clip_grad_norm=1.0) as trainer):
        with pytest.raises(ConfigError, match="pipedream.*clip_grad_norm"):
            trainer.train_step(x.astype(np.float32), y)
