"""``cpu_intensive``: {"n": int} -> {"primes": the number of primes <= n}.

A segmented sieve of Eratosthenes over odd numbers in pure Python: ``bytearray`` slice assignment
does the inner loop in C, and segments of :data:`SEGMENT` odd numbers keep memory flat for n up to
10**9 (the schema's limit). A later issue moves this into a compiled kernel.
"""

from __future__ import annotations

import math
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

SEGMENT = 1 << 18
"""Odd numbers sieved per segment (256 KiB of flags)."""


def count_primes(n: int) -> int:
    """The number of primes p <= n (0 for n < 2)."""
    if n < 2:
        return 0
    if n < 3:
        return 1
    root = math.isqrt(n)
    # Sieving primes up to sqrt(n), by a plain sieve (sqrt(10**9) is about 31623).
    small = bytearray([1]) * (root + 1)
    small[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(root) + 1):
        if small[p]:
            small[p * p :: p] = bytes(len(range(p * p, root + 1, p)))
    odd_primes = [p for p in range(3, root + 1, 2) if small[p]]
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


@register
class CpuIntensive(JobType):
    """Count the primes up to n (CPU-bound)."""

    name = "cpu_intensive"
    schema = BUILTIN_SCHEMAS["cpu_intensive"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"primes": count_primes(n)}``."""
        return {"primes": count_primes(as_int(payload["n"], "n"))}
