"""Shape families: what calibrating one partition size teaches about the others.

This module owns the prediction ``granularity="auto"`` makes for a task whose
footprint was never measured, and the order and budget of its calibration.

A task's *family* is its codelet, variant, worker kind and footprint with the
leading (partition) dimension of every operand dropped (``"32x64x8x8:<f4"``
becomes ``"64x8x8:<f4"``; a codelet's own parameters are kept). A layer at another
granularity, or a batch's last, shorter partition, is the same family at another
size (the codelet's work figure, linear in the partition's samples); two layers of
the same shapes are one family too, so what one of them taught serves the other.

Policy
------
- :class:`FamilyModel` predicts an unmeasured footprint from its family's measured
  ones (their medians): on the straight line through the measured sizes either side of
  it (interpolated), or through the two nearest (extended beyond them), or in proportion to the size from
  the only one; a line that would give a time under a tenth of the nearest measured
  one's share of its size gives that share instead (it never goes to zero or below).
  A footprint measured for any candidate variant is left to the measured models.
- Calibration order (:func:`calibration_order`): with the model's first fusion, the
  ``g`` of one partition per worker (the smallest ``g`` at least the worker count: the
  configuration a model of large kernels most often runs at, so it is measured, not
  predicted, and its graph is small, so its capture step is cheap), then the largest
  ``g`` (another size, so every family of that fusion has a line: partitions of 8 and of
  32 images of ResNet-18 predict the sizes between and beyond them within 10% where one
  size scaled in proportion missed a weight gradient's per-partition cost by 70%); then
  the smallest ``g`` with the other fusion, then the rest from large to small. The first
  is always calibrated; each further one while the projected
  calibration (seconds so far, plus two steps of the slowest step measured: a
  configuration's first step and one timed) stays under ``CALIBRATION_BUDGET``
  and two of the ``CALIBRATION_STEPS`` are left (a configuration whose next step
  would end past the budget stops once each footprint has one measurement:
  ``granularity._calibrate``). A configuration's steps stop once each of its
  footprints is measured and each one's family has ``CALIBRATION_SAMPLES``
  measurements at any size, in any layer: partitions of 32 images measured at g=2
  count for those of 8 at g=8, so the second configuration needs one timed step. Past
  it, a configuration is predicted by its families, or left out of the candidates
  where one of its tasks has neither a measured footprint nor a family (a codelet no
  calibrated configuration ran, such as the other fusion's).
"""

from __future__ import annotations

__all__ = ["CALIBRATION_BUDGET", "CALIBRATION_STEPS", "FamilyModel", "calibration_order",
           "family_of"]

CALIBRATION_BUDGET = 10.0
"""Seconds the calibration may take before configurations are left to their families (issue
28's goal for ResNet-18). The built-in toy models stay well under it (``CALIBRATION_STEPS``
stops them first); on 2 cores ResNet-18 in the CIFAR layout (3 s a step at batch 64)
calibrates one configuration."""

CALIBRATION_STEPS = 5
"""Training steps the calibration may take in all, each configuration's first included (issue
28: "at most 10 s or five steps, whichever is less"): the first configuration takes up to
three (its first step, its first replay and one timed), the second the two left (its first
and one timed); past them, configurations are left to their families. Those of the other
fusion then have none (their codelets never ran) and are left out of the candidates (in
issue 30's goal figure, ``docs/granularity.md``, a fused configuration measured fastest
for LeNet-5 and dahl-basic); the re-check compares the rest on measured steps."""

_FLOOR = 0.1  # a line never predicts under a tenth of the nearest measure's share of size


def family_of(footprint: str) -> str:
    """The footprint with each operand's leading dimension dropped (module docstring)."""
    parts = []
    for part in footprint.split("|"):
        dims, sep, rest = part.partition(":")
        if sep and "=" not in part:
            dims = dims.partition("x")[2]
        parts.append(dims + sep + rest)
    return "|".join(parts)


