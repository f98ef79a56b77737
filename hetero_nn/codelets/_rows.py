"""Row helpers of the convolution and padding kernels: copies and multiply-adds of one row.

Kernels index flat views of C-contiguous arrays with unsigned offsets: Numba
then emits no negative-index wraparound and the row loops vectorise (5-7x on
short rows). The helpers are ``jit_inline``: Numba inlines them into each
kernel, as a call per row would cost more than the row. ``step`` is the
stride between the elements of the strided side of a row.
"""

from __future__ import annotations

import numpy as np
from numba import uintp

from ._jit import jit_inline

START = np.intp(0)
"""The offset 0 for a kernel called, not inlined, from another: Numba compiles a called
kernel once more for each literal argument (a ``0`` typed ``Literal[int](0)``), not for
a global of a NumPy integer type."""


@jit_inline
def fill_row(dst, start, count, value):
    """``dst[start:start+count] = value``."""
    d = uintp(start)
    for j in range(uintp(count)):
        dst[d + j] = value


@jit_inline
def copy8(dst, d, src, s):
    """``dst[d:d+8] = src[s:s+8]``: eight loads, then eight stores, which LLVM merges
    into one vector load and one vector store (arithmetic written this way stays
    scalar: Numba leaves LLVM's SLP vectoriser off)."""
    a0 = src[s]
    a1 = src[s + uintp(1)]
    a2 = src[s + uintp(2)]
    a3 = src[s + uintp(3)]
    a4 = src[s + uintp(4)]
    a5 = src[s + uintp(5)]
    a6 = src[s + uintp(6)]
    a7 = src[s + uintp(7)]
    dst[d] = a0
    dst[d + uintp(1)] = a1
    dst[d + uintp(2)] = a2
    dst[d + uintp(3)] = a3
    dst[d + uintp(4)] = a4
    dst[d + uintp(5)] = a5
    dst[d + uintp(6)] = a6
    dst[d + uintp(7)] = a7


@jit_inline
def copy_blocks(dst, d0, src, s0, count):
    """``dst[d0:d0+count] = src[s0:s0+count]`` by blocks of 8, for ``count >= 8``.

    LLVM's vectorised loop starts at 32 floats (8 lanes, unrolled 4 times), so
    a plain loop copies the short rows of a convolution one scalar at a time.
    The last block overlaps the one before it: ``dst`` and ``src`` must not.
    One ``copy8`` in the loop (the last block taken by clamping its start):
    each inlined copy costs compilation time in every kernel that copies rows.
    """
    d, s, last = uintp(d0), uintp(s0), uintp(count - 8)
    j = uintp(0)
    while True:
        copy8(dst, d + j, src, s + j)
        if j == last:
            break
        j = min(j + uintp(8), last)


@jit_inline
def gather_row(dst, d0, src, s0, step, count):
    """``dst[d0 + j] = src[s0 + step*j]`` for ``j < count``; ``dst`` and ``src`` do not overlap.
    Rows of 8 or more with a unit step go by blocks; shorter ones stay scalar whatever
    the loop, so one loop serves them and strided rows."""
    d, s, st = uintp(d0), uintp(s0), uintp(step)
    if step == 1 and count >= 8:
        copy_blocks(dst, d, src, s, count)
    else:
        for j in range(uintp(count)):
            dst[d + j] = src[s + st * j]


