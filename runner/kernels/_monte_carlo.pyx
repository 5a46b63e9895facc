# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled Monte Carlo sampling for monte_carlo_pi; the contract is in monte_carlo.py."""

import numpy as np

from cython.parallel cimport prange
from libc.stdint cimport uint64_t

from runner.kernels._splitmix cimport GOLDEN, mix64

cdef uint64_t _CHUNK = 1 << 22


cdef uint64_t inside_range(uint64_t seed, uint64_t first, uint64_t stop) noexcept nogil:
    """How many of samples first .. stop-1 fall inside the quarter circle."""
    cdef uint64_t k, r, a, b, inside = 0
    for k in range(first, stop):
        r = mix64(seed + k * GOLDEN)
        a = r >> 32
        b = r & 0xFFFFFFFFu
        inside += a * a <= 0xFFFFFFFFFFFFFFFFu - b * b
    return inside


def count_inside(seed, samples, threads=1):
    """Points inside the quarter circle among ``samples`` seeded samples, over ``threads`` threads."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if not 0 <= seed <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    cdef uint64_t c_seed = seed
    cdef uint64_t n = samples
    cdef uint64_t nchunks = (n + _CHUNK - 1) // _CHUNK
    cdef int nthreads = threads
    parts_array = np.zeros(max(<Py_ssize_t>nchunks, 1), dtype=np.uint64)
    cdef uint64_t[::1] parts = parts_array
    cdef Py_ssize_t c
    for c in prange(<Py_ssize_t>nchunks, nogil=True, num_threads=nthreads, schedule="dynamic"):
        parts[c] = inside_range(c_seed, 1 + c * _CHUNK, min(1 + (c + 1) * _CHUNK, n + 1))
    return int(parts_array.sum())
