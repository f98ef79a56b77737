"""Re-checking ``granularity="auto"``'s choice against the steps it leads to.

This module owns the last step of the decision (:mod:`hetero_nn.training.granularity`):
the configuration the performance models chose has run its measured steps; that
measure is compared with its prediction and with measured steps of the other
candidates, and the decision moves to another candidate that measures faster by more
than :data:`MARGIN`.

Policy
------
- *Which*: the chosen configuration (a per-block mix included) and every uniform
  candidate of the decision. Not only the next few by prediction: a model wrong about
  one configuration (calibrated under a load that has gone, or beside a busy neighbour
  process) ranks it wrongly while predicting the chosen one well, and only its own
  steps show it. The chosen one's measure over its prediction is recorded
  (``measured_over_predicted``).
- *How much*: the candidates are taken in the order of their predictions while the
  projected cost of the whole re-check (the warm-ups taken so far, :data:`ROUNDS`
  steps of each configuration taken at the time of its warm-up's last step, and the next
  one's warm-up and rounds at the time of the last one taken) stays
  under :data:`BUDGET` seconds. A model whose steps take seconds (ResNet-18 on two
  cores) is thereby re-checked against its next candidates only, never at the price of
  minutes; the candidates left out are named in the record (``not_measured``).
- *How*: each other configuration first takes ``warmup`` steps (its capture, the
  engine's binding and second plan); then :data:`ROUNDS` rounds each time one step of
  every configuration in turn, so a load that comes and goes falls on all of them; a
  configuration's time is the median of its rounds.
- *Switch*: to the fastest measured when it is faster than the chosen one by more than
  :data:`MARGIN`; otherwise the choice stands.
- These are steps of the decision, on the state it puts back after (weights,
  optimizer state, dropout steps): every trained step then runs at the final
  configuration, so an ``"auto"`` run is the same bits as a run given that
  configuration (a change of granularity changes the rounding of the gradient sums,
  so the switch is never made between trained steps).
"""

from __future__ import annotations

import statistics
import time

__all__ = ["BUDGET", "MARGIN", "ROUNDS", "recheck", "describe"]

MARGIN = 1.10        # switch when another candidate measures more than 10 % faster
ROUNDS = 7           # interleaved rounds, one step of each configuration per round
BUDGET = 10.0        # seconds the whole re-check may be projected to take
_perf = time.perf_counter


def recheck(trainer, x, y, chosen, rows, measured, configure, warmup) -> dict:
    """Measure ``chosen`` against the other candidates, keep the fastest (module docstring).

    ``chosen``: ``(g, fuse, layers, predicted_seconds)`` of the models' choice, which has
    just run its measured steps (``measured``, their median); ``rows``: the decision's
    candidate rows; ``configure(trainer, g, fuse, layers)`` sets a configuration. Leaves
    the trainer at the final configuration and returns the record
    (``GranularityDecision.recheck``).
    """
    predicted = chosen[3]
    ratio = measured / predicted if predicted > 0 else None  # None: JSON has no infinity
    others = sorted((r for r in rows if (r["granularity"], r["fuse"], None) != chosen[:3]),
                    key=lambda r: r["predicted_seconds"])
    configs = [chosen] + [(r["granularity"], r["fuse"], None, r["predicted_seconds"])
                          for r in others]
    start, step_seconds = _perf(), [measured]
    taken = [chosen]
    for config in configs[1:]:  # the chosen one is warm: it ran its measured steps last
        if (_perf() - start + ROUNDS * sum(step_seconds)
                + (warmup + ROUNDS) * step_seconds[-1]) > BUDGET:
            break  # this one's rounds would take the re-check past its budget
        configure(trainer, *config[:3])
        last = measured  # this configuration's step time, as far as its warm-up says
        for _ in range(warmup):
            t0 = _perf()
            trainer.train_step(x, y)
            last = _perf() - t0
        step_seconds.append(last)
        taken.append(config)
    left_out, configs = configs[len(taken):], taken
    times = [[] for _ in configs]
    for _ in range(ROUNDS):
        for config, seconds in zip(configs, times):
            configure(trainer, *config[:3])
            t0 = _perf()
            trainer.train_step(x, y)
            seconds.append(_perf() - t0)
    medians = [statistics.median(t) for t in times]
    best = min(range(len(configs)), key=medians.__getitem__)
    switched = best != 0 and medians[best] * MARGIN < medians[0]
    configure(trainer, *configs[best if switched else 0][:3])
    measured_rows = [{"granularity": g, "fuse": fuse,
                      "layer_granularity": None if layers is None else list(layers),
                      "predicted_seconds": p, "measured_seconds": m}
                     for (g, fuse, layers, p), m in zip(configs, medians)]
    return {"switched": switched, "margin": MARGIN, "rounds": ROUNDS, "budget": BUDGET,
            "not_measured": [{"granularity": g, "fuse": fuse, "predicted_seconds": p}
                             for g, fuse, _, p in left_out],
            "measured_over_predicted": ratio,
            "chosen_by_models": measured_rows[0],
            "final": measured_rows[best if switched else 0], "measured": measured_rows}


def _name(row) -> str:
    fuse = "" if row["fuse"] is None else (" fused" if row["fuse"] else " unfused")
    layers = "" if row["layer_granularity"] is None else f" per layer {row['layer_granularity']}"
    return f"g={row['granularity']}{fuse}{layers}"


def _cut(record) -> str:
    left = len(record.get("not_measured", ()))
    return f", {left} more left out by the {record['budget']:g} s budget" if left else ""


def describe(record) -> str:
    """The re-check as one line of output."""
    first, final = record["chosen_by_models"], record["final"]
    best_other = min(record["measured"][1:], key=lambda r: r["measured_seconds"], default=None)
    head = (f"  re-checked on measured steps ({len(record['measured'])} configurations, "
            f"{record['rounds']} rounds{_cut(record)}): {_name(first)} predicted "
            f"{1e3 * first['predicted_seconds']:.3f} ms, measured "
            f"{1e3 * first['measured_seconds']:.3f} ms")
    if record["switched"]:
        gain = first["measured_seconds"] / final["measured_seconds"] - 1
        return (f"{head}; {_name(final)} measured {1e3 * final['measured_seconds']:.3f} ms, "
                f"{100 * gain:.0f}% faster: switched to {_name(final)}")
    if best_other is None:
        return f"{head}; kept"
    return (f"{head}; kept (best other {_name(best_other)} measured "
            f"{1e3 * best_other['measured_seconds']:.3f} ms, not "
            f"{100 * (record['margin'] - 1):.0f}% faster)")
