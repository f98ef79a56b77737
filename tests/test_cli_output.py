"""What ``hetero-nn train`` says a user needs to read (issue 30, items 6 and 8): where
``--pipeline`` cut, that nothing was kept without ``--out``, that a ``--limit`` run's test
accuracy is on a limited split, and every file the run wrote."""

from hetero_nn.cli import main

RUN = ["train", "--dataset", "synthetic", "--limit", "64", "--batch-size", "32",
       "--model", "dahl-basic", "--epochs", "1", "--devices", "cpu:2"]


def test_a_pipelined_limited_run_without_out_says_where_it_cut_and_that_nothing_was_kept(
        capsys):
    assert main([*RUN, "--pipeline", "2"]) == 0
    captured = capsys.readouterr()
    (cut,) = [line for line in captured.err.splitlines() if "pipeline of" in line]
    assert cut.startswith("hetero-nn: pipeline of 2 stages (1f1b): stage 0: block")
    assert " on cpu0" in cut and "; stage 1: block" in cut and " on cpu1" in cut
    out = captured.out.splitlines()
    assert "on the first 64 test samples (--limit 64), not the whole split" in out[-2]
    assert out[-1].startswith("nothing was kept: no --out DIR")


def test_the_wrote_line_lists_every_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*RUN, "-q", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (f"wrote {out}/metrics.json, metrics.csv, checkpoint.npz, "
                         "checkpoint-final.npz")
    assert all((out / name).is_file() for name in ("metrics.json", "metrics.csv",
                                                     "checkpoint.npz", "checkpoint-final.npz"))
