"""Result files of the experiments: a provenance head and an atomic write of the JSON.

Every experiment writes ``<results>/<name>-<UTC time>.json`` and a copy as
``<name>-latest.json``: the git commit, versions and machine
(``hetero_nn.cli.environment``), the command line, the options, the load average and
the experiment's own fields. Files are written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import os
import sys
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
