# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled exact sums of int64 and float64 arrays; the contract is in array_sum.py.

The Python-visible functions check their input, pick the chunks and combine the chunks' partial results
(exactly, as Python ints); the loops are ``cdef ... nogil`` and run in an OpenMP ``prange`` over chunks.
"""

import numpy as np

from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint64_t

cdef Py_ssize_t _CHUNK_MAX = 1 << 30  # keeps every accumulator far from overflow


cdef void sum_int64_chunk(const int64_t* data, Py_ssize_t n, uint64_t* out) noexcept nogil:
    """out = (W, H) for the biased terms b = x + 2**63 (the sign bit flipped, so 0 <= b < 2**64).

    W is the sum of the b wrapped to 64 bits, H the sum of their high 32-bit halves (exact while
    n <= 2**32). Then the exact sum of the b is ``T = H * 2**32 + ((W - H * 2**32) mod 2**64)`` (the sum of
    the low halves is below n * 2**32 <= 2**64, so the wrapped difference is it), and the sum of the
    x is ``T - n * 2**63``. Two adds and a shift per term: the loop vectorises and keeps up with memory.
    """
    cdef uint64_t w = 0, hi = 0, b
    cdef Py_ssize_t i
    for i in range(n):
        b = (<uint64_t>data[i]) ^ 0x8000000000000000u
        w += b
        hi += b >> 32
    out[0] = w
    out[1] = hi


cdef inline int _add_float(uint64_t b, int64_t* acc) noexcept nogil:
    """Add one float64 (its bit pattern) into acc[LIMBS] exactly; returns 1 if it is not finite."""
    cdef unsigned int expo = <unsigned int>((b >> 52) & 0x7FF)
    cdef uint64_t mant = b & 0xFFFFFFFFFFFFFu
    cdef uint64_t high
    cdef int64_t s
    cdef unsigned int pos, limb, sh
    if expo == 0x7FF:
        return 1
    if expo != 0:
        mant = mant | (<uint64_t>1 << 52)
    else:
        expo = 1  # subnormal: same scale as the smallest normal exponent
    # value * 2**1074 == mant << pos, split into three 32-bit words at limb, limb+1, limb+2
    pos = expo - 1
    limb = pos >> 5
    sh = pos & 31
    high = (mant >> 1) >> (31 - sh)  # == (mant << sh) >> 32, without losing bits
    s = -<int64_t>(b >> 63)  # 0 or -1: conditional negation as (w ^ s) - s
    acc[limb] += (<int64_t>((mant << sh) & 0xFFFFFFFFu) ^ s) - s
    acc[limb + 1] += (<int64_t>(high & 0xFFFFFFFFu) ^ s) - s
    acc[limb + 2] += (<int64_t>(high >> 32) ^ s) - s
    return 0


cdef int sum_float64_chunk(const uint64_t* bits, Py_ssize_t n, int64_t* acc) noexcept nogil:
    """Add n float64 (as their bit patterns) into acc[LIMBS] exactly; returns 1 if one was not finite.

    Even and odd terms go to two sets of limbs (acc and acc + LIMBS, so acc holds 2 * LIMBS words):
    consecutive terms of similar size hit the same limbs, and two sets halve that dependency chain.
    """
    cdef int bad = 0
    cdef Py_ssize_t i
    cdef int64_t* odd = acc + LIMBS
    for i in range(0, n - 1, 2):
        bad |= _add_float(bits[i], acc)
        bad |= _add_float(bits[i + 1], odd)
    if n % 2:
        bad |= _add_float(bits[n - 1], acc)
    for i in range(LIMBS):
        acc[i] += odd[i]
        odd[i] = 0
    return bad


cdef Py_ssize_t _chunks(Py_ssize_t n, int threads):
    cdef Py_ssize_t k = (n + _CHUNK_MAX - 1) // _CHUNK_MAX
    return max(k, <Py_ssize_t>threads)


def _checked(values, str dtype, threads):
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if getattr(values, "ndim", None) != 1 or str(getattr(values, "dtype", "")) != dtype:
        raise ValueError(
            f"values must be a 1-D {dtype} array, got {getattr(values, 'dtype', type(values).__name__)} "
            f"{getattr(values, 'shape', None)}"
        )
    return np.ascontiguousarray(values)


def sum_int64(values, threads=1):
    """The exact sum (a Python int) of a 1-D int64 array, over ``threads`` threads."""
    values = _checked(values, "int64", threads)
    cdef const int64_t[::1] data = values
    cdef Py_ssize_t n = data.shape[0]
    cdef int nthreads = threads
    cdef Py_ssize_t nchunks = _chunks(n, nthreads)
    parts_array = np.zeros((nchunks, 2), dtype=np.uint64)
    cdef uint64_t[:, ::1] parts = parts_array
    cdef Py_ssize_t c, start, stop
    if n == 0:
        return 0
    for c in prange(nchunks, nogil=True, num_threads=nthreads, schedule="static"):
        start = c * n // nchunks
        stop = (c + 1) * n // nchunks
        sum_int64_chunk(&data[0] + start, stop - start, &parts[c, 0])
    total = 0
    for c, (w, hi) in enumerate(parts_array.tolist()):
        terms = (c + 1) * n // nchunks - c * n // nchunks  # a Python int: the shift below must not wrap
        total += (hi << 32) + ((w - (hi << 32)) & 0xFFFFFFFFFFFFFFFF) - (terms << 63)
    return total


def sum_float64(values, threads=1):
    """The correctly rounded sum of a 1-D float64 array, over ``threads`` threads.

    Raises:
        ValueError: NaN or infinity in ``values``.
        OverflowError: the sum is beyond the float64 range.
    """
    values = _checked(values, "float64", threads)
    cdef const uint64_t[::1] bits = values.view(np.uint64)
    cdef Py_ssize_t n = bits.shape[0]
    cdef int nthreads = threads
    cdef Py_ssize_t nchunks = _chunks(n, nthreads)
    acc_array = np.zeros((nchunks, 2 * LIMBS), dtype=np.int64)
    cdef int64_t[:, ::1] acc = acc_array
    bad_array = np.zeros(nchunks, dtype=np.int32)
    cdef int[::1] bad = bad_array
    cdef Py_ssize_t c, start, stop
    if n == 0:
        return 0.0
    for c in prange(nchunks, nogil=True, num_threads=nthreads, schedule="static"):
        start = c * n // nchunks
        stop = (c + 1) * n // nchunks
        bad[c] = sum_float64_chunk(&bits[0] + start, stop - start, &acc[c, 0])
    if bad_array.any():
        raise ValueError("values must be finite (no NaN or infinity)")
    total = 0
    for row in acc_array[:, :LIMBS].tolist():
        for limb, word in enumerate(row):
            if word:
                total += word << (32 * limb)
    try:
        return total / (1 << 1074)  # int / int: correctly rounded by Python
    except OverflowError:
        raise OverflowError("the sum is beyond the float64 range") from None
