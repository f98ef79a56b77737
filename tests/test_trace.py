"""Trace: Chrome JSON, statistics, utilisation, DOT, Gantt PNG, JSON round trip, atomic writes."""

import json
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.scheduler.trace.views import TaskRecord, Trace

T0 = 1234.5   # an arbitrary perf_counter origin: every export is relative to it
MS = 1e-3


def diamond():
    """A -> (B, C) -> D; A, B, D on cpu0, C on cuda0; cpu1 idle."""
    a = TaskRecord(0, "conv_fwd", "cpu", "cpu0", "cpu", "host0",
                   submit=T0, ready=T0, start=T0 + 1 * MS, end=T0 + 4 * MS)
    b = TaskRecord(1, "relu_fwd", "cpu", "cpu0", "cpu", "host0",
                   submit=T0, ready=T0 + 4 * MS, start=T0 + 5 * MS, end=T0 + 6 * MS, deps=(0,))
    c = TaskRecord(2, "relu_fwd", "cuda", "cuda0", "cuda", "gpu0",
                   submit=T0 + 0.5 * MS, ready=T0 + 4 * MS, start=T0 + 4.5 * MS,
                   end=T0 + 7.5 * MS, bytes_in=4096, deps=(0,))
    d = TaskRecord(3, "conv_fwd", "cpu", "cpu0", "cpu", "host0",
                   submit=T0 + 0.5 * MS, ready=T0 + 7.5 * MS, start=T0 + 8 * MS,
                   end=T0 + 9 * MS, deps=(1, 2, 99))   # 99: a task of an earlier step
    return Trace([a, b, c, d], workers=["cpu0", "cpu1", "cuda0"])


def test_container_basics():
    trace = diamond()
    assert len(trace) == 4
    assert [r.task_id for r in trace] == [0, 1, 2, 3]
    assert trace.records[2].bytes_in == 4096
    assert trace.makespan == pytest.approx(9 * MS)
    assert trace.workers == ["cpu0", "cpu1", "cuda0"]
    assert "4 tasks" in repr(trace) and "3 workers" in repr(trace)
    # Without a worker list: the records' workers in natural order.
    recs = [TaskRecord(i, "k", "cpu", w, "cpu", "host0", 0.0, 0.0, 0.0, 1.0)
            for i, w in enumerate(["cpu10", "cpu2", "cpu1"])]
    assert Trace(recs).workers == ["cpu1", "cpu2", "cpu10"]
    assert Trace(recs, workers=["cpu2"]).workers == ["cpu2", "cpu1", "cpu10"]


