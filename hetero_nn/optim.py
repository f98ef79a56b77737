"""Optimizers, learning-rate schedules and gradient clipping with ``torch.optim``'s arguments.

``hn.optim.SGD(lr=0.05, momentum=0.9)`` is a recipe; the trainer calls
``bind(parameters, rt)`` and then ``step(rt)`` once per batch, which submits
one update task per parameter after that batch's gradient tasks. State buffers
(momentum, Adam's moments) are host arrays registered with the runtime, so
checkpoints read them with ``state_dict()``.

What changes from step to step (the learning rate, SGD's momentum and first step,
Adam's betas and step count) reaches the tasks as data: ``step`` registers the
step's *hyper handle* (:func:`~hetero_nn.codelets.optim.sgd_hyper`,
:func:`~hetero_nn.codelets.optim.adam_hyper`) that every update task reads, so a
captured step can be replayed every step: :meth:`Optimizer.replayed` counts the
step as ``step`` would and returns the values the trainer writes into the hyper
handle the graph captured. ``replay_key()`` holds only what stays fixed.

Schedules (``StepLR``, ``CosineAnnealingLR``, ``OneCycleLR``) take the optimizer
recipe and set its ``lr`` (and, for OneCycle, SGD's ``momentum`` or Adam's
``beta1``) in Python on every ``step()``, with ``torch.optim.lr_scheduler``'s
constructors and arithmetic: the construction is step 0, StepLR and
CosineAnnealingLR use PyTorch's recursive (chainable) update, so the floats
are PyTorch's own. Their ``state_dict()`` is JSON-serialisable and goes into
checkpoints. ``clip_grad_norm`` submits ``torch.nn.utils.clip_grad_norm_`` as tasks.
"""

from __future__ import annotations

import numpy as np

import math

from .codelets.optim import (adam_hyper, adam_step, adamw_step, clip_scale, sgd_hyper, sgd_step,
                              sgd_step_plain, sum_squares)
from .codelets.reduce import fill_zero
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
        self.step_input = None  # the hyper handle the last ``step`` registered

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
        """Submit one update task per parameter, all reading this step's hyper handle."""
        if rt is not self._rt:
            self.bind(self.params, rt)
        self.steps += 1
        self.step_input = hyper = rt.register(self.hyper_values(), name="optimizer.hyper")
        for name, p in self.params:
            self._submit(rt, p, self._handles[name], hyper)

    def _submit(self, rt, p, buffers, hyper):
        raise NotImplementedError

    def hyper_values(self) -> np.ndarray:
        """The data of the current step's hyper handle (after ``steps`` counted it)."""
        raise NotImplementedError

    def replay_key(self):
        """What the parameters of ``step``'s tasks depend on besides the data (hashable),
        or None when a captured step cannot be replayed (see
        :meth:`hetero_nn.training.trainer.Trainer.train_step`)."""
        return None

    def replayed(self) -> np.ndarray:
        """Count a step run by replaying a captured graph (``step`` was not called) and
        return the values of its hyper handle, to write into the captured one."""
        self.steps += 1
        return self.hyper_values()

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

    def _submit(self, rt, p, buffers, hyper):
        if buffers:  # a momentum that a schedule set to 0 leaves the buffer alone
            rt.submit(sgd_step, p.handle, p.grad, buffers[0], hyper, dampening=self.dampening,
                      weight_decay=self.weight_decay, nesterov=self.nesterov)
        else:
            rt.submit(sgd_step_plain, p.handle, p.grad, hyper, weight_decay=self.weight_decay)

    def hyper_values(self):
        return sgd_hyper(self.lr, self.momentum, self.steps == 1)

    def hyper(self):
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def replay_key(self):
        """What stays fixed: dampening, weight decay, Nesterov, and whether there is a
        momentum buffer (lr, momentum and the first step are in the hyper handle)."""
        return ("sgd", self.dampening, self.weight_decay, self.nesterov, bool(self.buffers))

    def __repr__(self):
        return "SGD(" + ", ".join(f"{k}={v}" for k, v in self.hyper().items()) + ")"


