"""Optimizers and gradient clipping with ``torch.optim``'s arguments (``hn.optim.SGD``); the
schedules are in :mod:`hetero_nn.optim.lr_scheduler`, which imports this module.

``hn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)`` takes the parameters first,
or parameter groups with their own options, as torch's; ``hn.optim.SGD(lr=0.05)`` is a
recipe that the trainer gives the model's parameters (one group). The trainer calls
``bind(named_parameters, rt)`` and then ``step(rt)`` once per batch, which submits
one update task per parameter after that batch's gradient tasks. State buffers
(momentum, Adam's moments) are host arrays registered with the runtime, so
checkpoints read them with ``state_dict()``, under the model's parameter names.

What changes from step to step (the learning rate, SGD's momentum and first step,
Adam's betas and step count) reaches the tasks as data: ``step`` registers the
step's *hyper handle* (:func:`~hetero_nn.codelets.optim.sgd_hyper`,
:func:`~hetero_nn.codelets.optim.adam_hyper`; one row per parameter group, each
group's tasks reading their row through a child handle) that every update task
reads, so a captured step can be replayed every step: :meth:`Optimizer.replayed`
counts the step as ``step`` would and returns the values the trainer writes into the
hyper handle the graph captured. ``replay_key()`` holds only what stays fixed, group
by group. ``state_dict()`` records the groups' options, and ``load_state_dict``
restores them, so groups and schedules survive checkpoints.
``clip_grad_norm`` submits ``torch.nn.utils.clip_grad_norm_`` as tasks.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np

from ..codelets.optim import (adam_hyper, adam_step, adamw_step, clip_scale, sgd_hyper, sgd_step,
                              sgd_step_plain, sum_squares)
from ..codelets.reduce import fill_zero
from ..errors import CheckpointError, ConfigError
from ..layers.base import Parameter, note_step_input


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


def _what(value) -> str:
    return f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"


def _groups(params, owner) -> list[dict]:
    """The parameter groups ``params`` gives: its dicts, or one group of its parameters."""
    expected = (f"{owner}: the first argument is the parameters to optimize: model.parameters() "
                "or a list of parameter groups (dicts with 'params' and their own options)")
    if isinstance(params, numbers.Number):
        raise ConfigError(f"{expected}; got the number {params!r} (give the learning rate as "
                          f"lr={params!r})")
    if isinstance(params, (dict, str, Parameter)) or hasattr(params, "named_parameters"):
        hint = "; give model.parameters()" if hasattr(params, "named_parameters") else ""
        raise ConfigError(f"{expected}; got a {_what(params)}{hint}")
    try:
        items = list(params)
    except TypeError:
        raise ConfigError(f"{expected}; got a {_what(params)}") from None
    if items and all(isinstance(item, dict) for item in items):
        return [dict(item) for item in items]
    return [{"params": _parameters(items, owner, expected)}]


def _parameters(items, owner, expected) -> list:
    """The Parameters of ``items`` (``named_parameters()`` pairs accepted)."""
    if isinstance(items, Parameter):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            item = item[1]
        if not isinstance(item, Parameter):
            hint = (" (a torch tensor: convert the module with hn.from_torch and give the "
                    "model's parameters)" if type(item).__module__.startswith("torch") else "")
            raise ConfigError(f"{expected}; got a {_what(item)} among them{hint}")
        out.append(item)
    if not out:
        raise ConfigError(f"{owner}: got an empty parameter list")
    return out


def _group_option(name):
    """A property for the option ``name`` of every group: read from the first group, set in
    all (what ``opt.lr = 0.1`` means with one group, as the schedules and the CLI use it)."""
    def get(self):
        return self.param_groups[0][name]

    def set_(self, value):
        checked = self._check_options({name: value}, type(self).__name__)[name]
        for group in self.param_groups:
            group[name] = checked

    return property(get, set_, doc=f"``{name}`` of the parameter groups (the first one's).")


class Optimizer:
    """Base: parameter groups as ``torch.optim.Optimizer``'s; ``step`` submits the update tasks.

    ``params`` is ``model.parameters()`` (one group with the defaults), a list of
    parameter groups, dicts of ``"params"`` and the options that differ for them
    (``[{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]``), or None:
    then :meth:`bind` (the trainer) gives the model's parameters, one group.
    ``param_groups`` holds the groups, each a dict of its options and its ``"params"``.
    """

    #: The state buffers each parameter may have (a checkpoint may hold these).
    state_buffers: tuple[str, ...] = ()
    #: The state buffers each parameter has now.
    buffers: tuple[str, ...] = ()
    #: Options of a group written into the hyper handle each step (the others are fixed).
    per_step: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict):
        owner = type(self).__name__
        self.defaults = self._check_options(defaults, owner)
        self.param_groups: list[dict] = []
        self._implicit = params is None  # the trainer's bind gives the parameters
        if self._implicit:
            self.param_groups.append({"params": [], **self.defaults})
        else:
            for group in _groups(params, owner):
                self.add_param_group(group)
        self.params = []  # [(name, Parameter)] of every group, once bound
        self._group_of: dict[str, int] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self._handles: dict = {}
        self._rt = None
        self.steps = 0
        self.step_inputs = None  # the hyper handles registered while a step is captured

    def _check_options(self, options, owner) -> dict:
        """``options`` checked and normalised (a ConfigError names the option)."""
        raise NotImplementedError

    def add_param_group(self, group: dict) -> None:
        """Add a group: ``{"params": [...], option: value, ...}``, the options it lacks
        taken from the defaults (``torch.optim.Optimizer.add_param_group``)."""
        owner, index = type(self).__name__, len(self.param_groups)
        if not isinstance(group, dict) or "params" not in group:
            raise ConfigError(f"{owner}: parameter group {index} must be a dict with 'params', "
                              f"got {group!r}")
        unknown = [k for k in group if k != "params" and k not in self.defaults]
        if unknown:
            raise ConfigError(f"{owner}: parameter group {index} has the unknown option "
                              f"{unknown[0]!r} (expected 'params', "
                              f"{', '.join(map(repr, self.defaults))})")
        params = _parameters(group["params"], f"{owner} parameter group {index}",
                             f"{owner}: parameter group {index}'s 'params' must be parameters")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) < len(params):
            raise ConfigError(f"{owner}: some parameters appear in more than one parameter group")
        options = self._check_options({**self.defaults, **{k: v for k, v in group.items()
                                                           if k != "params"}},
                                      f"{owner} parameter group {index}")
        self.param_groups.append({"params": list(params), **options})
        self._rt = None  # bind again at the next step

    def bind(self, named_parameters, rt):
        """Attach to a runtime: ``[(name, Parameter), ...]`` names the parameters (the
        model's ``named_parameters()``; an optimizer made without parameters takes them
        all), the state buffers are made (zeroed) where missing and registered with ``rt``."""
        if named_parameters is None:  # no model to name them: their index in the groups
            named = [(str(i), p) for i, p in
                     enumerate(p for g in self.param_groups for p in g["params"])]
        else:
            named = list(named_parameters)
        if self._implicit:
            self.param_groups[0]["params"] = [p for _, p in named]
        names = {id(p): name for name, p in named}
        self.params, self._group_of = [], {}
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name = names.get(id(p))
                if name is None:
                    raise ConfigError(f"{type(self).__name__}: parameter group {gi} holds a "
                                      f"parameter that is not the model's ({p!r})")
                self.params.append((name, p))
                self._group_of[name] = gi
        for name, p in self.params:
            st = self.state.get(name)
            if st is None or any(b not in st or st[b].shape != p.data.shape
                                 or st[b].dtype != p.data.dtype for b in self.buffers):
                self.state[name] = {b: np.zeros_like(p.data) for b in self.buffers}
        self._rt = rt  # None: the parameters named, nothing registered yet
        self._handles = {} if rt is None else {
            name: [rt.register(self.state[name][b], name=f"{name}.{b}") for b in self.buffers]
            for name, _ in self.params}

    def _sync(self):
        """Make the host copies of the buffers current."""
        if self._rt is not None and not self._rt.closed:
            for hs in self._handles.values():
                for h in hs:
                    self._rt.fetch(h)

    def step(self, rt=None, place=None):
        """Submit one update task per parameter, each reading its group's row of this step's
        hyper handle (``rt``: the runtime the parameters are bound to when not given).
        ``place(parameter)``, where given, is the context each parameter's update is
        submitted in (a pipeline stage's ``rt.placing(workers)``), or None for none."""
        if rt is None:
            rt = next((p.runtime for g in self.param_groups for p in g["params"]
                       if p.runtime is not None), None)
            if rt is None:
                raise ConfigError(f"{type(self).__name__}.step: no runtime; the parameters are "
                                  "bound to none (train with a Trainer, or give rt)")
        if rt is not self._rt or any(len(hs) != len(self.buffers)
                                     for hs in self._handles.values()):
            self._sync()
            self.bind(self.params or None, rt)
        self.steps += 1
        hyper = note_step_input(self, rt.register(self.hyper_values(), name="optimizer.hyper"))
        rows = [hyper] if len(hyper.shape) == 1 else list(hyper.split(0, hyper.shape[0]))
        for name, p in self.params:
            gi = self._group_of[name]
            with (place and place(p)) or contextlib.nullcontext():
                self._submit(rt, p, self._handles[name], rows[gi], self.param_groups[gi], gi)
        self._stepped()

    def _submit(self, rt, p, buffers, hyper, group, index):
        raise NotImplementedError

    def _hyper_row(self, group, index) -> np.ndarray:
        raise NotImplementedError

    def _stepped(self) -> None:
        """A step was submitted or replayed, after its hyper values were taken."""

    def hyper_values(self) -> np.ndarray:
        """The data of the current step's hyper handle (after ``steps`` counted it): one
        row, or one per group where there are several."""
        rows = [self._hyper_row(g, i) for i, g in enumerate(self.param_groups)]
        return rows[0] if len(rows) == 1 else np.stack(rows)

    def replay_key(self):
        """What the parameters of ``step``'s tasks depend on besides the data (hashable):
        every group's options that are not in the hyper handle (see
        :meth:`hetero_nn.training.trainer.Trainer.train_step`)."""
        return (type(self).__name__, tuple(self._fixed(g, i) for i, g in
                                           enumerate(self.param_groups)))

    def _fixed(self, group, index) -> tuple:
        return tuple(_hashable(group[k]) for k in self.defaults if k not in self.per_step)

    def replayed(self) -> np.ndarray:
        """Count a step run by replaying a captured graph (``step`` was not called) and
        return the values of its hyper handle, to write into the captured one."""
        self.steps += 1
        values = self.hyper_values()
        self._stepped()
        return values

    def _options(self, group) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()
                if k != "params"}

    def hyper(self) -> dict:
        """The first group's options (JSON); with groups given, ``"param_groups"`` lists
        every group's options and parameter names (once bound)."""
        out = self._options(self.param_groups[0])
        if not self._implicit:
            names = {id(p): n for n, p in self.params}
            out["param_groups"] = [{**self._options(g),
                                    "params": [names.get(id(p)) for p in g["params"]]}
                                   for g in self.param_groups]
        return out

    def state_dict(self) -> dict:
        """``{"steps": int, "hyper": {...}, "state": {param: {buffer: array}}}`` (copies)."""
        self._sync()
        return {"steps": self.steps, "hyper": self.hyper(),
                "state": {n: {b: a.copy() for b, a in st.items()} for n, st in self.state.items()}}

    def load_state_dict(self, sd):
        """Restore the step count, the buffers and, where ``sd`` lists parameter groups,
        every group's options (``torch.optim.Optimizer.load_state_dict``)."""
        self._sync()
        saved = sd.get("hyper", {}).get("param_groups")
        if saved is not None:
            self._load_groups(saved)
        self.steps = int(sd["steps"])
        for name, st in sd["state"].items():
            for b, a in st.items():
                if b not in self.state_buffers:
                    raise CheckpointError(f"{type(self).__name__}: unknown state buffer {b!r} of {name!r}")
                cur = self.state.get(name, {}).get(b)
                if cur is not None and cur.shape == np.shape(a):
                    cur[...] = a
                else:
                    self.state.setdefault(name, {})[b] = np.array(a)
        if self._rt is not None and not self._rt.closed:
            self.bind(self.params, self._rt)  # host copies changed: register them again

    def _load_groups(self, saved):
        owner = type(self).__name__
        if len(saved) != len(self.param_groups):
            raise CheckpointError(f"{owner}: the state holds {len(saved)} parameter groups, the "
                                  f"optimizer has {len(self.param_groups)}")
        names = {id(p): n for n, p in self.params}
        for i, (group, state) in enumerate(zip(self.param_groups, saved)):
            mine = [names.get(id(p)) for p in group["params"]]
            if self.params and state.get("params") is not None and state["params"] != mine:
                raise CheckpointError(f"{owner}: parameter group {i} holds {state['params']} in "
                                      f"the state, {mine} in the optimizer")
            options = {k: v for k, v in state.items() if k in self.defaults}
            group.update(self._check_options(options, f"{owner} parameter group {i}"))

    def __repr__(self):
        body = ", ".join(f"{k}={v}" for k, v in self._options(self.param_groups[0]).items())
        extra = f", {len(self.param_groups)} parameter groups" if len(self.param_groups) > 1 else ""
        return f"{type(self).__name__}({body}{extra})"

    lr = _group_option("lr")
    weight_decay = _group_option("weight_decay")


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


class SGD(Optimizer):
    """``torch.optim.SGD(params=None, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
    nesterov=False)``.

    As torch's, a group's momentum buffers start on its first step with a momentum
    (a copy of the gradient), whenever that is: a momentum given at construction, set
    later (``opt.momentum = 0.9``, ``param_groups[i]["momentum"]``, a schedule) or in a
    group added later. From then on the group's update tasks keep the buffers, and a
    momentum of 0 leaves them as they are. Every parameter has a buffer once any group
    has started (checkpoints stay one shape); ``momentum_started`` says which groups have.
    """

    state_buffers = ("momentum_buffer",)
    per_step = ("lr", "momentum")

    def __init__(self, params=None, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        #: per group: whether its buffers hold a momentum (torch: ``"momentum_buffer" in
        #: state``); the first step with a momentum starts them from the gradient
        self.momentum_started: list[bool] = []
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov})
        self.momentum_started = [False] * len(self.param_groups)  # the trainer's group too

    def add_param_group(self, group):
        super().add_param_group(group)
        self.momentum_started.append(False)

    def _buffered(self, index) -> bool:
        """Whether the tasks of group ``index`` keep momentum buffers this step."""
        return self.momentum_started[index] or self.param_groups[index]["momentum"] != 0

    @property
    def buffers(self):
        return ("momentum_buffer",) if any(map(self._buffered, range(len(self.param_groups)))) \
            else ()

    def _check_options(self, options, owner):
        out = dict(options)
        for key in ("lr", "momentum", "dampening", "weight_decay"):
            if key in out:
                out[key] = _check(out[key], key, owner)
        if "nesterov" in out:
            out["nesterov"] = bool(out["nesterov"])
            if out["nesterov"] and (out.get("momentum", 1) <= 0 or out.get("dampening", 0) != 0):
                raise ConfigError(f"{owner}: Nesterov momentum requires a momentum and zero "
                                  "dampening")
        return out

    def _submit(self, rt, p, buffers, hyper, group, index):
        if self._buffered(index):
            rt.submit(sgd_step, p.handle, p.grad, buffers[0], hyper, dampening=group["dampening"],
                      weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        else:
            rt.submit(sgd_step_plain, p.handle, p.grad, hyper, weight_decay=group["weight_decay"])

    def _hyper_row(self, group, index):
        return sgd_hyper(group["lr"], group["momentum"], not self.momentum_started[index])

    def _stepped(self):
        for index, group in enumerate(self.param_groups):
            if group["momentum"] != 0:
                self.momentum_started[index] = True

    def _fixed(self, group, index):
        """Dampening, weight decay, Nesterov and whether the group keeps momentum buffers
        (lr, momentum and the first step are in the hyper handle)."""
        return super()._fixed(group, index) + (self._buffered(index),)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "momentum_started": list(self.momentum_started)}

    def load_state_dict(self, sd):
        started = sd.get("momentum_started")
        if started is None:  # an older checkpoint: a group with a momentum started at step 1
            groups = sd.get("hyper", {}).get("param_groups") or self.param_groups
            started = [int(sd["steps"]) > 0 and float(g.get("momentum", 0)) != 0
                       for g in groups]
        if len(started) != len(self.param_groups):
            raise CheckpointError(f"SGD: the state says whether {len(started)} parameter "
                                  f"groups started their momentum, the optimizer has "
                                  f"{len(self.param_groups)}")
        self.momentum_started = [bool(s) for s in started]
        super().load_state_dict(sd)

    momentum = _group_option("momentum")
    dampening = _group_option("dampening")
    nesterov = _group_option("nesterov")


