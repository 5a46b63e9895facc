# cython: language_level=3
"""C-level API of the compiled Monte Carlo sampler (contract in monte_carlo.py)."""

from libc.stdint cimport uint64_t

cdef uint64_t inside_range(uint64_t seed, uint64_t first, uint64_t stop) noexcept nogil
