"""The trace is an observer: it holds records, never compiled graphs; a stream that cannot
be written warns once and the run goes on; a replay's records name the variant that ran."""

from __future__ import annotations

import gc
import os
import warnings
import weakref

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import RW
from hetero_nn.codelets._jit import jit
from hetero_nn.scheduler.perfmodel import PerfModel
from hetero_nn.scheduler.trace.buffer import TraceWarning
from helpers import within

BOUND = 300.0


@jit
def _scale_a(x, factor):
    for i in range(x.shape[0]):
        x[i] *= factor


@jit
def _scale_b(x, factor):
    for i in range(x.shape[0]):
        x[i] = x[i] * factor


SCALE = hn.Codelet("observer_scale", modes=(RW,), variants={"cpu:a": _scale_a, "cpu:b": _scale_b})


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_trace_stream_that_cannot_be_written_warns_once_and_training_goes_on():
    def train(trace):
        data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=64, seed=0)
        model = hn.build_model("dahl-basic", data.input_shape, 10, seed=1)
        rt = hn.Runtime(devices="cpu:2", perfmodel=False, trace=trace)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with hn.Trainer(model, runtime=rt, batch_size=16, granularity=2, seed=5) as tr:
                tr.fit(data, epochs=2, verbose=0)
                ids = [r.task_id for r in rt.trace().records]
        return model.state_dict(), ids, [w for w in caught if w.category is TraceWarning]

    def scenario():
        weights, ids, warned = train("/dev/full")
        assert len(warned) == 1 and "/dev/full" in str(warned[0].message)
        assert ids and len(ids) == len(set(ids))  # no record kept twice
        reference, _, none = train(False)
        assert not none
        assert all(weights[k].tobytes() == reference[k].tobytes() for k in reference)
    within(BOUND, scenario)


def test_dropped_graphs_are_freed_with_tracing_on():
    def scenario():
        with hn.Runtime(devices="cpu:2", perfmodel=False, variants=("cpu:a",)) as rt:
            h = rt.register(np.ones(8))
            refs = []
            for _ in range(3):
                with rt.capture() as graph:
                    for p in h.split(0, 2):
                        rt.submit(SCALE, p, factor=2.0)
                for _ in range(3):
                    graph.replay()
                refs += [weakref.ref(graph._compiled)] + \
                    [weakref.ref(s) for s in graph._compiled.segments]
                del graph
            gc.collect()
            assert rt.trace().records  # the records stay
            assert all(r() is None for r in refs)  # the graphs do not
    within(BOUND, scenario)


def test_replay_records_name_the_variant_that_ran_while_the_model_explores(tmp_path):
    def scenario():
        with hn.Runtime(devices="cpu:1", perfmodel=PerfModel(tmp_path / "pm.json"),
                        deterministic=False, trace_flushes=None) as rt:
            h = rt.register(np.ones(64))
            with rt.capture() as graph:
                rt.submit(SCALE, h, factor=1.0)
            for _ in range(12):
                graph.replay()
            traced = {}
            for r in rt.trace().records:
                traced[r.variant] = traced.get(r.variant, 0) + 1
            task = graph._compiled.segments[0].bound[0].task
            fp = rt.footprint(task)[0]
            counted = {v: rt.perfmodel.count("observer_scale", v, "cpu", fp) for v in ("cpu:a", "cpu:b")}
            # the model counts every run but the first of each variant (a warm-up)
            assert sum(traced.values()) == 13 and set(traced) == {"cpu:a", "cpu:b"}
            assert {v: traced[v] - 1 for v in traced} == counted
    within(BOUND, scenario)
