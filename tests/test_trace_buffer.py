"""The runtime's trace is bounded: the last N flushes in memory, everything in a stream file."""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.scheduler.trace.views import Trace
from hetero_nn.scheduler.trace.buffer import TRACE_FLUSHES, TraceBuffer


def _scale(x, factor):
    x *= factor


SCALE = hn.Codelet("scale_traced", modes=(hn.RW,), variants={"ref": _scale})


def _flushes(rt, n, parts=2):
    """``n`` flushes of ``parts`` tasks each; returns the ids submitted, per flush."""
    h = rt.register(np.ones(max(8, parts)))
    ids = []
    for _ in range(n):
        ids.append([rt.submit(SCALE, part, factor=1.0).id for part in h.split(0, parts)])
        rt.wait()
    return ids


def test_the_default_trace_keeps_the_last_flushes_only():
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace_flushes=3) as rt:
        ids = _flushes(rt, 10)
        kept = sorted(r.task_id for r in rt.trace().records)
        assert kept == sorted(i for flush in ids[-3:] for i in flush)
        assert len(rt._trace) == 6  # what memory holds: 3 flushes of 2 tasks
    with hn.Runtime(devices="cpu:1", perfmodel=False) as rt:
        assert rt._trace.flushes == TRACE_FLUSHES
        _flushes(rt, TRACE_FLUSHES + 20, parts=1)
        assert len(rt.trace()) == TRACE_FLUSHES


def test_trace_flushes_none_keeps_everything_until_cleared():
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace_flushes=None) as rt:
        _flushes(rt, TRACE_FLUSHES + 5, parts=1)
        assert len(rt.trace(clear=True)) == TRACE_FLUSHES + 5
        assert len(rt.trace()) == 0


def test_a_trace_path_streams_every_record(tmp_path):
    path = tmp_path / "trace.jsonl"
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace=path, trace_flushes=2) as rt:
        ids = _flushes(rt, 7)
        in_memory = rt.trace()
    streamed = Trace.from_json(path)
    assert sorted(r.task_id for r in streamed) == sorted(i for flush in ids for i in flush)
    assert streamed.workers == ["cpu0", "cpu1"]
    last = {r.task_id: r for r in streamed.records}
    for record in in_memory:  # the same records, field for field
        assert last[record.task_id] == record


def test_a_torn_last_line_is_skipped_and_a_bad_line_named(tmp_path):
    path = tmp_path / "trace.jsonl"
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace=path) as rt:
        _flushes(rt, 3, parts=1)
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # a process killed mid-write
    assert len(Trace.from_json(path)) == 2
    lines = whole.split(b"\n")
    lines[2] = b'{"task": {"task_id": 1'
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=r"trace.jsonl, line 3: not a trace record"):
        Trace.from_json(path)


def test_copies_between_nodes_are_kept_with_their_flush():
    buffer = TraceBuffer(flushes=1)
    from hetero_nn.scheduler.trace.records import TransferRecord

    first = TransferRecord("host0", "cuda0", 64, 0.0, 1.0)
    second = TransferRecord("cuda0", "host0", 64, 2.0, 3.0)
    buffer.add_transfer(first)
    buffer.add_flush([])
    buffer.add_transfer(second)
    assert buffer.transfers() == [first, second]  # the second: since the last flush
    buffer.add_flush([])
    assert buffer.transfers() == [second]  # the first flush is gone with its copy


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_trace_flushes_must_be_positive(bad):
    with pytest.raises(ValueError, match="trace_flushes"):
        TraceBuffer(flushes=bad)


def test_a_runtime_that_ran_nothing_leaves_an_empty_stream(tmp_path):
    path = tmp_path / "trace.jsonl"
    with hn.Runtime(devices="cpu:1", perfmodel=False, trace=path):
        pass
    assert len(Trace.from_json(path)) == 0
    with pytest.raises(hn.errors.ConfigError, match="trace_flushes"):
        hn.Runtime(devices="cpu:1", perfmodel=False, trace_flushes=0)


def test_granularity_auto_calibrates_with_a_full_bounded_trace():
    """The calibration reads its own steps' records even when the runtime's trace is
    already full (a long run): it is given a buffer of its own, then handed back."""
    train = hn.datasets.load("synthetic", image_size=12, num_samples=64)
    model = hn.build_model("dahl-basic", train.input_shape, train.num_classes, seed=0)
    with hn.Runtime(devices="cpu:2", perfmodel=False, trace_flushes=1) as rt:
        _flushes(rt, 1, parts=64)  # the trace is full, of a flush longer than a step
        with hn.Trainer(model, runtime=rt, batch_size=16, granularity="auto") as trainer:
            x, y = train.batch(np.arange(16))
            trainer.train_step(x, y)
            decision = trainer.granularity_decision
        assert decision.dispatch_seconds > 0  # measured from the calibration steps' records
        assert len(rt._trace._flushes) == 1  # bounded again, the calibration's last in it


def test_a_trace_of_the_runtime_s_tuples_reads_as_one_of_records():
    """``rt.trace()`` hands the flushes' records over as kept (the executors' tuples); the
    records are made at the first read, equal to those the buffer makes, in the same
    order, the workers alike."""
    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        _flushes(rt, 3, parts=4)
        made = rt._trace.records()
        lazy = rt.trace(clear=True)
        assert len(lazy) == len(made) == 12 and len(rt._trace) == 0
        assert lazy.workers == ["cpu0", "cpu1"]
        assert lazy.records == made and all(type(r) is type(made[0]) for r in lazy)
        mixed = Trace([made[0], tuple(getattr(made[1], f) for f in made[1].__slots__)])
        assert mixed.records == made[:2] and mixed.workers == sorted({made[0].worker,
                                                                     made[1].worker})


def test_a_flush_s_records_are_kept_flat_with_no_object_the_collector_walks():
    """The executors extend one flat list per flush: independent tasks' records, and a
    chain's, hold plain values only (nothing a garbage collection after the flush walks),
    and read back as the runtime's records, one per task, dependencies as tuples."""
    import gc

    with hn.Runtime(devices="cpu:2", perfmodel=False) as rt:
        ids = _flushes(rt, 1, parts=8)[0]
        (kept,) = rt._trace.per_flush()
        assert len(kept) == 8 and not any(gc.is_tracked(v) for v in kept.values)
        assert sorted(r.task_id for r in rt.trace().records) == sorted(ids)
        assert kept.workers() <= {"cpu0", "cpu1"}
        h = rt.register(np.ones(4))  # a chain: each record's one dependency kept as its id
        chain = [rt.submit(SCALE, h, factor=2.0).id for _ in range(3)]
        rt.wait()
        kept = rt._trace.per_flush()[-1]
        assert not any(gc.is_tracked(v) for v in kept.values)
        assert [r.deps for r in rt.trace().records[-3:]] == [(), (chain[0],), (chain[1],)]
