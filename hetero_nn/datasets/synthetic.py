"""The ``synthetic`` dataset: seeded, learnable images generated per sample.

A smooth random template per class plus noise, generated from the sample's index,
so even 512x512 images cost nothing until a batch asks for them.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError

_SYNTHETIC_DEFAULTS = dict(image_size=28, channels=1, num_classes=10, num_samples=None,
                           seed=0, noise=1.0)
_SYNTHETIC_SAMPLES = {"train": 2048, "test": 512}
EAGER_BYTES = 64 << 20     # generate at load time up to this many bytes
_SYNTHETIC_GRID = 6                   # templates are bilinear upsamplings of 6 x 6 grids
# Seed-sequence tags: the entropy lists differ in their second word, never only by length
# (SeedSequence pads with zeros, so [a, b] and [a, b, 0] would collide).
_TAG_TEMPLATE, _TAG_LABEL, _TAG_SAMPLE = 0x7E3B1A7E, 0x1ABE1, 0x5A3B1E
_SPLIT_KEY = {"train": 0, "test": 1}


def _interp_matrix(n_out: int, n_in: int) -> np.ndarray:
    """``(n_out, n_in)`` bilinear (corner-aligned) interpolation weights."""
    if n_in == 1:
        return np.ones((n_out, 1))
    position = np.linspace(0.0, n_in - 1, n_out)
    low = np.minimum(np.floor(position).astype(np.int64), n_in - 2)
    frac = position - low
    weights = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    weights[rows, low] = 1.0 - frac
    weights[rows, low + 1] += frac
    return weights


class _SyntheticImages:
    """Generator of synthetic samples: ``sample i`` is a pure function of (seed, split, i).

    Class ``k``'s template in channel ``c`` is ``A @ G[k, c] @ B.T`` (a random 6 x 6 grid
    ``G`` bilinearly upsampled), shifted and scaled to zero mean and unit variance; the
    grids depend on the seed only, so both splits share them. Sample ``i`` draws from
    ``default_rng([seed, tag, split, i])`` an amplitude ``a ~ U(0.5, 1.5)`` and Gaussian
    noise ``n``, and is ``(a * template + noise * n) / sqrt(13/12 + noise**2)``: values of
    about zero mean and unit variance, which is why the normalisation is the identity.
    """

    def __init__(self, seed, split, channels, height, width, num_classes, noise):
        self.seed, self.split_key = seed, _SPLIT_KEY[split]
        self.shape = (channels, height, width)
        self.noise = float(noise)
        grid_h, grid_w = min(_SYNTHETIC_GRID, height), min(_SYNTHETIC_GRID, width)
        self.rows = _interp_matrix(height, grid_h)
        self.cols = _interp_matrix(width, grid_w)
        rng = np.random.default_rng([seed, _TAG_TEMPLATE])
        self.grids = rng.standard_normal((num_classes, channels, grid_h, grid_w))
        # Mean and variance of each upsampled template, in closed form (no H x W pass):
        # mean = a.G.b with a, b the column means; E[T^2] = tr(G BtB G^T AtA) / (H W).
        a_mean, b_mean = self.rows.mean(axis=0), self.cols.mean(axis=0)
        ata, btb = self.rows.T @ self.rows, self.cols.T @ self.cols
        mean = np.einsum("i,kcij,j->kc", a_mean, self.grids, b_mean)
        second = np.einsum("kcij,jl,kcml,mi->kc", self.grids, btb, self.grids, ata)
        second /= height * width
        var = second - mean ** 2
        flat = var <= 1e-12 * np.maximum(second, 1e-300)   # e.g. 1 x 1 images
        self.center = np.where(flat, 0.0, mean)
        self.scale = np.where(flat, np.sqrt(np.maximum(second, 1e-300)), np.sqrt(np.abs(var)))
        self.norm = math.sqrt(13.0 / 12.0 + self.noise ** 2)

    def template(self, label: int) -> np.ndarray:
        """Class ``label``'s template, ``float64`` ``(C, H, W)``."""
        raw = self.rows @ self.grids[label] @ self.cols.T
        return (raw - self.center[label][:, None, None]) / self.scale[label][:, None, None]

    def __call__(self, indices: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The samples ``indices`` (of classes ``labels``), ``float32`` ``(n, C, H, W)``."""
        out = np.empty((len(indices),) + self.shape, dtype=np.float32)
        rows, cols_t = self.rows.astype(np.float32), self.cols.T.astype(np.float32)
        for row, (index, label) in enumerate(zip(indices, labels)):
            rng = np.random.default_rng([self.seed, _TAG_SAMPLE, self.split_key, int(index)])
            amplitude = rng.uniform(0.5, 1.5)
            noise = rng.standard_normal(self.shape, dtype=np.float32)
            # amplitude * template / norm, folded into the small grid: one float32 matmul.
            gain = amplitude / self.norm / self.scale[int(label)]
            grid = (self.grids[int(label)] * gain[:, None, None]).astype(np.float32)
            height_rows = (rows @ grid).reshape(-1, grid.shape[-1])        # (C * H, grid)
            np.matmul(height_rows, cols_t, out=out[row].reshape(height_rows.shape[0], -1))
            out[row] -= (self.center[int(label)] * gain).astype(np.float32)[:, None, None]
            noise *= np.float32(self.noise / self.norm)
            out[row] += noise
        return out


def _synthetic_labels(seed: int, split: str, count: int, num_classes: int) -> np.ndarray:
    """Balanced labels: each block of ``num_classes`` samples holds every class once.

    The keys come from one generator's stream, so the first ``n`` labels do not depend
    on ``count``: a smaller ``num_samples`` (or ``limit``) keeps a prefix.
    """
    blocks = -(-count // num_classes)
    keys = np.random.default_rng([seed, _TAG_LABEL, _SPLIT_KEY[split]]).random(
        blocks * num_classes)
    return keys.reshape(blocks, num_classes).argsort(axis=1).ravel()[:count].astype(np.int64)


def _positive_int(option: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ConfigError(f"synthetic option {option}={value!r}: expected a positive integer")
    return int(value)


def load_synthetic(split: str, options: dict):
    """``(generator, labels, classes, sample shape)`` of one synthetic split; options checked."""
    unknown = sorted(set(options) - set(_SYNTHETIC_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown synthetic option(s) {', '.join(unknown)}; expected "
                          f"{', '.join(_SYNTHETIC_DEFAULTS)}")
    opts = {**_SYNTHETIC_DEFAULTS, **options}
    size = opts["image_size"]
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ConfigError(f"synthetic option image_size={size!r}: expected an int or "
                              f"(height, width)")
        height, width = size
    else:
        height, width = size, size
    height = _positive_int("image_size", height)
    width = _positive_int("image_size", width)
    channels = _positive_int("channels", opts["channels"])
    num_classes = _positive_int("num_classes", opts["num_classes"])
    if num_classes < 2:
        raise ConfigError(f"synthetic option num_classes={num_classes}: expected at least 2")
    count = opts["num_samples"]
    count = _SYNTHETIC_SAMPLES[split] if count is None else _positive_int("num_samples", count)
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"synthetic option seed={seed!r}: expected an integer >= 0")
    try:
        noise = float(opts["noise"])
    except (TypeError, ValueError):
        noise = math.nan
    if not noise >= 0.0 or math.isinf(noise):
        raise ConfigError(f"synthetic option noise={opts['noise']!r}: expected a finite "
                          f"number >= 0")
    generator = _SyntheticImages(int(seed), split, channels, height, width, num_classes, noise)
    labels = _synthetic_labels(int(seed), split, count, num_classes)
    classes = tuple(f"class_{k}" for k in range(num_classes))
    return generator, labels, classes, (channels, height, width)


