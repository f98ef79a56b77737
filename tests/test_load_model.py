"""Models that reload: a model made of the package's layers, trained with ``fit`` and saved,
comes back from ``hn.load_model`` in a fresh Python process that never saw its source,
predicting the same bits; ``hetero-nn evaluate`` scores it as the run did; a checkpoint
naming a layer class nobody registered says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hetero_nn as hn
from helpers import REPO

TRAIN = textwrap.dedent('''
    import sys
    from collections import OrderedDict
    import numpy as np
    import hetero_nn as hn

    out = sys.argv[1]
    hn.manual_seed(0)
    train = hn.datasets.load("synthetic", "train", limit=96)
    test = hn.datasets.load("synthetic", "test", limit=40)
    model = hn.Sequential(OrderedDict([
        ("stem", hn.Conv2d(1, 6, 3, padding=1, bias=False)), ("bn", hn.BatchNorm2d(6)),
        ("act", hn.SiLU()),
        ("block", hn.Residual([hn.Conv2d(6, 6, 3, padding=1), hn.BatchNorm2d(6), hn.ReLU6(),
                               hn.Dropout2d(0.1)])),
        ("pool", hn.MaxPool2d(2)),
        ("down", hn.Residual([hn.Conv2d(6, 8, 3, stride=2, padding=1), hn.Hardswish()],
                             shortcut=[hn.Conv2d(6, 8, 1, stride=2, bias=False)])),
        ("norm", hn.LayerNorm((8, 7, 7))), ("gap", hn.GlobalAvgPool2D()),
        ("flat", hn.Flatten()), ("fc", hn.Linear(8, 16)), ("bn1", hn.BatchNorm1d(16)),
        ("gelu", hn.GELU()), ("drop", hn.Dropout(0.2)), ("head", hn.Linear(16, 10))]))
    opt = hn.optim.AdamW([{"params": [p for n, p in model.named_parameters()
                                      if n.endswith("weight")]},
                          {"params": [p for n, p in model.named_parameters()
                                      if not n.endswith("weight")], "weight_decay": 0.0}],
                         lr=3e-3)
    with hn.Trainer(model, optimizer=opt, batch_size=16, granularity=2) as trainer:
        trainer.fit(train, epochs=2, checkpoint_dir=out, verbose=0)
        loss, accuracy = trainer.evaluate(test)
        x = test.batch(np.arange(40))[0]
        model.eval()
        np.save(f"{out}/predictions.npy", model(x))
    print(loss, accuracy)
''')

LOAD = textwrap.dedent('''
    import sys
    import numpy as np
    import hetero_nn as hn

    out = sys.argv[1]
    model = hn.load_model(f"{out}/checkpoint-final.npz").eval()
    x = hn.datasets.load("synthetic", "test", limit=40).batch(np.arange(40))[0]
    np.save(f"{out}/reloaded.npy", model(x))
    print(type(model).__name__, [name for name, _ in model.named_children()][:3])
''')


def python(tmp_path, code, *args, timeout=600):
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_trained_model_reloads_in_a_fresh_process_with_the_same_predictions(tmp_path):
    run = tmp_path / "run"
    loss, accuracy = map(float, python(tmp_path, TRAIN, run).split())
    assert "Sequential ['stem', 'bn', 'act']" in python(tmp_path, LOAD, run)
    trained, reloaded = np.load(run / "predictions.npy"), np.load(run / "reloaded.npy")
    assert trained.shape == (40, 10) and np.array_equal(trained, reloaded)
    ckpt = hn.checkpoint.read_checkpoint(run / "checkpoint-final.npz")
    assert ckpt.architecture["model"]["class"] == "Sequential" and "model" not in ckpt.config
    done = subprocess.run([sys.executable, "-m", "hetero_nn", "evaluate", "--checkpoint",
                           str(run / "checkpoint-final.npz"), "--dataset", "synthetic",
                           "--limit", "40", "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["accuracy"] == accuracy and abs(result["loss"] - loss) <= 1e-6 * abs(loss)
    assert result["model"] == "Sequential"


class Unregistered(hn.layers.Layer):
    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, rt, xs):
        return xs

    def backward(self, rt, dys, need_input_grad=True):
        return dys


def test_a_layer_class_nobody_registered_is_named_in_one_line(tmp_path):
    model = hn.Sequential(hn.Flatten(), Unregistered(3), hn.Linear(4, 2))
    data = (np.ones((4, 1, 2, 2), np.float32), np.array([0, 1, 0, 1]))
    with hn.Trainer(model, batch_size=4) as trainer:
        trainer.fit(data, epochs=1, checkpoint_dir=tmp_path, verbose=0)
    with pytest.raises(hn.CheckpointError) as info:
        hn.load_model(tmp_path / "checkpoint-final.npz")
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "checkpoint-final.npz"))
    assert (f"unknown layer class '{__name__}.Unregistered': not a hetero_nn layer; register "
            "it with hn.layers.register(Unregistered) before loading") in message
    hn.layers.register(Unregistered)
    try:
        model = hn.load_model(tmp_path / "checkpoint-final.npz")
        assert isinstance(model[1], Unregistered) and model[1].width == 3
    finally:
        hn.layers.registry._registered.pop("Unregistered")


def test_an_argument_that_is_not_data_leaves_the_weights_saved_and_says_why(tmp_path):
    model = hn.Sequential(hn.Flatten(), Unregistered(lambda: 3), hn.Linear(4, 2))
    with hn.Trainer(model, batch_size=4) as trainer:
        trainer.fit((np.ones((4, 1, 2, 2), np.float32), np.zeros(4, int)), epochs=1,
                    checkpoint_dir=tmp_path, verbose=0)
    ckpt = hn.checkpoint.read_checkpoint(tmp_path / "checkpoint-final.npz")
    assert set(ckpt.model_state) == {"2.weight", "2.bias"}
    with pytest.raises(hn.CheckpointError, match=r"could not be recorded as data \(cannot record "
                                                 r"model\.1 \(Unregistered\) argument 0: a "
                                                 r"function is not data"):
        hn.load_model(ckpt)
