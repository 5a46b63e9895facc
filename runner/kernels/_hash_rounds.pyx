# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled hash rounds; the contract is in hash_rounds.py.

Threads take groups of four lanes: four independent chains in one loop keep the multiplier busy
while each chain waits for its previous round (a single chain is latency-bound).
"""

import numpy as np

from cython.parallel cimport prange
from libc.stdint cimport uint64_t

from runner.kernels._splitmix cimport GOLDEN, mix64

cdef int LANES = 64
cdef int GROUP = 4


cdef void chains(uint64_t seed, uint64_t first_lane, uint64_t rounds, uint64_t* out) noexcept nogil:
    """Run lanes first_lane .. first_lane+3 for ``rounds`` rounds; write their final states to out[0..3]."""
    cdef uint64_t s0 = mix64(seed + (first_lane + 1) * GOLDEN)
    cdef uint64_t s1 = mix64(seed + (first_lane + 2) * GOLDEN)
    cdef uint64_t s2 = mix64(seed + (first_lane + 3) * GOLDEN)
    cdef uint64_t s3 = mix64(seed + (first_lane + 4) * GOLDEN)
    cdef uint64_t r
    for r in range(rounds):
        s0 = mix64(s0 + GOLDEN)
        s1 = mix64(s1 + GOLDEN)
        s2 = mix64(s2 + GOLDEN)
        s3 = mix64(s3 + GOLDEN)
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3


def hash_rounds(seed, rounds, threads=1):
    """The 64-bit digest of 64 chains of ``rounds`` SplitMix64 rounds from ``seed``, over ``threads``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if not 0 <= seed <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    states_array = np.zeros(LANES, dtype=np.uint64)
    cdef uint64_t[::1] states = states_array
    cdef uint64_t c_seed = seed
    cdef uint64_t c_rounds = rounds
    cdef int nthreads = threads
    cdef Py_ssize_t g
    for g in prange(LANES // GROUP, nogil=True, num_threads=nthreads, schedule="static"):
        chains(c_seed, g * GROUP, c_rounds, &states[g * GROUP])
    cdef uint64_t digest = 0
    cdef Py_ssize_t lane
    for lane in range(LANES):
        digest = mix64(digest ^ states[lane])
    return digest
