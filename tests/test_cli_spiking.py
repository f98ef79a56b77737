"""Spiking models through ``hetero-nn train`` and ``evaluate``, and their resume.

``--model snn-conv --time-steps T --encoding direct|rate`` trains with the membrane
cross-entropy on intensities in [0, 1], records the options for ``--resume`` and
``evaluate``, and refuses the options that do not apply; ``granularity="auto"`` chooses
for a spiking model; a rate-coded run interrupted mid-epoch and resumed from its
checkpoint ends with the bits of one never interrupted (the encoder's seed and step
count are in the checkpoint).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.cli import main
from hetero_nn.training.checkpoint import CHECKPOINT_NAME, FINAL_NAME, read_checkpoint

TINY = ["--dataset", "synthetic", "--limit", "96", "--batch-size", "24", "--devices", "cpu:2",
        "--time-steps", "4"]


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.mark.parametrize("argv, named", [
    (["train", "--model", "lenet5", "--time-steps", "5"],
     "--time-steps applies to the spiking models (snn-mlp, snn-conv), not lenet5"),
    (["train", "--encoding", "rate"], "--encoding applies to the spiking models"),
    (["train", "--model", "snn-mlp", "--label-smoothing", "0.1"],
     "--label-smoothing: snn-mlp trains with MembraneCrossEntropy"),
    (["train", "--model", "snn-conv", "--normalize"], "--normalize: snn-conv reads pixel"),
    (["train", "--model", "snn-conv", "--encoding", "poisson"], "--encoding"),
    (["train", "--model", "snn-conv", "--time-steps", "0"], "--time-steps"),
])
def test_spiking_options_that_do_not_apply_stop_with_one_line(argv, named, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hetero-nn: error: ") and named in err[0], err


def test_train_snn_conv_rate_coded_then_evaluate_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "snn-conv", "--encoding", "rate", *TINY, "--epochs", "1",
            "--optimizer", "adam", "--lr", "5e-4", "--out", str(out), "-q"]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    config = metrics["config"]
    assert (config["model"], config["time_steps"], config["encoding"]) == ("snn-conv", 4, "rate")
    assert {"lif_fwd", "lif_bwd", "rate_encode", "membrane_xent",
            "spike_dense_fwd.overwrite"} <= set(metrics["variants_run"])
    final = read_checkpoint(out / FINAL_NAME)
    assert final.config["model"]["encoding"] == "rate" and final.config["loss"] == \
        "MembraneCrossEntropy"
    assert final.config["rate_encode"] == {"0": [final.config["model"]["rate_seed"], 4]}
    rebuilt = hn.load_model(out / FINAL_NAME)  # from the architecture recorded as data
    assert [type(layer) for layer in rebuilt][:4] == [hn.layers.RateEncode, hn.layers.Conv2D,
                                                      hn.layers.MaxPool2D, hn.layers.LIF]
    assert (rebuilt[0].seed, rebuilt[0].steps) == (final.config["model"]["rate_seed"], 4)
    assert all(np.array_equal(v, final.model_state[k]) for k, v in rebuilt.state_dict().items())
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / FINAL_NAME), "--limit", "96",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == metrics["test_accuracy"]
    assert result["loss"] == pytest.approx(metrics["test_loss"], rel=1e-6)
    assert main(["train", "--out", str(out), "--resume", "--encoding", "direct"]) == 2
    assert "--encoding direct differs from the run's rate" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "-q"]) == 0
    assert read_checkpoint(out / FINAL_NAME).config["rate_encode"]["0"][1] == 8


def test_granularity_auto_chooses_for_a_spiking_model(tmp_path, capsys):
    out = tmp_path / "auto"
    assert main(["train", "--model", "snn-mlp", *TINY, "--epochs", "1", "--granularity", "auto",
                 "--out", str(out), "-q"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["granularity"] in (1, 2, 3, 4, 6, 8, 12, 24)
    assert read_checkpoint(out / FINAL_NAME).config["auto_granularity"] is True


class Stop(Exception):
    pass


def fit(tmp_path, stop_after=None, resume=None):
    train = hn.datasets.load("synthetic", image_size=16, num_samples=96, seed=1)
    model = hn.build_model("snn-conv", train.input_shape, 10, seed=0, encoding="rate",
                           time_steps=3)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
            hn.Trainer(model, hn.losses.MembraneCrossEntropy(), hn.optim.Adam(lr=1e-3), rt,
                       batch_size=16, granularity=2) as trainer:
        if resume is not None:
            trainer.load_checkpoint(resume)

        def on_step(t, loss):
            if stop_after is not None and t.global_step == stop_after:
                raise Stop

        try:
            trainer.fit(train, epochs=2, checkpoint_dir=tmp_path, checkpoint_every=4,
                        verbose=0, on_step=on_step)
        except Stop:
            return None
        return model.state_dict(), model[0].steps


def test_a_rate_coded_run_resumed_mid_epoch_ends_bit_identical(tmp_path):
    reference = fit(tmp_path / "reference")
    assert fit(tmp_path / "stopped", stop_after=9) is None
    ckpt = read_checkpoint(tmp_path / "stopped" / CHECKPOINT_NAME)
    assert (ckpt.epoch, ckpt.step) == (1, 2)  # mid-epoch: steps 4 and 8 were checkpointed
    resumed = fit(tmp_path / "resumed", resume=tmp_path / "stopped" / CHECKPOINT_NAME)
    assert resumed[1] == reference[1] == 12
    for key, value in reference[0].items():
        assert np.array_equal(resumed[0][key], value), key
