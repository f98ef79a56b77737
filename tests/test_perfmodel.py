"""Performance models: history statistics, regression on size, transfer fits, files, threads."""

import json
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

from hetero_nn.scheduler.perfmodel.history import RECENT
from hetero_nn.scheduler.perfmodel.model import (FORMAT_VERSION, PerfModel, PerfModelWarning,
                                           default_cache_dir, fit_regression)

KEY = ("conv2d_fwd", "cpu", "cpu")


def _record_power_law(pm, rng, a, b, c=0.0, sizes=None, noise=0.0, reps=3, codelet="conv2d_fwd"):
    """Record ``t = a * size**b + c`` (times ``1 + noise * N(0,1)``) for each size as its own footprint."""
    for size in sizes:
        for _ in range(reps):
            t = (a * size ** b + c) * (1.0 + noise * rng.standard_normal())
            pm.record(codelet, "cpu", "cpu", f"f64[{size}]", float(size), t)


# -- history -------------------------------------------------------------------------

def test_history_mean_and_variance_match_numpy(tmp_path):
    rng = np.random.default_rng(0)
    pm = PerfModel(tmp_path)
    times = rng.lognormal(mean=-9, sigma=0.5, size=int(rng.integers(20, 200)))
    for t in times:
        pm.record(*KEY, "f32[8,3,32,32]", 24576.0, float(t))
    assert pm.count(*KEY, "f32[8,3,32,32]") == len(times)
    assert pm.predict(*KEY, "f32[8,3,32,32]", 24576.0) == np.median(times[-RECENT:])
    (row,) = pm.entries("conv2d_fwd")
    assert row["mean"] == pytest.approx(times.mean(), rel=1e-12)
    assert row["var"] == pytest.approx(np.var(times, ddof=1), rel=1e-9)
    assert row["stddev"] == pytest.approx(np.std(times, ddof=1), rel=1e-9)
    assert row["size"] == 24576.0
    assert row["count"] == len(times)


def test_one_outlier_does_not_move_the_estimate(tmp_path):
    """Issue 30, item 9: a run slowed 1000x by a busy machine (StarPU's users see one such
    sample push every task onto one device) leaves the prediction where the others are,
    in memory, on disk, and in the regression over footprints."""
    rng = np.random.default_rng(3)
    pm = PerfModel(tmp_path)
    for size in (100.0, 400.0):
        times = (size * 1e-8) * rng.uniform(0.95, 1.05, 9)
        times[4] *= 1000.0  # the outlier
        for t in times:
            pm.record(*KEY, f"s{size:g}", size, float(t))
        truth = size * 1e-8
        assert pm.predict(*KEY, f"s{size:g}", size) == pytest.approx(truth, rel=0.05)
        row = next(r for r in pm.entries() if r["footprint"] == f"s{size:g}")
        assert row["mean"] > 100 * truth and row["median"] == pytest.approx(truth, rel=0.05)
    assert pm.predict(*KEY, "s200", 200.0) == pytest.approx(200e-8, rel=0.1)
    pm.save()
    assert PerfModel(tmp_path).predict(*KEY, "s100", 100.0) == pytest.approx(1e-6, rel=0.05)
    arrays = PerfModel(tmp_path / "other")  # the replay engine's path
    ns = np.array([7, 1000, 1000, 5_000_000, 1000])  # nanoseconds; the first left out
    arrays.record_array(*KEY, "a", 1.0, ns, np.arange(5), skip=1)
    assert arrays.predict(*KEY, "a", 1.0) == 1000 * 1e-9
    assert arrays.count(*KEY, "a") == 4
    with pytest.raises(ValueError, match="not >= 0"):
        arrays.record_array(*KEY, "a", 1.0, np.array([5, -3]), np.arange(2))


def test_a_model_saved_without_recent_runs_predicts_its_mean(tmp_path):
    pm = PerfModel(tmp_path)
    pm.record(*KEY, "fp", 1.0, 2e-6)
    pm.save()
    path = next(pm.directory.glob("conv2d_fwd.json"))
    doc = json.loads(path.read_text())
    assert _entries(doc)
    for entry in _entries(doc):
        del entry["recent"]
    path.write_text(json.dumps(doc))
    assert PerfModel(tmp_path).predict(*KEY, "fp", 1.0) == 2e-6


