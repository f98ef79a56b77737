"""Learning-rate schedules with ``torch.optim.lr_scheduler``'s constructors and arithmetic.

Schedules (``StepLR``, ``CosineAnnealingLR``, ``OneCycleLR``) set every parameter
group's ``lr`` (and, for OneCycle, SGD's ``momentum`` or Adam's ``beta1``) in
Python on every ``step()``: the construction is step 0, StepLR and
CosineAnnealingLR use PyTorch's recursive (chainable) update, so the floats are
PyTorch's own, group by group. Their ``state_dict()`` is JSON-serialisable and goes
into checkpoints; loading it sets the groups' values again. Reached as
``hn.optim.StepLR`` etc., as ``torch.optim.lr_scheduler``'s are.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CheckpointError, ConfigError
from .optimizers import SGD, Optimizer, _check


class LRScheduler:
    """Base of the schedules: ``torch.optim.lr_scheduler.LRScheduler``, one value per
    parameter group.

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
            self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = -1
        self._step_count = 0
        self._initial = True
        self.step()
        self._initial = False

    def get_lr(self) -> list:
        """The learning rate of every group after this step."""
        raise NotImplementedError

    def step(self):
        """Advance one step (an optimizer step or an epoch) and set the groups' lr."""
        self._step_count += 1
        self.last_epoch += 1
        # Not through the option checks: PyTorch's linear OneCycle overshoots to a negative
        # value on its last step (an lr no optimizer step uses), and it is kept as is.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = float(lr)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        """The learning rates set by the last ``step``, one per group (as PyTorch)."""
        return list(self._last_lr)

    @staticmethod
    def _momentum_of(group):
        return list(group["betas"]) if "betas" in group else group.get("momentum")

    @staticmethod
    def _set_momentum(group, momentum):
        """SGD's momentum, or Adam's beta1, of one group (OneCycle's cycling)."""
        if "betas" in group:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def state_dict(self) -> dict:
        """Position, hyper-parameters and the optimizer values set last (JSON-serialisable)."""
        groups = self.optimizer.param_groups
        state = {"type": type(self).__name__, "last_epoch": self.last_epoch,
                 "step_count": self._step_count, "base_lrs": list(self.base_lrs),
                 "last_lr": list(self._last_lr), "momentum": self._momentum_of(groups[0]),
                 "hyper": {k: getattr(self, k) for k in self._hyper}}
        if len(groups) > 1:
            state["group_momentum"] = [self._momentum_of(g) for g in groups]
        return state

    def load_state_dict(self, state):
        """Restore ``state_dict()``'s values, every group's lr (and momentum) included."""
        if state.get("type") != type(self).__name__:
            raise CheckpointError(f"scheduler state is for {state.get('type')}, the run uses "
                                  f"{type(self).__name__}")
        groups = self.optimizer.param_groups
        if len(state["last_lr"]) != len(groups):
            raise CheckpointError(f"scheduler state for {len(state['last_lr'])} parameter "
                                  f"groups, the optimizer has {len(groups)}")
        self.last_epoch = int(state["last_epoch"])
        self._step_count = int(state["step_count"])
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self._last_lr = [float(v) for v in state["last_lr"]]
        for key, value in state.get("hyper", {}).items():
            if key in self._hyper:
                setattr(self, key, value)
        momenta = state.get("group_momentum") or [state.get("momentum")]
        for group, lr, momentum in zip(groups, self._last_lr, momenta):
            group["lr"] = lr
            if isinstance(momentum, list):
                group["betas"] = tuple(float(b) for b in momentum)
            elif momentum is not None:
                group["momentum"] = float(momentum)

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
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return lrs
        return [lr * self.gamma for lr in lrs]


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
        return [self._lr(g["lr"], base) for g, base in
                zip(self.optimizer.param_groups, self.base_lrs)]

    def _lr(self, lr, base_lr):
        t_max, eta_min = self.T_max, self.eta_min
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
    ``base_momentum``. ``max_lr``, ``base_momentum`` and ``max_momentum`` may be lists,
    one value per parameter group, as PyTorch's. SGD must then have a momentum in every
    group (PyTorch would switch a momentum-less SGD to momentum SGD; here that is an error).
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
        groups = getattr(optimizer, "param_groups", [None])
        self.max_lr = self._per_group(max_lr, "max_lr", len(groups))
        self.div_factor = _check(div_factor, "div_factor", "OneCycleLR")
        self.final_div_factor = _check(final_div_factor, "final_div_factor", "OneCycleLR")
        self.three_phase = bool(three_phase)
        self.cycle_momentum = bool(cycle_momentum)
        self.base_momentum = self._per_group(base_momentum, "base_momentum", len(groups))
        self.max_momentum = self._per_group(max_momentum, "max_momentum", len(groups))
        if isinstance(optimizer, Optimizer):
            if self.cycle_momentum and isinstance(optimizer, SGD) and \
                    not all(g["momentum"] for g in optimizer.param_groups):
                raise ConfigError("OneCycleLR: cycle_momentum needs SGD with a momentum (or give "
                                  "cycle_momentum=False)")
            self.base_lrs = [m / self.div_factor for m in self._values(self.max_lr, groups)]
            if self.cycle_momentum:
                for group, m in zip(groups, self._values(self.max_momentum, groups)):
                    self._set_momentum(group, m)
        super().__init__(optimizer)

    @staticmethod
    def _per_group(value, name, count):
        """A number, or a list of one per group (kept as given: the state records it)."""
        if isinstance(value, (list, tuple)):
            if len(value) != count:
                raise ConfigError(f"OneCycleLR: {name} has {len(value)} values for {count} "
                                  "parameter groups")
            return [_check(v, name, "OneCycleLR") for v in value]
        return _check(value, name, "OneCycleLR")

    @staticmethod
    def _values(value, groups):
        return list(value) if isinstance(value, list) else [value] * len(groups)

    def _phases(self, max_lr, base_momentum, max_momentum):
        """``(end_step, start_lr, end_lr, start_momentum, end_momentum)`` as PyTorch's."""
        initial = max_lr / self.div_factor
        lrs = {"initial": initial, "max": max_lr, "min": initial / self.final_div_factor}
        n, pct = self.total_steps, self.pct_start
        if self.three_phase:
            return [(float(pct * n) - 1, lrs["initial"], lrs["max"], max_momentum, base_momentum),
                    (float(2 * pct * n) - 2, lrs["max"], lrs["initial"], base_momentum,
                     max_momentum),
                    (n - 1, lrs["initial"], lrs["min"], max_momentum, max_momentum)]
        return [(float(pct * n) - 1, lrs["initial"], lrs["max"], max_momentum, base_momentum),
                (n - 1, lrs["max"], lrs["min"], base_momentum, max_momentum)]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ConfigError(f"OneCycleLR: stepped {step_num} times, but total_steps is "
                              f"{self.total_steps}")
        groups = self.optimizer.param_groups
        lrs = []
        for group, max_lr, base_m, max_m in zip(groups, self._values(self.max_lr, groups),
                                                self._values(self.base_momentum, groups),
                                                self._values(self.max_momentum, groups)):
            phases = self._phases(max_lr, base_m, max_m)
            start_step = 0.0
            for i, (end_step, start_lr, end_lr, start_m, end_m) in enumerate(phases):
                if step_num <= end_step or i == len(phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(start_m, end_m, pct))
                    lrs.append(self._anneal(start_lr, end_lr, pct))
                    break
                start_step = end_step
        return lrs


SCHEDULES = {"step": StepLR, "cosine": CosineAnnealingLR, "onecycle": OneCycleLR}

__all__ = ["LRScheduler", "StepLR", "CosineAnnealingLR", "OneCycleLR", "SCHEDULES"]
