"""The energy readers against a powercap folder layout as a real machine has it (written
into a temporary directory), counter wrap-around included, and their null-with-reason
answers where there is nothing to read."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hetero_nn.energy import EnergyMeter, find_counters, nvml_counters, powercap_counters

# /sys/class/powercap of a two-socket Xeon (Linux 6.1), as `ls -l` and `cat` show it:
# the zones are links into /sys/devices/virtual/powercap/intel-rapl, subzones appear
# both nested and at the top, and the MMIO interface repeats package-0.
RANGE = 262143328850
LAYOUT = {
    "intel-rapl:0": ("package-0", 123456789012),
    "intel-rapl:0/intel-rapl:0:0": ("core", 98765432),
    "intel-rapl:0/intel-rapl:0:1": ("dram", 45678901234),
    "intel-rapl:1": ("package-1", 223456789012),
    "intel-rapl:1/intel-rapl:1:0": ("dram", 55678901234),
    "intel-rapl:2": ("psys", 7777777777),
}
MMIO = {"intel-rapl-mmio:0": ("package-0", 123456789012)}


def write_powercap(tmp_path: Path, layout=LAYOUT, mmio=MMIO) -> Path:
    """Write the layout: real zone folders under devices/, links to them under class/."""
    devices = tmp_path / "devices" / "virtual" / "powercap"
    root = tmp_path / "class" / "powercap"
    root.mkdir(parents=True)
    for kind, zones in (("intel-rapl", layout), ("intel-rapl-mmio", mmio)):
        (devices / kind).mkdir(parents=True)
        (devices / kind / "enabled").write_text("1\n")
        os.symlink(devices / kind, root / kind)
        for rel, (name, energy) in zones.items():
            zone = devices / kind / rel
            zone.mkdir(parents=True)
            (zone / "name").write_text(name + "\n")
            (zone / "energy_uj").write_text(f"{energy}\n")
            (zone / "max_energy_range_uj").write_text(f"{RANGE}\n")
            (zone / "enabled").write_text("1\n")
            os.symlink(zone, root / Path(rel).name)
    return root


def set_energy(root: Path, zone: str, value: int) -> None:
    """A new counter value, written whole (sysfs reads never see half a write)."""
    target = root / zone / "energy_uj"
    staged = target.with_name("energy_uj.new")
    staged.write_text(f"{value}\n")
    os.replace(staged, target)


def test_finds_packages_and_dram_only(tmp_path):
    root = write_powercap(tmp_path)
    counters, reasons = powercap_counters(root)
    assert sorted(c.name for c in counters) == ["package-0", "package-0/dram", "package-1",
                                                "package-1/dram"]
    assert reasons == []
    assert {c.modulus for c in counters} == {RANGE + 1}


def test_meter_counts_increases_and_a_wrap_around(tmp_path):
    root = write_powercap(tmp_path)
    meter = EnergyMeter(powercap_root=root, nvml=False, poll_seconds=0)
    meter.start()
    set_energy(root, "intel-rapl:0", 123456789012 + 5_000_000)       # +5 J
    set_energy(root, "intel-rapl:0:1", 45678901234 + 250_000)        # +0.25 J
    set_energy(root, "intel-rapl:1", RANGE - 1_000_000)               # on its way to wrap
    meter.sample()
    set_energy(root, "intel-rapl:1", 2_000_000)                       # wrapped: +3 J (+1 uJ)
    set_energy(root, "intel-rapl:1:0", 55678901234)                   # nothing
    reading = meter.stop()
    wrapped = (RANGE - 1_000_000 - 223456789012) + 1_000_000 + 1 + 2_000_000
    assert reading.counters == pytest.approx({"package-0": 5.0, "package-0/dram": 0.25,
                                              "package-1": wrapped * 1e-6,
                                              "package-1/dram": 0.0}, abs=1e-9)
    assert reading.joules == pytest.approx(5.25 + wrapped * 1e-6)
    assert reading.reason is None
    doc = reading.to_json(images=1000)
    assert doc["joules_per_image"] == pytest.approx(reading.joules / 1000)
    json.dumps(doc)


def test_split_gives_consecutive_intervals(tmp_path):
    root = write_powercap(tmp_path, {"intel-rapl:0": ("package-0", 10)}, {})
    meter = EnergyMeter(powercap_root=root, nvml=False, poll_seconds=0).start()
    set_energy(root, "intel-rapl:0", 2_000_010)
    first = meter.split()
    set_energy(root, "intel-rapl:0", 2_500_010)
    second = meter.stop()
    assert (first.joules, second.joules) == pytest.approx((2.0, 0.5))


def test_poller_reads_while_running(tmp_path):
    root = write_powercap(tmp_path, {"intel-rapl:0": ("package-0", RANGE - 10)}, {})
    with EnergyMeter(powercap_root=root, nvml=False, poll_seconds=0.01) as meter:
        set_energy(root, "intel-rapl:0", 5)  # wraps once: 16 uJ
        deadline = 200
        while meter._last.get("package-0") != 5 and deadline:  # the poller has read it
            deadline -= 1
            time.sleep(0.01)
        set_energy(root, "intel-rapl:0", 20)
    assert meter.reading.joules == pytest.approx(31e-6)


def test_counter_removed_mid_run_gives_null_with_reason(tmp_path):
    root = write_powercap(tmp_path, {"intel-rapl:0": ("package-0", 1)}, {})
    meter = EnergyMeter(powercap_root=root, nvml=False, poll_seconds=0).start()
    (root / "intel-rapl:0" / "energy_uj").unlink()
    reading = meter.stop()
    assert reading.joules is None and "package-0" in reading.reason
    assert reading.to_json(10)["joules_per_image"] is None


def test_unreadable_energy_is_a_reason_not_a_zero(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    root = write_powercap(tmp_path, {"intel-rapl:0": ("package-0", 1)}, {})
    os.chmod(root / "intel-rapl:0" / "energy_uj", 0o200)
    counters, reasons = powercap_counters(root)
    assert counters == [] and "permission denied" in reasons[0]


def test_no_powercap_and_no_zones(tmp_path):
    counters, reasons = powercap_counters(tmp_path / "missing")
    assert counters == [] and "does not exist" in reasons[0]
    (tmp_path / "empty").mkdir()
    counters, reasons = powercap_counters(tmp_path / "empty")
    assert counters == [] and "no package or dram zone" in reasons[0]


def test_this_machine_reports_null_with_reasons_where_it_has_no_counters():
    counters, reasons = find_counters()
    with EnergyMeter(poll_seconds=0) as meter:
        pass
    reading = meter.reading
    if counters:
        assert reading.joules is not None and reading.joules >= 0
    else:
        assert reading.joules is None and reading.reason
        assert any(r.startswith("powercap") for r in reasons)
        assert any(r.startswith("nvml") for r in reasons)


def test_nvml_without_a_driver_says_why():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    counters, reasons = nvml_counters()
    if not counters:
        assert reasons and reasons[0].startswith("nvml:")


def test_fit_records_energy_per_epoch_or_why_not():
    import numpy as np

    import hetero_nn as hn
    from hetero_nn.training.progress import energy_total

    counters, reasons = find_counters()
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((24, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 24))
    model = hn.build_model("dahl-basic", (1, 8, 8), 10, seed=0)
    with (hn.Runtime(devices="cpu:1", perfmodel=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=8) as trainer):
        history = trainer.fit(data, epochs=2, verbose=0)
    for record in history:
        assert {"energy_joules", "joules_per_image", "energy_reason"} <= set(record)
        if counters:
            assert record["energy_joules"] >= 0 and record["energy_reason"] is None
        else:
            assert record["energy_joules"] is None and record["joules_per_image"] is None
            assert record["energy_reason"] == "; ".join(reasons)
    total = energy_total(history)
    assert (total["joules"] is None) == (not counters) and (total["reason"] is None) == bool(counters)
    assert energy_total([])["reason"] == "no epoch finished"


def test_metrics_json_carries_the_energy_fields(tmp_path):
    from test_cli import DATA, TINY

    from hetero_nn.cli import main
    if not (DATA / "mnist").is_dir():
        pytest.skip("the MNIST files are not in the shared datasets")
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "1", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["energy"]) == {"joules", "joules_per_image", "reason"}
    epoch = metrics["epochs"][0]
    assert "energy_joules" in epoch and "joules_per_image" in epoch
    if metrics["energy"]["joules"] is None:
        assert metrics["energy"]["reason"] == epoch["energy_reason"] and epoch["energy_reason"]