class Adam(Optimizer):
    """``torch.optim.Adam(params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)``."""

    state_buffers = buffers = ("exp_avg", "exp_avg_sq")
    per_step = ("lr", "betas")
    codelet = adam_step

    def __init__(self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    def _check_options(self, options, owner):
        out = dict(options)
        for key in ("lr", "eps", "weight_decay"):
            if key in out:
                out[key] = _check(out[key], key, owner)
        if "betas" in out:
            try:
                b1, b2 = out["betas"]
            except (TypeError, ValueError):
                raise ConfigError(f"{owner}: betas must be a pair, got {out['betas']!r}") from None
            out["betas"] = (_check(b1, "betas[0]", owner, 0.0, 1.0, open_max=True),
                            _check(b2, "betas[1]", owner, 0.0, 1.0, open_max=True))
        return out

    def _submit(self, rt, p, buffers, hyper, group, index):
        rt.submit(self.codelet, p.handle, p.grad, buffers[0], buffers[1], hyper, eps=group["eps"],
                  weight_decay=group["weight_decay"])

    def _hyper_row(self, group, index):
        return adam_hyper(group["lr"], group["betas"][0], group["betas"][1], self.steps)

    betas = _group_option("betas")
    eps = _group_option("eps")


class AdamW(Adam):
    """``torch.optim.AdamW(params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2)``.

    Decoupled weight decay: each step first scales the weights by
    ``1 - lr * weight_decay``, then takes Adam's step without an L2 term.
    """

    codelet = adamw_step

    def __init__(self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


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
