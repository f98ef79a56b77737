"""The statistics a performance model keeps (:mod:`~hetero_nn.scheduler.perfmodel` owns
the models, their lock and their files).

- :class:`History`: one (codelet, variant, kind, footprint)'s run times as count, mean and
  M2 (Welford), with the mean size; histories merge pairwise (Chan et al.), so what is on
  disk and what a process measured add up without double counting. It also keeps the
  last :data:`RECENT` run times, whose median is its :attr:`~History.estimate` (what the
  model predicts): one run slowed by a busy machine moves a mean by its whole excess
  over the count, and has pushed every task onto one device in StarPU's users' reports;
  it does not move a median.
- :class:`LinkStats`: one link's transfers as weighted running sums for
  ``t = latency + nbytes * seconds_per_byte``, weights ``1 / t**2`` (timing noise is
  relative); :func:`default_link` before any record, by node kind.
- :func:`fit_regression`: StarPU's non-linear model ``t = a * size**b + c`` over the
  footprints of one (codelet, variant, kind), a :class:`Regression`.

Plain values, no locks: the caller (``PerfModel``) serialises access.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["History", "LinkStats", "Regression", "default_link", "fit_regression"]

_HOST_LINK = (1e-6, 1.0 / 10e9)   # host memory to host memory: 1 us + 10 GB/s
_CUDA_LINK = (10e-6, 1.0 / 20e9)  # anything involving a GPU: 10 us + 20 GB/s
#: Run times a History keeps (the latest) for its median.
RECENT = 15


class History:
    """Running statistics of one key: count, mean and M2 of the time (Welford), mean size,
    and the ``recent`` run times (the last :data:`RECENT`, oldest first)."""

    __slots__ = ("count", "mean", "m2", "size", "recent")

    def __init__(self, count=0, mean=0.0, m2=0.0, size=0.0, recent=()):
        self.count = count
        self.mean = mean
        self.m2 = m2
        self.size = size
        self.recent = tuple(recent)[-RECENT:]

    def add(self, size: float, seconds: float) -> None:
        """Mutates: adds one measurement."""
        self.count += 1
        n = self.count
        delta = seconds - self.mean
        self.mean += delta / n
        self.m2 += delta * (seconds - self.mean)
        self.size += (size - self.size) / n
        self.recent = (*self.recent, seconds)[-RECENT:]

    def absorb(self, other: "History") -> None:
        """Mutates: adds every measurement of ``other`` (see :meth:`merged`)."""
        m = self.merged(other)
        self.count, self.mean, self.m2, self.size, self.recent = \
            m.count, m.mean, m.m2, m.size, m.recent

    @classmethod
    def of(cls, size: float, seconds: list) -> "History":
        """The statistics of a batch of runs of one size."""
        n = len(seconds)
        mean = math.fsum(seconds) / n
        return cls(n, mean, math.fsum([(t - mean) * (t - mean) for t in seconds]), size, seconds)

    @classmethod
    def of_nanoseconds(cls, size: float, ns, idx, skip: int = 0) -> "History | None":
        """The statistics of the runs ``ns[idx[skip:]]`` (nanoseconds, a compiled replay's
        stamps) in seconds, in one compiled pass (a replay gives the model a batch per
        key at every run: numpy's small-array calls cost more than the replay of a small
        graph); None when a run time is not >= 0."""
        count, mean, m2, recent = _batch_ns(ns, idx, skip, RECENT)
        if count < 0:
            return None
        return cls(count, mean, m2, size, recent.tolist())

    def merged(self, other: "History | None") -> "History":
        """A new history holding both sets of measurements (Chan et al.'s pairwise formula;
        ``other``'s recent runs taken as the later)."""
        if other is None or other.count == 0:
            return History(self.count, self.mean, self.m2, self.size, self.recent)
        if self.count == 0:
            return History(other.count, other.mean, other.m2, other.size, other.recent)
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / n
        size = self.size + (other.size - self.size) * other.count / n
        return History(n, mean, m2, size, self.recent + other.recent)

    @property
    def estimate(self) -> float:
        """The run time to expect: the median of the recent runs, robust to outliers (the
        mean for a history saved without them)."""
        return statistics.median(self.recent) if self.recent else self.mean

    @property
    def variance(self) -> float:
        """Sample variance (0 with a single measurement)."""
        return self.m2 / (self.count - 1) if self.count > 1 else 0.0

    def to_json(self) -> dict:
        return {"size": self.size, "count": self.count, "mean": self.mean, "m2": self.m2,
                "recent": list(self.recent)}

    @classmethod
    def from_json(cls, row: dict) -> "History":
        count, mean, m2, size = row["count"], row["mean"], row["m2"], row["size"]
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"bad count {count!r}")
        for label, value in (("mean", mean), ("m2", m2), ("size", size)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"bad {label} {value!r}")
        recent = row.get("recent", [])
        if not isinstance(recent, list) or len(recent) > count or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                and t >= 0 for t in recent):
            raise ValueError(f"bad recent {recent!r}")
        return cls(count, float(mean), float(m2), float(size), [float(t) for t in recent])


