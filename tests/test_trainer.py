"""Trainer.fit, evaluate, granularity "auto" (see also test_granularity.py), divergence, and the built-in models.

``fit`` is a loop of ``train_step`` over the batches of ``epoch_order(seed,
epoch)``: its weights equal a hand-written loop's bit for bit and PyTorch's to
1e-9 (float64) over whole epochs, and its history reports the same losses and
accuracies PyTorch computes. The built-in models are the networks their
docstrings name (checked against ``torch.nn`` twins on 28x28 and 32x32 inputs).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.snn_models import SPIKING_MODELS
from hetero_nn.training.checkpoint import CHECKPOINT_NAME, read_checkpoint
from twins import torch_twin

REL_F64 = 1e-9


@pytest.fixture(scope="module")
def torch():
    """PyTorch on one thread, for the cross-checks; the test is skipped where it is missing."""
    torch = pytest.importorskip("torch", reason="PyTorch is optional; the cross-checks against "
                                                "it need it")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


def _data(n=96, size=12, channels=1, seed=0, split="train"):
    return hn.datasets.load("synthetic", split, image_size=size, num_samples=n, seed=seed,
                            channels=channels)


def _runtime(**kw):
    kw.setdefault("devices", "cpu:2")
    return hn.Runtime(perfmodel=False, trace=False, **kw)


def _torch_twin(torch, model):
    """A torch module of the same layers, holding the same weights and buffers (float64)."""
    return torch_twin(model, "float64")


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# --------------------------------------------------------------------------- models

@pytest.mark.parametrize("name", [n for n in hn.MODELS if n not in SPIKING_MODELS])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_builtin_models_equal_their_torch_twins(torch, name, shape):
    """The CNNs (the spiking models' twins are in test_spiking_vs_snntorch.py)."""
    model = hn.build_model(name, shape, 10, dtype="float64", seed=3)
    assert model.input_shape == shape and model.output_shape == (10,)
    assert model.spec == {"name": name, "input_shape": list(shape), "num_classes": 10}
    twin = _torch_twin(torch, model).eval()  # evaluate_batch and predict run in eval mode
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, *shape))
    y = rng.integers(0, 10, 5)
    with hn.Trainer(model, runtime=_runtime(), batch_size=5, granularity=2,
                    dtype="float64") as tr:
        loss, correct = tr.evaluate_batch(x, y)
        preds = tr.predict(x)
    with torch.no_grad():
        logits = twin(torch.from_numpy(x))
    assert math.isclose(loss, torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)).item(),
                        rel_tol=REL_F64)
    assert np.array_equal(preds, logits.argmax(1).numpy())
    assert correct == int((logits.argmax(1).numpy() == y).sum())


def test_model_sizes_follow_the_input():
    assert hn.build_model("dahl-basic", (1, 28, 28))[4].in_features == 4 * 13 * 13
    assert hn.build_model("lenet5", (1, 28, 28))[7].in_features == 16 * 5 * 5
    assert hn.build_model("lenet5", (3, 32, 32))[7].in_features == 16 * 6 * 6
    assert hn.build_model("cifar-small", (3, 32, 32))[7].in_features == 64 * 8 * 8
    a = hn.build_model("lenet5", (1, 28, 28), seed=7).state_dict()
    b = hn.build_model("lenet5", (1, 28, 28), seed=7).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_build_model_refuses_unknown_names_and_inputs_too_small():
    with pytest.raises(hn.ConfigError, match="unknown model 'resnet'.*lenet5"):
        hn.build_model("resnet", (1, 28, 28))
    with pytest.raises(hn.ShapeError, match="'lenet5' does not fit input of shape \\(1, 8, 8\\)"):
        hn.build_model("lenet5", (1, 8, 8))
    with pytest.raises(hn.ConfigError, match="input_shape"):
        hn.build_model("dahl-basic", (28, 28))


# --------------------------------------------------------------------------- fit

