"""Seeded Monte Carlo points for monte_carlo_pi: the Python twin, and the loader of ``_monte_carlo``.

Contract (both builds, any thread count): sample k (k = 1 .. samples) is ``r = mix64(seed + k * GOLDEN)``
(the k-th SplitMix64 output of ``seed``), read as the point ``(a, b) = (r >> 32, r & 0xFFFFFFFF)`` of a
2**32 x 2**32 grid; it is inside when ``a*a + b*b < 2**64``. :func:`count_inside` returns how many are
inside, so ``4 * inside / samples`` estimates pi. Every sample is computed from its index alone, so the
answer cannot depend on how the samples are shared out.

The twin runs blocks of :data:`BLOCK` samples as numpy uint64 arrays (wrapping arithmetic, the same
integers); :func:`inside_reference` is the one-sample-at-a-time definition in plain Python.
"""

from __future__ import annotations

from runner.kernels import check_threads, extension
from runner.kernels.hash_rounds import GOLDEN, MASK, mix64

__all__ = ["BLOCK", "COMPILED", "count_inside", "inside_reference", "py_count_inside"]

BLOCK = 1 << 20
"""Samples per numpy block in the twin."""

_ext = extension("_monte_carlo")
COMPILED = _ext is not None
"""True when the compiled build runs."""


def inside_reference(seed: int, samples: int) -> int:
    """The definition, one sample at a time in Python ints (slow; for tests and benchmarks)."""
    inside = 0
    for k in range(1, samples + 1):
        r = mix64((seed + k * GOLDEN) & MASK)
        a, b = r >> 32, r & 0xFFFFFFFF
        inside += a * a + b * b < 1 << 64
    return inside


def py_count_inside(seed: int, samples: int, threads: int = 1) -> int:
    """Points inside the quarter circle among ``samples`` seeded samples (numpy blocks)."""
    import numpy as np

    _check(seed, samples, threads)
    golden = np.uint64(GOLDEN)
    inside = 0
    for start in range(1, samples + 1, BLOCK):
        k = np.arange(start, min(start + BLOCK, samples + 1), dtype=np.uint64)
        z = np.uint64(seed) + k * golden
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        a = z >> np.uint64(32)
        b = z & np.uint64(0xFFFFFFFF)
        # a*a + b*b < 2**64  <=>  a*a <= 2**64 - 1 - b*b  (each square fits in 64 bits)
        inside += int(np.count_nonzero(a * a <= np.uint64(MASK) - b * b))
    return inside


def count_inside(seed: int, samples: int, threads: int = 1) -> int:
    """Points inside the quarter circle among ``samples`` seeded samples, over ``threads`` threads."""
    if _ext is not None:
        return int(_ext.count_inside(seed, samples, threads))
    return py_count_inside(seed, samples, threads)


def _check(seed: int, samples: int, threads: int) -> None:
    check_threads(threads)
    if not 0 <= seed <= MASK:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
