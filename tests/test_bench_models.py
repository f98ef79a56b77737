"""benchmarks/bench_models.py on a run of one step: every configuration gives a row (the
ratio to PyTorch beside hetero_nn's), and the per-layer roofline a share of the sgemm
rate for each pass of each convolution, and a traced step's convolution sums."""

import json

import pytest
from helpers import load_script


@pytest.mark.slow  # about 18 s (the sgemm rate, six timed rows): CI is near its 20 minutes
def test_rows_and_roofline(tmp_path, capsys):
    pytest.importorskip("torch", reason="the benchmark compares with PyTorch")
    out = tmp_path / "models.json"
    load_script("benchmarks/bench_models.py").main([
        "--models", "lenet5", "--batches", "4", "--rounds", "1", "--steps", "1",
        "--warmup", "1", "--no-compile", "--json", str(out)])
    doc = json.loads(out.read_text())
    configs = [r["config"] for r in doc["rows"]]
    assert configs == ["hn train g=2", "torch train", "hn infer model(x)", "torch infer"]
    assert all(r["img_s"] > 0 and r["vs_torch"] > 0 for r in doc["rows"])
    assert [r["layer"] for r in doc["roofline"]] == ["0", "3"]  # LeNet-5's two convolutions
    assert all(0 < r[f"{k}_share"] for r in doc["roofline"]
               for k in ("fwd", "bwd_input", "bwd_weight"))
    # the traced training step's sums: every convolution task of the step, by pass
    assert [(r["codelet"], r["tasks"]) for r in doc["step_sums"]] == [
        ("conv forward", 4), ("conv backward", 4)]  # 2 layers x 2 partitions, one step
    assert all(r["gflop"] > 0 and r["share"] > 0 for r in doc["step_sums"])
    assert "hn train g=2" in capsys.readouterr().out


def test_fusion_bench_compares_before_and_now(capsys):
    pytest.importorskip("torch", reason="the models come over by to_torch/from_torch")
    rows = load_script("benchmarks/bench_models_fusion.py").main([
        "--models", "cifar-small", "--batch", "4", "--rounds", "1", "--warmup", "1"])
    assert [(r[0], r[1]) for r in rows] == [("cifar-small", "train"), ("cifar-small", "infer")]
    assert all(r[2] > 0 and r[3] > 0 for r in rows)
    assert "before" in capsys.readouterr().out
