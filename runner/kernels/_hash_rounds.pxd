# cython: language_level=3
"""C-level API of the compiled hash rounds (contract in hash_rounds.py)."""

from libc.stdint cimport uint64_t

cdef void chains(uint64_t seed, uint64_t first_lane, uint64_t rounds, uint64_t* out) noexcept nogil