def test_fit_returns_one_record_per_epoch_with_the_documented_keys():
    train, test = _data(n=128), _data(n=64, split="test")
    model = hn.build_model("dahl-basic", train.input_shape, train.num_classes, seed=0)
    with hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=_runtime(),
                    batch_size=32, granularity=2) as tr:
        history = tr.fit(train, epochs=3, validation=test, verbose=0)
        again = tr.fit(train, epochs=3, validation=test, verbose=0)  # already done: no step
        steps = tr.global_step
    assert [r["epoch"] for r in history] == [1, 2, 3] and again == history and steps == 12
    for r in history:
        assert set(hn.HISTORY_KEYS) <= set(r)
        assert 0 <= r["train_accuracy"] <= 1 and 0 <= r["test_accuracy"] <= 1
        # the first step of the process (kernel compilation) is timed apart, out of images/s
        warm, warm_samples = r["warmup_seconds"], 32 if r["epoch"] == 1 else 0
        assert (warm > 0) == (r["epoch"] == 1) and r["seconds"] > warm
        assert r["images_per_second"] == pytest.approx((128 - warm_samples) / (r["seconds"] - warm))
        assert r["samples"] == 128 and r["steps"] == 4 and r["granularity"] == 2
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["test_accuracy"] > 0.5  # ten classes: chance is 0.1


def test_fit_is_a_loop_of_train_step_over_the_seeded_epoch_order():
    train = _data(n=70)  # 70 = 4 batches of 16 and one of 6
    weights = []
    for by_hand in (False, True):
        model = hn.build_model("dahl-basic", train.input_shape, 10, seed=1)
        with hn.Trainer(model, runtime=_runtime(), batch_size=16, granularity=2, seed=5) as tr:
            if by_hand:
                for epoch in range(2):
                    for x, y in train.batches(16, seed=5, epoch=epoch):
                        tr.train_step(x, y)
            else:
                tr.fit(train, epochs=2, verbose=0)
            weights.append(model.state_dict())
    assert all(weights[0][k].tobytes() == weights[1][k].tobytes() for k in weights[0])


def test_fit_and_evaluate_equal_pytorch_over_whole_epochs(torch):
    train, test = _data(n=72, channels=3, size=10), _data(n=40, channels=3, size=10, split="test")
    model = hn.build_model("cifar-small", train.input_shape, 10, dtype="float64", seed=2)
    twin = _torch_twin(torch, model)
    opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    with hn.Trainer(model, optimizer=hn.optim.SGD(lr=0.05, momentum=0.9), runtime=_runtime(),
                    batch_size=16, granularity=3, dtype="float64", seed=9) as tr:
        history = tr.fit(train, epochs=2, validation=test, verbose=0)
        weights = model.state_dict()
    for epoch in range(2):
        loss_sum, correct = 0.0, 0
        for x, y in train.batches(16, seed=9, epoch=epoch, dtype="float64"):
            opt.zero_grad()
            logits = twin(torch.from_numpy(x))
            loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += int((logits.argmax(1).numpy() == y).sum())
        assert math.isclose(history[epoch]["train_loss"], loss_sum / len(train), rel_tol=REL_F64)
        assert history[epoch]["train_accuracy"] == correct / len(train)
    for name, value in twin.state_dict().items():
        assert _rel(weights[name], value.numpy()) < REL_F64, name
    x, y = test.batch(slice(None), dtype="float64")
    with torch.no_grad():
        logits = twin(torch.from_numpy(x))
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)).item()
    assert math.isclose(history[-1]["test_loss"], expected, rel_tol=REL_F64)
    assert history[-1]["test_accuracy"] == float((logits.argmax(1).numpy() == y).mean())


def test_fit_takes_plain_arrays_and_shuffles_per_epoch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 1, 8, 8)).astype(np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64)
    model = hn.build_model("dahl-basic", (1, 8, 8), 2, seed=0)
    with hn.Trainer(model, runtime=_runtime(), batch_size=16) as tr:
        history = tr.fit((x, y), epochs=2, validation=(x, y), verbose=0)
        loss, acc = tr.evaluate((x, y))
    assert history[-1]["test_loss"] == loss and history[-1]["test_accuracy"] == acc
    data = hn.training.loader.ArrayData(x, y)
    assert not np.array_equal(data.epoch_order(0, 0), data.epoch_order(0, 1))
    with pytest.raises(hn.ConfigError, match="expected a hetero_nn Dataset"):
        hn.Trainer(model, runtime=_runtime(), batch_size=16).fit(x, epochs=1)


