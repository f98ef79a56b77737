"""Codelets: StarPU-style operation declarations with NumPy, Numba and CuPy variants."""

from .codelet import R, RW, REDUX, SCRATCH, W, AccessMode, Codelet, variant_kind

__all__ = ["AccessMode", "Codelet", "R", "W", "RW", "REDUX", "SCRATCH", "variant_kind"]
