"""``hetero-nn train`` with the training toolbox: AdamW, weight decay, Nesterov, label
smoothing, schedules, clipping, --augment and --normalize; what they write; resume
through them bit for bit; and the options that do not go together."""

import json

import numpy as np
import pytest

from hetero_nn.training.checkpoint import FINAL_NAME, read_checkpoint
from hetero_nn.cli import main

TINY = ["train", "--dataset", "synthetic", "--limit", "96", "--batch-size", "16",
        "--model", "dahl-basic", "--devices", "cpu:2", "--granularity", "2", "-q"]


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _weights(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k].tobytes() for k in npz.files if k.startswith(("model/", "optimizer/"))}


@pytest.mark.parametrize("argv, named", [
    (["--optimizer", "adamw", "--momentum", "0.5"], "--momentum"),
    (["--optimizer", "adam", "--nesterov"], "--nesterov"),
    (["--step-size", "3"], "--step-size applies to --schedule step"),
    (["--schedule", "cosine", "--max-lr", "0.1"], "--max-lr applies to --schedule onecycle"),
    (["--schedule-interval", "step"], "--schedule-interval needs a --schedule"),
    (["--schedule", "linear"], "--schedule"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm"),
    (["--weight-decay", "-1"], "--weight-decay"),
    (["--label-smoothing", "1.5"], "--label-smoothing"),
])
def test_options_that_do_not_fit_are_named(argv, named, capsys):
    assert main([*TINY, *argv]) == 2
    assert named in _error_line(capsys)


def test_recipe_options_train_and_record_their_settings(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--epochs", "2", "--optimizer", "adamw", "--weight-decay", "0.05",
                 "--schedule", "onecycle", "--max-lr", "0.01", "--clip-grad-norm", "1",
                 "--label-smoothing", "0.1", "--augment", "--normalize", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    run = metrics["config"]
    assert (run["optimizer"], run["weight_decay"], run["schedule"], run["schedule_interval"],
            run["schedule_length"], run["max_lr"]) == ("adamw", 0.05, "onecycle", "step", 12, 0.01)
    final = read_checkpoint(out / FINAL_NAME)
    assert final.scheduler["type"] == "OneCycleLR" and final.scheduler["last_epoch"] == 12
    assert final.config["optimizer"]["name"] == "adamw"
    assert len(final.config["normalize"]["mean"]) == 1 and "RandomCrop" in final.config["augment"]
    # the onecycle schedule ends with the run: more epochs are refused, naming the option
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "-q"]) == 2
    assert "--epochs 3" in _error_line(capsys)
    # evaluate applies the run's --normalize statistics
    assert main(["evaluate", "--checkpoint", str(out / FINAL_NAME), "--limit", "96",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == metrics["test_accuracy"]


@pytest.mark.parametrize("schedule", [["--schedule", "step", "--step-size", "1", "--gamma", "0.5"],
                                      ["--schedule", "cosine", "--t-max", "3"]],
                         ids=["step", "cosine"])
def test_resume_through_schedule_augmentation_and_clipping_is_bit_identical(tmp_path, schedule):
    common = [*TINY, "--optimizer", "sgd", "--nesterov", "--weight-decay", "1e-3",
              *schedule, "--clip-grad-norm", "0.5", "--augment"]
    assert main([*common, "--epochs", "3", "--out", str(tmp_path / "whole")]) == 0
    assert main([*common, "--epochs", "1", "--out", str(tmp_path / "parts")]) == 0
    assert main(["train", "--out", str(tmp_path / "parts"), "--resume", "--epochs", "3",
                 "-q"]) == 0
    whole, parts = tmp_path / "whole" / FINAL_NAME, tmp_path / "parts" / FINAL_NAME
    assert _weights(whole) == _weights(parts)
    assert read_checkpoint(whole).scheduler == read_checkpoint(parts).scheduler