def test_fit_refuses_bad_arguments():
    model = hn.build_model("dahl-basic", (1, 8, 8), 2, seed=0)
    with hn.Trainer(model, runtime=_runtime(), batch_size=4) as tr:
        data = (np.zeros((8, 1, 8, 8), np.float32), np.zeros(8, np.int64))
        with pytest.raises(hn.ConfigError, match="epochs"):
            tr.fit(data, epochs=-1)
        with pytest.raises(hn.ConfigError, match="checkpoint_every"):
            tr.fit(data, epochs=1, checkpoint_every=0)
    with pytest.raises(hn.ConfigError, match="granularity 8 is larger than the batch size 4"):
        hn.Trainer(model, runtime=_runtime(), batch_size=4, granularity=8)
    with pytest.raises(hn.ConfigError, match="granularity"):
        hn.Trainer(model, runtime=_runtime(), batch_size=4, granularity="fast")


def test_the_trainer_keeps_the_models_dtype():
    data = _data(n=32)
    model = hn.build_model("dahl-basic", data.input_shape, 10, dtype="float64", seed=0)
    before = model.state_dict()
    with hn.Trainer(model, runtime=_runtime(), batch_size=16) as tr:
        assert tr.dtype == np.float64
        tr.fit(data, epochs=1, verbose=0)
        assert tr.checkpoint_config()["dtype"] == "float64"
    after = model.state_dict()
    assert model.dtype == np.float64 and all(v.dtype == np.float64 for v in after.values())
    assert all(not np.array_equal(before[k], after[k]) for k in before)  # trained, in float64
    with pytest.raises(hn.ConfigError) as info:
        hn.Trainer(model, dtype="float32")
    assert "dtype='float32'" in str(info.value) and "built in float64" in str(info.value)
    with hn.Trainer(model, runtime=_runtime(), dtype=np.float64) as tr:  # agreeing: fine
        assert tr.dtype == np.float64
    unbuilt = hn.Sequential(hn.Flatten(), hn.Dense(data.input_shape[-1] ** 2, 10))
    with hn.Trainer(unbuilt, runtime=_runtime(), batch_size=16) as tr:
        assert tr.dtype == np.float32
        tr.fit(data, epochs=1, verbose=0)
    assert unbuilt.dtype == np.float32
    with hn.Trainer(hn.Sequential(hn.Flatten(), hn.Dense(144, 10)), runtime=_runtime(),
                    dtype="float64") as tr:
        assert tr.dtype == np.float64
    with pytest.raises(hn.ConfigError, match="float32 or float64"):
        hn.Trainer(unbuilt, dtype="float16")


# --------------------------------------------------------------------------- granularity auto

def test_auto_granularity_chooses_the_best_prediction_without_touching_the_weights():
    train = _data(n=64)
    model = hn.build_model("dahl-basic", train.input_shape, 10, seed=0)
    before = model.state_dict()
    with hn.Trainer(model, runtime=_runtime(), batch_size=32, granularity="auto") as tr:
        x, y = train.batch(np.arange(32))
        g = tr.tune_granularity(x, y)
        after = model.state_dict()
        assert tr.optimizer.steps == 0 and tr.graphs_captured == 0
        assert tr.runtime.perfmodel is None  # the decision's own model is dropped after
        decision = tr.granularity_decision
        rows = decision.candidates
        # up to 4 per worker, 2 workers; fused and unfused
        assert sorted({r["granularity"] for r in rows}) == [1, 2, 4, 8]
        # the five calibration steps took two sizes of the first fusion: the other
        # fusion's codelets never ran, so its configurations have no family
        assert {r["fuse"] for r in rows} == {True} and decision.calibration_steps <= 5
        assert sorted(decision.left_out) == [[g, False] for g in (1, 2, 4, 8)]
        assert g == decision.granularity == tr.granularity and model.fuse == decision.fuse
        # the models' choice: the smallest g within the tolerance of the best prediction
        by_models = decision.recheck["chosen_by_models"]
        best = min(r["predicted_seconds"] for r in rows)
        chosen = next(r for r in rows if (r["granularity"], r["fuse"]) ==
                      (by_models["granularity"], by_models["fuse"]))
        assert chosen["predicted_seconds"] <= 1.05 * best
        assert all(r["predicted_seconds"] > 1.05 * best for r in rows
                   if r["granularity"] < chosen["granularity"])
        assert by_models["predicted_seconds"] <= chosen["predicted_seconds"]
        # then the re-check on measured steps: the decision is its final configuration
        final = decision.recheck["final"]
        assert (final["granularity"], final["fuse"]) == (g, model.fuse)
        assert decision.predicted_seconds == final["predicted_seconds"]
        assert decision.measured_seconds > 0 and decision.calibration_steps >= 2 * len(decision.calibrated)
        assert model.granularities == decision.layer_granularity
        history = tr.fit(train, epochs=1, verbose=0)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert history[0]["granularity"] == g