class Adam(Optimizer):
    """``torch.optim.Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)``."""

    buffers = ("exp_avg", "exp_avg_sq")
    codelet = adam_step

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

    def _submit(self, rt, p, buffers, hyper):
        rt.submit(self.codelet, p.handle, p.grad, buffers[0], buffers[1], hyper, eps=self.eps,
                  weight_decay=self.weight_decay)

    def hyper_values(self):
        return adam_hyper(self.lr, self.betas[0], self.betas[1], self.steps)

    def replay_key(self):
        """What stays fixed: the codelet, eps and weight decay (lr, betas and the step
        count are in the hyper handle)."""
        return (self.codelet.name, self.eps, self.weight_decay)

    def hyper(self):
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}

    def __repr__(self):
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v}" for k, v in self.hyper().items()) + ")"


class AdamW(Adam):
    """``torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)``.

    Decoupled weight decay: each step first scales the weights by
    ``1 - lr * weight_decay``, then takes Adam's step without an L2 term.
    """

    codelet = adamw_step

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


# ---------------------------------------------------------------------------------------
# Gradient clipping
# ---------------------------------------------------------------------------------------

def _parameter_list(parameters):
    """Parameters of an optimizer (bound), a model, or an iterable of Parameters."""
    if isinstance(parameters, Optimizer):
        params = [p for _, p in parameters.params]
    elif hasattr(parameters, "parameters") and callable(parameters.parameters):
        params = list(parameters.parameters())
    else:
        params = list(parameters)
    unbound = [p for p in params if getattr(p, "grad", None) is None]
    if unbound:
        raise ConfigError(f"clip_grad_norm: parameter {getattr(unbound[0], 'name', unbound[0])!r} "
                          "has no gradient handle (bind the model to a runtime first)")
    return params


def submit_clip_grad_norm(parameters, max_norm):
    """Submit the clipping tasks; returns the 0-d handle of the squared total norm.

    One ``sum_squares`` task per parameter (REDUX into one scalar, in the order of
    ``parameters``), then one ``clip_scale`` task per gradient. Nothing waits.
    """
    max_norm = _check(max_norm, "max_norm", "clip_grad_norm")
    params = _parameter_list(parameters)
    if not params:
        return None
    rt = params[0].runtime
    total = rt.temporary((), params[0].grad.dtype, name="grad_norm_sq")
    rt.submit(fill_zero, total)
    for p in params:
        rt.submit(sum_squares, p.grad, total)
    for p in params:
        rt.submit(clip_scale, p.grad, total, max_norm=max_norm)
    return total


