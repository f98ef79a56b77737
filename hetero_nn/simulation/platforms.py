"""Platforms of several machines, and devices described by their datasheets.

This module owns what ``hetero-nn simulate --platform FILE`` reads beyond the
one-machine :class:`~hetero_nn.simulation.simulate.Platform`: a
:class:`ClusterPlatform` is machines (each with CPU cores and GPUs of named
devices, its memory and the links inside it) and the network between them; a
:class:`Device` is a processor described by datasheet figures -- peak FLOP/s per
dtype, memory bandwidth, kernel launch latency -- from which :meth:`Device.roofline`
predicts a codelet that has no measured model.

Policy
------
A task's time on a device: this host's measured model where the device says its
times are this host's (``"measured": true``, times ``scale``) and one exists;
otherwise the roofline ``launch_latency + max(flops / (peak * compute
efficiency), bytes / (bandwidth * memory efficiency))``, ``flops`` from the
codelet's ``flops`` function (0 for a codelet without one: memory-bound),
``bytes`` the operands' sizes (read-write operands twice). The simulation says
which tasks it predicted which way. Every figure of a platform file carries a
``source`` (a citation, or the key of one in the file's ``sources``), which the
loader requires, so the provenance of a prediction can be read in the file.

File format (JSON; docs/simulate.md has the full description)::

    {"name": ..., "sources": {key: citation},
     "devices": {name: {"kind": "cpu"|"cuda", "peak_flops": {"float32": F, ...},
                        "memory_bandwidth": B/s, "launch_latency": s, "memory": bytes,
                        "efficiency": {"compute": e, "memory": e}, "measured": bool,
                        "scale": f, "source": key}},
     "machines": [{"name": ..., "count": n, "cpus": {"device": name, "count": n},
                   "gpus": {"device": name, "count": n}, "memory": bytes,
                   "links": {"host-cuda"|"cuda-cuda"|"host-host":
                             {"latency": s, "bandwidth": B/s, "source": key}}}],
     "network": {"latency": s, "bandwidth": B/s, "message_overhead": s, "source": key},
     "dispatch": s}

A file in the one-machine format (``workers``, ``links``, ``scale``) loads as one
machine whose devices are this host's measured models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..codelets.codelet import RW, REDUX, SCRATCH
from ..errors import ConfigError
from ..json_keys import check_keys
from .machine import DEFAULT_LINKS, KINDS, ONE_MACHINE_KEYS, Platform, read_platform_file

__all__ = ["Device", "Machine", "Network", "ClusterPlatform", "load_platform", "roofline_costs"]

#: The keys each entry of a platform file may have (an unknown one is refused).
_KEYS = {"platform": ("name", "sources", "devices", "machines", "network", "dispatch"),
         "device": ("kind", "peak_flops", "memory_bandwidth", "launch_latency", "memory",
                    "efficiency", "measured", "scale", "source"),
         "efficiency": ("compute", "memory"),
         "machine": ("name", "count", "cpus", "gpus", "memory", "links"),
         "part": ("device", "count"),
         "link": ("latency", "bandwidth", "source"),
         "network": ("latency", "bandwidth", "message_overhead", "source"),
         **ONE_MACHINE_KEYS}


@dataclass
class Device:
    """A processor from its datasheet (see the module docstring for the fields)."""

    name: str
    kind: str
    peak_flops: dict = field(default_factory=dict)
    memory_bandwidth: float = 0.0
    launch_latency: float = 0.0
    memory: float | None = None
    efficiency: dict = field(default_factory=lambda: {"compute": 1.0, "memory": 1.0})
    measured: bool = False
    scale: float = 1.0
    source: str = ""

    def roofline(self, flops, nbytes, dtype="float32") -> float:
        """Seconds for ``flops`` operations on ``nbytes`` bytes: the slower of compute and
        memory traffic at this device's attainable rates, plus its launch latency."""
        peak = self.peak_flops.get(np.dtype(dtype).name) or self.peak_flops.get("float32")
        compute = flops / (peak * self.efficiency.get("compute", 1.0)) if peak and flops else 0.0
        bw = self.memory_bandwidth * self.efficiency.get("memory", 1.0)
        memory = nbytes / bw if bw and nbytes else 0.0
        return self.launch_latency + max(compute, memory)


