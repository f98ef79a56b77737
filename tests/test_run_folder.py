"""A run's folder is never overwritten by accident, and the small messages of its options.

``--resume FILE --out DIR`` with FILE elsewhere is a new run as far as DIR is
concerned: refused when DIR holds another run, with the same message as a fresh run,
and ``--overwrite`` replaces that run. Interrupts and kills are in tests/faults/.
"""

import json

import pytest

from hetero_nn.cli import main
from hetero_nn.cli.run_folder import resume_command
from hetero_nn.training.checkpoint import CHECKPOINT_NAME, FINAL_NAME, read_checkpoint

RUN = ["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "32",
       "--model", "dahl-basic", "--devices", "cpu:1", "-q"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetero-nn: error: "), err
    return lines[0]


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished runs with other seeds: ``a`` (1 epoch) and ``b``."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("a", "1"), ("b", "2")):
        assert main([*RUN, "--epochs", "1", "--seed", seed, "--out", str(root / name)]) == 0
    return root


def test_resuming_a_file_elsewhere_into_another_run_is_refused(two_runs, tmp_path, capsys):
    target = tmp_path / "b"
    target.mkdir()
    for name, data in _snapshot(two_runs / "b").items():
        (target / name).write_bytes(data)
    before = _snapshot(target)
    capsys.readouterr()
    assert main(["train", "--resume", str(two_runs / "a" / CHECKPOINT_NAME), "--epochs", "2",
                 "--out", str(target), "-q"]) == 2
    line = _error_line(capsys)
    assert f"--out {target} holds another run" in line and "--overwrite" in line
    assert _snapshot(target) == before  # nothing of b touched
    # --overwrite: b goes, a's run continues there
    assert main(["train", "--resume", str(two_runs / "a" / CHECKPOINT_NAME), "--epochs", "2",
                 "--out", str(target), "--overwrite", "-q"]) == 0
    final = read_checkpoint(target / FINAL_NAME)
    assert final.epoch == 2 and final.config["run"]["seed"] == 1
    assert json.loads((target / "metrics.json").read_text())["config"]["seed"] == 1


def test_resuming_a_file_into_an_empty_folder_makes_it_resumable_at_once(two_runs, tmp_path):
    out = tmp_path / "fresh"
    assert main(["train", "--resume", str(two_runs / "a" / CHECKPOINT_NAME), "--epochs", "2",
                 "--out", str(out), "-q"]) == 0
    assert read_checkpoint(out / FINAL_NAME).epoch == 2


def test_overwrite_never_removes_the_checkpoint_being_resumed(two_runs, capsys):
    folder = two_runs / "a"
    before = _snapshot(folder)
    for argv in (["--resume"], ["--resume", str(folder / CHECKPOINT_NAME)]):
        assert main(["train", *argv, "--out", str(folder), "--overwrite", "--epochs", "2"]) == 2
        assert "--overwrite would remove" in _error_line(capsys)
    assert _snapshot(folder) == before


def test_epochs_zero_is_refused_in_one_line(tmp_path, capsys):
    assert main([*RUN, "--epochs", "0", "--out", str(tmp_path / "run")]) == 2
    line = _error_line(capsys)
    assert "--epochs" in line and "positive integer" in line and "'0'" in line
    assert not (tmp_path / "run").exists()


def test_an_option_the_run_did_not_have_says_none(two_runs, capsys):
    assert main(["train", "--out", str(two_runs / "a"), "--resume", "--clip-grad-norm", "1",
                 "--epochs", "2"]) == 2
    line = _error_line(capsys)
    assert "--clip-grad-norm 1.0 differs from the run's (none) in" in line
    assert "None" not in line
    assert main(["train", "--out", str(two_runs / "a"), "--resume", "--seed", "5"]) == 2
    assert "--seed 5 differs from the run's 1 in" in _error_line(capsys)


def test_the_resume_command_repeats_what_says_where_and_how(tmp_path):
    from hetero_nn.cli import build_parser

    args = build_parser().parse_args(["train", "--out", str(tmp_path / "my run"), "--devices",
                                      "cpu:2", "--policy", "dmda", "--checkpoint-every", "5",
                                      "--trace", "-q", "--seed", "4", "--lr", "0.1"])
    assert resume_command(args) == (f"hetero-nn train --out '{tmp_path / 'my run'}' --resume "
                                    "--devices cpu:2 --policy dmda --checkpoint-every 5 --trace "
                                    "--quiet")
