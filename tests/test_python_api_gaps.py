"""What a PyTorch user reaches for (issue 30, item 7): ``Parameter.numel()`` and ``.size``,
``hn.save_model`` / ``hn.load_model`` without a Trainer, ``fit(checkpoint_dir=)`` refusing
another run's folder as the CLI's ``--out`` does, and the Trainer's default granularity
equal to the CLI's."""

import os

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.cli.train import DEFAULT_GRANULARITY as CLI_DEFAULT
from hetero_nn.training.checkpoint import CHECKPOINT_NAME


def _model(dtype="float64"):
    model = hn.Sequential(hn.Conv2D(1, 2, 3), hn.ReLU(), hn.Flatten(), hn.Linear(18, 3),
                          hn.Dropout(0.3, seed=1))
    model.build((1, 5, 5), dtype)
    model.reset_parameters(np.random.default_rng(0))
    return model


def test_parameter_numel_and_size():
    params = dict(_model().named_parameters())
    assert params["0.weight"].numel() == params["0.weight"].size == 2 * 1 * 3 * 3
    assert sum(p.numel() for p in params.values()) == 18 + 2 + 54 + 3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_model_then_load_model_gives_the_same_outputs(tmp_path, dtype):
    model = _model(dtype)
    path = hn.save_model(model, tmp_path / "m.npz")
    assert path == tmp_path / "m.npz" and os.listdir(tmp_path) == ["m.npz"]  # no temporary
    loaded = hn.load_model(path)
    assert loaded.dtype == np.dtype(dtype)
    x = np.random.default_rng(1).random((4, 1, 5, 5)).astype(dtype)
    model.eval(), loaded.eval()
    try:
        np.testing.assert_array_equal(loaded(x), model(x))
    finally:
        hn.close_default_runtime()  # model(x) ran on the default runtime: no thread left behind
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_save_model_refuses_a_model_not_built(tmp_path):
    with pytest.raises(hn.ConfigError, match="save_model: Sequential is not built"):
        hn.save_model(hn.Sequential(hn.Linear(2, 2)), tmp_path / "m.npz")


def _data(n=16):
    rng = np.random.default_rng(2)
    return rng.random((n, 1, 5, 5)), rng.integers(0, 3, n)


def test_fit_refuses_a_folder_holding_another_run_unless_resumed(tmp_path):
    folder = tmp_path / "run"
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        first = hn.Trainer(_model(), runtime=rt, batch_size=8)
        first.fit(_data(), epochs=1, checkpoint_dir=folder, verbose=0)
        first.fit(_data(), epochs=2, checkpoint_dir=folder, verbose=0)  # its own: goes on
        before = (folder / CHECKPOINT_NAME).read_bytes()
        other = hn.Trainer(_model(), runtime=rt, batch_size=8)
        with pytest.raises(hn.ConfigError) as info:
            other.fit(_data(), epochs=1, checkpoint_dir=folder, verbose=0)
        assert str(info.value).startswith(f"checkpoint_dir {folder} holds another run "
                                          "(checkpoint.npz, checkpoint-final.npz)")
        assert "trainer.load_checkpoint(" in str(info.value)
        assert (folder / CHECKPOINT_NAME).read_bytes() == before  # nothing lost
        other.load_checkpoint(folder / CHECKPOINT_NAME)  # resuming it is allowed
        other.fit(_data(), epochs=3, checkpoint_dir=folder, verbose=0)
        assert other.epoch == 3


def test_the_trainers_default_granularity_is_the_clis():
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        assert hn.Trainer(_model(), runtime=rt, batch_size=8).granularity == CLI_DEFAULT == 2
        assert hn.Trainer(_model(), runtime=rt, batch_size=1).granularity == 1
