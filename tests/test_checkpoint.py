"""Checkpoints: the .npz layout (no pickle), atomic writes, strict reading, exact resume.

A checkpoint must load with ``numpy.load(allow_pickle=False)``, never be seen
half-written, refuse (naming the file and the key) a file that is corrupt or
does not fit the model or the optimizer, and hold enough of a run that a
trainer restored from it mid-epoch ends with the same bits as a run that was
never interrupted.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.training.checkpoint import (CHECKPOINT_NAME, FINAL_NAME, FORMAT, load_model,
                                  read_checkpoint, remove_stale_temporaries, write_checkpoint)


def _data(n=96, size=12, seed=0):
    return hn.datasets.load("synthetic", image_size=size, num_samples=n, seed=seed)


def _trainer(model_name="dahl-basic", optimizer=None, dtype="float32", granularity=2,
             batch_size=16, data=None, seed=0):
    data = data or _data()
    model = hn.build_model(model_name, data.input_shape, data.num_classes, dtype=dtype, seed=seed)
    rt = hn.Runtime(devices="cpu:2", perfmodel=False, deterministic=True,
                    variants=("cpu:im2col", "cpu"), trace=False)
    return hn.Trainer(model, optimizer=optimizer or hn.optim.SGD(lr=0.05, momentum=0.9),
                      runtime=rt, batch_size=batch_size, granularity=granularity, dtype=dtype,
                      seed=seed)


def _trained_checkpoint(tmp_path, steps=3, **kw):
    data = _data()
    tr = _trainer(data=data, **kw)
    try:
        for i, (x, y) in enumerate(data.batches(tr.batch_size, seed=0, epoch=0)):
            if i == steps:
                break
            tr.train_step(x, y)
        tr.global_step = tr.step_in_epoch = steps
        path = tr.save_checkpoint(tmp_path / CHECKPOINT_NAME)
        return path, tr.model.state_dict(), tr.optimizer.state_dict()
    finally:
        tr.runtime.close()


# --------------------------------------------------------------------------- format

def test_checkpoint_loads_without_pickle_and_holds_the_whole_state(tmp_path):
    path, weights, opt = _trained_checkpoint(tmp_path)
    with np.load(path, allow_pickle=False) as npz:
        files = set(npz.files)
        assert npz["format"].shape == () and str(npz["format"]) == FORMAT
        for name, value in weights.items():
            assert np.array_equal(npz[f"model/{name}"], value)
            assert npz[f"model/{name}"].dtype == value.dtype
            assert np.array_equal(npz[f"optimizer/state/{name}/momentum_buffer"],
                                  opt["state"][name]["momentum_buffer"])
        assert int(npz["optimizer/steps"]) == 3
        assert str(npz["optimizer/type"]) == "SGD"
        assert int(npz["progress/global_step"]) == 3 and int(npz["progress/step"]) == 3
        config = npz["config"]
        assert config.shape == () and config.dtype.kind == "U"
        cfg = json.loads(config[()])
        assert cfg["model"] == {"name": "dahl-basic", "input_shape": [1, 12, 12],
                                "num_classes": 10}
        assert cfg["batch_size"] == 16 and cfg["granularity"] == 2 and cfg["dtype"] == "float32"
        assert cfg["optimizer"]["name"] == "sgd" and cfg["optimizer"]["lr"] == 0.05
    assert {"rng/seed", "history", "progress/epoch", "progress/loss_sum"} <= files
    assert all(not f.endswith(".tmp") for f in os.listdir(tmp_path))

    ckpt = read_checkpoint(path)
    assert (ckpt.epoch, ckpt.step, ckpt.global_step, ckpt.seed) == (0, 3, 3, 0)
    assert ckpt.optimizer["type"] == "SGD" and ckpt.optimizer["hyper"]["momentum"] == 0.9
    assert set(ckpt.model_state) == set(weights)


def test_stale_temporaries_of_a_killed_run_are_removed_and_nothing_else(tmp_path):
    stale = tmp_path / f".{CHECKPOINT_NAME}.{'a' * 32}.tmp"
    stale.write_bytes(b"partial")
    others = [tmp_path / f".notes.txt.{'b' * 32}.tmp", tmp_path / f".{CHECKPOINT_NAME}.tmp",
              tmp_path / CHECKPOINT_NAME]
    for p in others:
        p.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path, {CHECKPOINT_NAME, FINAL_NAME}) == [stale]
    assert not stale.exists() and all(p.exists() for p in others)


# --------------------------------------------------------------------------- refusals

def test_a_checkpoint_of_another_model_names_the_file_key_and_shapes(tmp_path):
    path, _, _ = _trained_checkpoint(tmp_path)  # dahl-basic: 0.weight is (4, 1, 3, 3)
    tr = _trainer("lenet5")
    try:
        with pytest.raises(hn.CheckpointError) as info:
            tr.load_checkpoint(path)
    finally:
        tr.runtime.close()
    message = str(info.value)
    assert str(path) in message and "model/0.weight" in message
    assert "(4, 1, 3, 3)" in message and "(6, 1, 5, 5)" in message


def test_missing_and_unexpected_weights_are_named(tmp_path):
    path, weights, opt = _trained_checkpoint(tmp_path)
    config = read_checkpoint(path).config
    partial = {k: v for k, v in weights.items() if k != "4.bias"}
    write_checkpoint(tmp_path / "missing.npz", model_state=partial, config=config)
    extra = dict(weights, **{"9.weight": np.zeros((2, 2), np.float32)})
    write_checkpoint(tmp_path / "extra.npz", model_state=extra, config=config)
    tr = _trainer()
    try:
        with pytest.raises(hn.CheckpointError, match=r"missing\.npz: no weight 'model/4\.bias'"):
            tr.load_checkpoint(tmp_path / "missing.npz")
        with pytest.raises(hn.CheckpointError, match=r"extra\.npz: 'model/9\.weight' .* not a param"):
            tr.load_checkpoint(tmp_path / "extra.npz")
    finally:
        tr.runtime.close()


def test_optimizer_state_of_another_optimizer_is_refused(tmp_path):
    path, _, _ = _trained_checkpoint(tmp_path)  # SGD with momentum
    tr = _trainer(optimizer=hn.optim.Adam(lr=1e-3))
    try:
        with pytest.raises(hn.CheckpointError, match="optimizer state is for SGD.*Adam"):
            tr.load_checkpoint(path)
    finally:
        tr.runtime.close()


def _flip_a_byte_inside_a_member(path):
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("model/0.weight.npy")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size - 3] ^= 0xFF  # inside the array's bytes, not the header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "flipped", "empty", "no-format",
                                    "object-array"])
def test_corrupt_files_raise_checkpoint_error_naming_the_file(tmp_path, damage):
    path, weights, _ = _trained_checkpoint(tmp_path)
    bad = tmp_path / f"{damage}.npz"
    if damage == "truncated":
        bad.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        bad.write_bytes(np.random.default_rng(0).bytes(4096))
    elif damage == "flipped":
        bad.write_bytes(path.read_bytes())
        _flip_a_byte_inside_a_member(bad)
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "no-format":
        np.savez(bad, **{f"model/{k}": v for k, v in weights.items()})
    else:
        np.savez(bad, format=np.array(FORMAT), config=np.array([{"a": 1}], dtype=object))
    with pytest.raises(hn.CheckpointError) as info:
        read_checkpoint(bad)
    assert str(bad) in str(info.value) and "allow_pickle" not in str(info.value)
    if damage in ("truncated", "garbage", "empty", "no-format", "object-array"):
        assert f"{bad}: not a hetero_nn checkpoint" in str(info.value)
    with pytest.raises(hn.CheckpointError):
        read_checkpoint(tmp_path / "does-not-exist.npz")


def test_load_model_rebuilds_the_builtin_model_with_its_weights(tmp_path):
    path, weights, _ = _trained_checkpoint(tmp_path, dtype="float64")
    model = load_model(path)
    assert model.spec["name"] == "dahl-basic" and model.dtype == np.float64
    for name, value in model.state_dict().items():
        assert value.dtype == np.float64 and np.array_equal(value, weights[name])
    model32 = load_model(path, dtype="float32")
    assert all(v.dtype == np.float32 for v in model32.state_dict().values())


# --------------------------------------------------------------------------- exact resume

class _Crash(Exception):
    pass


@pytest.mark.parametrize("dtype, optimizer", [("float32", "sgd"), ("float64", "adam")])
def test_resume_mid_epoch_ends_bit_identical_to_an_uninterrupted_run(tmp_path, dtype, optimizer):
    data, val = _data(n=80), _data(n=32, seed=1)  # 5 steps of 16 per epoch

    def make():
        opt = hn.optim.SGD(lr=0.05, momentum=0.9) if optimizer == "sgd" else hn.optim.Adam(lr=1e-2)
        return _trainer(optimizer=opt, dtype=dtype, granularity=3, data=data)

    reference = make()
    try:
        ref_history = reference.fit(data, epochs=2, validation=val, verbose=0)
        ref_weights = reference.model.state_dict()
        ref_opt = reference.optimizer.state_dict()
    finally:
        reference.runtime.close()

    def crash(trainer, loss):
        if trainer.global_step == 8:  # step 3 of epoch 2; the last checkpoint is at step 6
            raise _Crash

    crashed = make()
    try:
        with pytest.raises(_Crash):
            crashed.fit(data, epochs=2, validation=val, verbose=0, checkpoint_dir=tmp_path,
                        checkpoint_every=3, on_step=crash)
    finally:
        crashed.runtime.close()
    ckpt = read_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert (ckpt.epoch, ckpt.step, ckpt.global_step) == (1, 1, 6)

    resumed = make()
    try:
        resumed.load_checkpoint(tmp_path / CHECKPOINT_NAME)
        history = resumed.fit(data, epochs=2, validation=val, verbose=0, checkpoint_dir=tmp_path,
                              checkpoint_every=3)
        weights = resumed.model.state_dict()
        opt = resumed.optimizer.state_dict()
    finally:
        resumed.runtime.close()
    for name, value in ref_weights.items():
        assert value.dtype == np.dtype(dtype)
        assert value.tobytes() == weights[name].tobytes(), name
        for buffer, array in ref_opt["state"][name].items():
            assert array.tobytes() == opt["state"][name][buffer].tobytes(), (name, buffer)
    assert opt["steps"] == ref_opt["steps"] == 10
    timing = {"seconds", "images_per_second", "eval_seconds", "warmup_seconds"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in history] == \
        [{k: v for k, v in r.items() if k not in timing} for r in ref_history]
    final = read_checkpoint(tmp_path / FINAL_NAME)
    assert (final.epoch, final.step, final.global_step) == (2, 0, 10)
