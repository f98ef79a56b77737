"""Numba compilation flags, set in one place for every CPU kernel.

Kernels are compiled ``nogil=True`` so worker threads run them in parallel,
``cache=True`` so later processes skip the compile, and never ``fastmath`` so
results stay comparable with PyTorch to the last bits floating point allows.
"""

import numba

jit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy")