@jit_inline
def axpy_gather_row(dst, d0, alpha, src, s0, step, count):
    """``dst[d0 + j] += alpha * src[s0 + step*j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + st * j]


@jit_inline
def axpy3_row(dst, d0, a, b, c, src, s0, s1, s2, count):
    """``dst[d0 + j] += a*src[s0 + j] + b*src[s1 + j] + c*src[s2 + j]`` for ``j < count``, the
    three products added one after the other: in ONE pass over ``dst``, the sums of three
    ``axpy_gather_row`` passes bit for bit, with a third of the stores."""
    d, t0, t1, t2 = uintp(d0), uintp(s0), uintp(s1), uintp(s2)
    for j in range(uintp(count)):
        v = dst[d + j]
        v += a * src[t0 + j]
        v += b * src[t1 + j]
        v += c * src[t2 + j]
        dst[d + j] = v


@jit_inline
def set3_row(dst, d0, start, a, b, c, src, s0, s1, s2, count):
    """``axpy3_row`` onto a row that holds ``start`` (of ``dst``'s dtype), without reading
    it: ``dst`` filled with ``start`` then ``axpy3_row``, bit for bit, in one pass."""
    d, t0, t1, t2 = uintp(d0), uintp(s0), uintp(s1), uintp(s2)
    for j in range(uintp(count)):
        v = start
        v += a * src[t0 + j]
        v += b * src[t1 + j]
        v += c * src[t2 + j]
        dst[d + j] = v


@jit_inline
def axpy_scatter_row(dst, d0, step, alpha, src, s0, count):
    """``dst[d0 + step*j] += alpha * src[s0 + j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += alpha * src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + st * j] += alpha * src[s + j]


@jit_inline
def add_scatter_row(dst, d0, step, src, s0, count):
    """``dst[d0 + step*j] += src[s0 + j]`` for ``j < count``."""
    d, s = uintp(d0), uintp(s0)
    if step == 1:
        for j in range(uintp(count)):
            dst[d + j] += src[s + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            dst[d + st * j] += src[s + j]


@jit_inline
def mul_gather_row(lanes, l0, a, a0, b, b0, step, count):
    """``lanes[l0 + j] += a[a0 + j] * b[b0 + step*j]``: a dot product kept lane-wise."""
    m, s, t = uintp(l0), uintp(a0), uintp(b0)
    if step == 1:
        for j in range(uintp(count)):
            lanes[m + j] += a[s + j] * b[t + j]
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            lanes[m + j] += a[s + j] * b[t + st * j]


@jit_inline
def mul3_row(lanes, l0, l1, l2, a, a0, b, b0, b1, b2, count):
    """``mul_gather_row`` (unit step) for three lane rows at once, sharing the loads of ``a``:
    ``lanes[lk + j] += a[a0 + j] * b[bk + j]`` for ``k < 3``."""
    m0, m1, m2, s = uintp(l0), uintp(l1), uintp(l2), uintp(a0)
    t0, t1, t2 = uintp(b0), uintp(b1), uintp(b2)
    for j in range(uintp(count)):
        g = a[s + j]
        lanes[m0 + j] += g * b[t0 + j]
        lanes[m1 + j] += g * b[t1 + j]
        lanes[m2 + j] += g * b[t2 + j]


@jit_inline
def row_sum(src, s0, count, total):
    """``total + src[s0] + ... + src[s0 + count - 1]``, added in that order."""
    s = uintp(s0)
    for j in range(uintp(count)):
        total += src[s + j]
    return total


@jit_inline
def finish_row(dst, d0, src, s0, count, bias, o, activation):
    """``dst[d0 + j] = act(src[s0 + j] (+ bias[o]))`` for ``j < count`` (``bias`` empty: none;
    ``activation`` 0 none, 1 ``relu_fwd``'s ReLU, 2 ``relu6_fwd``'s clamp): the bias add
    rounded, then the activation's selects, so the bits of the three passes it replaces.
    ``dst`` and ``src`` are the same row or do not overlap."""
    d, s = uintp(d0), uintp(s0)
    zero, six = dst.dtype.type(0), dst.dtype.type(6)
    if bias.size == 0 and activation == 0:
        gather_row(dst, d, src, s, 1, count)
        return
    b = bias[o] if bias.size else zero
    has_bias = bias.size != 0
    if activation == 0:
        for j in range(uintp(count)):
            dst[d + j] = src[s + j] + b
    elif activation == 1:
        for j in range(uintp(count)):
            v = src[s + j] + b if has_bias else src[s + j]
            dst[d + j] = zero if v <= 0 else v  # -0.0 becomes 0, NaN passes
    else:
        for j in range(uintp(count)):
            v = src[s + j] + b if has_bias else src[s + j]
            r = zero if v < 0 else v  # a clamp: NaN and -0.0 pass
            dst[d + j] = six if v > 6 else r
