"""Numba compilation flags, set in one place for every CPU kernel.

Kernels are compiled ``nogil=True`` so worker threads run them in parallel,
``cache=True`` so later processes skip the compile, and never ``fastmath`` so
results stay comparable with PyTorch to the last bits floating point allows.
GEMMs inside kernels use Numba's ``np.dot``, i.e. SciPy's BLAS, so a variant
that multiplies matrices is still one call without the interpreter lock.
"""

import numba
import numba.extending
import scipy.linalg.cython_blas  # noqa: F401  (the BLAS of Numba's np.dot, loaded before any
#                                   runtime holds BLAS to one thread per worker: threadpoolctl
#                                   limits only the libraries already loaded)

jit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy")

jit_inline = numba.njit(inline="always", nogil=True, fastmath=False, error_model="numpy")
"""The same flags for small helpers inlined at the Numba IR level into the kernels
that call them (no call overhead in inner loops; not cached on their own)."""


def as_dtype_of(a, value):
    """``a.dtype.type(value)``: ``value`` rounded to ``a``'s dtype, in Python and in kernels
    (as a wrapper's ``dtype(lr)`` is, so a kernel that reads ``lr`` from an operand
    rounds it the same way)."""
    return a.dtype.type(value)


@numba.extending.overload(as_dtype_of, jit_options={"nogil": True})
def _as_dtype_of(a, value):
    dtype = a.dtype

    def impl(a, value):
        return dtype(value)
    return impl
