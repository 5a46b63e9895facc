"""``cpu_intensive``: CPU-bound work whose cost grows with a payload parameter (compiled kernels).

Two forms (exactly one):

* ``{"n": int}`` -> ``{"primes": the number of primes <= n}`` (a segmented sieve; cost ~ n log log n);
* ``{"rounds": int, "seed"?: int}`` -> ``{"digest": 16 hex digits, "rounds": r, "lanes": 64}``: 64 chains
  of ``rounds`` SplitMix64 rounds (cost: 64 * rounds rounds), see :mod:`runner.kernels.hash_rounds`.

Both spread over ``thread_demand`` threads and give the same answer for any thread count.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.kernels import primes
from runner.kernels.hash_rounds import LANES, hash_rounds
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

__all__ = ["CpuIntensive", "count_primes"]


def count_primes(n: int, threads: int = 1) -> int:
    """The number of primes p <= n (0 for n < 2), over ``threads`` threads."""
    return primes.count_primes(n, threads)


@register
class CpuIntensive(JobType):
    """Count the primes up to n, or run a fixed number of hash rounds (CPU-bound)."""

    name = "cpu_intensive"
    schema = BUILTIN_SCHEMAS["cpu_intensive"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"primes": ...}`` for ``n``, or the digest of the hash rounds for ``rounds``."""
        if "rounds" in payload:
            rounds = as_int(payload["rounds"], "rounds")
            seed = as_int(payload.get("seed", 0), "seed")
            digest = hash_rounds(seed, rounds, ctx.threads)
            return {"digest": f"{digest:016x}", "rounds": rounds, "lanes": LANES}
        return {"primes": count_primes(as_int(payload["n"], "n"), ctx.threads)}
