"""The roofline's FLOP counts and step sums (:mod:`hetero_nn.cli.roofline`): a convolution's
FLOPs counted by hand against those captured from a model's training step, the
convolutions' codelets sorted into the forward and backward sums, and the training
steps' records told from the validation pass's."""

from __future__ import annotations

import pytest

from hetero_nn.cli.roofline import conv_pass, model_flops, step_records, step_sums
from hetero_nn.layers import Conv2D, Dense, Flatten, ReLU, Sequential
from hetero_nn.scheduler.trace.records import TaskRecord
from hetero_nn.scheduler.trace.views import Trace


def test_a_convolution_s_flops_counted_by_hand():
    model = Sequential(Conv2D(3, 4, 3, padding=1, bias=False), ReLU(), Flatten(),
                       Dense(4 * 5 * 5, 3))
    model.build((3, 5, 5), "float64")
    flops = model_flops(model, None, batch=4, granularity=2, evaluate=False)
    # per image: 4 output channels x 5x5 pixels, each 3x3x3 multiply-adds (2 FLOPs each)
    per_partition = 2 * (2 * 4 * 5 * 5 * 3 * 3 * 3)
    assert flops["conv2d_fwd_nobias"] == (2, 2 * per_partition)
    # the weight gradient's REDUX: the first partition overwrites, the other accumulates
    assert flops["conv2d_bwd_weight.overwrite"] == flops["conv2d_bwd_weight"] == (1, per_partition)
    assert "conv2d_bwd_input" not in flops  # the first layer's input needs no gradient


def test_step_sums_add_the_convolutions_by_pass():
    assert [conv_pass(n) for n in ("conv2d_fwd_nobias", "conv2d_relu_pool_fwd",
                                   "conv2d_folded_fwd", "conv2d_bwd_input",
                                   "conv2d_bwd_weight.overwrite", "conv2d_depthwise_fwd",
                                   "dense_fwd", "bn_act_fwd", "total")] == [
        "forward", "forward", "forward", "backward", "backward", None, None, None, None]
    rows = [{"codelet": c, "tasks": t, "gflop": f, "seconds": s} for c, t, f, s in (
        ("conv2d_fwd_nobias", 4, 2.0, 0.1), ("conv2d_bwd_input", 2, 1.0, 0.05),
        ("conv2d_bwd_weight", 4, 2.0, 0.15), ("conv2d_depthwise_fwd", 4, 0.5, 0.2),
        ("dense_fwd", 2, 0.1, 0.01))]
    fwd, bwd = step_sums(rows, rate=40.0)
    assert (fwd["codelet"], fwd["tasks"], fwd["gflop"]) == ("conv forward", 4, 2.0)
    assert fwd["gflops"] == pytest.approx(20.0) and fwd["share"] == pytest.approx(0.5)
    assert (bwd["codelet"], bwd["tasks"], bwd["gflop"]) == ("conv backward", 6, 3.0)
    assert bwd["gflops"] == pytest.approx(15.0) and bwd["share"] == pytest.approx(0.375)
    assert step_sums(rows[3:], rate=40.0) == []


def test_the_steps_records_leave_the_validation_pass_out():
    records = [TaskRecord(i, "conv2d_fwd_nobias", "cpu", "cpu0", "cpu", "host0", 0.0, 0.0,
                          float(i), i + 0.5) for i in range(5)]
    trace = Trace(records, ["cpu0"])
    assert step_records(trace) == (records, "every task of the trace (5)")  # a stream's
    trace.metadata.update(global_steps=[4, 5], step_tasks=3)  # what train --trace writes
    assert step_records(trace) == (records[:3], "training steps 4..5 (3 tasks; the "
                                                "validation pass's 2 left out)")
    trace.metadata["step_tasks"] = 9  # not this trace's: read whole
    assert step_records(trace)[0] == records
