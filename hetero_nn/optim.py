"""Optimizers with ``torch.optim``'s arguments, built without parameters.

``hn.optim.SGD(lr=0.05, momentum=0.9)`` is a recipe; the trainer calls
``bind(parameters, rt)`` and then ``step(rt)`` once per batch, which submits
one update task per parameter after that batch's gradient tasks. State buffers
(momentum, Adam's moments) are host arrays registered with the runtime, so
checkpoints read them with ``state_dict()``.
"""

from __future__ import annotations

import numpy as np

from .codelets.optim import adam_step, sgd_step, sgd_step_plain
from .errors import CheckpointError, ConfigError


def _check(value, name, owner, minimum=0.0, maximum=None, open_max=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}: {name} must be a number, got {value!r}") from None
    if not np.isfinite(v) or v < minimum or (maximum is not None and
                                              (v >= maximum if open_max else v > maximum)):
        bound = f" and {'<' if open_max else '<='} {maximum}" if maximum is not None else ""
        raise ConfigError(f"{owner}: {name} must be >= {minimum}{bound}, got {value!r}")
    return v


class Optimizer:
    """Base: parameters bound later; ``step`` submits the update tasks."""

    buffers: tuple[str, ...] = ()

    def __init__(self):
        self.params = []
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self._handles: dict = {}
        self._rt = None
        self.steps = 0

    def bind(self, named_parameters, rt):
        """Attach ``[(name, Parameter), ...]`` (creating zeroed buffers) and register with ``rt``."""
        self.params = list(named_parameters)
        for name, p in self.params:
            st = self.state.get(name)
            if st is None or any(st[b].shape != p.data.shape or st[b].dtype != p.data.dtype
                                 for b in self.buffers):
                self.state[name] = {b: np.zeros_like(p.data) for b in self.buffers}
        self._rt = rt
        self._handles = {name: [rt.register(self.state[name][b], name=f"{name}.{b}")
                                for b in self.buffers] for name, _ in self.params}

    def _sync(self):
        """Make the host copies of the buffers current."""
        if self._rt is not None and not self._rt.closed:
            for hs in self._handles.values():
                for h in hs:
                    self._rt.fetch(h)

    def step(self, rt):
        if rt is not self._rt:
            self.bind(self.params, rt)
        self.steps += 1
        for name, p in self.params:
            self._submit(rt, p, self._handles[name])

    def _submit(self, rt, p, buffers):
        raise NotImplementedError

    def hyper(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """``{"steps": int, "hyper": {...}, "state": {param: {buffer: array}}}`` (copies)."""
        self._sync()
        return {"steps": self.steps, "hyper": self.hyper(),
                "state": {n: {b: a.copy() for b, a in st.items()} for n, st in self.state.items()}}

    def load_state_dict(self, sd):
        self._sync()
        self.steps = int(sd["steps"])
        for name, st in sd["state"].items():
            for b, a in st.items():
                if b not in self.buffers:
                    raise CheckpointError(f"{type(self).__name__}: unknown state buffer {b!r} of {name!r}")
                cur = self.state.get(name, {}).get(b)
                if cur is not None and cur.shape == np.shape(a):
                    cur[...] = a
                else:
                    self.state.setdefault(name, {})[b] = np.array(a)
        if self._rt is not None and not self._rt.closed:
            self.bind(self.params, self._rt)  # host copies changed: register them again

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _check(value, "lr", type(self).__name__)


class SGD(Optimizer):
    """``torch.optim.SGD(lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)``."""

    def __init__(self, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__()
        self.lr = lr
        self.momentum = _check(momentum, "momentum", "SGD")
        self.dampening = _check(dampening, "dampening", "SGD")
        self.weight_decay = _check(weight_decay, "weight_decay", "SGD")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError("SGD: Nesterov momentum requires a momentum and zero dampening")
        self.buffers = ("momentum_buffer",) if self.momentum else ()

    def _submit(self, rt, p, buffers):
        if self.momentum:
            rt.submit(sgd_step, p.handle, p.grad, buffers[0], lr=self.lr, momentum=self.momentum,
                      dampening=self.dampening, weight_decay=self.weight_decay,
                      nesterov=self.nesterov, first=self.steps == 1)
        else:
            rt.submit(sgd_step_plain, p.handle, p.grad, lr=self.lr, weight_decay=self.weight_decay)

    def hyper(self):
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def __repr__(self):
        return "SGD(" + ", ".join(f"{k}={v}" for k, v in self.hyper().items()) + ")"


class Adam(Optimizer):
    """``torch.optim.Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)``."""

    buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__()
        self.lr = lr
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise ConfigError(f"Adam: betas must be a pair, got {betas!r}") from None
        self.betas = (_check(b1, "betas[0]", "Adam", 0.0, 1.0, open_max=True),
                      _check(b2, "betas[1]", "Adam", 0.0, 1.0, open_max=True))
        self.eps = _check(eps, "eps", "Adam")
        self.weight_decay = _check(weight_decay, "weight_decay", "Adam")

    def _submit(self, rt, p, buffers):
        rt.submit(adam_step, p.handle, p.grad, buffers[0], buffers[1], lr=self.lr,
                  beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                  weight_decay=self.weight_decay, step=self.steps)

    def hyper(self):
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}

    def __repr__(self):
        return "Adam(" + ", ".join(f"{k}={v}" for k, v in self.hyper().items()) + ")"


OPTIMIZERS = {"sgd": SGD, "adam": Adam}