def clip_grad_norm(parameters, max_norm) -> float:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (2-norm) as tasks.

    Scales every gradient by ``min(max_norm / (total_norm + 1e-6), 1)``, where
    ``total_norm`` is the 2-norm of all gradients together, and returns
    ``total_norm`` (waiting for it). ``parameters`` is a bound optimizer, a model
    or an iterable of its Parameters; the gradients are those computed by the
    tasks submitted so far. :class:`~hetero_nn.training.trainer.Trainer` clips inside each
    step with ``clip_grad_norm=max_norm``.
    """
    total = submit_clip_grad_norm(parameters, max_norm)
    if total is None:
        return 0.0
    value = total.owner.fetch(total)
    return float(np.sqrt(value))


# ---------------------------------------------------------------------------------------
# Learning-rate schedules
# ---------------------------------------------------------------------------------------

class LRScheduler:
    """Base of the schedules: ``torch.optim.lr_scheduler.LRScheduler`` for one parameter group.

    ``interval`` says when :class:`~hetero_nn.training.trainer.Trainer` steps it by default:
    after every optimizer step (``"step"``) or at the end of every epoch (``"epoch"``).
    """

    interval = "epoch"
    _hyper: tuple[str, ...] = ()

    def __init__(self, optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(f"{type(self).__name__}: expected a hetero_nn optimizer, got "
                              f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        if not hasattr(self, "base_lrs"):
            self.base_lrs = [optimizer.lr]
        self.last_epoch = -1
        self._step_count = 0
        self._initial = True
        self.step()
        self._initial = False

    def get_lr(self) -> float:
        raise NotImplementedError

    def step(self):
        """Advance one step (an optimizer step or an epoch) and set the optimizer's lr."""
        self._step_count += 1
        self.last_epoch += 1
        # Not through the lr setter: PyTorch's linear OneCycle overshoots to a negative
        # value on its last step (an lr no optimizer step uses), and it is kept as is.
        self.optimizer._lr = float(self.get_lr())
        self._last_lr = [self.optimizer.lr]

    def get_last_lr(self) -> list:
        """The learning rate set by the last ``step`` (a one-element list, as PyTorch)."""
        return list(self._last_lr)

    def _momentum(self):
        opt = self.optimizer
        return list(opt.betas) if isinstance(opt, Adam) else getattr(opt, "momentum", None)

    def state_dict(self) -> dict:
        """Position, hyper-parameters and the optimizer values set last (JSON-serialisable)."""
        return {"type": type(self).__name__, "last_epoch": self.last_epoch,
                "step_count": self._step_count, "base_lrs": list(self.base_lrs),
                "last_lr": list(self._last_lr), "momentum": self._momentum(),
                "hyper": {k: getattr(self, k) for k in self._hyper}}

    def load_state_dict(self, state):
        """Restore ``state_dict()``'s values, the optimizer's lr (and momentum) included."""
        if state.get("type") != type(self).__name__:
            raise CheckpointError(f"scheduler state is for {state.get('type')}, the run uses "
                                  f"{type(self).__name__}")
        self.last_epoch = int(state["last_epoch"])
        self._step_count = int(state["step_count"])
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self._last_lr = [float(v) for v in state["last_lr"]]
        for key, value in state.get("hyper", {}).items():
            if key in self._hyper:
                setattr(self, key, value)
        self.optimizer._lr = self._last_lr[0]
        momentum = state.get("momentum")
        if isinstance(self.optimizer, Adam) and momentum is not None:
            self.optimizer.betas = tuple(float(b) for b in momentum)
        elif momentum is not None:
            self.optimizer.momentum = float(momentum)

    def __repr__(self):
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._hyper)
        return f"{type(self).__name__}({args})"


class StepLR(LRScheduler):
    """``torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma=0.1)``:
    ``lr *= gamma`` every ``step_size`` steps."""

    _hyper = ("step_size", "gamma")

    def __init__(self, optimizer, step_size, gamma=0.1):
        if isinstance(step_size, bool) or not isinstance(step_size, (int, np.integer)) \
                or step_size < 1:
            raise ConfigError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        self.step_size = int(step_size)
        self.gamma = _check(gamma, "gamma", "StepLR")
        super().__init__(optimizer)

    def get_lr(self):
        lr = self.optimizer.lr
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return lr
        return lr * self.gamma


