# cython: language_level=3
"""C-level API of the compiled array sums (see array_sum.py for the contract)."""

from libc.stdint cimport int64_t, uint64_t

cdef enum:
    LIMBS = 68  # 32-bit limbs of the float64 superaccumulator: bit 0 is 2**-1074, 68 * 32 > 2098 + carries

cdef void sum_int64_chunk(const int64_t* data, Py_ssize_t n, uint64_t* out) noexcept nogil
cdef int sum_float64_chunk(const uint64_t* bits, Py_ssize_t n, int64_t* acc) noexcept nogil  # acc: 2 * LIMBS words
