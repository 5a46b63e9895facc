"""Counting primes up to n: the Python twin, and the loader of ``_primes``.

Contract (both builds, any thread count): :func:`count_primes` is the number of primes ``p <= n``
(0 for ``n < 2``). Both sieve odd numbers only, in segments, with the odd primes up to ``isqrt(n)``.

The twin marks composites with ``bytearray`` slice assignment (the inner loop runs in C, but every
slice is a Python call). The compiled build gives each thread a contiguous block of segments of
:data:`SEGMENT` odd numbers (32 KiB of flags, one L1 cache) and, per block, the next multiple of every
sieving prime, so that no division happens per segment; the blocks' counts are summed afterwards.
"""

from __future__ import annotations

import math

from runner.kernels import check_threads, extension

__all__ = ["COMPILED", "SEGMENT", "count_primes", "odd_primes_upto", "py_count_primes"]

SEGMENT = 1 << 18
"""Odd numbers per segment in the Python twin (256 KiB of flags)."""

_ext = extension("_primes")
COMPILED = _ext is not None
"""True when the compiled build runs."""


def odd_primes_upto(limit: int) -> list[int]:
    """The odd primes ``3 <= p <= limit`` (plain sieve of Eratosthenes)."""
    if limit < 3:
        return []
    flags = bytearray([1]) * (limit + 1)
    flags[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(limit) + 1):
        if flags[p]:
            flags[p * p :: p] = bytes(len(range(p * p, limit + 1, p)))
    return [p for p in range(3, limit + 1, 2) if flags[p]]


def py_count_primes(n: int, threads: int = 1) -> int:
    """The number of primes ``p <= n`` (``threads`` is checked, then ignored)."""
    check_threads(threads)
    if n < 2:
        return 0
    if n < 3:
        return 1
    odd_primes = odd_primes_upto(math.isqrt(n))
    # Index i of a segment stands for the odd number lo + 2*i.
    count = 1  # the prime 2
    lo = 3
    while lo <= n:
        size = min(SEGMENT, (n - lo) // 2 + 1)
        flags = bytearray([1]) * size
        hi = lo + 2 * (size - 1)
        for p in odd_primes:
            if p * p > hi:
                break
            start = max(p * p, (lo + p - 1) // p * p)
            if start % 2 == 0:
                start += p
            first = (start - lo) // 2
            if first < size:
                flags[first::p] = bytes(len(range(first, size, p)))
        count += flags.count(1)
        lo = hi + 2
    return count


def count_primes(n: int, threads: int = 1) -> int:
    """The number of primes ``p <= n``, over ``threads`` threads."""
    if _ext is not None:
        return int(_ext.count_primes(n, threads))
    return py_count_primes(n, threads)
