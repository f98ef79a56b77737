"""Result files of the experiments: a provenance head and an atomic write of the JSON.

Every experiment writes ``<results>/<name>-<UTC time>.json`` and a copy as
``<name>-latest.json``: the git commit, versions and machine
(``hetero_nn.cli.environment``), the command line, the options, the load average and
the experiment's own fields. Files are written under a temporary name and renamed.

The experiments that train through the CLI as a user would (acceptance, spiking) run
each training with :func:`train_through_cli` and judge it with :func:`verdict`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


#: Built-in model -> the input the memory and pipeline studies train it on.
SHAPES = {"dahl-basic": (1, 28, 28), "lenet5": (1, 28, 28), "cifar-small": (3, 32, 32),
          "resnet-small": (3, 32, 32)}


def head(name, started, argv, options) -> dict:
    """The fields every result file starts with."""
    from hetero_nn.cli.run_folder import environment

    script = Path(sys.modules["__main__"].__file__ if argv is None else name + ".py")
    return {"experiment": name, "started_utc": started.isoformat(timespec="seconds"),
            "command": [sys.executable, *(sys.argv if argv is None else [str(script), *argv])],
            **environment(), "options": options, "load_average": os.getloadavg()}


def torch_missing(prog, hint) -> bool:
    """Whether PyTorch cannot be imported; if so, says it in one line on stderr."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"{prog}: error: PyTorch is not installed ({hint})", file=sys.stderr)
        return True
    return False


def write(document, folder, name, started) -> Path:
    """Write ``document`` as this run's file and as ``<name>-latest.json``; its path."""
    from hetero_nn.fileio import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    text = json.dumps(document, indent=1) + "\n"
    atomic_write_text(path, text)
    atomic_write_text(folder / f"{name}-latest.json", text)
    return path


def train_through_cli(name, cmd, out, target, **popen) -> tuple[dict, dict | None, str]:
    """Run the ``hetero-nn train`` command line ``cmd`` (whose ``--out`` is ``out``), echoing
    it and the run's output. Returns the run's record (command, return code, wall time,
    ``target`` test accuracy, and what its ``metrics.json`` says), the metrics themselves
    (None when the run wrote none) and the run's stderr. ``popen``: ``subprocess.run``'s
    ``cwd``/``env``."""
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **popen)
    wall = time.perf_counter() - t0
    print(proc.stdout, end="", flush=True)
    result = {"name": name, "command": cmd[1:], "returncode": proc.returncode,
              "wall_seconds": wall, "target_test_accuracy": target, "out": str(out)}
    metrics_path = Path(out) / "metrics.json"
    metrics = None
    if metrics_path.is_file():
        metrics = json.loads(metrics_path.read_text())
        result.update(config=metrics["config"], devices=metrics["devices"],
                      granularity=metrics["granularity"], epochs=metrics["epochs"],
                      status=metrics["status"], test_accuracy=metrics["test_accuracy"],
                      test_loss=metrics["test_loss"])
    else:
        result.update(status="failed", test_accuracy=None)
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-2000:]
        print(proc.stderr[-2000:], file=sys.stderr)
    return result, metrics, proc.stderr


def verdict(result) -> dict:
    """Set ``result["passed"]`` (the run succeeded and met its target, if it has one) and
    print the run's line; returns ``result``."""
    acc, target = result.get("test_accuracy"), result["target_test_accuracy"]
    result["passed"] = result["returncode"] == 0 and acc is not None and (
        target is None or acc >= target)
    shown = f"{acc:.2%}" if acc is not None else "-"
    goal = f"target {target:.1%}" if target is not None else "reported"
    print(f"== {result['name']}: test accuracy {shown} ({goal}) "
          f"{'PASS' if result['passed'] else 'FAIL'}; {result['wall_seconds']:.0f} s wall",
          flush=True)
    return result
