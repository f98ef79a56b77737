"""benchmarks/bench_codelets_conv_options.py runs (batch 1, one timed call): a row per CPU
variant of every codelet it names, each against a PyTorch time."""

import pytest
from helpers import load_script

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


def test_every_new_codelet_gets_its_rows(capsys):
    pytest.importorskip("torch", reason="the benchmark compares with PyTorch")
    script = load_script("benchmarks/bench_codelets_conv_options.py")
    assert script.main(["--batch", "1", "--repeat", "1", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    fastest = out.split("fastest non-reference variant")[1].splitlines()[1:]
    names = {line.split()[1] for line in fastest if line.strip()}
    assert names == {
        "conv2d_depthwise_fwd", "conv2d_depthwise_bwd_input", "conv2d_depthwise_bwd_params",
        "conv2d_fwd", "conv2d_bwd_input", "conv2d_bwd_params", "maxpool2d_fwd", "maxpool2d_bwd",
        "avgpool2d_fwd", "avgpool2d_bwd", "adaptive_avgpool2d_fwd", "adaptive_avgpool2d_bwd"}
    rows = [line.split() for line in fastest if line.strip()]
    assert len(rows) == 3 * len(script.CONVS) + 2 * (len(script.MAX_POOLS) + len(script.AVG_POOLS)
                                                     + len(script.ADAPTIVE))
    assert all(len(r) == 7 and min(map(float, r[3:])) >= 0 for r in rows)  # times and ratios
