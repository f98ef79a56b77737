"""The step cache's memory: graphs kept up to a byte budget, least recently run dropped."""

import numpy as np

import hetero_nn as hn
from hetero_nn.training.step_cache import MAX_BYTES

SHAPE = (1, 12, 12)


def _trainer(rt, **kwargs):
    model = hn.build_model("dahl-basic", SHAPE, 10, dtype="float64", seed=0)
    return hn.Trainer(model, runtime=rt, batch_size=16, granularity=2, dtype="float64", **kwargs)


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *SHAPE)), rng.integers(0, 10, n)


def test_a_graph_counts_what_it_owns():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = _trainer(rt)
        trainer.train_step(*_batch(16))
        (step,) = trainer.step_cache._steps.values()
        assert trainer.step_cache.max_bytes == MAX_BYTES
        # at least the activations of the batch: the fused conv-ReLU-pool output
        # (16 x 4 x 5 x 5 float64) and the logits' gradient (16 x 10)
        assert step.graph.nbytes >= 16 * 4 * 5 * 5 * 8 + 16 * 10 * 8
        assert trainer.step_cache.nbytes == step.nbytes == (step.graph.nbytes + 16 * 144 * 8
                                                            + 16 * 8)


def test_graphs_are_bounded_by_bytes_and_the_busy_one_stays():
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        trainer = _trainer(rt)
        trainer.train_step(*_batch(16))
        one = trainer.step_cache.nbytes
        trainer.step_cache.max_bytes = int(2.5 * one)  # room for two graphs of this size
        for n in (15, 16, 14, 16, 13, 16, 12, 16):  # odd batches between steps of 16
            trainer.train_step(*_batch(n, seed=n))
        cache = trainer.step_cache
        assert len(cache._steps) == 2 and cache.nbytes <= cache.max_bytes
        assert cache.nbytes == sum(s.nbytes for s in cache._steps.values())
        assert [key[0][0] for key in cache._steps] == [12, 16]  # the busy key survived
        assert trainer.graphs_captured == 5  # 16 once, then each odd size once
        cache.max_bytes = 1  # smaller than any graph: the one just run is still kept
        trainer.train_step(*_batch(11))
        assert [key[0][0] for key in cache._steps] == [11]


def test_a_replay_still_equals_submission_after_evictions():
    results = []
    for replay in (True, False):
        with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
            trainer = _trainer(rt, replay=replay)
            trainer.step_cache.max_bytes = 1
            for n in (16, 15, 16, 15, 16):
                trainer.train_step(*_batch(n, seed=n))
            results.append({k: v.tobytes() for k, v in trainer.model.state_dict().items()})
    assert results[0] == results[1]