@dataclass
class Machine:
    """One kind of machine of a platform: ``count`` of them, each with ``cpus`` cores and
    ``gpus`` GPUs (``(Device, n)`` pairs), its memory and its links."""

    name: str
    count: int = 1
    cpus: tuple | None = None
    gpus: tuple | None = None
    memory: float | None = None
    links: dict = field(default_factory=dict)
    simulator: Platform | None = None  # a one-machine-format file's own Platform

    def devices(self) -> dict:
        """``{kind: Device}`` of this machine."""
        return {part[0].kind: part[0] for part in (self.cpus, self.gpus) if part and part[1]}

    def platform(self, dispatch=None, cpu_workers=None) -> Platform:
        """This machine as the simulator's one-machine :class:`Platform` (its CPU workers
        capped at ``cpu_workers``: the cores a rank's runtime uses)."""
        if self.simulator is not None:
            return self.simulator
        workers = {}
        if self.cpus and self.cpus[1]:
            workers["cpu"] = min(self.cpus[1], cpu_workers or self.cpus[1])
        if self.gpus and self.gpus[1]:
            workers["cuda"] = self.gpus[1]
        devices = self.devices()
        return Platform(name=self.name, workers=workers, links=dict(self.links),
                        scale={k: (k, d.scale) for k, d in devices.items()
                               if d.measured and d.scale != 1.0},
                        dispatch=dispatch,
                        measured={k: d.measured for k, d in devices.items()},
                        fallback=roofline_costs(self))


@dataclass
class Network:
    """The links between machines: ``latency`` s and ``bandwidth`` B/s per message and
    per machine's port, and the software's own ``message_overhead`` s per message."""

    latency: float = 25e-6
    bandwidth: float = 1.25e9
    message_overhead: float = 50e-6
    source: str = ""

    def message(self, nbytes) -> float:
        """Seconds for one message of ``nbytes`` bytes, alone on the link."""
        return self.latency + self.message_overhead + nbytes / self.bandwidth


@dataclass
class ClusterPlatform:
    """Machines and the network between them (module docstring)."""

    name: str
    machines: list
    network: Network = field(default_factory=Network)
    dispatch: float | None = None
    sources: dict = field(default_factory=dict)

    @property
    def count(self) -> int:
        """Machines in all."""
        return sum(m.count for m in self.machines)

    def machine(self, i=0) -> Machine:
        """The kind of the ``i``-th machine (machines in file order)."""
        for m in self.machines:
            if i < m.count:
                return m
            i -= m.count
        raise IndexError(f"platform {self.name}: {self.count} machines, no machine {i}")


def _figure(doc, key, where, positive=True):
    try:
        value = float(doc[key])
    except KeyError:
        raise ConfigError(f"{where}: no {key!r}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key!r} must be a number, got {doc[key]!r}") from None
    if value < 0 or (positive and value == 0) or not np.isfinite(value):
        raise ConfigError(f"{where}: {key!r} must be {'positive' if positive else '>= 0'}, "
                          f"got {doc[key]!r}")
    return value


def _source(doc, where, sources):
    """The citation(s) of an entry: its ``source``, keys of ``sources`` joined by ``;``
    when the file has a ``sources`` table, else the citation itself."""
    src = doc.get("source")
    if not isinstance(src, str) or not src.strip():
        raise ConfigError(f"{where}: no 'source' (say where its figures come from)")
    if not sources:
        return src
    keys = [k.strip() for k in src.split(";")]
    unknown = [k for k in keys if k not in sources]
    if unknown:
        raise ConfigError(f"{where}: source {unknown} is not a key of 'sources' "
                          f"({sorted(sources)})")
    return "; ".join(sources[k] for k in keys)


def _link(doc, where, sources, keys="link"):
    if isinstance(doc, dict):
        check_keys(doc, _KEYS[keys], where)
    _source(doc, where, sources)
    return (_figure(doc, "latency", where, positive=False), _figure(doc, "bandwidth", where))


def _device(name, doc, where, sources) -> Device:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected an object")
    check_keys(doc, _KEYS["device"], where)
    kind = doc.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: 'kind' must be one of {list(KINDS)}, got {kind!r}")
    measured = bool(doc.get("measured", False))
    peaks = doc.get("peak_flops", {})
    if not isinstance(peaks, dict) or (not measured and not peaks):
        raise ConfigError(f"{where}: 'peak_flops' must map dtypes to FLOP/s (needed unless "
                          f"'measured' is true)")
    if isinstance(peaks, dict):
        check_keys(peaks, ("float16", "float32", "float64"), f"{where} peak_flops")
    peak = {str(np.dtype(k)): _figure(peaks, k, f"{where} peak_flops") for k in peaks}
    eff = doc.get("efficiency", {})
    if isinstance(eff, dict):
        check_keys(eff, _KEYS["efficiency"], f"{where} efficiency")
    efficiency = {k: _figure(eff, k, f"{where} efficiency") for k in ("compute", "memory")
                  if k in eff}
    if any(e > 1 for e in efficiency.values()):
        raise ConfigError(f"{where}: an efficiency is a fraction of the peak, at most 1")
    return Device(name, kind, peak,
                  _figure(doc, "memory_bandwidth", where) if not measured or
                  "memory_bandwidth" in doc else 0.0,
                  _figure(doc, "launch_latency", where, positive=False)
                  if "launch_latency" in doc else 0.0,
                  _figure(doc, "memory", where) if "memory" in doc else None,
                  {"compute": 1.0, "memory": 1.0, **efficiency}, measured,
                  _figure(doc, "scale", where) if "scale" in doc else 1.0,
                  _source(doc, where, sources))