def calibration_order(configs: list, workers: int = 1) -> list:
    """``configs`` (``(g, fuse)``, g ascending, fusions in the model's order) in the order
    they are calibrated (module docstring): the g of one partition per worker (the smallest
    at least ``workers``, else the largest) and another size, the largest g (else the
    smallest), with the first fusion; the smallest g with the last fusion; then the
    others from the largest g down."""
    if len(configs) <= 1:
        return list(configs)
    fusion = configs[0][1]
    sizes = sorted({g for g, f in configs if f == fusion})
    own = next((g for g in sizes if g >= workers), sizes[-1])
    first = [(own, fusion)]
    if len(sizes) > 1:
        first.append((sizes[-1] if sizes[-1] != own else sizes[0], fusion))
    last = configs[-1][1]
    other = min((c for c in configs if c[1] == last and c not in first), default=None,
                key=lambda c: c[0])
    if other is not None:
        first.append(other)
    rest = sorted((c for c in configs if c not in first),
                  key=lambda c: (-c[0], configs.index(c)))
    return [*first, *rest]


class FamilyModel:
    """Predictions by family for the tasks the runtime's performance model has not measured:
    ``models`` of :func:`~hetero_nn.simulation.simulate.simulate`. ``used`` counts the
    tasks it predicted."""

    def __init__(self, rt):
        self.rt = rt
        self.pm = rt.perfmodel
        self._points: dict = {}  # (codelet, variant, kind) -> {family: [(size, seconds)]}
        self.used = 0

    def __call__(self, task, kind):
        codelet = task.codelet
        if kind not in codelet.kinds:
            return None
        name, fp = codelet.name, task.footprint
        variants = self.rt.candidates(codelet, kind)
        if any(self.pm.count(name, v, kind, fp) for v in variants):
            return None
        family = family_of(fp)
        guesses = [s for s in (self._predict(name, v, kind, family, task.size)
                               for v in variants) if s is not None]
        if not guesses:
            return None
        self.used += 1
        return min(guesses), "family"

    def covers(self, graphs, kinds) -> bool:
        """Whether every task of the captured ``graphs`` has a measured footprint or a
        family on one of ``kinds`` (a configuration not calibrated is a candidate only so)."""
        return all(any(kind in t.codelet.kinds and (
            any(self.pm.count(t.codelet.name, v, kind, t.footprint)
                for v in self.rt.candidates(t.codelet, kind))
            or self(t, kind) is not None) for kind in kinds)
            for flushed in graphs for t in flushed)

    def _predict(self, name, variant, kind, family, size):
        points = self._families(name, variant, kind).get(family)
        if not points or not size > 0:
            return None
        below = max((p for p in points if p[0] <= size), default=None)
        above = min((p for p in points if p[0] >= size), default=None)
        if below is not None and above is not None and below[0] != above[0]:
            pair = [below, above]  # interpolated
        else:
            pair = sorted(points, key=lambda p: abs(p[0] - size))
            pair = [pair[0], *(p for p in pair[1:] if p[0] != pair[0][0])][:2]
        s0, t0 = pair[0] if abs(pair[0][0] - size) <= abs(pair[-1][0] - size) else pair[-1]
        share = t0 * size / s0
        if len(pair) < 2:
            return share
        (s0, t0), (s1, t1) = pair
        line = t0 + (t1 - t0) * (size - s0) / (s1 - s0)
        return max(line, _FLOOR * share)

    def _families(self, name, variant, kind) -> dict:
        key = (name, variant, kind)
        got = self._points.get(key)
        if got is None:
            got = self._points[key] = {}
            for row in self.pm.entries(name):
                if (row["variant"], row["kind"]) == (variant, kind) and row["size"] > 0:
                    got.setdefault(family_of(row["footprint"]), []).append(
                        (row["size"], row["median"]))
        return got
