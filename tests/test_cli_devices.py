"""More CPU workers than cores, and ``--devices`` with ``--cluster``: one warning line
each, never silence (issue 30, item 5)."""

import pytest

from hetero_nn.cli import main
from hetero_nn.cli.connect import cores

RUN = ["train", "--dataset", "synthetic", "--limit", "32", "--batch-size", "32",
       "--model", "dahl-basic", "--epochs", "1", "-q"]


def _warnings(err):
    return [line for line in err.splitlines() if line.startswith("hetero-nn: warning:")]


def test_more_cpu_workers_than_cores_is_one_warning_line(capsys):
    n = cores() + 1
    assert main([*RUN, "--devices", f"cpu:{n}"]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert f"--devices cpu:{n}: {n} CPU workers on {cores()} cores" in line
    assert main([*RUN, "--devices", f"cpu:{cores()}"]) == 0
    assert _warnings(capsys.readouterr().err) == []


def test_devices_with_a_cluster_is_not_ignored_silently(capsys):
    pytest.importorskip("distributed")
    assert main([*RUN, "--cluster", "local:1", "--devices", "cpu:2"]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert "--devices cpu:2 with --cluster local:1: the cluster's workers train" in line
    assert "--cluster-devices cpu:2" in line
