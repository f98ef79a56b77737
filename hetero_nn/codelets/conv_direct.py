"""Direct convolution kernels (Numba): the ``cpu:direct`` variants and the depthwise ``cpu`` ones.

No column buffer: one kernel tap at a time, each a long multiply-add over a
"wide" row of a padded copy of the input plane. With the plane padded to
``HP x WP`` and an output row kept ``WP`` long (only its first ``OW`` entries
are outputs), output ``t = i*WP + j`` of tap ``(p, q)`` reads input
``(i*SH + p*DH)*WP + j*SW + q*DW = base(p, q) + SW*t`` when ``SH == SW``: one tap
is then ONE long axpy over ``t < (OH-1)*WP + OW`` instead of OH rows of OW (the
tail entries ``j >= OW`` are computed and never read; every index stays inside
the padded plane). When ``SH != SW`` the same loops run one output row at a time.

Kernels run per group of channels (``groups`` in the geometry), padding only the
group's planes, so a depthwise convolution (one input plane per group) works on
one plane and one output row buffer that stay in the L1 cache. The taps of a
kernel row are added three at a time (``axpy3_gather_row``: the same sums, bit for
bit, with a third of the stores). Padding modes come from ``padding.pad_plane``
and the input gradient's fold from ``padding.fold_plane``.

``geo`` is a :class:`~hetero_nn.codelets.conv.Conv2dGeometry`; weights are
``[O, C/groups, KH, KW]``. The forward and input-gradient kernels overwrite
their output; the parameter kernel adds into ``dw`` (and ``db``).
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, jit_inline
from ._rows import (add_scatter_row, axpy3_gather_row, axpy_gather_row, axpy_scatter_row,
                    fill_row, gather_row, mul_gather_row, row_sum)
from .padding import fold_plane, pad_planes

LANES_BYTES = 1 << 14
"""Size of the lane-wise sums of the parameter kernel per block of output rows:
within the L1 cache beside the rows of ``x`` and ``dy`` they read."""


@jit_inline
def wide_runs(sh, sw, out_h, out_w, wp):
    """``(runs, run_len)`` of the wide layout: one long run if ``sh == sw``, else one per row."""
    if sh == sw:
        return 1, (out_h - 1) * wp + out_w
    return out_h, out_w


@jit_inline
def widen_planes(gf, g0, n_planes, out_h, out_w, wide, w0, wp, span):
    """Copy ``n_planes`` output planes (``gf[g0:]``) into wide rows ``wide[w0 + k*span + i*wp]``;
    the entries past ``OW`` are left as they are (the caller keeps them zero)."""
    for k in range(n_planes):
        for i in range(out_h):
            gather_row(wide, w0 + k * span + i * wp, gf, g0 + (k * out_h + i) * out_w, 1, out_w)


@jit_inline
def _add_taps(acc, d0, wf, w0, kw_size, src, base, tap, sw, runs, row_in, run_len, wp):
    """``acc[d0 + t] += sum_q w[w0 + q] * src[base + q*tap + sw*t]`` over one kernel row,
    three taps per pass, in tap order (one run, or one per output row ``r`` at
    ``d0 + r*wp`` when ``runs > 1``). ``tap`` may be negative."""
    q = 0
    while q < kw_size:
        b = base + q * tap
        if q + 3 <= kw_size:
            for r in range(runs):
                axpy3_gather_row(acc, d0 + r * wp, wf[w0 + q], wf[w0 + q + 1], wf[w0 + q + 2],
                                 src, b + r * row_in, tap, sw, run_len)
            q += 3
        else:
            for r in range(runs):
                axpy_gather_row(acc, d0 + r * wp, wf[w0 + q], src, b + r * row_in, sw, run_len)
            q += 1


@jit
def conv2d_fwd_cpu(x, w, b, has_bias, y, geo):
    """Direct convolution into ``y`` (overwritten), one wide output plane at a time."""
    n_batch, n_in, height, width = x.shape
    n_out, group_in, kh_size, kw_size = w.shape
    group_out = n_out // geo.groups
    out_h, out_w, wp = geo.out_h, geo.out_w, geo.wp
    runs, run_len = wide_runs(geo.sh, geo.sw, out_h, out_w, wp)
    span = (out_h - 1) * wp + out_w
    plane = geo.hp * wp
    xf, wf, yf = x.reshape(-1), w.reshape(-1), y.reshape(-1)
    xpad = np.zeros(group_in * plane, dtype=x.dtype)  # borders stay zero in 'zeros' mode
    acc = np.empty(span, dtype=y.dtype)
    for n in range(n_batch):
        for g in range(geo.groups):
            pad_planes(xf, (n * n_in + g * group_in) * height * width, group_in, height, width,
                        xpad, 0, geo)
            for o in range(g * group_out, (g + 1) * group_out):
                fill_row(acc, 0, span, b[o] if has_bias else 0.0)
                for c in range(group_in):
                    for p in range(kh_size):
                        _add_taps(acc, 0, wf, ((o * group_in + c) * kh_size + p) * kw_size,
                                  kw_size, xpad, c * plane + p * geo.dh * wp, geo.dw, geo.sw,
                                  runs, geo.sh * wp, run_len, wp)
                y0 = (n * n_out + o) * out_h * out_w
                for i in range(out_h):
                    gather_row(yf, y0 + i * out_w, acc, i * wp, 1, out_w)


@jit
def conv2d_bwd_input_cpu(dy, w, dx, geo):
    """Direct transposed convolution into ``dx`` (overwritten), one padded input plane at a
    time, folded onto ``dx`` (padding modes). The wide gradient rows are zero past ``OW``,
    so the tail entries add ``w * 0``.

    With unit strides, input ``u`` of kernel row ``p`` receives ``w[p, q] * g[u - p*DH*WP -
    q*DW]``: each wide gradient plane is kept between margins of ``(KW-1)*DW`` zeros so
    that three taps are added per pass as a gather (``_add_taps`` with a negative tap
    step), in the order one pass per tap would add them. Other strides scatter one tap
    per pass.
    """
    n_batch, n_in, height, width = dx.shape
    n_out, group_in, kh_size, kw_size = w.shape
    group_out = n_out // geo.groups
    out_h, out_w, hp, wp, dh, dw = geo.out_h, geo.out_w, geo.hp, geo.wp, geo.dh, geo.dw
    runs, run_len = wide_runs(geo.sh, geo.sw, out_h, out_w, wp)
    unit = geo.sh == 1 and geo.sw == 1
    margin = (kw_size - 1) * dw if unit else 0
    span = (out_h - 1) * wp + out_w
    stride = span + 2 * margin  # one wide plane and its margins
    gf, wf, dxf = dy.reshape(-1), w.reshape(-1), dx.reshape(-1)
    gwide = np.zeros(group_out * stride, dtype=dy.dtype)  # tails and margins stay zero
    plane = np.empty(hp * wp, dtype=dx.dtype)
    for n in range(n_batch):
        for g in range(geo.groups):
            for k in range(group_out):
                widen_planes(gf, (n * n_out + g * group_out + k) * out_h * out_w, 1, out_h, out_w,
                             gwide, k * stride + margin, wp, span)
            for c in range(group_in):
                fill_row(plane, 0, hp * wp, 0.0)
                for k in range(group_out):
                    w0 = ((g * group_out + k) * group_in + c) * kh_size * kw_size
                    for p in range(kh_size):
                        if unit:
                            _add_taps(plane, p * dh * wp, wf, w0 + p * kw_size, kw_size, gwide,
                                      k * stride + margin, -dw, 1, 1, 0, run_len + margin, 0)
                            continue
                        for q in range(kw_size):
                            wv = wf[w0 + p * kw_size + q]
                            for r in range(runs):
                                axpy_scatter_row(plane, (p * dh + r * geo.sh) * wp + q * dw,
                                                 geo.sw, wv, gwide, k * stride + r * wp, run_len)
                fold_plane(plane, 0, hp, wp, dxf, (n * n_in + g * group_in + c) * height * width,
                           height, width, geo.pt, geo.pl, geo.mode)


@jit
def conv2d_bwd_params_cpu(x, dy, dw, db, has_bias, geo):
    """Direct weight (and bias) gradient, added into ``dw`` (and ``db``).

    Each ``dw[o, c, p, q]`` is a dot product over ``(n, i, j)``. Without
    fastmath a scalar reduction does not vectorise, so the products are summed
    lane-wise over the batch (vector loads and stores, no reassociation) and each
    tap's lanes are summed at the end, over the real outputs only. The lanes of
    every tap of one ``(o, c)`` cover a block of output rows sized to stay in the
    L1 cache (``LANES_BYTES``); blocks are summed in order.
    """
    n_batch, n_in, height, width = x.shape
    n_out, group_in, kh_size, kw_size = dw.shape
    groups = geo.groups
    group_out = n_out // groups
    out_h, out_w, hp, wp = geo.out_h, geo.out_w, geo.hp, geo.wp
    sh, sw = geo.sh, geo.sw
    span = (out_h - 1) * wp + out_w
    plane, taps = hp * wp, kh_size * kw_size
    rows = max(1, min(out_h, LANES_BYTES // max(1, taps * wp * dw.itemsize)))
    xf, gf, dwf = x.reshape(-1), dy.reshape(-1), dw.reshape(-1)
    xpad = np.zeros(n_batch * group_in * plane, dtype=x.dtype)
    gwide = np.zeros(n_batch * group_out * span, dtype=dy.dtype)
    lanes = np.empty(max(taps * rows * wp, span), dtype=dw.dtype)  # a tap's block, or db's span
    for g in range(groups):
        for n in range(n_batch):
            pad_planes(xf, (n * n_in + g * group_in) * height * width, group_in, height, width,
                        xpad, n * group_in * plane, geo)
            widen_planes(gf, (n * n_out + g * group_out) * out_h * out_w, group_out, out_h, out_w,
                         gwide, n * group_out * span, wp, span)
        for k in range(group_out):
            o = g * group_out + k
            if has_bias:
                fill_row(lanes, 0, span, 0.0)
                for n in range(n_batch):
                    add_scatter_row(lanes, 0, 1, gwide, (n * group_out + k) * span, span)
                total = db[o]
                for i in range(out_h):
                    total = row_sum(lanes, i * wp, out_w, total)
                db[o] = total
            for c in range(group_in):
                w0 = (o * group_in + c) * taps
                for i0 in range(0, out_h, rows):
                    i1 = min(i0 + rows, out_h)
                    block = (i1 - i0 - 1) * wp + out_w
                    fill_row(lanes, 0, taps * block, 0.0)
                    for n in range(n_batch):
                        g0 = (n * group_out + k) * span
                        x0 = (n * group_in + c) * plane
                        for p in range(kh_size):
                            for q in range(kw_size):
                                l0 = (p * kw_size + q) * block
                                base = x0 + p * geo.dh * wp + q * geo.dw
                                if sh == sw:
                                    mul_gather_row(lanes, l0, gwide, g0 + i0 * wp, xpad,
                                                   base + i0 * sh * wp, sw, block)
                                else:
                                    for i in range(i0, i1):
                                        mul_gather_row(lanes, l0 + (i - i0) * wp, gwide,
                                                       g0 + i * wp, xpad, base + i * sh * wp,
                                                       sw, out_w)
                    for t in range(taps):
                        total = dwf[w0 + t]
                        for i in range(i1 - i0):
                            total = row_sum(lanes, t * block + i * wp, out_w, total)
                        dwf[w0 + t] = total
