"""The platform a simulation runs on, and the machine the policies see.

A :class:`Platform` describes workers per device kind, the links between memory nodes
(latency, bandwidth) and per-kind scale factors; it reads itself from a platform file
or from this machine's device spec. :class:`_Machine` is that platform as the real
policy classes see a runtime (workers, memory nodes, a transfer model,
``predict``), for :mod:`~hetero_nn.simulation.simulate` to drive in virtual time.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..json_keys import check_keys
from ..scheduler.devices import Worker, parse_devices

__all__ = ["DEFAULT_LINKS", "KINDS", "Platform", "read_platform_file"]

KINDS = ("cpu", "cuda")
#: Default links (latency s, bandwidth B/s) when neither a platform nor a model names them.
DEFAULT_LINKS = {"host-host": (1e-6, 10e9), "host-cuda": (10e-6, 12e9), "cuda-cuda": (10e-6, 50e9)}


@dataclass
class Platform:
    """A machine to simulate.

    ``workers``: ``{kind: count}``; CPU workers share the host node ``host0``, each
    CUDA worker has its node ``cuda<i>``. ``links``: ``{"host-cuda": (latency s,
    bandwidth B/s), "cuda-cuda": ..., "host-host": ...}`` (missing ones: the
    transfer model's fit for the same node names, else :data:`DEFAULT_LINKS`).
    ``scale``: ``{kind: (from_kind, factor)}``: that kind's run times are the
    other kind's predictions times ``factor`` (a GPU that was never lent).
    ``dispatch``: seconds the runtime spends per task besides the codelet
    (``None``: the measured value, else 0). ``measured``: ``{kind: False}`` for the
    kinds whose devices this host's measurements do not describe (a datasheet's
    device: :mod:`~hetero_nn.simulation.platforms`), which only a ``fallback``
    predicts: the platform's own (``fallback``: its devices' rooflines) or
    :func:`simulate`'s.
    """

    name: str = "platform"
    workers: dict = field(default_factory=lambda: {"cpu": 1})
    links: dict = field(default_factory=dict)
    scale: dict = field(default_factory=dict)
    dispatch: float | None = None
    measured: dict = field(default_factory=dict)
    fallback: object = None  # (task, kind) -> (seconds, how): a datasheet's roofline

    @classmethod
    def from_devices(cls, devices) -> "Platform":
        """This machine's workers for a device spec (``cuda-emu`` devices are CUDA workers)."""
        ncpu, gpus, emulated = parse_devices(devices)
        workers = {"cpu": ncpu} if ncpu else {}
        ncuda = len(gpus) + emulated
        if -1 in gpus:
            raise ConfigError(f"devices {devices!r}: name the GPUs to simulate ('cuda:0:1')")
        if ncuda:
            workers["cuda"] = ncuda
        return cls(name=str(devices), workers=workers)

    @classmethod
    def load(cls, path) -> "Platform":
        """Read a platform from a JSON file (see ``docs/simulate.md``)."""
        doc = read_platform_file(path)
        if "machines" in doc:
            raise ConfigError(f"--platform {path}: a platform of machines; read it with "
                              "hetero_nn.simulation.platforms.load_platform")
        check_one_machine_keys(doc, path)
        try:
            workers = {str(k): int(v) for k, v in doc.get("workers", {"cpu": 1}).items()}
            links = {str(k): (float(v["latency"]), float(v["bandwidth"]))
                     for k, v in doc.get("links", {}).items()}
            scale = {str(k): (str(v["from"]), float(v["factor"]))
                     for k, v in doc.get("scale", {}).items()}
            dispatch = doc.get("dispatch")
            dispatch = None if dispatch is None else float(dispatch)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"--platform {path}: bad entry ({type(exc).__name__}: {exc}); "
                              "expected workers {kind: n}, links {name: {latency, bandwidth}}, "
                              "scale {kind: {from, factor}}") from None
        bad = [k for k in (*workers, *scale) if k not in KINDS]
        bad += [k for k in links if k not in DEFAULT_LINKS]
        if bad:
            raise ConfigError(f"--platform {path}: unknown names {bad}; kinds are {list(KINDS)}, "
                              f"links {list(DEFAULT_LINKS)}")
        if not any(workers.values()):
            raise ConfigError(f"--platform {path}: no worker at all")
        return cls(name=str(doc.get("name", path)), workers=workers, links=links, scale=scale,
                   dispatch=dispatch)


#: The keys a one-machine platform file may have (an unknown one is refused).
ONE_MACHINE_KEYS = {"one-machine": ("name", "workers", "links", "scale", "dispatch"),
                    "one-machine link": ("latency", "bandwidth"),
                    "scale": ("from", "factor")}


def check_one_machine_keys(doc, path) -> None:
    """Refuse a key the one-machine format does not define (``"wokers"``), naming the
    closest valid one (:meth:`Platform.load <hetero_nn.simulation.machine.Platform.load>`)."""
    where = f"--platform {path}"
    check_keys(doc, ONE_MACHINE_KEYS["one-machine"], where)
    for group, keys in (("links", "one-machine link"), ("scale", "scale")):
        entries = doc.get(group)
        for name, entry in (entries.items() if isinstance(entries, dict) else ()):
            if isinstance(entry, dict):
                check_keys(entry, ONE_MACHINE_KEYS[keys], f"{where}: {group} {name!r}")


def read_platform_file(path) -> dict:
    """The JSON object of a platform file; ConfigError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ConfigError(f"--platform {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--platform {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--platform {path}: expected a JSON object")
    return doc


class _Node:
    """A simulated memory node: what policies and workers read of one."""

    __slots__ = ("index", "kind", "name", "emulated")

    def __init__(self, index, kind, name):
        self.index, self.kind, self.name, self.emulated = index, kind, name, False

    def __repr__(self):
        return f"node {self.name}"


class _Links:
    """The platform's transfer model, with the PerfModel's ``predict_transfer`` signature."""

    def __init__(self, platform, perfmodel):
        self.links = platform.links
        self.perfmodel = perfmodel

    @staticmethod
    def kind(src, dst):
        gpus = src.startswith("cuda") + dst.startswith("cuda")
        return ("host-host", "host-cuda", "cuda-cuda")[gpus]

    def predict_transfer(self, src, dst, nbytes):
        if src == dst:
            return 0.0
        link = self.links.get(self.kind(src, dst))
        if link is None:
            if self.perfmodel is not None:
                return self.perfmodel.predict_transfer(src, dst, nbytes)
            link = DEFAULT_LINKS[self.kind(src, dst)]
        latency, bandwidth = link
        return latency + nbytes / bandwidth


class _Machine:
    """The platform as the policies see a runtime: workers, nodes, a transfer model."""

    def __init__(self, platform, perfmodel, seed=0):
        self.nodes = [_Node(0, "host", "host0")]
        self.workers = []
        lock = threading.Lock()
        for kind in KINDS:
            for i in range(platform.workers.get(kind, 0)):
                if kind == "cpu":
                    node = self.nodes[0]
                else:
                    node = _Node(len(self.nodes), "cuda", f"cuda{i}")
                    self.nodes.append(node)
                self.workers.append(Worker(len(self.workers), f"{kind}{i}", kind, node, lock))
        self.perfmodel = _Links(platform, perfmodel)
        self._single_node = len(self.nodes) == 1
        self.seed = seed

    @staticmethod
    def predict(task, kind):
        return None, task.cost[kind]