def _entries(doc):
    """The history rows of a codelet file, wherever its layout nests them."""
    if isinstance(doc, dict):
        if "recent" in doc:
            return [doc]
        return [row for value in doc.values() for row in _entries(value)]
    if isinstance(doc, list):
        return [row for value in doc for row in _entries(value)]
    return []


def test_keys_do_not_mix_and_unknown_is_none(tmp_path):
    pm = PerfModel(tmp_path)
    assert pm.predict(*KEY, "f64[10]", 10.0) is None
    assert pm.count(*KEY, "f64[10]") == 0
    pm.record(*KEY, "f64[10]", 10.0, 1e-5)
    pm.record("conv2d_fwd", "ref", "cpu", "f64[10]", 10.0, 5e-5)
    assert pm.predict(*KEY, "f64[10]", 10.0) == 1e-5
    assert pm.predict("conv2d_fwd", "ref", "cpu", "f64[10]", 10.0) == 5e-5
    assert pm.predict("conv2d_fwd", "cuda", "cuda", "f64[10]", 10.0) is None
    # a single measured size cannot give a regression
    assert pm.predict(*KEY, "f64[20]", 20.0) is None
    assert pm.fit(*KEY) is None


def test_count_counts_the_records_of_one_key(tmp_path):
    pm = PerfModel(tmp_path)
    for i in range(10):
        assert pm.count(*KEY, "fp") == i
        pm.record(*KEY, "fp", 1.0, 1e-6)
    assert pm.count(*KEY, "fp") == 10 and pm.count(*KEY, "other") == 0


@pytest.mark.parametrize("bad", [-1e-6, float("nan")])
def test_record_rejects_impossible_times(tmp_path, bad):
    with pytest.raises(ValueError, match="conv2d_fwd"):
        PerfModel(tmp_path).record(*KEY, "fp", 1.0, bad)


# -- regression ------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_regression_predicts_unseen_size_of_power_law(tmp_path, seed):
    rng = np.random.default_rng(seed)
    a = 10 ** rng.uniform(-10, -8)
    b = rng.uniform(0.7, 1.6)
    sizes = sorted({int(s) for s in 10 ** rng.uniform(3, 6, size=int(rng.integers(2, 8)))})
    if len(sizes) < 2:
        sizes = [1000, 100000]
    pm = PerfModel(tmp_path)
    _record_power_law(pm, rng, a, b, sizes=sizes)
    for unseen in (int(10 ** rng.uniform(3, 6)), sizes[-1] * 3):
        pred = pm.predict(*KEY, f"f64[{unseen}]x", float(unseen))
        assert pred == pytest.approx(a * unseen ** b, rel=0.03)
    fit = pm.fit(*KEY)
    assert fit.b == pytest.approx(b, rel=1e-3)
    assert fit.c == 0.0


def test_regression_with_noise_and_fixed_cost(tmp_path):
    rng = np.random.default_rng(7)
    a, b, c = 3e-9, 1.1, 20e-6  # 20 us per task dominates the small sizes
    sizes = [2 ** k for k in range(6, 20, 2)]
    pm = PerfModel(tmp_path)
    _record_power_law(pm, rng, a, b, c=c, sizes=sizes, noise=0.01, reps=10)
    fit = pm.fit(*KEY)
    assert fit.c == pytest.approx(c, rel=0.2)
    for unseen in (100, 5000, 300000):
        truth = a * unseen ** b + c
        assert pm.predict(*KEY, "unseen", float(unseen)) == pytest.approx(truth, rel=0.05)
    # the plain power law (c = 0) cannot fit these data as well in the small sizes
    plain = fit_regression([(s, a * s ** b + c) for s in sizes[:2]])
    assert plain.c == 0.0  # two sizes: no room for c


def test_regression_too_steep_to_represent_is_no_fit():
    # sizes within 0.1% of each other, times 100x apart: log t on log size is a slope of
    # about 9,000, whose power overflows a float (it raised OverflowError before)
    assert fit_regression([(1000.0, 1e-4), (1000.5, 1e-2), (1001.0, 1.0)]) is None
    fit = fit_regression([(1000.0, 1e-4), (2000.0, 2e-4), (4000.0, 4e-4)])
    assert fit.b == pytest.approx(1.0, rel=1e-6)  # a plain law still fits


