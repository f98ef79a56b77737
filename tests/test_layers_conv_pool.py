"""Conv2d, MaxPool2d, AvgPool2d and AdaptiveAvgPool2d as layers: PyTorch's names (the Keras
spellings are the same classes), arguments, defaults, state_dict keys and refusals; each
option through the runtime equal to the torch.nn module (float64 and float32, granularity
1 and 3, train and eval); which chains the fusion pass takes; shapes checked at build."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn.layers import fused
from test_layers_blocks import TOL, run_layer, torch_reference

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")]


# --------------------------------------------------------------------------- names and arguments

def test_pytorch_names_are_primary_and_keras_spellings_are_the_same_classes():
    assert hn.Conv2D is hn.Conv2d and hn.layers.Conv2D is hn.layers.Conv2d
    assert hn.MaxPool2D is hn.MaxPool2d and hn.AvgPool2D is hn.AvgPool2d
    assert hn.Conv2d.__name__ == "Conv2d" and hn.MaxPool2d.__name__ == "MaxPool2d"
    glob = hn.GlobalAvgPool2D()
    assert isinstance(glob, hn.AdaptiveAvgPool2d) and glob.output_size == 1
    assert glob.infer_shape((5, 3, 7)) == (5, 1, 1)


@pytest.mark.parametrize("ours, theirs", [
    (hn.Conv2d, torch.nn.Conv2d), (hn.MaxPool2d, torch.nn.MaxPool2d),
    (hn.AvgPool2d, torch.nn.AvgPool2d), (hn.AdaptiveAvgPool2d, torch.nn.AdaptiveAvgPool2d)])
def test_arguments_and_defaults_are_pytorchs(ours, theirs):
    mine = inspect.signature(ours.__init__).parameters
    torch_params = inspect.signature(theirs.__init__).parameters
    assert list(mine) == list(torch_params)
    for name, p in torch_params.items():
        assert mine[name].default == p.default, name


def test_conv_state_dict_and_initialisation_are_pytorchs():
    hn.manual_seed(0)
    layer = hn.Conv2d(6, 4, (3, 2), groups=2, dilation=2)
    twin = torch.nn.Conv2d(6, 4, (3, 2), groups=2, dilation=2)
    model = hn.Sequential(layer)
    model.build((6, 9, 9), "float64")
    ours = model.state_dict()
    assert list(ours) == ["0.weight", "0.bias"]
    assert {k[2:]: v.shape for k, v in ours.items()} == {
        k: tuple(v.shape) for k, v in twin.state_dict().items()}
    bound = 1 / np.sqrt(3 * 3 * 2)  # fan_in = in_channels / groups * kh * kw
    assert np.abs(ours["0.weight"]).max() <= bound and np.abs(ours["0.weight"]).max() > bound / 2


@pytest.mark.parametrize("make, match", [
    (lambda: hn.Conv2d(3, 4, 3, groups=2), "Conv2d: in_channels 3 must be divisible by groups"),
    (lambda: hn.Conv2d(4, 3, 3, groups=2), "Conv2d: out_channels 3 must be divisible by groups"),
    (lambda: hn.Conv2d(2, 2, 3, groups=0), "Conv2d: groups must be"),
    (lambda: hn.Conv2d(2, 2, 3, dilation=0), "Conv2d: dilation must be"),
    (lambda: hn.Conv2d(2, 2, 3, padding="full"), "Conv2d: padding must be an int, a pair"),
    (lambda: hn.Conv2d(2, 2, 3, padding=1.5), "Conv2d: padding must be an int, a pair"),
    (lambda: hn.Conv2d(2, 2, 3, stride=2, padding="same"), "Conv2d: padding='same' is not "
                                                           "supported for strided"),
    (lambda: hn.Conv2d(2, 2, 3, padding_mode="mirror"), "Conv2d: padding_mode must be one of"),
    (lambda: hn.Conv2d(2, 2, 3, device="cuda"), "Conv2d: device='cuda'"),
    (lambda: hn.Conv2d(2, 2, 3, dtype="int32"), "Conv2d: dtype must be float32 or float64"),
    (lambda: hn.MaxPool2d(2, padding=2), "MaxPool2d: padding \\(2, 2\\) must be at most half"),
    (lambda: hn.MaxPool2d(2, return_indices=True), "MaxPool2d: return_indices=True"),
    (lambda: hn.MaxPool2d(2, dilation=(1, 0)), "MaxPool2d: dilation must be"),
    (lambda: hn.AvgPool2d(3, padding=2), "AvgPool2d: padding"),
    (lambda: hn.AvgPool2d(3, divisor_override=0), "AvgPool2d: divisor_override"),
    (lambda: hn.AdaptiveAvgPool2d(0), "AdaptiveAvgPool2d: output_size"),
    (lambda: hn.AdaptiveAvgPool2d((2, 3, 4)), "AdaptiveAvgPool2d: output_size"),
    (lambda: hn.AdaptiveAvgPool2d("7"), "AdaptiveAvgPool2d: output_size"),
])
def test_bad_arguments_are_refused_at_construction_naming_the_layer(make, match):
    with pytest.raises(hn.ConfigError, match=match):
        make()


@pytest.mark.parametrize("layer, shape, match", [
    (hn.Conv2d(1, 2, 3, padding=3, padding_mode="reflect"), (1, 3, 8), "reflect"),
    (hn.Conv2d(1, 2, 3, dilation=3), (1, 6, 6), "does not fit"),
    (hn.MaxPool2d(3, 2), (4, 2, 2), "larger than the input"),
    (hn.MaxPool2d(2, 1, padding=1, dilation=4), (4, 3, 3), "holds no element"),
    (hn.AvgPool2d(5), (4, 3, 3), "larger than the input"),
    (hn.AdaptiveAvgPool2d(2), (4, 3), "expects input of shape \\(C, H, W\\)"),
])
def test_shapes_are_checked_at_build_naming_the_layer(layer, shape, match):
    with pytest.raises(hn.ShapeError, match=f"layer 0 \\({type(layer).__name__}.*{match}"):
        hn.Sequential(layer).build(shape)


def test_output_shapes_follow_pytorch():
    cases = [
        (lambda m: m.Conv2d(3, 6, 4, padding="same", dilation=(1, 2), groups=3), (3, 9, 10)),
        (lambda m: m.Conv2d(3, 6, 3, stride=(2, 1), padding="valid", dilation=2), (3, 11, 9)),
        (lambda m: m.MaxPool2d(3, 2, padding=1, ceil_mode=True), (2, 8, 9)),
        (lambda m: m.MaxPool2d((2, 3), (1, 2), dilation=(2, 1), ceil_mode=True), (2, 8, 9)),
        (lambda m: m.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 8, 9)),
        (lambda m: m.AvgPool2d(5, ceil_mode=True), (2, 3, 3)),  # one window, past the input
        (lambda m: m.AdaptiveAvgPool2d((None, 4)), (2, 8, 9)),
        (lambda m: m.AdaptiveAvgPool2d(12), (2, 8, 9)),
    ]
    for make, shape in cases:
        expected = tuple(make(torch.nn)(torch.zeros(1, *shape)).shape[1:])
        assert hn.Sequential(make(hn)).build(shape) == expected, make(hn)


# --------------------------------------------------------------------------- through the runtime

LAYERS = {  # name: (constructor, input shape (N, C, H, W))
    "conv-same-reflect": (lambda: hn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect"),
                          (5, 3, 7, 6)),
    "conv-even-same-replicate": (lambda: hn.Conv2d(2, 3, (2, 4), padding="same",
                                                   padding_mode="replicate"), (4, 2, 6, 7)),
    "conv-dilated-circular": (lambda: hn.Conv2d(2, 4, 3, padding=2, dilation=2,
                                                padding_mode="circular"), (4, 2, 7, 8)),
    "conv-grouped-strided": (lambda: hn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2,
                                               bias=False), (5, 4, 9, 8)),
    "conv-depthwise": (lambda: hn.Conv2d(4, 4, 3, padding=1, groups=4), (5, 4, 8, 8)),
    "conv-depthwise-multiplier": (lambda: hn.Conv2d(3, 6, (3, 5), stride=(1, 2), padding=(1, 2),
                                                    dilation=(2, 1), groups=3, bias=False),
                                  (4, 3, 9, 10)),
    "conv-valid": (lambda: hn.Conv2d(2, 3, 3, padding="valid"), (4, 2, 6, 6)),
    "maxpool-stem": (lambda: hn.MaxPool2d(3, 2, padding=1), (4, 3, 9, 9)),
    "maxpool-ceil-dilated": (lambda: hn.MaxPool2d((3, 2), (2, 1), padding=1, dilation=(1, 2),
                                                  ceil_mode=True), (4, 2, 8, 7)),
    "avgpool-ceil-exclude": (lambda: hn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                  count_include_pad=False), (4, 2, 6, 7)),
    "avgpool-divisor": (lambda: hn.AvgPool2d((2, 3), divisor_override=4), (4, 2, 6, 7)),
    "adaptive-7": (lambda: hn.AdaptiveAvgPool2d(3), (4, 3, 7, 8)),
    "adaptive-none": (lambda: hn.AdaptiveAvgPool2d((None, 5)), (4, 2, 5, 3)),
    "global": (hn.GlobalAvgPool2D, (4, 3, 5, 6)),
}


@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_backward_equal_torch(name, dtype, g):
    make, x_shape = LAYERS[name]
    rng = np.random.default_rng(len(name) * 17 + g)
    hn.manual_seed(len(name))
    layer = make()
    x = (rng.standard_normal(x_shape) * 2 + 0.5).astype(dtype)
    out_shape = layer.build(x_shape[1:], dtype)
    dy = rng.standard_normal((x_shape[0], *out_shape)).astype(dtype)
    y_ref, dx_ref, grads_ref, _ = torch_reference(layer, x.astype(np.float64),
                                                  dy.astype(np.float64))
    y, dx, grads, _ = run_layer(layer, x, dy, g, dtype)
    assert y.dtype == np.dtype(dtype) and y.shape == y_ref.shape
    assert np.abs(y - y_ref).max() <= TOL[dtype] * max(1.0, np.abs(y_ref).max())
    assert np.abs(dx - dx_ref).max() <= TOL[dtype] * max(1.0, np.abs(dx_ref).max())
    assert grads.keys() == grads_ref.keys()
    for key, grad in grads.items():
        scale = max(1.0, float(np.abs(grads_ref[key]).max()))
        assert np.abs(grad - grads_ref[key]).max() <= TOL[dtype] * scale, key


def test_depthwise_layer_submits_the_depthwise_codelets():
    layer = hn.Conv2d(4, 8, 3, groups=4)
    assert layer.depthwise and layer.fwd.name == "conv2d_depthwise_fwd"
    assert layer.bwd_params.name == "conv2d_depthwise_bwd_params"
    assert "groups" not in layer._kw
    for not_depthwise in (hn.Conv2d(1, 4, 3), hn.Conv2d(4, 8, 3, groups=2)):
        assert not not_depthwise.depthwise and not_depthwise.fwd.name == "conv2d_fwd"


# --------------------------------------------------------------------------- fusion

def test_fusion_takes_every_option_but_depthwise():
    chain = [hn.Conv2d(4, 8, 3, padding="same", dilation=2, groups=2, padding_mode="circular"),
             hn.ReLU(), hn.MaxPool2d(3, 2, padding=1, dilation=(1, 2), ceil_mode=True)]
    blocks = fused.choose_fusion(chain)
    assert [type(b).__name__ for _, b in blocks] == ["ConvReLUPool"]
    assert blocks[0][1]._kw() == {"stride": 1, "padding": "same", "dilation": 2, "groups": 2,
                                  "padding_mode": "circular", "pool_size": 3, "pool_stride": 2,
                                  "pool_padding": 1, "pool_dilation": (1, 2),
                                  "pool_ceil_mode": True}
    depthwise = [hn.Conv2d(4, 4, 3, groups=4), hn.ReLU(), hn.MaxPool2d(2)]
    assert [type(b).__name__ for _, b in fused.choose_fusion(depthwise)] == ["Conv2d", "ReLU",
                                                                    "MaxPool2d"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_fused_chain_with_options_equals_torch_and_the_unfused_layers(dtype):
    def model(fuse):
        hn.manual_seed(3)
        return hn.Sequential(
            hn.Conv2d(4, 6, (3, 2), padding="same", dilation=(1, 2), groups=2,
                      padding_mode="reflect"),
            hn.ReLU(), hn.MaxPool2d(3, 2, padding=1, ceil_mode=True), fuse=fuse)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4, 7, 9)).astype(dtype)
    fused_model, plain = model(True), model(False)
    out_shape = fused_model.build(x.shape[1:], dtype)
    plain.build(x.shape[1:], dtype)
    dy = rng.standard_normal((5, *out_shape)).astype(dtype)
    y_ref, dx_ref, grads_ref, _ = torch_reference(fused_model, x.astype(np.float64),
                                                  dy.astype(np.float64))
    runs = [run_layer(m, x, dy, 3, dtype) for m in (fused_model, plain)]
    assert [type(b).__name__ for _, b in fused_model._plan()] == ["ConvReLUPool"]
    for y, dx, grads, _ in runs:
        assert np.abs(y - y_ref).max() <= TOL[dtype] * np.abs(y_ref).max()
        assert np.abs(dx - dx_ref).max() <= TOL[dtype] * np.abs(dx_ref).max()
        for key, grad in grads.items():
            assert np.abs(grad - grads_ref[key]).max() <= TOL[dtype] * np.abs(
                grads_ref[key]).max(), key