@njit(cache=True, nogil=True)
def _batch_ns(ns, idx, skip, keep):
    """Count, mean and M2 (two passes) in seconds of ``ns[idx[skip:]]``, and the last
    ``keep`` of them; a count of -1 when one is not >= 0."""
    n = len(idx) - skip
    total = 0.0
    for j in range(skip, len(idx)):
        x = ns[idx[j]] * 1e-9
        if not x >= 0.0:
            return -1, 0.0, 0.0, np.empty(0)
        total += x
    mean = total / n if n > 0 else 0.0
    m2 = 0.0
    for j in range(skip, len(idx)):
        d = ns[idx[j]] * 1e-9 - mean
        m2 += d * d
    last = np.empty(min(keep, n))
    for j in range(len(last)):
        last[j] = ns[idx[len(idx) - len(last) + j]] * 1e-9
    return n, mean, m2, last


class LinkStats:
    """Weighted running sums of one link's transfers, for ``t = latency + nbytes * spb``.

    Weights are ``1 / t**2`` (relative error), so a 64 MiB copy does not drown
    the latency that small copies measure. Weighted means and co-moments are
    updated incrementally (West 1979) and merge pairwise.
    """

    __slots__ = ("count", "weight", "mean_x", "mean_y", "cxx", "cxy")

    def __init__(self, count=0, weight=0.0, mean_x=0.0, mean_y=0.0, cxx=0.0, cxy=0.0):
        self.count = count
        self.weight = weight
        self.mean_x = mean_x
        self.mean_y = mean_y
        self.cxx = cxx
        self.cxy = cxy

    def add(self, nbytes: float, seconds: float) -> None:
        """Mutates: adds one transfer."""
        w = 1.0 / max(seconds, 1e-9) ** 2
        self.count += 1
        self.weight += w
        r = w / self.weight
        dx = nbytes - self.mean_x
        self.mean_x += r * dx
        self.mean_y += r * (seconds - self.mean_y)
        self.cxx += w * dx * (nbytes - self.mean_x)
        self.cxy += w * dx * (seconds - self.mean_y)

    def merged(self, other: "LinkStats | None") -> "LinkStats":
        """A new set of sums holding both."""
        if other is None or other.count == 0:
            return LinkStats(self.count, self.weight, self.mean_x, self.mean_y, self.cxx, self.cxy)
        if self.count == 0:
            return LinkStats(other.count, other.weight, other.mean_x, other.mean_y,
                              other.cxx, other.cxy)
        weight = self.weight + other.weight
        dx = other.mean_x - self.mean_x
        dy = other.mean_y - self.mean_y
        f = self.weight * other.weight / weight
        return LinkStats(self.count + other.count, weight,
                          self.mean_x + dx * other.weight / weight,
                          self.mean_y + dy * other.weight / weight,
                          self.cxx + other.cxx + dx * dx * f,
                          self.cxy + other.cxy + dx * dy * f)

    def fit(self, default: tuple[float, float]) -> tuple[float, float]:
        """(latency s, seconds per byte) by weighted least squares, kept physical.

        Too little spread in sizes to see a slope: the defaults scaled to match
        the measured mean. A negative latency: a fit through the origin.
        """
        lat0, spb0 = default
        spread = self.cxx / self.weight if self.weight else 0.0
        if self.count >= 2 and spread > (1e-6 * max(self.mean_x, 1.0)) ** 2:
            spb = self.cxy / self.cxx
            if spb > 0:
                latency = self.mean_y - spb * self.mean_x
                if latency >= 0:
                    return latency, spb
                sxx = self.cxx + self.weight * self.mean_x ** 2
                sxy = self.cxy + self.weight * self.mean_x * self.mean_y
                if sxy > 0:
                    return 0.0, sxy / sxx
        scale = self.mean_y / (lat0 + spb0 * self.mean_x)
        return lat0 * scale, spb0 * scale

    def to_json(self) -> dict:
        return {"count": self.count, "weight": self.weight, "mean_bytes": self.mean_x,
                "mean_seconds": self.mean_y, "cxx": self.cxx, "cxy": self.cxy}

    @classmethod
    def from_json(cls, row: dict) -> "LinkStats":
        count = row["count"]
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"bad count {count!r}")
        values = [row[k] for k in ("weight", "mean_bytes", "mean_seconds", "cxx", "cxy")]
        for v in values:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"bad value {v!r}")
        if values[0] <= 0 or values[3] < 0:
            raise ValueError("bad weight or co-moment")
        return cls(count, *(float(v) for v in values))


