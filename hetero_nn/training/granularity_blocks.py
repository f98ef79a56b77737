"""The per-block pass of ``granularity="auto"``: which blocks pay at a granularity of their own.

This module owns step 5 of the decision (:mod:`hetero_nn.training.granularity`): from
the chosen uniform configuration, one greedy pass over the model's blocks in order,
each block tried at every other candidate ``g``.

Policy
------
- *Estimate first* (no capture): a block's tasks are found in the step graph of each
  uniform candidate already captured and costed for the candidates' predictions
  (:func:`block_tasks`); at ``h`` partitions the block costs its tasks' predicted
  seconds (run time and the path's ``dispatch``) over ``min(h, workers)`` (its
  partitions run side by side, at most one per worker). A trial's estimate is the
  best step so far plus the block's cost at ``h`` less its cost now.
- *Simulate only what the estimate keeps*: per block, the ``h`` of the lowest
  estimate is simulated (a capture of the step with that block at ``h``, replayed in
  virtual time as every prediction is) only where that estimate passes the keep rule
  (lower than the best step so far divided by ``TOLERANCE``); the simulation, not
  the estimate, decides whether it is kept. A block costs one simulation at most,
  most blocks none, where the pass before simulated ``blocks * (candidates - 1)``
  trials (45 on ResNet-18, most of its decision's time).
- A block's tasks (:func:`block_tasks`): those reading or writing its parameters,
  buffers or their gradients; a task touching none of a block's (an activation's,
  the REDUX partials' of a weight gradient) belongs to the block of the task
  submitted before it, a REDUX tree's to the block its combination reaches. The loss's
  tasks fall to the last block: at every g they are few and small. A block with no
  parameters (ReLU, pooling, Flatten) has no tasks of its own, so it is not tried.
- The estimate is coarse on purpose: it leaves out what the simulation sees (a block's
  weight gradients beside the next block's backward, the wait for a worker), so it only
  ranks; the simulation decides.
- A block is not tried at an ``h`` where one of its tasks in the uniform configuration
  has no prediction (one-partition batch norm at g=1 when only g=4 was calibrated);
  the uniform configuration may be left out of the candidates while some of its blocks
  are tried.
"""

from __future__ import annotations

from ..simulation.simulate import MissingModels

__all__ = ["block_seconds", "block_tasks", "per_block"]


def block_tasks(model, graphs, handles) -> dict:
    """``{task: first layer of its block}`` for the tasks of the captured ``graphs``
    (one uniform configuration's step; ``handles``: capture's map of real handles to
    the graphs' ones), by the policy of the module docstring; tasks before any block's
    (none in a Sequential's step) are left out."""
    owner = {}
    for first, last, _ in model.blocks():
        for layer in model.layers[first:last]:
            for _, p in layer.named_state():
                for h in (p.handle, getattr(p, "grad", None)):
                    sim = handles.get(h) if h is not None else None
                    if sim is not None:
                        owner[sim.root] = first
    tasks = sorted((t for graph in graphs for t in graph), key=lambda t: t.id)
    found, current = {}, None
    for t in tasks:
        own = next((owner[h.root] for h in t.handles if h.root in owner), None)
        if own is not None:
            current = found[t] = own
        elif current is not None:
            found[t] = current
    for t in reversed(tasks):  # a REDUX tree's tasks: the block its combination reaches
        if t.codelet.name.endswith(".redux") and not any(h.root in owner for h in t.handles):
            reached = next((found[s] for s in t.succ if s in found), None)
            if reached is not None:
                found[t] = reached
    return found


def block_seconds(model, graphs, handles, dispatch) -> dict:
    """``{first layer: predicted seconds of its block's tasks}`` (:func:`block_tasks`;
    each task's cheapest kind, plus ``dispatch``) of captured graphs whose tasks were
    given their costs (:func:`~hetero_nn.simulation.simulate.assign_costs`); a block
    with a task of no prediction is left out."""
    seconds: dict = {}
    unknown = set()
    for t, first in block_tasks(model, graphs, handles).items():
        if not t.cost:
            unknown.add(first)
        else:
            seconds[first] = seconds.get(first, 0.0) + dispatch + min(t.cost.values())
    return {first: s for first, s in seconds.items() if first not in unknown}


def per_block(model, g, fuse, candidates, predicted, predict, uniform, workers, tolerance):
    """The greedy pass (module docstring): ``(layers, predicted, trials)``.

    ``predict(g, fuse, layers)`` -> ``(seconds, tasks)`` simulates a configuration (it
    raises MissingModels for a task no model covers); ``uniform(h)`` -> ``{first layer:
    predicted seconds}`` of the uniform configuration ``(h, fuse)``'s blocks (a block
    left out where a task of it has no prediction); ``workers``: the workers the
    predictions run on."""
    n = len(model.layers)
    layers = [g] * n
    trials = []
    costs = {h: uniform(h) for h in candidates}
    for first, last, name in model.blocks():
        now = costs.get(layers[first])
        if now is None or first not in now:
            continue
        estimates = []
        for h in candidates:
            at_h = costs.get(h)
            if h == layers[first] or at_h is None or first not in at_h:
                continue
            change = (at_h[first] / min(h, workers)
                      - now[first] / min(layers[first], workers))
            estimates.append((predicted + change, h))
        if not estimates:
            continue
        rows = {h: {"layer": first, "block": name, "granularity": h,
                    "estimated_seconds": e, "predicted_seconds": None, "kept": False}
                for e, h in estimates}
        trials += rows.values()
        estimate, h = min(estimates)
        if not estimate * tolerance < predicted:
            continue  # no trial of this block is worth its simulation
        trial = list(layers)
        trial[first:last] = [h] * (last - first)
        try:
            seconds, _ = predict(g, fuse, tuple(trial))
        except MissingModels:  # a task of another shape family than any calibrated
            continue
        rows[h]["predicted_seconds"] = seconds
        if seconds * tolerance < predicted:
            predicted, layers = seconds, trial
            rows[h]["kept"] = True
    return (None if all(h == g for h in layers) else tuple(layers)), predicted, trials
