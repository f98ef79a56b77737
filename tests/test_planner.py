"""The planner: platform files of several machines and datasheet devices, the roofline for
codelets without a measured model, and the cluster path's predicted step and scaling.

The session's performance-model cache is empty (conftest), so every codelet here is
predicted by its device's roofline -- which the output must say.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetero_nn.cli import main
from hetero_nn.errors import ConfigError
from hetero_nn.simulation.platforms import Device, load_platform
from hetero_nn.training.cluster.planner import predict_cluster_step

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = REPO / "examples" / "platforms"
SHIPPED = ["h100-node.json", "four-h100-node.json", "cpu-cluster-64.json"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_platforms_load_and_source_every_figure(name):
    doc = json.loads((PLATFORMS / name).read_text())
    sources = doc["sources"]
    cited = [d["source"] for d in doc["devices"].values()]
    cited += [link["source"] for m in doc["machines"] for link in m.get("links", {}).values()]
    cited += [doc["network"]["source"]] if "network" in doc else []
    for entry in cited:
        assert all(key.strip() in sources for key in entry.split(";")), entry
    assert all(len(text) > 40 for text in sources.values())  # a citation, not a label
    platform = load_platform(PLATFORMS / name)
    assert platform.count == sum(m.get("count", 1) for m in doc["machines"])


def test_the_64_node_cluster_and_the_gpu_nodes():
    cluster = load_platform(PLATFORMS / "cpu-cluster-64.json")
    assert cluster.count == 64 and cluster.machine(63).cpus[1] == 128
    four = load_platform(PLATFORMS / "four-h100-node.json").machine(0).platform()
    assert four.workers == {"cpu": 32, "cuda": 4} and four.measured["cuda"] is False
    assert four.links["cuda-cuda"] == (1e-5, 450e9)


def test_a_figure_without_its_source_is_one_error_naming_the_entry(tmp_path):
    doc = json.loads((PLATFORMS / "h100-node.json").read_text())
    del doc["devices"]["h100-sxm5"]["source"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="device 'h100-sxm5': no 'source'"):
        load_platform(path)
    doc["devices"]["h100-sxm5"]["source"] = "h100-datasheet; no-such-key"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="no-such-key"):
        load_platform(path)
    doc["devices"]["h100-sxm5"].update(source="h100-datasheet", kind="tpu")
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="'kind' must be one of"):
        load_platform(path)


def test_the_one_machine_format_still_loads():
    platform = load_platform(PLATFORMS / "four-gpus.json")
    assert platform.count == 1
    assert platform.machine(0).platform().scale == {"cuda": ("cpu", 0.05)}


def test_roofline_is_the_slower_of_compute_and_memory_plus_the_launch():
    gpu = Device("g", "cuda", {"float32": 1e12, "float64": 5e11}, 1e11, launch_latency=5e-6,
                 efficiency={"compute": 0.5, "memory": 1.0})
    assert math.isclose(gpu.roofline(1e9, 1e3), 5e-6 + 1e9 / 5e11)           # compute-bound
    assert math.isclose(gpu.roofline(1e3, 1e9), 5e-6 + 1e9 / 1e11)           # memory-bound
    assert math.isclose(gpu.roofline(1e9, 1e3, "float64"), 5e-6 + 1e9 / 2.5e11)
    assert gpu.roofline(0, 0) == 5e-6


def test_a_gpu_node_is_predicted_by_roofline_and_says_so(capsys):
    assert main(["simulate", "--model", "lenet5", "--batch-size", "16", "--granularity", "2",
                 "--platform", str(PLATFORMS / "h100-node.json")]) == 0
    out = capsys.readouterr().out
    assert "cuda tasks predicted by roofline" in out and "(no measured model)" in out
    assert "cuda0" in out


def test_cluster_step_terms_grow_with_the_workers():
    """W=1: no message at all; more workers: more exposed reduction; batch norm's
    statistics are reductions on the critical path (resnet-small has them)."""
    platform = load_platform(PLATFORMS / "cpu-cluster-64.json")
    shape = (3, 8, 8)
    one = predict_cluster_step("resnet-small", shape, 16, 2, platform, 1, cpu_workers=2)
    two = predict_cluster_step("resnet-small", shape, 32, 4, platform, 2, cpu_workers=2)
    many = predict_cluster_step("resnet-small", shape, 512, 64, platform, 32, cpu_workers=2)
    dispatch = platform.dispatch  # the runtime's cost per task, messages or not
    assert one.exposed_seconds == 0
    assert one.statistics_seconds == pytest.approx(36 * dispatch)  # 9 batch norms x 4, no message
    assert 0 < two.statistics_seconds < many.statistics_seconds
    assert two.step_seconds < many.step_seconds
    assert len(two.buckets) >= 2  # buckets of at most 128 KiB: the reductions overlap
    assert all(done >= sent for _, sent, done in two.buckets)
    assert two.result.predicted_by["cpu"]["network"] > 0


def test_cli_projection_and_its_errors(capsys):
    args = ["simulate", "--model", "lenet5", "--batch-size", "32", "--granularity", "2",
            "--platform", str(PLATFORMS / "cpu-cluster-64.json"), "--cluster-threads", "2"]
    assert main([*args, "--cluster-workers", "1,4", "--scaling", "weak"]) == 0
    out = capsys.readouterr().out
    assert "weak scaling" in out and "speed-up" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 4] and [int(r[1]) for r in rows] == [32, 128]
    assert main([*args, "--cluster-workers", "65"]) == 2
    assert "has 64 machine(s)" in capsys.readouterr().err