def default_link(src: str, dst: str) -> tuple[float, float]:
    """Defaults by node kind, read from the names: any ``cuda*`` end, else host to host."""
    if src.startswith("cuda") or dst.startswith("cuda"):
        return _CUDA_LINK
    return _HOST_LINK


@dataclass(frozen=True, slots=True)
class Regression:
    """``t = a * size**b + c`` fitted over the footprints of one (codelet, variant, kind)."""

    a: float
    b: float
    c: float
    points: int        # footprints the fit used
    min_size: float
    max_size: float

    def __call__(self, size: float) -> float:
        return self.a * size ** self.b + self.c


def _power_fit(log_sizes, times, c):
    """Least squares of ``log(t - c)`` on ``log size``: (a, b) and the error in ``log t``."""
    ys = [math.log(t - c) for t in times]
    n = len(ys)
    mx = sum(log_sizes) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in log_sizes)
    sxy = sum((x - mx) * (y - my) for x, y in zip(log_sizes, ys))
    b = sxy / sxx
    try:
        a = math.exp(my - b * mx)
        preds = [a * math.exp(b * x) + c for x in log_sizes]
    except OverflowError:  # a power this steep (sizes close together): no fit
        return 0.0, b, math.inf
    err = 0.0
    for pred, t in zip(preds, times):
        err += (math.log(pred) - math.log(t)) ** 2 if pred > 0 else math.inf
    return a, b, err


def fit_regression(points) -> Regression | None:
    """Fit StarPU's non-linear model to ``(size, seconds)`` points; ``None`` below 2 sizes.

    ``c`` (a fixed cost per task) is searched on a grid over ``[0, min t)`` then
    refined by golden section, minimising the squared error in ``log t``; it
    needs at least 3 distinct sizes, else ``c = 0`` (a plain power law).
    """
    pts = [(s, t) for s, t in points if s > 0 and t > 0]
    sizes = {s for s, _ in pts}
    if len(sizes) < 2:
        return None
    log_sizes = [math.log(s) for s, _ in pts]
    times = [t for _, t in pts]
    a, b, err = _power_fit(log_sizes, times, 0.0)
    best = (err, a, b, 0.0)
    if len(sizes) >= 3 and err > 1e-24:
        t_min = min(times)
        steps = 16
        grid = [t_min * k / steps for k in range(steps)]
        errs = [(_power_fit(log_sizes, times, c)[2], c) for c in grid[1:]]
        _, c_best = min(errs)
        lo, hi = max(c_best - t_min / steps, 0.0), min(c_best + t_min / steps, t_min * 0.999)
        golden = (math.sqrt(5) - 1) / 2
        for _ in range(30):  # golden section inside the best grid cell's neighbourhood
            c1, c2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
            if _power_fit(log_sizes, times, c1)[2] < _power_fit(log_sizes, times, c2)[2]:
                hi = c2
            else:
                lo = c1
        c = (lo + hi) / 2
        a_c, b_c, err_c = _power_fit(log_sizes, times, c)
        if err_c < best[0]:
            best = (err_c, a_c, b_c, c)
    err, a, b, c = best
    if not math.isfinite(err):
        return None
    return Regression(a, b, c, len(pts), min(sizes), max(sizes))
