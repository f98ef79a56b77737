"""``hn.from_torch`` and ``hn.to_torch``.

Goals: models defined in torch -- LeNet-5 written with functional calls and
``x.view(n, -1)``, a VGG-style stack of ``nn.Sequential`` blocks, ResNet-18 as
torchvision defines it (``BasicBlock`` with downsampling shortcuts, ``MaxPool2d(3, 2,
padding=1)``, ``AdaptiveAvgPool2d((1, 1))``, ``torch.flatten``; written out here, as
torchvision is not installed) and a MobileNet-style inverted residual block (depthwise
``groups=C`` convolution, ``ReLU6``, 1x1 projection, residual add) -- convert with
their weights; the forward outputs, the loss and 3 SGD-momentum steps equal torch's
within 1e-9 in float64 at granularity 1 and 3, and the policies give the same bits.
Dropout runs with ``p=0`` in the cross-checks (two generators' masks cannot agree).

Then: what does not convert says so in one line naming the node, its target and the
source line; ``to_torch`` gives back an equivalent module; importing hetero_nn never
imports torch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import hetero_nn as hn
from helpers import REPO, rel_err, torch_sgd_losses

torch = pytest.importorskip("torch", reason="PyTorch is optional; from_torch needs it")
nn = torch.nn
F = torch.nn.functional

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LR, MOMENTUM, STEPS, BATCH = 0.05, 0.9, 3, 6
REL = 1e-9


# --------------------------------------------------------------------------- torch models

class LeNet5(nn.Module):
    """LeNet-5 as tutorials write it: functional ReLU and pooling, ``x.view(n, -1)``."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), (2, 2))
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class VGGStyle(nn.Module):
    """Two VGG stages (conv-BN-ReLU twice, max pool), global pooling, a dropout head."""

    def __init__(self, num_classes=10, p=0.0):
        super().__init__()

        def stage(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True), nn.MaxPool2d(2, 2)]

        self.features = nn.Sequential(*stage(3, 8), *stage(8, 16))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(16, 32), nn.ReLU(True), nn.Dropout(p),
                                        nn.Linear(32, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def randomize_batch_norm(model, generator):
    """Running statistics and affine values other than 0 and 1, so that a mix-up shows."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.running_mean.normal_(0, 0.5, generator=generator)
                m.running_var.uniform_(0.5, 2.0, generator=generator)
                m.weight.normal_(1, 0.2, generator=generator)
                m.bias.normal_(0, 0.2, generator=generator)


class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock`` (``torchvision/models/resnet.py``)."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision's ``ResNet`` (``resnet18``: BasicBlock, [2, 2, 2, 2]), its initialisation
    included."""

    def __init__(self, block=BasicBlock, layers=(2, 2, 2, 2), num_classes=10):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, depthwise 3x3 (``groups`` = channels), ReLU6,
    1x1 projection, and the residual add where the shape allows."""

    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == oup
        self.conv = nn.Sequential(
            nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup))

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetStyle(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU6(inplace=True))
        self.blocks = nn.Sequential(InvertedResidual(16, 16, 1, 4), InvertedResidual(16, 24, 2, 4),
                                    InvertedResidual(24, 24, 1, 4))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(24, num_classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.classifier(x.flatten(1))


MODELS = {  # name: (constructor, one sample's shape)
    "lenet5": (LeNet5, (1, 28, 28)),
    "vgg": (VGGStyle, (3, 16, 16)),
    "resnet18": (ResNet, (3, 32, 32)),
    "mobilenet": (MobileNetStyle, (3, 16, 16)),
}


def torch_model(name):
    torch.manual_seed(0)
    model = MODELS[name][0]().double()
    randomize_batch_norm(model, torch.Generator().manual_seed(1))
    return model


def batches(name, steps=STEPS + 1):
    rng = np.random.default_rng(3)
    shape = MODELS[name][1]
    return [(rng.standard_normal((BATCH, *shape)), rng.integers(0, 10, BATCH))
            for _ in range(steps)]


def torch_state_of(model):
    """The torch model's weights and buffers: under the converted model's keys too."""
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def torch_train(model, data):
    model.train()
    return torch_sgd_losses(model, data, LR, MOMENTUM)


def hn_train(hn_model, data, held_out, g, policy):
    with hn.Runtime(devices="cpu:2", policy=policy, perfmodel=False) as rt, \
            hn.Trainer(hn_model, optimizer=hn.optim.SGD(hn_model.parameters(), lr=LR,
                                                        momentum=MOMENTUM),
                       runtime=rt, batch_size=BATCH, granularity=g) as trainer:
        hn_model.train()
        losses = [trainer.train_step(x, y) for x, y in data]
        hn_model.eval()
        logits = hn_model(held_out)
    return losses, hn_model.state_dict(), logits


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "resnet18"
                                  else name for name in MODELS])
def test_converted_model_trains_as_torch_and_the_policies_agree(name):
    """(ResNet-18: about a minute on two cores, so ``-m slow``; its conversion, forward pass
    and loss are checked by the test after this one in the default run.)"""
    data = batches(name)
    model = torch_model(name)
    hn_model = hn.from_torch(model, MODELS[name][1])
    assert hn_model.dtype == np.float64 and hn_model.input_shape == MODELS[name][1]
    model.eval(), hn_model.eval()
    x = torch.from_numpy(data[-1][0])
    with torch.no_grad():
        assert rel_err(hn_model(data[-1][0]), model(x).numpy()) <= REL
    hn.close_default_runtime()
    initial = hn_model.state_dict()
    assert list(initial) == list(torch_state_of(model))
    expected_losses = torch_train(model, data[:STEPS])
    expected = torch_state_of(model)
    model.eval()
    with torch.no_grad():
        expected_logits = model(x * 0.5).numpy()
    runs = {}
    for g, policy in ((1, "eager"), (3, "eager"), (3, "dmda"), (3, "heft")):
        hn_model.load_state_dict(initial)
        runs[g, policy] = losses, state, logits = hn_train(hn_model, data[:STEPS],
                                                           data[-1][0] * 0.5, g, policy)
        assert rel_err(losses, expected_losses) <= REL, (g, policy)
        for key, value in expected.items():
            assert rel_err(state[key], value) <= REL, (g, policy, key)
        assert rel_err(logits, expected_logits) <= REL
    for policy in ("dmda", "heft"):  # the same bits whatever the policy
        assert runs[3, policy][0] == runs[3, "eager"][0]
        assert all(np.array_equal(runs[3, policy][1][k], runs[3, "eager"][1][k])
                   for k in expected)


def test_resnet18_converts_with_its_forward_pass_and_loss_equal_to_torch():
    model = torch_model("resnet18")
    converted = hn.from_torch(model, MODELS["resnet18"][1])
    blocks = [(n, type(layer).__name__) for n, layer in converted.named_children()]
    assert blocks[:4] == [("conv1", "Conv2d"), ("bn1", "BatchNorm2d"), ("relu", "ReLU"),
                          ("maxpool", "MaxPool2d")]
    assert [n for n, kind in blocks if kind == "Residual"] == \
        [f"layer{i}_{j}" for i in range(1, 5) for j in range(2)]
    assert [converted.layer2_0.shortcut is None, converted.layer2_1.shortcut is None] == \
        [False, True]
    x, y = batches("resnet18", 1)[0]
    for mode in ("train", "eval"):
        getattr(model, mode)(), getattr(converted, mode)()
        with torch.no_grad():
            logits = model(torch.from_numpy(x))
            expected = F.cross_entropy(logits, torch.from_numpy(y)).item()
        ours = converted(x)
        assert rel_err(ours, logits.numpy()) <= REL, mode
        shifted = ours - ours.max(axis=1, keepdims=True)
        loss = -np.mean(shifted[np.arange(len(y)), y] - np.log(np.exp(shifted).sum(axis=1)))
        assert abs(loss - expected) <= REL * abs(expected), mode
    state = torch_state_of(model)
    ours = converted.state_dict()
    assert all(rel_err(ours[k], v) <= REL for k, v in state.items())
    hn.close_default_runtime()


def test_torch_state_dict_loads_strictly_both_ways():
    """A torch ResNet-18's ``state_dict`` (torch's keys, tensors) loads into the converted
    model with ``strict=True`` and the converted model's loads back into torch's; the keys
    survive the model's recorded architecture and ``to_torch``."""
    from hetero_nn.layers.registry import architecture, build
    model = torch_model("resnet18").float().eval()
    converted = hn.from_torch(model, MODELS["resnet18"][1]).eval()
    assert list(converted.state_dict()) == list(model.state_dict())
    assert "layer2.0.downsample.1.running_var" in converted.state_dict()
    torch.manual_seed(5)
    other = MODELS["resnet18"][0]().float()
    randomize_batch_norm(other, torch.Generator().manual_seed(6))
    other.eval()
    converted.load_state_dict(other.state_dict(), strict=True)
    x = np.random.default_rng(4).standard_normal((3, *MODELS["resnet18"][1])).astype(np.float32)
    with torch.no_grad():
        expected = other(torch.from_numpy(x)).numpy()
    assert rel_err(converted(x), expected) <= 1e-4
    model.load_state_dict({k: torch.from_numpy(v) for k, v in converted.state_dict().items()},
                          strict=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  other.state_dict().values()))
    with torch.no_grad():
        back = hn.to_torch(converted).eval()(torch.from_numpy(x)).numpy()
    assert rel_err(back, expected) <= 1e-4
    with pytest.raises(hn.errors.CheckpointError, match="unexpected keys"):
        converted.load_state_dict({**other.state_dict(), "fc.extra": torch.zeros(1)})
    rebuilt = build(architecture(converted))
    assert rebuilt.state_names == converted.state_names
    hn.close_default_runtime()


