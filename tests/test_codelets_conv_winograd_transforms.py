"""The Winograd transforms (``codelets/conv_winograd.py``) against NumPy twins that do the
same operations in the same order: equal bit for bit, float32 and float64, over hypothesis
geometries (odd images, padding 0-2, partial last tiles, 1x1 and 2x2 outputs), on buffers of
16 planes ``plane_stride`` apart whose padding the kernels leave alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_nn.codelets import conv, conv_winograd

DTYPES = st.sampled_from([np.float32, np.float64])


def planes(flat, size):
    """The 16 planes of a flat buffer, ``plane_stride(size)`` apart, as ``[16, size]``."""
    return flat.reshape(16, -1)[:, :size]


def padded(size, dtype):
    """A flat buffer of 16 planes of ``size`` elements, NaN throughout."""
    return np.full(16 * conv_winograd.plane_stride(size), np.nan, dtype)


def filters_twin(w):
    """``u[4i + j, o, c] = (G g G^T)[i, j]`` for ``g = w[o, c]``."""
    half = w.dtype.type(0.5)
    g0, g1, g2 = w[:, :, 0], w[:, :, 1], w[:, :, 2]       # rows of each filter: [O, C, 3]
    t = (g0, (g0 + g1 + g2) * half, (g0 - g1 + g2) * half, g2)
    u = []
    for ti in t:
        c0, c1, c2 = ti[..., 0], ti[..., 1], ti[..., 2]
        u += [c0, (c0 + c1 + c2) * half, (c0 - c1 + c2) * half, c2]
    return np.stack(u)


def tiles_twin(x, geo):
    """``v[xi, c, n*T + ty*TW + tx] = (B^T d B)[xi]`` for the 4x4 tiles ``d`` of the padded
    input (zeros past it)."""
    n, c, height, width = x.shape
    th, tw = conv_winograd.tiles(geo)
    plane = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), x.dtype)
    h, w = min(height, plane.shape[2] - geo.pt), min(width, plane.shape[3] - geo.pl)
    plane[:, :, geo.pt:geo.pt + h, geo.pl:geo.pl + w] = x[:, :, :h, :w]
    d = [[plane[:, :, r:r + 2 * th:2, s:s + 2 * tw:2] for s in range(4)] for r in range(4)]
    rows = ([a - b for a, b in zip(d[0], d[2])], [a + b for a, b in zip(d[1], d[2])],
            [a - b for a, b in zip(d[2], d[1])], [a - b for a, b in zip(d[1], d[3])])
    v = []
    for r in rows:
        v += [r[0] - r[2], r[1] + r[2], r[2] - r[1], r[1] - r[3]]
    return np.stack(v).transpose(0, 2, 1, 3, 4).reshape(16, c, -1)


def untiles_twin(m, bias, out_shape):
    """``y``'s 2x2 tiles ``= A^T m A + bias`` from ``m[xi, o, col]``."""
    n, o, out_h, out_w = out_shape
    th, tw = (out_h + 1) // 2, (out_w + 1) // 2
    mt = m.reshape(16, o, n, th, tw).transpose(0, 2, 1, 3, 4)      # [16, N, O, TH, TW]
    b0 = (np.zeros(o, m.dtype) if bias is None else bias).reshape(1, o, 1, 1)
    s = ([mt[b] + mt[4 + b] + mt[8 + b] for b in range(4)],
         [mt[4 + b] - mt[8 + b] - mt[12 + b] for b in range(4)])
    y = np.empty((n, o, 2 * th, 2 * tw), m.dtype)
    for a in range(2):
        y[:, :, a::2, 0::2] = s[a][0] + s[a][1] + s[a][2] + b0
        y[:, :, a::2, 1::2] = s[a][1] - s[a][2] - s[a][3] + b0
    return y[:, :, :out_h, :out_w]


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), DTYPES)
def test_filter_transforms_equal_their_twin(n_out, n_in, dtype):
    w = np.random.default_rng(n_out * 10 + n_in).standard_normal((n_out, n_in, 3, 3))
    w = w.astype(dtype)
    ps = conv_winograd.plane_stride(n_out * n_in)
    for flipped, want in ((False, filters_twin(w)),
                          (True, filters_twin(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]))):
        u = padded(n_out * n_in, dtype)
        conv_winograd.transform_filters(w, u, ps, flipped)
        np.testing.assert_array_equal(planes(u, n_out * n_in).reshape(want.shape), want)
        assert np.isnan(u.reshape(16, -1)[:, n_out * n_in:]).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 10),
       st.integers(1, 10), st.integers(0, 2), st.booleans(), DTYPES)
def test_tile_transforms_equal_their_twins(n, c, o, h, w, padding, bias, dtype):
    if min(h, w) + 2 * padding < 3:
        return
    rng = np.random.default_rng(n + 7 * h + 31 * w)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    geo = conv.conv2d_geometry(x.shape, (o, c, 3, 3), padding=padding)
    th, tw = conv_winograd.tiles(geo)
    plane = np.empty((2 * th + 2, 2 * tw + 2), dtype)
    k = n * th * tw
    v = padded(c * k, dtype)
    conv_winograd.transform_tiles(x, 0, n, plane, v, conv_winograd.plane_stride(c * k), geo)
    np.testing.assert_array_equal(planes(v, c * k).reshape(16, c, k), tiles_twin(x, geo))
    m = padded(o * k, dtype)
    planes(m, o * k)[...] = rng.standard_normal((16, o * k))
    b = rng.standard_normal(o).astype(dtype) if bias else None
    y = np.full((n, o, geo.out_h, geo.out_w), np.nan, dtype)
    conv_winograd.untransform_tiles(m, 0, n, np.empty(0, dtype) if b is None else b, y,
                                    conv_winograd.plane_stride(o * k))
    np.testing.assert_array_equal(y, untiles_twin(planes(m, o * k).reshape(16, o, k), b,
                                                  y.shape))