def test_regression_refits_when_new_footprints_arrive(tmp_path):
    pm = PerfModel(tmp_path)
    pm.record(*KEY, "s100", 100.0, 1e-6)
    assert pm.predict(*KEY, "s400", 400.0) is None
    pm.record(*KEY, "s200", 200.0, 2e-6)
    assert pm.predict(*KEY, "s400", 400.0) == pytest.approx(4e-6, rel=1e-9)
    pm.record(*KEY, "s300", 300.0, 9e-6)  # a new footprint invalidates the fit
    assert pm.fit(*KEY).points == 3
    assert pm.predict(*KEY, "s400", 400.0) != pytest.approx(4e-6, rel=1e-3)


# -- transfers -----------------------------------------------------------------------

def test_transfer_fit_recovers_latency_and_bandwidth(tmp_path):
    rng = np.random.default_rng(3)
    latency, bandwidth = 7e-6, 12e9
    pm = PerfModel(tmp_path)
    for nbytes in (2 ** rng.uniform(8, 26, size=400)).astype(int):
        t = (latency + nbytes / bandwidth) * (1 + 0.01 * rng.standard_normal())
        pm.record_transfer("host0", "cuda0", int(nbytes), float(t))
    lat, bw = pm.link("host0", "cuda0")
    assert lat == pytest.approx(latency, rel=0.05)
    assert bw == pytest.approx(bandwidth, rel=0.05)
    assert pm.predict_transfer("host0", "cuda0", 1 << 20) == pytest.approx(
        latency + (1 << 20) / bandwidth, rel=0.03)
    # the other direction is another link, still on its default
    assert pm.predict_transfer("cuda0", "host0", 0) == pytest.approx(10e-6)


def test_transfer_defaults_and_same_node(tmp_path):
    pm = PerfModel(tmp_path)
    assert pm.predict_transfer("host0", "host0", 1 << 30) == 0.0
    assert pm.predict_transfer("host0", "host1", 10_000) == pytest.approx(1e-6 + 10_000 / 10e9)
    assert pm.predict_transfer("cuda0", "cuda1", 10_000) == pytest.approx(10e-6 + 10_000 / 20e9)
    assert pm.predict_transfer("host0", "cuda1", 0) == pytest.approx(10e-6)


def test_transfer_with_one_size_scales_the_default(tmp_path):
    pm = PerfModel(tmp_path)
    for _ in range(5):
        pm.record_transfer("host0", "cuda0", 1 << 20, 1e-4)
    assert pm.predict_transfer("host0", "cuda0", 1 << 20) == pytest.approx(1e-4)
    lat, bw = pm.link("host0", "cuda0")
    assert lat > 0 and bw > 0


# -- files -----------------------------------------------------------------------------

def test_default_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HETERO_NN_CACHE")
    assert str(default_cache_dir()).endswith(".cache/hetero_nn")


def test_save_load_round_trip_via_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HETERO_NN_CACHE", str(tmp_path))
    rng = np.random.default_rng(1)
    pm = PerfModel(hostname="node-a")
    times = rng.uniform(1e-5, 2e-5, size=17)
    for t in times:
        pm.record(*KEY, "f32[4,4]", 16.0, float(t))
    for nbytes in (1000, 10 ** 6, 10 ** 7):
        pm.record_transfer("host0", "cuda0", nbytes, 1e-5 + nbytes / 15e9)
    pm.save()
    path = tmp_path / "perfmodels" / "node-a" / "conv2d_fwd.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == FORMAT_VERSION and doc["codelet"] == "conv2d_fwd"
    assert (tmp_path / "perfmodels" / "node-a" / "_transfers.json").exists()

    again = PerfModel(hostname="node-a")
    assert again.count(*KEY, "f32[4,4]") == 17
    assert again.predict(*KEY, "f32[4,4]", 16.0) == np.median(times[-RECENT:])
    (row,) = again.entries()
    assert row["mean"] == pytest.approx(times.mean(), rel=1e-12)
    assert row["var"] == pytest.approx(np.var(times, ddof=1), rel=1e-9)
    assert again.link("host0", "cuda0")[1] == pytest.approx(15e9, rel=1e-6)
    assert PerfModel(hostname="node-b").count(*KEY, "f32[4,4]") == 0  # machine-specific
    assert PerfModel(hostname="node-a", load=False).count(*KEY, "f32[4,4]") == 0


