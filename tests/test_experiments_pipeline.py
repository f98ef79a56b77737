"""experiments/pipeline.py end to end, tiny: a data-parallel row and a row per schedule,
with the bubble measured from the trace beside the ideal."""

import json

import pytest

from helpers import load_script


def test_tiny_run_writes_rows(tmp_path):
    study = load_script("experiments/pipeline.py")
    argv = ["--stages", "2", "--granularities", "4", "--batch", "8", "--steps", "1",
            "--warmup", "1", "--results", str(tmp_path)]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "pipeline-latest.json").read_text())
    assert [r["side"] for r in doc["rows"]] == ["data-parallel", "pipeline 1f1b", "pipeline gpipe"]
    for r in doc["rows"]:
        assert r["images_per_s"] > 0 and r["stages"] == 2 and r["g"] == 4
    for r in doc["rows"][1:]:
        assert 0 <= r["bubble"] < 1 and r["ideal_bubble"] == 0.2 and r["imbalance"] >= 1


@pytest.mark.slow  # about 14 s (two Dask workers); the pipeline's own tests cover the cluster path
def test_tiny_run_on_two_dask_workers_compares_with_data_parallelism(tmp_path):
    study = load_script("experiments/pipeline.py")
    argv = ["--cluster", "local:2", "--stages", "2", "--granularities", "4", "--batch", "8",
            "--steps", "1", "--warmup", "1", "--schedules", "gpipe", "--results", str(tmp_path)]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "pipeline-latest.json").read_text())
    assert [r["side"] for r in doc["rows"]] == ["data-parallel", "pipeline gpipe"]
    assert all(r["cluster"] == "local:2" and r["images_per_s"] > 0 for r in doc["rows"])
    staged = doc["rows"][1]
    assert 0 <= staged["bubble"] < 1 and staged["ideal_bubble"] == 0.2
    assert len(staged["stage_bubbles"]) == 2 and len(staged["cut"]) == 2


def test_the_uniform_study_model_and_pipedream_rows(tmp_path):
    study = load_script("experiments/pipeline.py")
    argv = ["--models", "mlp-uniform", "--stages", "2", "--granularities", "4", "--batch", "8",
            "--steps", "1", "--warmup", "1", "--schedules", "pipedream", "--results",
            str(tmp_path)]
    assert study.main(argv) == 0
    doc = json.loads((tmp_path / "pipeline-latest.json").read_text())
    piped = doc["rows"][1]
    assert piped["side"] == "pipeline pipedream" and piped["schedule_run"] == "pipedream"
    assert 0 <= piped["overhead_free_bubble"] < 1 and piped["stage_imbalance"] >= 1
    assert sum(len(stage["blocks"]) for stage in piped["cut"]) == 11  # Flatten, 9 fused, head
