"""snnTorch twins of hetero_nn's spiking networks, for the tests that compare with snnTorch.

``snn_twin(model, dtype)`` is a torch module that runs ``model``'s layers one time step at
a time, as snnTorch's tutorials do: every layer at every step (a layer before the model's
``Repeat`` too), each LIF as ``snn.Leaky`` with the fast-sigmoid surrogate in float32, or
as :class:`Leaky64` in float64, with a copy of the model's weights. Its forward takes the
batch (and the spikes of a ``RateEncode`` model, drawn by hetero_nn's own encoder so both
see the same) and returns the output record ``(N, T, K)`` and every LIF's spikes and
membranes. torch and snntorch are imported by the caller (``pytest.importorskip``).

:class:`Leaky64` keeps ``snn.Leaky``'s equations in its order (``mem_reset``, then
``_base_sub`` / ``_base_zero``, then ``fire``), ``reset_delay=True`` and the fast-sigmoid
surrogate ``FastSigmoid``, but its spikes keep the membrane's dtype: snnTorch's surrogate
returns float32 spikes, which rounds every gradient through a spike to float32.
"""

from __future__ import annotations

import numpy as np

import hetero_nn as hn
from twins import torch_module


def _torch():
    import torch
    return torch


def leaky64_class():
    torch = _torch()

    class FastSigmoid(torch.autograd.Function):
        """snntorch.surrogate.FastSigmoid with spikes in the input's dtype."""

        @staticmethod
        def forward(ctx, input_, slope):
            ctx.save_for_backward(input_)
            ctx.slope = slope
            return (input_ > 0).to(input_.dtype)

        @staticmethod
        def backward(ctx, grad_output):
            (input_,) = ctx.saved_tensors
            return grad_output.clone() / (ctx.slope * torch.abs(input_) + 1.0) ** 2, None

    class Leaky64(torch.nn.Module):
        """snn.Leaky's forward (reset_delay=True) with float64-preserving spikes."""

        def __init__(self, beta, threshold, slope, reset, learn_beta, learn_threshold):
            super().__init__()
            for name, value, learn in (("beta", beta, learn_beta),
                                       ("threshold", threshold, learn_threshold)):
                value = torch.as_tensor(value, dtype=torch.float64)
                if learn:
                    setattr(self, name, torch.nn.Parameter(value))
                else:
                    self.register_buffer(name, value)
            self.slope = slope
            self.reset_mechanism = reset

        def spike_grad(self, x):
            return FastSigmoid.apply(x, self.slope)

        def forward(self, input_, mem=None):
            if mem is None or mem.shape != input_.shape:
                mem = torch.zeros_like(input_)
            reset = self.spike_grad(mem - self.threshold).clone().detach()  # mem_reset
            if self.reset_mechanism == "subtract":
                mem = (self.beta.clamp(0, 1) * mem + input_) - reset * self.threshold
            else:
                mem = (1 - reset) * mem
                mem = self.beta.clamp(0, 1) * mem + input_
            return self.spike_grad(mem - self.threshold), mem

    return Leaky64


def leaky(layer, dtype):
    """The snnTorch neuron for a hetero_nn LIF: ``snn.Leaky`` (float32) or Leaky64."""
    torch = _torch()
    kw = dict(learn_beta=layer.learn_beta, learn_threshold=layer.learn_threshold)
    if np.dtype(dtype) == np.float64:
        return leaky64_class()(layer.beta, layer.threshold, layer.slope, layer.reset, **kw)
    import snntorch as snn
    from snntorch import surrogate
    return snn.Leaky(beta=torch.tensor(layer.beta), threshold=torch.tensor(layer.threshold),
                     spike_grad=surrogate.fast_sigmoid(slope=layer.slope),
                     reset_mechanism=layer.reset, **kw)


def snn_twin(model, dtype, once=True):
    """The step-by-step torch twin of the built spiking Sequential ``model`` (see above).

    ``once``: the layers before a ``Repeat`` run once, as in ``model`` (the same values
    as running them at every step); False runs them at every step, as snnTorch's
    tutorials write a network fed the same image each step."""
    torch = _torch()
    tdtype = getattr(torch, np.dtype(dtype).name)

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kinds = []
            mods = {}
            for i, layer in enumerate(model):
                if isinstance(layer, hn.layers.LIF):
                    mods[str(i)] = leaky(layer, dtype)
                    self.kinds.append(("lif", layer.output))
                elif isinstance(layer, (hn.layers.Repeat, hn.layers.RateEncode)):
                    self.kinds.append((type(layer).__name__, layer.time_steps))
                else:
                    mods[str(i)] = torch_module(layer)
                    self.kinds.append(("step", None))
            self.layers = torch.nn.ModuleDict(mods)

        def forward(self, x, spikes=None):
            steps = next(arg for kind, arg in self.kinds if kind in ("Repeat", "RateEncode"))
            mems = {}
            records = {}
            out = []
            start = 0
            for i, (kind, arg) in enumerate(self.kinds):  # the layers before a Repeat: once
                if not once or kind in ("Repeat", "RateEncode"):
                    break
                x = self.layers[str(i)](x)
                start = i + 1
            for t in range(steps):
                h = x
                for i, (kind, arg) in enumerate(self.kinds[start:], start):
                    if kind == "RateEncode":
                        h = spikes[:, t]
                    elif kind == "lif":
                        neuron = self.layers[str(i)]
                        if t == 0 and hasattr(neuron, "init_leaky"):
                            mems[i] = neuron.init_leaky()
                        spk, mems[i] = neuron(h, mems.get(i))
                        records.setdefault(i, []).append((spk, mems[i]))
                        h = spk if arg == "spikes" else mems[i]
                    elif kind == "step":
                        h = self.layers[str(i)](h)
                out.append(h)
            stacked = {i: (torch.stack([s for s, _ in r], 1), torch.stack([m for _, m in r], 1))
                       for i, r in records.items()}
            return torch.stack(out, 1), stacked

    twin = Twin().to(tdtype)
    state = {k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, p in twin.named_parameters():
            layer, attr = name.split(".", 1)[1].split(".", 1)
            p.copy_(state[f"{layer}.{attr}"])
    return twin