def test_save_load_round_trip_via_cache_dir_and_lazy_load(tmp_path):
    pm = PerfModel(tmp_path / "cache")
    reader = PerfModel(tmp_path / "cache")  # created before the file exists: loads on first touch
    pm.record("pool_fwd", "ref", "cpu", "f64[2,2]", 4.0, 3e-6)
    pm.record("odd name/with:chars", "cpu", "cpu", "fp", 1.0, 1e-6)
    pm.save()
    assert reader.predict("pool_fwd", "ref", "cpu", "f64[2,2]", 4.0) == 3e-6
    assert reader.count("odd name/with:chars", "cpu", "cpu", "fp") == 1
    assert reader.codelets() == ["odd name/with:chars", "pool_fwd"]
    assert all(p.parent == pm.directory for p in pm.directory.glob("*.json"))


def test_saving_twice_does_not_double_count(tmp_path):
    pm = PerfModel(tmp_path)
    pm.record(*KEY, "fp", 1.0, 1e-6)
    pm.save()
    pm.save()
    pm.record(*KEY, "fp", 1.0, 3e-6)
    pm.save()
    assert pm.count(*KEY, "fp") == 2
    fresh = PerfModel(tmp_path)
    assert fresh.count(*KEY, "fp") == 2
    assert fresh.predict(*KEY, "fp", 1.0) == pytest.approx(2e-6)


def test_two_instances_merge_their_measurements(tmp_path):
    rng = np.random.default_rng(5)
    first, second = PerfModel(tmp_path), PerfModel(tmp_path)
    ta = rng.uniform(1e-6, 5e-6, size=11)
    tb = rng.uniform(4e-6, 9e-6, size=23)
    for t in ta:
        first.record(*KEY, "shared", 8.0, float(t))
    for t in tb:
        second.record(*KEY, "shared", 8.0, float(t))
    second.record(*KEY, "only-second", 9.0, 1e-6)
    first.record_transfer("host0", "cuda0", 1 << 20, 1e-4)
    second.record_transfer("host0", "cuda0", 1 << 22, 3e-4)
    first.save()
    second.save()
    first.save()  # nothing new: must not erase what the second one wrote
    both = np.concatenate([ta, tb])
    for pm in (PerfModel(tmp_path), second):
        assert pm.count(*KEY, "shared") == len(both)
        assert pm.predict(*KEY, "shared", 8.0) == np.median(both[-RECENT:])  # the later runs
        row = next(r for r in pm.entries() if r["footprint"] == "shared")
        assert row["mean"] == pytest.approx(both.mean(), rel=1e-12)
        assert row["var"] == pytest.approx(np.var(both, ddof=1), rel=1e-9)
        assert pm.count(*KEY, "only-second") == 1
        assert pm.transfer_entries()[0]["count"] == 2