def test_names_and_structure_follow_the_torch_module():
    model = hn.from_torch(torch_model("vgg"), (3, 16, 16))
    assert model.names[:3] == ["features_0", "features_1", "features_2"]
    assert [type(layer).__name__ for layer in model][-6:] == \
        ["AdaptiveAvgPool2d", "Flatten", "Linear", "ReLU", "Dropout", "Linear"]
    lenet = hn.from_torch(torch_model("lenet5"), (1, 28, 28))
    assert [(n, type(layer).__name__) for n, layer in lenet.named_children()][5:8] == \
        [("max_pool2d_1", "MaxPool2d"), ("view", "Flatten"), ("fc1", "Linear")]


def test_modes_and_dtype_follow_the_module():
    model = torch_model("vgg")
    model.float().train()
    model.classifier.eval()
    converted = hn.from_torch(model, (3, 16, 16))
    assert converted.dtype == np.float32 and converted.training
    assert [layer.training for layer in converted][-4:] == [False] * 4
    assert hn.from_torch(model, (3, 16, 16), dtype="float64").dtype == np.float64
    assert model.training and not model.classifier.training  # the module is left as it was


# --------------------------------------------------------------------------- what does not convert

class Upsampling(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.up = nn.Upsample(scale_factor=2)

    def forward(self, x):
        return self.up(self.conv(x))


class Concatenating(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 1), nn.Conv2d(1, 2, 1)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], 1)


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(F.relu(self.conv(x)))


