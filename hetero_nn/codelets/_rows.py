"""Row helpers of the convolution and padding kernels: copies and multiply-adds of one row.

Kernels index flat views of C-contiguous arrays with unsigned offsets: Numba
then emits no negative-index wraparound and the row loops vectorise (5-7x on
short rows). The helpers are ``jit_inline``: Numba inlines them into each
kernel, as a call per row would cost more than the row. ``step`` is the
stride between the elements of the strided side of a row.
"""

from __future__ import annotations

from numba import uintp

from ._jit import jit_inline


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
    """
    d, s, n = uintp(d0), uintp(s0), uintp(count)
    eight = uintp(8)
    j = uintp(0)
    while j + eight < n:
        copy8(dst, d + j, src, s + j)
        j += eight
    copy8(dst, d + n - eight, src, s + n - eight)


@jit_inline
def gather_row(dst, d0, src, s0, step, count):
    """``dst[d0 + j] = src[s0 + step*j]`` for ``j < count``; ``dst`` and ``src`` do not overlap."""
    d, s = uintp(d0), uintp(s0)
    if step == 1 and count >= 8:
        copy_blocks(dst, d, src, s, count)
    elif step == 1:
        for j in range(uintp(count)):
            dst[d + j] = src[s + j]
    else:
        st = uintp(step)
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
def axpy3_gather_row(dst, d0, a, b, c, src, s0, tap, step, count):
    """``axpy_gather_row`` three times, for alphas ``a, b, c`` at ``src`` offsets ``0, tap,
    2*tap``, in ONE pass over ``dst``: each entry gets the three products added in that
    order, so the sums are bit for bit the three passes' (a third of the stores)."""
    d, s0_, s1, s2 = uintp(d0), uintp(s0), uintp(s0 + tap), uintp(s0 + 2 * tap)
    if step == 1:
        for j in range(uintp(count)):
            v = dst[d + j]
            v += a * src[s0_ + j]
            v += b * src[s1 + j]
            v += c * src[s2 + j]
            dst[d + j] = v
    else:
        st = uintp(step)
        for j in range(uintp(count)):
            v = dst[d + j]
            v += a * src[s0_ + st * j]
            v += b * src[s1 + st * j]
            v += c * src[s2 + st * j]
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
def row_sum(src, s0, count, total):
    """``total + src[s0] + ... + src[s0 + count - 1]``, added in that order."""
    s = uintp(s0)
    for j in range(uintp(count)):
        total += src[s + j]
    return total
