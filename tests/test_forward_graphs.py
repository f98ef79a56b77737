"""Inference by replay: ``model(x)`` and ``Trainer.predict`` capture their forward pass once
per batch shape and mode and replay it, with the same bits as submitting the same tasks;
a rebinding of the weights drops the graphs, an update in place is read by the replay."""

import numpy as np

import hetero_nn as hn

SHAPE = (2, 6, 6)


def small_model(dropout=0.0):
    hn.manual_seed(4)
    return hn.Sequential(hn.Conv2D(2, 4, 3, padding=1), hn.BatchNorm2D(4), hn.ReLU(),
                         hn.Residual([hn.Conv2D(4, 4, 3, padding=1), hn.BatchNorm2D(4)]),
                         hn.Dropout(dropout), hn.GlobalAvgPool2D(), hn.Flatten(),
                         hn.Dense(4, 3))


def batch(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, *SHAPE))


def submitted(model, rt, x):
    """The forward pass of ``x`` submitted, not replayed: what ``model(x)`` did before."""
    ys = model.forward(rt, [rt.register(x.copy(), name="x")])
    return np.concatenate([rt.fetch(y, copy=True) for y in ys])


def test_calls_replay_with_the_bits_of_submission_in_eval_mode():
    model, twin = small_model().eval(), small_model().eval()
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        for m in (model, twin):
            m.build(SHAPE, "float64")
            m.bind(rt)
        x = batch(6)
        first = model(x)
        graphs = model._forward_graphs
        (call,) = graphs._calls.values()
        assert graphs.captured == 1 and call.graph.replays == 0
        assert len(call.outputs) == 2  # a partition per CPU worker, the bits of one
        again, other = model(x), model(batch(6, seed=1))
        assert graphs.captured == 1 and call.graph.replays == 2
        assert np.array_equal(first, again)
        assert np.array_equal(other, submitted(twin, rt, batch(6, seed=1)))
        model(batch(5))  # another shape: a graph of its own
        model.train()    # another mode: another graph
        model(x)
        assert graphs.captured == 3 and len(graphs) == 3


def test_training_mode_calls_replay_with_running_statistics_and_dropout_as_submission():
    model, twin = small_model(dropout=0.5), small_model(dropout=0.5)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        for m in (model, twin):
            m.build(SHAPE, "float64")
            m.bind(rt)
        for seed in range(3):  # capture, then two replays: new masks, statistics moving
            assert np.array_equal(model(batch(6, seed)), submitted(twin, rt, batch(6, seed)))
        assert model._forward_graphs.captured == 1
        (call,) = model._forward_graphs._calls.values()
        assert len(call.outputs) == 1  # batch statistics over the whole batch, as submitted
        state, expected = model.state_dict(), twin.state_dict()
        assert all(np.array_equal(state[k], expected[k]) for k in expected)


def test_rebound_weights_drop_the_graphs_and_trained_weights_are_read():
    model = small_model().eval()
    data = (batch(8), np.arange(8) % 3)
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt, \
            hn.Trainer(model, runtime=rt, batch_size=8, dtype="float64") as trainer:
        trainer.train_step(*data)  # builds and binds the model to rt
        before = model(data[0])
        trainer.train_step(*data)  # weights updated in place: the same handles
        after = model(data[0])
        assert model._forward_graphs.captured == 1 and not np.array_equal(before, after)
        assert np.array_equal(after, submitted(model, rt, data[0]))
        state = {k: v * 0.5 for k, v in model.state_dict().items()}
        model.load_state_dict(state)  # re-registered: the graphs are dropped
        loaded = model(data[0])
        assert model._forward_graphs.captured == 2 and len(model._forward_graphs) == 1
        assert np.array_equal(loaded, submitted(model, rt, data[0]))
        preds = trainer.predict(data[0])
        trainer.predict(data[0])  # replayed
        assert trainer.graphs_captured == 2  # the train step's, predict's
        assert np.array_equal(preds, loaded.argmax(axis=1))