def test_auto_granularity_is_resolved_by_fit_and_bounded_by_the_batch():
    train = _data(n=24)
    model = hn.build_model("dahl-basic", train.input_shape, 10, seed=0)
    with hn.Trainer(model, runtime=_runtime(devices="cpu:1"), batch_size=3,
                    granularity="auto") as tr:
        assert tr.granularity is None and tr.granularity_decision is None
        tr.fit(train, epochs=1, verbose=0)
        rows = tr.granularity_decision.candidates
        assert sorted({r["granularity"] for r in rows}) == [1, 2]  # 4 * 1 worker, batches of 3
        assert tr.granularity in (1, 2)
        assert tr.checkpoint_config()["granularity"] == tr.granularity


# --------------------------------------------------------------------------- divergence

@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow in the exploding steps
def test_a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    train = _data(n=256)
    model = hn.build_model("dahl-basic", train.input_shape, 10, seed=0)
    with hn.Trainer(model, optimizer=hn.optim.SGD(lr=1e6, momentum=0.9), runtime=_runtime(),
                    batch_size=16, granularity=2) as tr:
        with pytest.raises(hn.TrainingDiverged) as info:
            tr.fit(train, epochs=2, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=1)
        diverged_at = tr.global_step + 1
    message = str(info.value)
    assert "training diverged" in message and "epoch 1/2" in message
    assert f"global step {diverged_at}" in message
    path = tmp_path / CHECKPOINT_NAME
    assert str(path) in message
    ckpt = read_checkpoint(path)
    assert 1 <= ckpt.global_step < diverged_at
    assert all(np.isfinite(v).all() for v in ckpt.model_state.values())
    assert all(np.isfinite(b).all() for st in ckpt.optimizer["state"].values() for b in st.values())
    assert not (tmp_path / "checkpoint-final.npz").exists()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_without_checkpoints_says_none_was_kept():
    train = _data(n=256)
    model = hn.build_model("dahl-basic", train.input_shape, 10, seed=0)
    with hn.Trainer(model, optimizer=hn.optim.SGD(lr=1e6, momentum=0.9), runtime=_runtime(),
                    batch_size=16) as tr:
        with pytest.raises(hn.TrainingDiverged, match="no checkpoint was written"):
            tr.fit(train, epochs=1, verbose=0)


def test_prefetched_batches_alternate_arenas_and_match_sequential_loading():
    """Batch b+1 is loaded into the other arena of the pair while b is in use."""
    import threading

    from hetero_nn.arena import ArenaPair
    from hetero_nn.training.loader import ArrayData, prefetched_batches

    rng = np.random.default_rng(3)
    data = ArrayData(rng.integers(0, 255, (50, 1, 6, 6)).astype(np.uint8), rng.integers(0, 10, 50))
    order = rng.permutation(50)
    pair = ArenaPair("test-batches")
    threads = threading.active_count()
    seen = []
    for x, y in prefetched_batches(data, order, 8, 1, 7, "float64", pair):
        ex, ey = data.batch(order[8 * (1 + len(seen)):8 * (2 + len(seen))], dtype="float64")
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
        seen.append((x.ctypes.data, x.copy()))
    assert len(seen) == 6
    assert seen[0][0] != seen[1][0] and seen[0][0] == seen[2][0]  # the two arenas alternate
    blocks = sum(a.stats.block_allocations for a in pair.arenas)
    for _ in prefetched_batches(data, order, 8, 0, 6, "float64", pair):
        pass
    assert sum(a.stats.block_allocations for a in pair.arenas) == blocks  # no growth once warm
    gen = prefetched_batches(data, order, 8, 0, 6, "float64", pair)
    next(gen)
    gen.close()  # a step that raises: the loader thread is joined
    assert threading.active_count() == threads


@pytest.mark.parametrize("bad", [{"granularity": 0}, {"seed": "x"}, {"scheduler_interval": "hour"}])
def test_a_bad_argument_closes_the_runtime_the_trainer_made(bad):
    import threading

    def workers():
        return {t for t in threading.enumerate() if t.name.startswith("hetero_nn-")}

    before = workers()
    with pytest.raises(hn.ConfigError):
        hn.Trainer(hn.build_model("lenet5", (1, 28, 28), 10, seed=0), **bad)
    time.sleep(0.05)  # the closed workers' threads finish
    assert workers() <= before