def test_two_processes_saving_concurrently_lose_nothing(tmp_path):
    script = (
        "import sys\n"
        "from hetero_nn.scheduler.perfmodel import PerfModel\n"
        "pm = PerfModel(sys.argv[1])\n"
        "for i in range(300):\n"
        "    pm.record('conv2d_fwd', 'cpu', 'cpu', 'fp', 1.0, 1e-6)\n"
        "    pm.record_transfer('host0', 'cuda0', 1000 + i, 1e-5)\n"
        "    if i % 10 == 0: pm.save()\n"
        "pm.save()\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)]) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    pm = PerfModel(tmp_path)
    assert pm.count(*KEY, "fp") == 600
    assert pm.transfer_entries()[0]["count"] == 600


def test_corrupt_and_foreign_files_are_set_aside_and_the_model_starts_fresh(tmp_path):
    pm = PerfModel(tmp_path)
    pm.directory.mkdir(parents=True)
    bad = pm.path_for("conv2d_fwd")
    bad.write_text("{ this is not json")
    with pytest.warns(PerfModelWarning, match="conv2d_fwd.json"):
        assert pm.predict(*KEY, "fp", 1.0) is None
    pm.record(*KEY, "fp", 1.0, 1e-6)
    pm.save()  # replaces the corrupt file
    assert PerfModel(tmp_path).count(*KEY, "fp") == 1

    foreign = pm.path_for("pool_fwd")
    foreign.write_text(json.dumps({"format": "something-else", "entries": []}))
    newer = pm.path_for("dense_fwd")
    newer.write_text(json.dumps({"format": "hetero_nn-perfmodel", "version": FORMAT_VERSION + 1,
                                 "codelet": "dense_fwd", "entries": []}))
    wrong = pm.path_for("relu_fwd")
    wrong.write_text(json.dumps({"format": "hetero_nn-perfmodel", "version": FORMAT_VERSION,
                                 "codelet": "relu_fwd",
                                 "entries": [{"variant": "cpu", "kind": "cpu", "footprint": "x",
                                              "size": 1, "count": -3, "mean": 1, "m2": 0}]}))
    (pm.directory / "_transfers.json").write_bytes(b"\xff\xfe\x00garbage")
    fresh = PerfModel(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fresh.codelets() == ["conv2d_fwd"]
        assert fresh.predict_transfer("host0", "cuda0", 0) == pytest.approx(10e-6)
    messages = "\n".join(str(w.message) for w in caught if w.category is PerfModelWarning)
    for path in (foreign, newer, wrong, pm.directory / "_transfers.json"):
        assert str(path) in messages
        assert not path.exists()  # set aside, kept for a post-mortem under another name
        (aside,) = pm.directory.glob(f"{path.name}.corrupt-*")
        assert aside.name in messages
    assert sorted(p.name for p in pm.directory.glob("*.json")) == ["conv2d_fwd.json"]


def test_a_corrupt_file_is_set_aside_once_and_a_fresh_one_saved(tmp_path):
    """The bytes of a damaged model survive under a new name; the next save writes a
    good file in its place, and later processes read that one without a warning."""
    pm = PerfModel(tmp_path)
    pm.directory.mkdir(parents=True)
    path = pm.path_for("conv2d_fwd")
    path.write_bytes(b'{"format": "hetero_nn-perfmodel", "version": 1, "codelet": "conv2')  # cut
    with pytest.warns(PerfModelWarning, match="set aside as conv2d_fwd.json.corrupt-") as caught:
        pm.record(*KEY, "fp", 1.0, 2e-6)
    assert len([w for w in caught if w.category is PerfModelWarning]) == 1
    (aside,) = pm.directory.glob("conv2d_fwd.json.corrupt-*")
    assert aside.read_bytes().endswith(b'"codelet": "conv2')
    pm.save()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh, good file: no warning any more
        assert PerfModel(tmp_path).count(*KEY, "fp") == 1


def test_a_file_replaced_after_it_was_read_is_not_set_aside(tmp_path):
    """Another process may write a good file between our read and our rename: the
    rename happens under the lock and only if the file is still the one read."""
    pm = PerfModel(tmp_path)
    pm.directory.mkdir(parents=True)
    path = pm.path_for("conv2d_fwd")
    path.write_text("{ not json")
    real_read = PerfModel._read_doc

    elsewhere = PerfModel(tmp_path / "elsewhere")
    elsewhere.record(*KEY, "fp", 1.0, 3e-6)
    elsewhere.save()

    def racing_read(self, *args, **kwargs):
        original_set_aside = self._set_aside

        def set_aside_after_a_rewrite(path_, identity, problem):
            os.replace(elsewhere.path_for(KEY[0]), path)  # the other process wins the race
            return original_set_aside(path_, identity, problem)

        self._set_aside = set_aside_after_a_rewrite
        return real_read(self, *args, **kwargs)

    pm._read_doc = racing_read.__get__(pm)
    pm.count(*KEY, "fp")
    assert not list(pm.directory.glob("*.corrupt-*"))
    assert PerfModel(tmp_path).count(*KEY, "fp") == 1


def test_unwritable_directory_warns_once_and_keeps_measurements(tmp_path):
    """Root ignores permission bits, so the folder is made impossible instead: its
    parent is a file. Every save fails; only the first one says so."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    pm = PerfModel(blocker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.record(*KEY, "fp", 1.0, 1e-6)  # no folder: nothing to read, nothing to say yet
    assert not caught
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            pm.save()
            pm.record(*KEY, "fp", 1.0, 1e-6)
    (warning,) = [w for w in caught if w.category is PerfModelWarning]
    assert "could not save" in str(warning.message) and str(blocker) in str(warning.message)
    assert pm.count(*KEY, "fp") == 4
    blocker.unlink()  # the folder can be made again: what waited in memory reaches the disk
    pm.save()
    assert PerfModel(blocker).count(*KEY, "fp") == 4


def test_save_if_due_saves_on_the_timer_only(tmp_path):
    pm = PerfModel(tmp_path, save_every=3600.0)
    pm.record(*KEY, "fp", 1.0, 1e-6)
    assert not pm.save_if_due() and not pm.path_for(KEY[0]).exists()
    pm.save_every = 0.0
    assert pm.save_if_due() and PerfModel(tmp_path).count(*KEY, "fp") == 1
    pm.save_every = None
    assert not pm.save_if_due()


def test_the_runtime_saves_the_models_while_it_runs(tmp_path):
    """A run killed before ``close()`` keeps what the timer saved: the runtime calls
    ``save_if_due`` after each flush."""
    import hetero_nn as hn

    def scale(x, factor):
        x *= factor

    codelet = hn.Codelet("scale_saved", modes=(hn.RW,), variants={"ref": scale})
    rt = hn.Runtime(devices="cpu:1", perfmodel=PerfModel(tmp_path, save_every=0.0))
    try:
        h = rt.register(np.ones(8))
        for _ in range(3):  # the first run of a footprint is a warm-up, not recorded
            rt.submit(codelet, h, factor=2.0)
            rt.wait()
        on_disk = PerfModel(tmp_path).entries("scale_saved")  # before close()
        assert [row["count"] for row in on_disk] == [2]
    finally:
        rt.close()


# -- threads -----------------------------------------------------------------------------

def test_threads_recording_predicting_and_saving_add_up(tmp_path):
    pm = PerfModel(tmp_path)
    n_threads, per_thread = 6, 1500
    errors = []

    def worker(i):
        try:
            for j in range(per_thread):
                footprint = f"fp{j % 3}"
                pm.record(*KEY, footprint, float(10 ** (j % 3 + 1)), 1e-6 * (i + 1))
                pm.predict(*KEY, "unseen", 50.0)
                pm.record_transfer("host0", "cuda0", 1000 * (j % 5 + 1), 1e-5)
                if j % 500 == 0:
                    pm.save()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pm.save()
    expected_mean = 1e-6 * np.mean(np.arange(1, n_threads + 1))
    for model in (pm, PerfModel(tmp_path)):
        assert sum(model.count(*KEY, f"fp{k}") for k in range(3)) == n_threads * per_thread
        row = next(r for r in model.entries() if r["footprint"] == "fp0")
        assert row["mean"] == pytest.approx(expected_mean, rel=1e-9)
        assert 1e-6 <= model.predict(*KEY, "fp0", 10.0) <= 1e-6 * n_threads
        assert model.transfer_entries()[0]["count"] == n_threads * per_thread


def test_an_unreadable_model_is_warned_once_per_folder(tmp_path):
    pm = PerfModel(tmp_path)
    for codelet in ("conv2d_fwd", "pool_fwd"):  # a folder where each file should be
        pm.path_for(codelet).mkdir(parents=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert pm.predict("conv2d_fwd", "cpu", "cpu", "fp", 1.0) is None
        assert pm.predict("pool_fwd", "cpu", "cpu", "fp", 1.0) is None
    (warning,) = [w for w in caught if w.category is PerfModelWarning]
    assert str(pm.directory) in str(warning.message) and "cannot read" in str(warning.message)


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_save_waits_for_a_held_lock_only_so_long_then_warns_and_keeps_its_data(
        tmp_path, monkeypatch):
    import fcntl

    from hetero_nn.scheduler.perfmodel import files as perfmodel_module
    monkeypatch.setattr(perfmodel_module, "FLOCK_TIMEOUT", 0.2)
    pm = PerfModel(tmp_path)
    pm.record(*KEY, "fp", 1.0, 1e-6)
    pm.directory.mkdir(parents=True, exist_ok=True)
    with open(pm.directory / ".lock", "a+") as other:  # another saver, stuck
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        with pytest.warns(PerfModelWarning, match="held by another process"):
            pm.save()
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
    pm.save()  # the measurement was kept for this one
    assert PerfModel(tmp_path).count(*KEY, "fp") == 1
