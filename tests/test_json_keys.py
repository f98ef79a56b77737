"""A misspelled key in a JSON file the user writes is refused, naming the file, the key
and the closest valid one (issue 30, item 1)."""

import json
from pathlib import Path

import pytest

import hetero_nn as hn
from hetero_nn.cli import main as cli_main
from hetero_nn.simulation.platforms import load_platform
from hetero_nn.simulation.machine import Platform

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "platforms"


def test_a_misspelled_top_level_key_is_refused_with_the_closest_valid_one(tmp_path):
    path = tmp_path / "typo-key.json"
    path.write_text(json.dumps({"name": "t", "wokers": {"cpu": 2}}))
    for load in (Platform.load, load_platform):
        with pytest.raises(hn.ConfigError) as info:
            load(path)
        message = str(info.value)
        assert "\n" not in message
        assert "typo-key.json" in message and "'wokers'" in message
        assert "did you mean 'workers'?" in message


@pytest.mark.parametrize("entry, expected", [
    (("links", "host-cuda", {"latency": 1e-5, "bandwith": 1e10}), "'bandwidth'"),
    (("scale", "cuda", {"from": "cpu", "factr": 0.1}), "'factor'"),
])
def test_a_misspelled_nested_key_of_the_one_machine_format_is_refused(tmp_path, entry, expected):
    doc = json.loads((EXAMPLES / "one-gpu.json").read_text())
    group, name, value = entry
    doc[group][name] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(hn.ConfigError, match=f"p.json: {group} '{name}': unknown key .*"
                                             f"did you mean {expected}"):
        Platform.load(path)


def _rename(doc, where, old, new):
    entry = doc
    for step in where:
        entry = entry[step]
    entry[new] = entry.pop(old)


@pytest.mark.parametrize("where, old, new, named", [
    ((), "machines", "machnes", "'machines'"),
    ((), "network", "netwrk", "'network'"),
    (("devices", "h100-sxm5"), "memory_bandwidth", "memory_bandwith", "'memory_bandwidth'"),
    (("devices", "h100-sxm5", "efficiency"), "compute", "compte", "'compute'"),
    (("devices", "h100-sxm5", "peak_flops"), "float64", "flaot64", "'float64'"),
    (("machines", 0), "count", "cont", "'count'"),
    (("machines", 0, "gpus"), "count", "cuont", "'count'"),
    (("machines", 0, "links", "host-cuda"), "latency", "latncy", "'latency'"),
])
def test_a_misspelled_key_of_a_platform_of_machines_is_refused(tmp_path, where, old, new,
                                                                named):
    doc = json.loads((EXAMPLES / "h100-node.json").read_text())
    doc.setdefault("network", {"latency": 1e-6, "bandwidth": 1e9, "source": "pcie5"})
    _rename(doc, where, old, new)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(hn.ConfigError) as info:
        load_platform(path)
    message = str(info.value)
    assert message.startswith(f"--platform {path}")
    assert f"unknown key {new!r}; did you mean {named}?" in message


def test_a_key_close_to_none_lists_the_valid_ones(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"workers": {"cpu": 1}, "zzz": 1}))
    with pytest.raises(hn.ConfigError, match="unknown key 'zzz'; the keys are 'name', "
                                             "'workers'"):
        Platform.load(path)


def test_every_example_platform_still_loads():
    for path in sorted(EXAMPLES.glob("*.json")):
        assert load_platform(path).machines


def test_the_cli_refuses_the_typo_in_one_line_with_a_non_zero_exit(tmp_path, capsys):
    path = tmp_path / "typo-key.json"
    path.write_text(json.dumps({"name": "t", "wokers": {"cpu": 2}}))
    status = cli_main(["simulate", "--model", "lenet5", "--batch-size", "8",
                       "--platform", str(path)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "typo-key.json: unknown key 'wokers'; did you mean 'workers'?" in err
