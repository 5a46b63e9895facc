# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled prime counting (segmented sieve of odd numbers); the contract is in primes.py.

Index i stands for the odd number 2*i + 1; the sieve covers indices 1 .. (n - 1) // 2.
"""

import math

import numpy as np

from cython.parallel cimport prange, threadid
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memset

cdef int64_t SEG = 1 << 15  # odd numbers per segment: 32 KiB of flags


cdef int64_t count_block(
    int64_t first, int64_t stop, const int64_t* primes, Py_ssize_t nprimes, int64_t* nxt, uint8_t* flags
) noexcept nogil:
    """Primes among the odd numbers of indices first .. stop-1, sieved segment by segment.

    ``nxt`` (nprimes words) is this thread's scratch: the index of each prime's next odd multiple.
    """
    cdef Py_ssize_t k
    cdef int64_t p, m, lo_number, a, b, j, length, count = 0, i
    lo_number = 2 * first + 1
    for k in range(nprimes):  # first odd multiple >= max(p*p, lo_number)
        p = primes[k]
        m = p * p
        if m < lo_number:
            m = (lo_number + p - 1) // p * p
            if m % 2 == 0:
                m += p
        nxt[k] = (m - 1) // 2
    a = first
    while a < stop:
        b = min(a + SEG, stop)
        length = b - a
        memset(flags, 1, <size_t>length)
        for k in range(nprimes):
            p = primes[k]
            j = nxt[k]
            if (p * p - 1) // 2 >= b:
                break  # this prime and every later one start beyond the segment
            j -= a
            while j < length:
                flags[j] = 0
                j += p
            nxt[k] = a + j
        for i in range(length):
            count += flags[i]
        a = b
    return count


def _odd_primes_upto(limit):
    """The odd primes 3 <= p <= limit, as an int64 array (a plain sieve; limit is isqrt(n))."""
    flags = np.ones(limit + 1, dtype=bool)
    flags[:3] = False
    flags[4::2] = False
    for p in range(3, math.isqrt(limit) + 1, 2):
        if flags[p]:
            flags[p * p :: 2 * p] = False
    return np.flatnonzero(flags).astype(np.int64)


def count_primes(n, threads=1):
    """The number of primes <= n, over ``threads`` threads."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if n < 2:
        return 0
    if n < 3:
        return 1
    odd_primes = _odd_primes_upto(math.isqrt(n))
    cdef Py_ssize_t nprimes = odd_primes.size
    primes_array = np.append(odd_primes, 0)  # one spare word: &primes[0] is valid even with no primes
    cdef const int64_t[::1] primes = primes_array
    cdef int64_t last = (n - 1) // 2  # the index of the largest odd number <= n
    cdef int64_t segments = (last + SEG - 1) // SEG
    cdef int nthreads = threads
    cdef Py_ssize_t nblocks = max(1, min(segments, 8 * nthreads))
    counts_array = np.zeros(nblocks, dtype=np.int64)
    cdef int64_t[::1] counts = counts_array
    # Scratch per thread, allocated here (not inside the threads: no malloc arena per thread).
    nxt_array = np.zeros((nthreads, nprimes + 1), dtype=np.int64)
    cdef int64_t[:, ::1] nxt = nxt_array
    flags_array = np.zeros((nthreads, SEG), dtype=np.uint8)
    cdef uint8_t[:, ::1] flags = flags_array
    cdef Py_ssize_t blk
    cdef int tid
    cdef int64_t first, stop
    for blk in prange(nblocks, nogil=True, num_threads=nthreads, schedule="dynamic"):
        tid = threadid()
        first = 1 + blk * segments // nblocks * SEG
        stop = min(1 + (blk + 1) * segments // nblocks * SEG, last + 1)
        counts[blk] = count_block(first, stop, &primes[0], nprimes, &nxt[tid, 0], &flags[tid, 0])
    return 1 + int(counts_array.sum())