class DataDependent(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


class Reshaping(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), 2, -1)


class Doubling(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        y = self.conv(x)
        return y + y


class FlattenAll(nn.Module):
    def forward(self, x):
        return torch.flatten(x)  # start_dim=0: the batch too


@pytest.mark.parametrize("module, shape, match", [
    (Upsampling(), (1, 6, 6),
     r"^from_torch: node 'up' \(call_module 'up'\) at .*test_from_torch\.py:\d+ "
     r"`return self\.up\(self\.conv\(x\)\)`: torch\.nn\.modules\.upsampling\.Upsample does not "
     r"convert \(modules that do: .*Conv2d"),
    (Concatenating(), (1, 4, 4),
     r"^from_torch: node 'cat' \(call_function torch\.cat\) at .*test_from_torch\.py:\d+ "
     r"`return torch\.cat\(\[self\.a\(x\), self\.b\(x\)\], 1\)`: this operation does not "
     r"convert"),
    (Shared(), (2, 4, 4), r"node 'conv_1' .*module 'conv' is called twice .*shared weights"),
    (DataDependent(), (2, 4, 4), r"^from_torch: torch\.fx cannot trace DataDependent: "),
    (Reshaping(), (2, 4, 4), r"node 'view' .*a reshape of samples \(2, 4, 4\) to \(N, 2, -1\)"),
    (Doubling(), (2, 4, 4), r"node 'add' .*`return y \+ y`: a tensor added to itself"),
    (FlattenAll(), (2, 4, 4), r"node 'flatten' .*Flatten: start_dim must be 1"),
    (LeNet5(), (1, 20, 20), r"^from_torch: LeNet5 fails on inputs of shape \(N, 1, 20, 20\)"),
])
def test_what_does_not_convert_names_the_node_target_and_line(module, shape, match):
    with pytest.raises(hn.ConversionError, match=match) as info:
        hn.from_torch(module, shape)
    assert "\n" not in str(info.value)


def test_convolution_and_pooling_options_convert_both_ways():
    torch.manual_seed(4)
    source = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding="same", padding_mode="reflect"), nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6, bias=False),
        nn.Conv2d(6, 4, (1, 3), stride=(1, 2), padding=(0, 1), groups=2, padding_mode="circular"),
        nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
        nn.AvgPool2d(2, 1, padding=1, ceil_mode=True, count_include_pad=False),
        nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Linear(24, 5)).double().eval()
    model = hn.from_torch(source, (3, 9, 11))
    back = hn.to_torch(model).eval()
    x = np.random.default_rng(1).standard_normal((4, 3, 9, 11))
    with torch.no_grad():
        expected = source(torch.from_numpy(x)).numpy()
        assert rel_err(back(torch.from_numpy(x)).numpy(), expected) <= 1e-12
    assert rel_err(model.eval()(x), expected) <= 1e-10
    assert [type(layer).__name__ for layer in model][4:7] == \
        ["MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]
    assert repr(back[2]) == repr(source[2]) and repr(back[3]) == repr(source[3])
    hn.close_default_runtime()


def test_to_torch_builds_the_equivalent_module():
    hn.manual_seed(2)
    model = hn.Sequential(
        hn.Conv2D(3, 4, 3, padding=1, bias=False), hn.BatchNorm2d(4), hn.SiLU(),
        hn.Residual([hn.Conv2D(4, 4, 3, padding=1), hn.ReLU6(), hn.Dropout2d(0.0)]),
        hn.MaxPool2D(2), hn.LayerNorm((4, 4, 4)), hn.Hardswish(), hn.GlobalAvgPool2D(),
        hn.Flatten(), hn.Linear(4, 6), hn.BatchNorm1d(6), hn.LeakyReLU(0.1), hn.Dropout(0.0),
        hn.Linear(6, 3), hn.Softmax(dim=1))
    model.build((3, 8, 8), "float64")
    module = hn.to_torch(model)
    assert list(module.state_dict()) == list(model.state_dict())
    x = np.random.default_rng(0).standard_normal((5, 3, 8, 8))
    for mode in ("eval", "train"):
        getattr(model, mode)()
        module_out = hn.to_torch(model)(torch.from_numpy(x))
        assert rel_err(model(x), module_out.detach().numpy()) <= 1e-10
    back = hn.from_torch(hn.to_torch(model.eval()).eval(), (3, 8, 8))
    assert rel_err(back(x), model(x)) <= 1e-12
    hn.close_default_runtime()


def test_importing_hetero_nn_never_imports_torch():
    code = ("import sys, hetero_nn as hn; hn.Sequential(hn.Linear(2, 2)); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO),
                                                       "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