def test_chrome_trace_events(tmp_path):
    trace = diamond()
    path = trace.to_chrome(tmp_path / "trace.json")
    with open(path) as f:
        document = json.load(f)
    events = document["traceEvents"]
    complete = {e["args"]["task_id"]: e for e in events if e["ph"] == "X"}
    assert sorted(complete) == [0, 1, 2, 3]

    process = {e["pid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(thread.values()) == ["cpu0", "cpu1", "cuda0"]
    for task_id, worker, kind in [(0, "cpu0", "cpu"), (1, "cpu0", "cpu"), (2, "cuda0", "cuda"),
                                  (3, "cpu0", "cpu")]:
        e = complete[task_id]
        assert process[e["pid"]] == kind
        assert thread[(e["pid"], e["tid"])] == worker
    assert complete[0]["pid"] != complete[2]["pid"]

    c = complete[2]
    assert c["name"] == "relu_fwd"
    assert c["ts"] == pytest.approx(4500.0) and c["dur"] == pytest.approx(3000.0)
    assert c["args"]["variant"] == "cuda" and c["args"]["node"] == "gpu0"
    assert c["args"]["bytes_in"] == 4096
    assert c["args"]["waiting_us"] == pytest.approx(3500.0)
    assert c["args"]["queued_us"] == pytest.approx(500.0)
    assert complete[0]["ts"] == pytest.approx(1000.0)      # relative to the earliest submit
    assert complete[3]["args"]["queued_us"] == pytest.approx(500.0)

    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys() and len(starts) == 4   # 99 is not in the trace
    ts_to_task = {round(e["ts"], 3): e["args"]["task_id"] for e in complete.values()}
    edges = {(ts_to_task[round(starts[i]["ts"], 3)], ts_to_task[round(finishes[i]["ts"], 3)])
             for i in starts}
    assert edges == {(0, 1), (0, 2), (1, 3), (2, 3)}
    assert all(f["bp"] == "e" for f in finishes.values())


def test_stats_per_codelet_and_variant():
    rows = diamond().stats()
    assert [(r["codelet"], r["variant"]) for r in rows] == [
        ("conv_fwd", "cpu"), ("relu_fwd", "cuda"), ("relu_fwd", "cpu")]
    conv = rows[0]
    assert conv["count"] == 2
    assert conv["total"] == pytest.approx(4 * MS)
    assert conv["mean"] == pytest.approx(2 * MS)
    assert conv["std"] == pytest.approx(1 * MS)          # durations 3 ms and 1 ms
    assert conv["min"] == pytest.approx(1 * MS) and conv["max"] == pytest.approx(3 * MS)
    assert rows[1]["count"] == 1 and rows[1]["std"] == 0.0
    assert rows[1]["total"] == pytest.approx(3 * MS)
    assert all(r["errors"] == 0 for r in rows)

    table = diamond().format_stats().splitlines()
    assert table[0].split() == ["codelet", "variant", "count", "total", "ms", "mean", "ms",
                                "std", "ms", "min", "ms", "max", "ms", "share", "%"]
    assert set(table[1]) <= {"-", " "}
    assert table[2].split()[:5] == ["conv_fwd", "cpu", "2", "4.000", "2.000"]
    assert table[2].split()[-1] == "50.0"
    assert len({len(line) for line in table[:2]}) == 1    # the header and rule line up


def test_utilisation():
    trace = diamond()
    util = trace.utilisation()
    assert util == pytest.approx({"cpu0": 5 / 9, "cpu1": 0.0, "cuda0": 3 / 9})
    text = trace.format_utilisation()
    assert "cpu1" in text and "55.6" in text and "33.3" in text and "makespan 9.000 ms" in text


def test_every_utilisation_column_has_a_label():
    header = diamond().format_utilisation().splitlines()[0].split()
    assert header == ["worker", "device", "tasks", "busy", "ms", "util", "%", "util", "bar"]


def test_dot_has_nodes_edges_and_worker_colours(tmp_path):
    path = diamond().to_dot(tmp_path / "dag.dot")
    text = path.read_text()
    assert text.startswith("digraph")
    for edge in ["t0 -> t1;", "t0 -> t2;", "t1 -> t3;", "t2 -> t3;"]:
        assert edge in text
    assert "t99" not in text
    assert text.count("->") == 4
    for label in ["conv_fwd#0", "relu_fwd#1", "relu_fwd#2", "conv_fwd#3"]:
        assert f'label="{label}"' in text
    colour_of = {}
    for line in text.splitlines():
        if line.strip().startswith("t") and "fillcolor" in line:
            task = int(line.split()[0][1:])
            colour_of[task] = line.split('fillcolor="')[1].split('"')[0]
    assert colour_of[0] == colour_of[1] == colour_of[3] != colour_of[2]


def test_gantt_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = diamond().gantt(tmp_path / "gantt.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    empty = Trace([], workers=["cpu0"]).gantt(tmp_path / "empty.png")
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    for name in ["matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
                 "matplotlib.patches"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install hetero-nn\[plot\]"):
        diamond().gantt(tmp_path / "gantt.png")
    assert list(tmp_path.iterdir()) == []


def test_json_round_trip(tmp_path):
    trace = diamond()
    trace.records[3].error = "ValueError: boom"
    path = trace.to_json(tmp_path / "raw.json")
    back = Trace.from_json(path)
    assert back.records == trace.records
    assert back.workers == trace.workers
    assert isinstance(back.records[3].deps, tuple)
    assert back.stats()[0]["errors"] == 1
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a hetero_nn trace"):
        Trace.from_json(tmp_path / "other.json")


def test_writes_are_atomic_and_leave_no_temporary_file(tmp_path):
    trace = diamond()
    trace.to_chrome(tmp_path / "trace.json")
    trace.to_dot(tmp_path / "dag.dot")
    trace.to_json(tmp_path / "raw.json")
    trace.to_chrome(tmp_path / "trace.json")   # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dag.dot", "raw.json", "trace.json"]


def test_empty_trace(tmp_path):
    trace = Trace([], workers=["cpu0"])
    assert trace.makespan == 0.0 and trace.stats() == []
    assert trace.utilisation() == {"cpu0": 0.0}
    document = json.loads(trace.to_chrome(tmp_path / "t.json").read_text())
    assert [e for e in document["traceEvents"] if e["ph"] == "X"] == []
    assert "cpu0" in trace.format_utilisation()
    assert trace.format_stats().splitlines()[0].startswith("codelet")


@st.composite
def random_traces(draw):
    workers = [f"cpu{i}" for i in range(draw(st.integers(1, 4)))]
    records = []
    clock = {w: 0.0 for w in workers}
    for task_id in range(draw(st.integers(1, 30))):
        worker = draw(st.sampled_from(workers))
        gap = draw(st.floats(0, 1e-3))
        duration = draw(st.floats(0, 5e-3))
        start = clock[worker] + gap
        clock[worker] = start + duration
        deps = tuple(draw(st.lists(st.integers(0, task_id - 1), max_size=3, unique=True))
                     if task_id else ())
        records.append(TaskRecord(task_id, draw(st.sampled_from(["a", "b", "c"])),
                                  draw(st.sampled_from(["ref", "cpu"])), worker, "cpu", "host0",
                                  submit=0.0, ready=start, start=start, end=start + duration,
                                  deps=deps))
    return Trace(records, workers=workers)


@given(trace=random_traces())
@settings(max_examples=50, deadline=None)
def test_random_traces_are_consistent(trace):
    rows = trace.stats()
    assert sum(r["count"] for r in rows) == len(trace)
    assert math.fsum(r["total"] for r in rows) == pytest.approx(
        math.fsum(r.end - r.start for r in trace), abs=1e-12)
    for r in rows:
        assert r["min"] <= r["mean"] + 1e-15 and r["mean"] <= r["max"] + 1e-15
        assert r["std"] <= (r["max"] - r["min"]) / 2 + 1e-12
    util = trace.utilisation()
    makespan = trace.makespan
    for w, fraction in util.items():
        busy = math.fsum(r.end - r.start for r in trace if r.worker == w)
        assert 0.0 <= fraction <= 1.0 + 1e-12
        if makespan > 0:
            assert fraction == pytest.approx(busy / makespan, abs=1e-9)
    events = trace.chrome_events()
    assert sum(e["ph"] == "X" for e in events) == len(trace)
    assert sum(e["ph"] == "s" for e in events) == sum(len(r.deps) for r in trace)


def _same_up_to_origin(a, b, origin):
    """``b`` is ``a`` read back from a Chrome trace: the same facts, times from ``origin``."""
    assert (b.task_id, b.codelet, b.variant, b.worker, b.device, b.node, b.bytes_in, b.deps,
            b.error) == (a.task_id, a.codelet, a.variant, a.worker, a.device, a.node,
                         a.bytes_in, a.deps, a.error)
    for name in ("submit", "ready", "start", "end"):
        assert getattr(b, name) == pytest.approx(getattr(a, name) - origin, abs=1e-9)


def test_from_json_reads_the_chrome_trace_back(tmp_path):
    from hetero_nn.scheduler.trace.records import TransferRecord

    trace = diamond()
    trace.records[3].error = "ValueError: boom"
    trace.transfers = [TransferRecord("host0", "gpu0", 4096, T0 + 2 * MS, T0 + 3 * MS)]
    path = trace.to_chrome(tmp_path / "trace.json", metadata={"global_steps": [3, 5]})
    back = Trace.from_json(path)
    assert back.workers == trace.workers  # cpu1, which ran nothing, included
    assert back.metadata == {"global_steps": [3, 5]}
    assert len(back.records) == len(trace.records)
    for a, b in zip(trace.records, back.records):
        _same_up_to_origin(a, b, T0)
    (copy,) = back.transfers
    assert (copy.src, copy.dst, copy.nbytes) == ("host0", "gpu0", 4096)
    assert copy.start == pytest.approx(2 * MS) and copy.end == pytest.approx(3 * MS)
    assert back.makespan == pytest.approx(trace.makespan)
    assert back.format_stats() == trace.format_stats()
    assert back.dot() == trace.dot()  # dependencies kept


@given(trace=random_traces())
@settings(max_examples=30, deadline=None)
def test_random_traces_survive_the_chrome_round_trip(trace, tmp_path_factory):
    path = trace.to_chrome(tmp_path_factory.mktemp("chrome") / "trace.json")
    back = Trace.from_json(path)
    assert back.workers == trace.workers
    for a, b in zip(trace.records, back.records, strict=True):
        _same_up_to_origin(a, b, trace.origin)


def test_from_json_names_the_file_it_cannot_read(tmp_path):
    from hetero_nn.errors import ConfigError

    (tmp_path / "notes.json").write_text("metrics, not a trace")
    with pytest.raises(ConfigError, match="notes.json: not a hetero_nn trace"):
        Trace.from_json(tmp_path / "notes.json")
    broken = {"traceEvents": [{"ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1, "args": {}}],
              "otherData": {"producer": "hetero_nn"}}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match="broken.json: a Chrome trace event"):
        Trace.from_json(tmp_path / "broken.json")
