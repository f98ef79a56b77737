"""Energy counters: the joules a run used, where the machine counts them, and why not elsewhere.

Policy
------
Measure, never estimate. A reading comes from hardware counters or it is ``None``
with the reason; no power model, TDP or utilisation product ever stands in for one.
Two optional sources:

- **Linux powercap (RAPL)**: every zone under ``/sys/class/powercap`` named
  ``package-N`` and its ``dram`` subzone (``core``, ``uncore`` and ``psys`` are
  left out: the first two are inside the package's count, ``psys`` covers it).
  ``energy_uj`` counts microjoules and wraps around past ``max_energy_range_uj``
  (the modulus is that range plus one). The ``intel-rapl-mmio`` zones repeat the
  package counter through another interface and are skipped. Since Linux 5.10
  ``energy_uj`` is readable by root only.
- **NVIDIA NVML** (``nvidia-ml-py``, imported as ``pynvml``; optional):
  ``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded,
  per GPU (Volta and newer).

A :class:`EnergyMeter` reads every counter when it starts, when it stops, and every
``poll_seconds`` in between on a thread of its own, adding each interval's
increase modulo the counter's range: an interval is counted right as long as no
counter wraps twice between two reads (a 262 kJ RAPL range lasts over an hour at
60 W; the default poll is every 30 s). A counter that fails mid-run makes the whole
reading ``None`` with the reason: a partial sum presented as the total would
understate it.

State of a meter: ``counters`` (what is read), ``unavailable`` (one reason per source
or zone that could not be read), ``_last`` (each counter's last raw value),
``_joules`` (each counter's joules since ``start``), ``_error`` (the first failure).

>>> meter = EnergyMeter(powercap_root="/nonexistent", nvml=False)
>>> with meter:
...     pass
>>> reading = meter.reading
>>> reading.joules is None, reading.reason.startswith("powercap: /nonexistent does not exist")
(True, True)
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Counter", "EnergyMeter", "EnergyReading", "find_counters", "nvml_counters",
           "powercap_counters"]

POWERCAP_ROOT = "/sys/class/powercap"
_ZONE = re.compile(r"^(?P<type>[a-z_-]+):(?P<path>\d+(?::\d+)*)$")


@dataclass(frozen=True)
class Counter:
    """One hardware energy counter.

    ``read()`` returns the raw count (an int in units of ``joules_per_unit``);
    ``modulus`` is the count it wraps at (None for a counter that does not wrap
    within a run, as NVML's 64-bit millijoules).
    """

    name: str
    source: str
    read: object = field(repr=False, compare=False)
    joules_per_unit: float
    modulus: int | None = None

    def increase(self, before: int, after: int) -> int:
        """Units counted from ``before`` to ``after`` (one wrap-around allowed)."""
        if self.modulus is None:
            return after - before
        return (after - before) % self.modulus


@dataclass(frozen=True)
class EnergyReading:
    """What a meter measured: ``joules`` in all (None when not measured, with ``reason``),
    per counter, over ``seconds``; ``unavailable`` lists the sources not read."""

    joules: float | None
    seconds: float
    counters: dict
    reason: str | None
    unavailable: tuple = ()

    def per_image(self, images: int) -> float | None:
        return None if self.joules is None or images <= 0 else self.joules / images

    def to_json(self, images: int | None = None) -> dict:
        """The fields ``metrics.json`` and the experiments' JSON carry."""
        return {"joules": self.joules,
                "joules_per_image": None if images is None else self.per_image(images),
                "seconds": self.seconds, "counters": dict(self.counters),
                "reason": self.reason, "unavailable": list(self.unavailable)}


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def powercap_counters(root=POWERCAP_ROOT) -> tuple[list[Counter], list[str]]:
    """The package and DRAM counters under ``root``, and why others were not taken."""
    root = Path(root)
    if not root.is_dir():
        return [], [f"powercap: {root} does not exist (the kernel exposes no powercap/RAPL "
                    "zones here, as in most virtual machines and containers)"]
    zones, seen = {}, set()
    for entry in sorted(os.listdir(root)):
        match = _ZONE.match(entry)
        if match is None or match["type"].endswith("-mmio"):
            continue
        zone = root / entry
        if not (zone / "energy_uj").exists() or not (zone / "name").exists():
            continue
        real = os.path.realpath(zone)
        if real in seen:
            continue
        seen.add(real)
        zones[(match["type"], match["path"])] = zone
    counters, reasons = [], []
    for (ztype, zpath), zone in zones.items():
        name = (zone / "name").read_text().strip()
        if name.startswith("package"):
            label = name
        elif name == "dram":
            parent = zones.get((ztype, zpath.rpartition(":")[0])) if ":" in zpath else None
            label = (f"{(parent / 'name').read_text().strip()}/dram" if parent is not None
                     else f"dram-{zpath}")
        else:
            continue
        counter = _powercap_counter(zone, label, reasons)
        if counter is not None:
            counters.append(counter)
    if not counters and not reasons:
        reasons.append(f"powercap: no package or dram zone under {root}")
    return counters, reasons


def _powercap_counter(zone: Path, label: str, reasons: list) -> Counter | None:
    energy = zone / "energy_uj"
    try:
        _read_int(energy)
        modulus = _read_int(zone / "max_energy_range_uj") + 1
    except PermissionError:
        reasons.append(f"powercap: {energy}: permission denied (energy_uj is readable by "
                       "root only since Linux 5.10; run as root or make it readable)")
        return None
    except (OSError, ValueError) as exc:
        reasons.append(f"powercap: {zone}: {type(exc).__name__}: {exc}")
        return None
    return Counter(label, "powercap", lambda: _read_int(energy), 1e-6, modulus)


def nvml_counters() -> tuple[list[Counter], list[str]]:
    """One total-energy counter per GPU NVML reports, and why others were not taken."""
    try:
        import pynvml  # nvidia-ml-py: optional, only where GPU energy is read
    except ImportError:
        return [], ["nvml: nvidia-ml-py is not installed (pip install nvidia-ml-py)"]
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return [], [f"nvml: {exc} (no NVIDIA driver or GPU reachable)"]
    counters, reasons = [], []
    for index in range(count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as exc:
            reasons.append(f"nvml: gpu{index}: total energy not readable: {exc} "
                           "(it needs a Volta or newer GPU)")
            continue
        counters.append(Counter(f"gpu{index}", "nvml",
                                lambda h=handle: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
                                1e-3))
    if count == 0:
        reasons.append("nvml: the driver reports no GPU")
    return counters, reasons


def find_counters(powercap_root=POWERCAP_ROOT, nvml=True) -> tuple[list[Counter], list[str]]:
    """Every energy counter this machine lets us read, and a reason per source it does not."""
    counters, reasons = powercap_counters(powercap_root)
    if nvml:
        more, why = nvml_counters()
        counters += more
        reasons += why
    return counters, reasons


class EnergyMeter:
    """Joules used between :meth:`start` and :meth:`stop`, read from hardware counters.

    Parameters
    ----------
    powercap_root : path, optional
        Where the powercap zones are (``/sys/class/powercap``).
    nvml : bool
        Also read the GPUs' counters through NVML when ``nvidia-ml-py`` is installed.
    poll_seconds : float
        Read every counter this often while running, so a counter that wraps is
        counted right (module docstring); 0 or None: only at start and stop.
    counters : list of Counter, optional
        Read these instead of looking for them.

    A context manager: entering starts, leaving stops; :attr:`reading` then holds the
    result. :meth:`split` reads and restarts, for consecutive intervals (epochs).
    """

    def __init__(self, powercap_root=POWERCAP_ROOT, nvml=True, poll_seconds=30.0,
                 counters=None):
        if counters is None:
            counters, unavailable = find_counters(powercap_root, nvml)
        else:
            unavailable = []
        self.counters = list(counters)
        self.unavailable = tuple(unavailable)
        self.poll_seconds = poll_seconds
        self.reading: EnergyReading | None = None
        self._lock = threading.Lock()
        self._last: dict = {}
        self._joules: dict = {}
        self._error = None
        self._t0 = None
        self._stop_polling = threading.Event()
        self._poller = None

    @property
    def available(self) -> bool:
        """Whether any counter can be read."""
        return bool(self.counters)

    def _read_all(self) -> None:
        """Read every counter and add its increase since the last read. Holds the lock."""
        for c in self.counters:
            try:
                value = c.read()
            except Exception as exc:  # a zone removed, a driver gone: the reading fails
                if self._error is None:
                    self._error = f"{c.source}: {c.name}: {type(exc).__name__}: {exc}"
                continue
            before = self._last.get(c.name)
            if before is not None:
                self._joules[c.name] += c.increase(before, value) * c.joules_per_unit
            self._last[c.name] = value

    def start(self) -> "EnergyMeter":
        with self._lock:
            self._last = {}
            self._joules = {c.name: 0.0 for c in self.counters}
            self._error = None
            self._read_all()
            self._t0 = time.perf_counter()
        if self.counters and self.poll_seconds:
            self._stop_polling.clear()
            self._poller = threading.Thread(target=self._poll, name="hetero_nn-energy",
                                            daemon=True)
            self._poller.start()
        return self

    def _poll(self):
        while not self._stop_polling.wait(self.poll_seconds):
            self.sample()

    def sample(self) -> None:
        """Read every counter now (the poller does so every ``poll_seconds``)."""
        with self._lock:
            self._read_all()

    def split(self) -> EnergyReading:
        """The reading since the last start or split; the meter goes on from now."""
        with self._lock:
            self._read_all()
            reading = self._reading()
            self._joules = dict.fromkeys(self._joules, 0.0)
            self._t0 = time.perf_counter()
        return reading

    def stop(self) -> EnergyReading:
        """Stop polling; the reading since the last start or split (also :attr:`reading`)."""
        if self._poller is not None:
            self._stop_polling.set()
            self._poller.join()
            self._poller = None
        with self._lock:
            self._read_all()
            self.reading = self._reading()
        return self.reading

    def _reading(self) -> EnergyReading:
        seconds = time.perf_counter() - self._t0
        if not self.counters:
            reason = "; ".join(self.unavailable) or "no energy counter"
            return EnergyReading(None, seconds, {}, reason, self.unavailable)
        if self._error is not None:
            return EnergyReading(None, seconds, {}, f"a counter failed: {self._error}",
                                 self.unavailable)
        counters = dict(self._joules)
        return EnergyReading(sum(counters.values()), seconds, counters, None, self.unavailable)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        names = [c.name for c in self.counters] or "none"
        return f"EnergyMeter(counters={names})"
