"""Direct convolution kernels (Numba): the ``cpu:direct`` variants and the depthwise ``cpu`` ones.

No column buffer: one kernel tap at a time, each a long multiply-add over a
"wide" row of a padded copy of the input plane. With an output row kept ``WQ``
long (only its first ``OW`` entries are outputs), output ``t = i*WQ + j`` of tap
``(p, q)`` reads input ``base(p, q) + t``: one tap is ONE long unit-stride axpy
over ``t < (OH-1)*WQ + OW`` instead of OH rows of OW (the tail entries ``j >=
OW`` are computed and never read; every index stays inside the plane).

Strides: the padded plane is split into its ``SH*SW`` stride *phases*, plane
``(a, b)`` holding rows ``a, a+SH, ...`` and columns ``b, b+SW, ...`` (``HQ x WQ``,
``HQ = ceil(HP/SH)``), so that tap ``(p, q)`` reads phase ``(p*DH % SH, q*DW % SW)``
from row ``p*DH // SH`` and column ``q*DW // SW`` on: every loop is unit-stride,
which LLVM vectorises (a strided gather would not). With unit strides the one
phase is the padded plane itself (``WQ = WP``).

Kernels run per group of channels (``groups`` in the geometry), padding only the
group's planes, so a depthwise convolution (one input plane per group) works on
one plane and one output row buffer that stay in the L1 cache. Three taps of a
kernel row are added per pass (``axpy3_row``, ``mul3_row``: the same sums, bit for
bit, with a third of the stores). Padding modes come from ``padding.pad_plane`` and
the input gradient's fold from ``padding.fold_plane``.

``geo`` is a :class:`~hetero_nn.codelets.conv.Conv2dGeometry`; weights are
``[O, C/groups, KH, KW]``. The forward and input-gradient kernels overwrite
their output; the parameter kernel adds into ``dw`` (and ``db``).
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, jit_inline
from ._rows import (add_scatter_row, axpy3_row, axpy_gather_row, axpy_scatter_row, fill_row,
                    gather_row, mul3_row, mul_gather_row, row_sum, set3_row)
from .padding import fold_plane, pad_plane

LANES_BYTES = 1 << 14
"""Size of the lane-wise sums of the parameter kernel per block of output rows:
within the L1 cache beside the rows of ``x`` and ``dy`` they read."""


@jit_inline
def _phases(geo):
    """``(phases, HQ, WQ)``: the stride phases of a padded plane and the size of each."""
    return (geo.sh * geo.sw, (geo.hp + geo.sh - 1) // geo.sh, (geo.wp + geo.sw - 1) // geo.sw)


@jit_inline
def _tap(p, q, geo, hq, wq):
    """Offset of tap ``(p, q)``'s first input in a plane's phases (see the module docstring)."""
    dp, dq = p * geo.dh, q * geo.dw
    phase = (dp % geo.sh) * geo.sw + dq % geo.sw
    return phase * hq * wq + (dp // geo.sh) * wq + dq // geo.sw


@jit_inline
def _split_phases(src, hp, wp, sh, sw, dst, d0, hq, wq):
    """``dst[d0 + ((a*SW + b)*HQ + r)*WQ + s] = src[(r*SH + a)*WP + s*SW + b]``; zero past
    the plane."""
    for a in range(sh):
        for b in range(sw):
            k0 = d0 + (a * sw + b) * hq * wq
            cols = max(0, (wp - b + sw - 1) // sw)
            for r in range(hq):
                row = r * sh + a
                if row < hp:
                    gather_row(dst, k0 + r * wq, src, row * wp + b, sw, cols)
                    fill_row(dst, k0 + r * wq + cols, wq - cols, 0.0)
                else:
                    fill_row(dst, k0 + r * wq, wq, 0.0)


@jit_inline
def _merge_phases(src, s0, hq, wq, sh, sw, dst, hp, wp):
    """The inverse of ``_split_phases``: the ``hp x wp`` plane ``dst`` from ``src[s0:]``."""
    for a in range(sh):
        for b in range(sw):
            k0 = s0 + (a * sw + b) * hq * wq
            cols = max(0, (wp - b + sw - 1) // sw)
            for r in range(hq):
                row = r * sh + a
                if row < hp:
                    for s in range(cols):
                        dst[row * wp + s * sw + b] = src[k0 + r * wq + s]


@jit_inline
def _load_planes(xf, x0, n_planes, height, width, pad, dst, d0, geo, hq, wq):
    """Pad ``n_planes`` consecutive input planes (``xf[x0:]``) and lay each out as its stride
    phases at ``dst[d0 + c*SH*SW*HQ*WQ]`` (``pad`` is a scratch plane; with unit strides the
    padded plane is written in place, borders kept zero by the caller in 'zeros' mode)."""
    area, per = height * width, geo.sh * geo.sw * hq * wq
    for c in range(n_planes):
        if geo.sh == 1 and geo.sw == 1:
            pad_plane(xf, x0 + c * area, height, width, dst, d0 + c * per, geo.pt, geo.pl,
                      geo.hp, geo.wp, geo.mode)
        else:
            pad_plane(xf, x0 + c * area, height, width, pad, 0, geo.pt, geo.pl, geo.hp, geo.wp,
                      geo.mode)
            _split_phases(pad, geo.hp, geo.wp, geo.sh, geo.sw, dst, d0 + c * per, hq, wq)


@jit_inline
def widen_planes(gf, g0, n_planes, out_h, out_w, wide, w0, row, stride):
    """Copy ``n_planes`` output planes (``gf[g0:]``) into wide rows ``wide[w0 + k*stride +
    i*row]``; the entries past ``OW`` are left as they are (the caller keeps them zero)."""
    for k in range(n_planes):
        for i in range(out_h):
            gather_row(wide, w0 + k * stride + i * row, gf, g0 + (k * out_h + i) * out_w, 1,
                       out_w)


@jit_inline
def _add_taps(acc, wf, w0, kw_size, src, s0, p, geo, hq, wq, count, start, first):
    """``acc[t] += sum_q w[w0 + q] * src[s0 + tap(p, q) + t]`` over kernel row ``p``, three
    taps per pass, in tap order; ``first``: ``acc`` holds ``start`` (and is not read)."""
    q = 0
    if first and kw_size >= 3:
        set3_row(acc, 0, start, wf[w0], wf[w0 + 1], wf[w0 + 2], src, s0 + _tap(p, 0, geo, hq, wq),
                 s0 + _tap(p, 1, geo, hq, wq), s0 + _tap(p, 2, geo, hq, wq), count)
        q = 3
    elif first:
        fill_row(acc, 0, count, start)
    while q < kw_size:
        if q + 3 <= kw_size:
            axpy3_row(acc, 0, wf[w0 + q], wf[w0 + q + 1], wf[w0 + q + 2], src,
                      s0 + _tap(p, q, geo, hq, wq), s0 + _tap(p, q + 1, geo, hq, wq),
                      s0 + _tap(p, q + 2, geo, hq, wq), count)
            q += 3
        else:
            axpy_gather_row(acc, 0, wf[w0 + q], src, s0 + _tap(p, q, geo, hq, wq), 1, count)
            q += 1


@jit
def conv2d_fwd_cpu(x, w, b, has_bias, y, geo):
    """Direct convolution into ``y`` (overwritten), one wide output plane at a time."""
    n_batch, n_in, height, width = x.shape
    n_out, group_in, kh_size, kw_size = w.shape
    group_out = n_out // geo.groups
    out_h, out_w = geo.out_h, geo.out_w
    phases, hq, wq = _phases(geo)
    per = phases * hq * wq
    span = (out_h - 1) * wq + out_w
    xf, wf, yf = x.reshape(-1), w.reshape(-1), y.reshape(-1)
    pad = np.zeros(geo.hp * geo.wp, dtype=x.dtype)   # borders stay zero in 'zeros' mode
    xph = np.zeros(group_in * per, dtype=x.dtype)    # likewise
    acc = np.empty(span, dtype=y.dtype)
    zero = y.dtype.type(0)
    for n in range(n_batch):
        for g in range(geo.groups):
            _load_planes(xf, (n * n_in + g * group_in) * height * width, group_in, height, width,
                         pad, xph, 0, geo, hq, wq)
            for o in range(g * group_out, (g + 1) * group_out):
                start = b[o] if has_bias else zero
                for c in range(group_in):
                    for p in range(kh_size):
                        _add_taps(acc, wf, ((o * group_in + c) * kh_size + p) * kw_size,
                                  kw_size, xph, c * per, p, geo, hq, wq, span, start,
                                  c == 0 and p == 0)
                y0 = (n * n_out + o) * out_h * out_w
                for i in range(out_h):
                    gather_row(yf, y0 + i * out_w, acc, i * wq, 1, out_w)


@jit
def conv2d_bwd_input_cpu(dy, w, dx, geo):
    """Direct transposed convolution into ``dx`` (overwritten), one input plane at a time,
    folded onto ``dx`` (padding modes). The wide gradient rows are zero past ``OW``, so
    the tail entries add ``w * 0``.

    With unit strides, input ``u`` of kernel row ``p`` receives ``w[p, q] * g[u - p*DH*WP -
    q*DW]``: each wide gradient plane is kept between margins of ``(KW-1)*DW`` zeros so
    that three taps are added per pass as a gather, in the order one pass per tap would
    add them. With other strides each tap adds its gradient onto its stride phase (one
    unit-stride pass per tap) and the phases are merged into the padded plane.
    """
    n_batch, n_in, height, width = dx.shape
    n_out, group_in, kh_size, kw_size = w.shape
    group_out = n_out // geo.groups
    out_h, out_w, hp, wp, dh, dw = geo.out_h, geo.out_w, geo.hp, geo.wp, geo.dh, geo.dw
    phases, hq, wq = _phases(geo)
    unit = phases == 1
    margin = (kw_size - 1) * dw if unit else 0
    span = (out_h - 1) * wq + out_w
    stride = span + 2 * margin  # one wide plane and its margins
    gf, wf, dxf = dy.reshape(-1), w.reshape(-1), dx.reshape(-1)
    gwide = np.zeros(group_out * stride, dtype=dy.dtype)  # tails and margins stay zero
    plane = np.empty(hp * wp, dtype=dx.dtype)
    phased = np.empty(0 if unit else phases * hq * wq, dtype=dx.dtype)
    for n in range(n_batch):
        for g in range(geo.groups):
            widen_planes(gf, (n * n_out + g * group_out) * out_h * out_w, group_out, out_h, out_w,
                         gwide, margin, wq, stride)
            for c in range(group_in):
                if unit:
                    fill_row(plane, 0, hp * wp, 0.0)
                else:
                    fill_row(phased, 0, phased.size, 0.0)
                for k in range(group_out):
                    w0 = ((g * group_out + k) * group_in + c) * kh_size * kw_size
                    for p in range(kh_size):
                        if unit:  # three taps per pass, gathered (offsets -DW apart)
                            q = 0
                            base = k * stride + margin
                            while q < kw_size:
                                d0, s0 = p * dh * wp, base - q * dw
                                if q + 3 <= kw_size:
                                    axpy3_row(plane, d0, wf[w0 + p * kw_size + q],
                                              wf[w0 + p * kw_size + q + 1],
                                              wf[w0 + p * kw_size + q + 2], gwide, s0, s0 - dw,
                                              s0 - 2 * dw, span + margin)
                                    q += 3
                                else:
                                    axpy_gather_row(plane, d0, wf[w0 + p * kw_size + q], gwide,
                                                    s0, 1, span + margin)
                                    q += 1
                            continue
                        for q in range(kw_size):
                            axpy_scatter_row(phased, _tap(p, q, geo, hq, wq), 1,
                                             wf[w0 + p * kw_size + q], gwide, k * stride, span)
                if not unit:
                    _merge_phases(phased, 0, hq, wq, geo.sh, geo.sw, plane, hp, wp)
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
    out_h, out_w = geo.out_h, geo.out_w
    phases, hq, wq = _phases(geo)
    per = phases * hq * wq
    span = (out_h - 1) * wq + out_w
    taps = kh_size * kw_size
    rows = max(1, min(out_h, LANES_BYTES // max(1, taps * wq * dw.itemsize)))
    xf, gf, dwf = x.reshape(-1), dy.reshape(-1), dw.reshape(-1)
    pad = np.zeros(geo.hp * geo.wp, dtype=x.dtype)
    xph = np.zeros(n_batch * group_in * per, dtype=x.dtype)
    gwide = np.zeros(n_batch * group_out * span, dtype=dy.dtype)
    lanes = np.empty(max(taps * rows * wq, span), dtype=dw.dtype)  # the taps' block, or db's
    for g in range(groups):
        for n in range(n_batch):
            _load_planes(xf, (n * n_in + g * group_in) * height * width, group_in, height, width,
                         pad, xph, n * group_in * per, geo, hq, wq)
            widen_planes(gf, (n * n_out + g * group_out) * out_h * out_w, group_out, out_h,
                         out_w, gwide, n * group_out * span, wq, span)
        for k in range(group_out):
            o = g * group_out + k
            if has_bias:
                fill_row(lanes, 0, span, 0.0)
                for n in range(n_batch):
                    add_scatter_row(lanes, 0, 1, gwide, (n * group_out + k) * span, span)
                total = db[o]
                for i in range(out_h):
                    total = row_sum(lanes, i * wq, out_w, total)
                db[o] = total
            for c in range(group_in):
                w0 = (o * group_in + c) * taps
                for i0 in range(0, out_h, rows):
                    i1 = min(i0 + rows, out_h)
                    block = (i1 - i0 - 1) * wq + out_w
                    fill_row(lanes, 0, taps * block, 0.0)
                    for n in range(n_batch):
                        g0 = (n * group_out + k) * span + i0 * wq
                        x0 = (n * group_in + c) * per + i0 * wq
                        for p in range(kh_size):
                            q = 0
                            while q < kw_size:
                                l0 = (p * kw_size + q) * block
                                if q + 3 <= kw_size:
                                    mul3_row(lanes, l0, l0 + block, l0 + 2 * block, gwide, g0,
                                             xph, x0 + _tap(p, q, geo, hq, wq),
                                             x0 + _tap(p, q + 1, geo, hq, wq),
                                             x0 + _tap(p, q + 2, geo, hq, wq), block)
                                    q += 3
                                else:
                                    mul_gather_row(lanes, l0, gwide, g0, xph,
                                                   x0 + _tap(p, q, geo, hq, wq), 1, block)
                                    q += 1
                    for t in range(taps):
                        total = dwf[w0 + t]
                        for i in range(i1 - i0):
                            total = row_sum(lanes, t * block + i * wq, out_w, total)
                        dwf[w0 + t] = total