def _host_device(kind) -> Device:
    return Device(f"this host's {kind}", kind, measured=True,
                  source="this host's performance models")


def load_platform(path) -> ClusterPlatform:
    """A platform file (either format; module docstring) as a :class:`ClusterPlatform`.
    Errors name the file and the entry at fault."""
    doc = read_platform_file(path)
    if "machines" not in doc and not {"sources", "devices", "network"} & set(doc):
        # the one-machine format
        p = Platform.load(path)
        cpus, gpus = p.workers.get("cpu", 0), p.workers.get("cuda", 0)
        machine = Machine(p.name, 1, (_host_device("cpu"), cpus) if cpus else None,
                          (_host_device("cuda"), gpus) if gpus else None, links=p.links,
                          simulator=p)
        return ClusterPlatform(p.name, [machine], dispatch=p.dispatch)
    where = f"--platform {path}"
    check_keys(doc, _KEYS["platform"], where)
    sources = doc.get("sources", {})
    if not isinstance(sources, dict):
        raise ConfigError(f"{where}: 'sources' must map keys to citations")
    devices = {name: _device(name, d, f"{where}: device {name!r}", sources)
               for name, d in (doc.get("devices") or {}).items()}
    machines = []
    listed = doc.get("machines")
    for i, m in enumerate(listed if isinstance(listed, list) else [None] if listed else []):
        at = f"{where}: machine {i}"
        if not isinstance(m, dict):
            raise ConfigError(f"{at}: expected an object")
        check_keys(m, _KEYS["machine"], at)
        parts = {}
        for part, kind in (("cpus", "cpu"), ("gpus", "cuda")):
            spec = m.get(part)
            if spec is None:
                continue
            if isinstance(spec, dict):
                check_keys(spec, _KEYS["part"], f"{at} {part}")
            dev = devices.get(spec.get("device")) if isinstance(spec, dict) else None
            if dev is None or dev.kind != kind:
                raise ConfigError(f"{at}: {part!r} must name a {kind} device of 'devices', "
                                  f"got {spec!r}")
            parts[part] = (dev, int(_figure(spec, "count", f"{at} {part}")))
        links = {}
        for name, link in (m.get("links") or {}).items():
            if name not in DEFAULT_LINKS:
                raise ConfigError(f"{at}: unknown link {name!r}; links are {list(DEFAULT_LINKS)}")
            links[name] = _link(link, f"{at} link {name!r}", sources)
        if not parts:
            raise ConfigError(f"{at}: no 'cpus' and no 'gpus'")
        machines.append(Machine(str(m.get("name", f"machine{i}")),
                                int(_figure(m, "count", at)) if "count" in m else 1,
                                parts.get("cpus"), parts.get("gpus"),
                                _figure(m, "memory", at) if "memory" in m else None, links))
    if not machines:
        raise ConfigError(f"{where}: 'machines' must list at least one machine")
    network = Network()
    if "network" in doc:
        net = doc["network"]
        latency, bandwidth = _link(net, f"{where}: network", sources, keys="network")
        network = Network(latency, bandwidth,
                          _figure(net, "message_overhead", f"{where}: network", positive=False)
                          if "message_overhead" in net else Network.message_overhead,
                          _source(net, f"{where}: network", sources))
    dispatch = doc.get("dispatch")
    return ClusterPlatform(str(doc.get("name", path)), machines, network,
                           None if dispatch is None else _figure(doc, "dispatch", where, False),
                           sources)


def roofline_costs(machine: Machine):
    """The ``fallback`` of :func:`~hetero_nn.simulation.simulate.simulate` for ``machine``:
    ``(seconds, "roofline")`` of a task on the device of a kind, or None when the
    device has no datasheet figures (a device of this host's models)."""
    devices = machine.devices()

    def cost(task, kind):
        device = devices.get(kind)
        if device is None or not (device.peak_flops or device.memory_bandwidth):
            return None
        nbytes = sum(h.nbytes * (2 if m in (RW, REDUX) else 1)
                     for h, m in zip(task.handles, task.modes) if m is not SCRATCH)
        flops = task.size if task.codelet.flops is not None else 0.0
        dtype = "float64" if "<f8" in task.footprint else "float32"
        return device.roofline(flops, nbytes, dtype), "roofline"

    return cost