class CosineAnnealingLR(LRScheduler):
    """``torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max, eta_min=0)``,
    in PyTorch's recursive form (which keeps cycling after ``T_max``)."""

    _hyper = ("T_max", "eta_min")

    def __init__(self, optimizer, T_max, eta_min=0.0):
        if isinstance(T_max, bool) or not isinstance(T_max, (int, np.integer)) or T_max < 1:
            raise ConfigError(f"CosineAnnealingLR: T_max must be a positive integer, got {T_max!r}")
        self.T_max = int(T_max)
        self.eta_min = _check(eta_min, "eta_min", "CosineAnnealingLR")
        super().__init__(optimizer)

    def get_lr(self):
        lr, base_lr, t_max, eta_min = self.optimizer.lr, self.base_lrs[0], self.T_max, self.eta_min
        if self._initial:
            return lr
        if (self.last_epoch - 1 - t_max) % (2 * t_max) == 0:
            return lr + (base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        return ((1 + math.cos(math.pi * self.last_epoch / t_max))
                / (1 + math.cos(math.pi * (self.last_epoch - 1) / t_max))
                * (lr - eta_min) + eta_min)


class OneCycleLR(LRScheduler):
    """``torch.optim.lr_scheduler.OneCycleLR`` (stepped after every optimizer step).

    ``OneCycleLR(optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
    pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
    max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False)``.
    The lr goes from ``max_lr / div_factor`` up to ``max_lr`` and down to
    ``max_lr / div_factor / final_div_factor``; with ``cycle_momentum`` SGD's momentum
    (or Adam's ``beta1``) moves the other way between ``max_momentum`` and
    ``base_momentum``. SGD must then have a momentum (PyTorch would switch a
    momentum-less SGD to momentum SGD; here that is an error).
    """

    interval = "step"
    _hyper = ("total_steps", "pct_start", "anneal_strategy", "cycle_momentum", "base_momentum",
              "max_momentum", "div_factor", "final_div_factor", "three_phase", "max_lr")

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False):
        def positive_int(value, name):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"OneCycleLR: {name} must be a positive integer, got {value!r}")
            return int(value)

        if total_steps is not None:
            self.total_steps = positive_int(total_steps, "total_steps")
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (positive_int(epochs, "epochs")
                                * positive_int(steps_per_epoch, "steps_per_epoch"))
        else:
            raise ConfigError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        self.pct_start = _check(pct_start, "pct_start", "OneCycleLR", 0.0, 1.0)
        if anneal_strategy not in ("cos", "linear"):
            raise ConfigError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                              f"{anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        self.max_lr = _check(max_lr, "max_lr", "OneCycleLR")
        self.div_factor = _check(div_factor, "div_factor", "OneCycleLR")
        self.final_div_factor = _check(final_div_factor, "final_div_factor", "OneCycleLR")
        self.three_phase = bool(three_phase)
        self.cycle_momentum = bool(cycle_momentum)
        self.base_momentum = _check(base_momentum, "base_momentum", "OneCycleLR")
        self.max_momentum = _check(max_momentum, "max_momentum", "OneCycleLR")
        if self.cycle_momentum and isinstance(optimizer, SGD) and not optimizer.momentum:
            raise ConfigError("OneCycleLR: cycle_momentum needs SGD with a momentum (or give "
                              "cycle_momentum=False)")
        self.base_lrs = [self.max_lr / self.div_factor]
        if self.cycle_momentum:
            self._set_momentum(optimizer, self.max_momentum)
        super().__init__(optimizer)

    def _phases(self):
        """``(end_step, start_lr, end_lr, start_momentum, end_momentum)`` as PyTorch's."""
        initial = self.max_lr / self.div_factor
        lrs = {"initial": initial, "max": self.max_lr, "min": initial / self.final_div_factor}
        n, pct = self.total_steps, self.pct_start
        if self.three_phase:
            return [(float(pct * n) - 1, lrs["initial"], lrs["max"], self.max_momentum,
                     self.base_momentum),
                    (float(2 * pct * n) - 2, lrs["max"], lrs["initial"], self.base_momentum,
                     self.max_momentum),
                    (n - 1, lrs["initial"], lrs["min"], self.max_momentum, self.max_momentum)]
        return [(float(pct * n) - 1, lrs["initial"], lrs["max"], self.max_momentum,
                 self.base_momentum),
                (n - 1, lrs["max"], lrs["min"], self.base_momentum, self.max_momentum)]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    @staticmethod
    def _set_momentum(optimizer, momentum):
        if isinstance(optimizer, Adam):
            optimizer.betas = (momentum, *optimizer.betas[1:])
        else:
            optimizer.momentum = momentum

    def get_lr(self):
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ConfigError(f"OneCycleLR: stepped {step_num} times, but total_steps is "
                              f"{self.total_steps}")
        phases = self._phases()
        start_step = 0.0
        for i, (end_step, start_lr, end_lr, start_m, end_m) in enumerate(phases):
            if step_num <= end_step or i == len(phases) - 1:
                pct = (step_num - start_step) / (end_step - start_step)
                if self.cycle_momentum:
                    self._set_momentum(self.optimizer, self._anneal(start_m, end_m, pct))
                return self._anneal(start_lr, end_lr, pct)
            start_step = end_step


SCHEDULES = {"step": StepLR, "cosine": CosineAnnealingLR, "onecycle": OneCycleLR}
