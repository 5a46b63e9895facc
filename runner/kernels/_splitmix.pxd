# cython: language_level=3
"""The SplitMix64 step, shared by the compiled kernels (``cimport runner.kernels._splitmix``).

``GOLDEN`` is SplitMix64's increment (2**64 / golden ratio) and :func:`mix64` its output function
(Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014): the k-th output
(k = 1, 2, ...) of a generator seeded with s is ``mix64(s + k * GOLDEN)``, all modulo 2**64, which is
what makes the streams counter-based: any thread can compute any term without the ones before it.
The Python twins spell the same constants out (``hash_rounds.GOLDEN``, ``hash_rounds.mix64``).
"""

from libc.stdint cimport uint64_t

cdef extern from *:
    """
    #define CORRAL_GOLDEN 0x9E3779B97F4A7C15ULL
    #define CORRAL_MIX_M1 0xBF58476D1CE4E5B9ULL
    #define CORRAL_MIX_M2 0x94D049BB133111EBULL
    """
    const uint64_t GOLDEN "CORRAL_GOLDEN"
    const uint64_t MIX_M1 "CORRAL_MIX_M1"
    const uint64_t MIX_M2 "CORRAL_MIX_M2"


cdef inline uint64_t mix64(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * MIX_M1
    z = (z ^ (z >> 27)) * MIX_M2
    return z ^ (z >> 31)
