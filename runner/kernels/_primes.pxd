# cython: language_level=3
"""C-level API of the compiled prime counter (contract in primes.py)."""

from libc.stdint cimport int64_t, uint8_t

cdef int64_t count_block(
    int64_t first, int64_t stop, const int64_t* primes, Py_ssize_t nprimes, int64_t* nxt, uint8_t* flags
) noexcept nogil
