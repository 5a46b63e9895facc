"""A fixed amount of integer hashing: the Python twin, and the loader of ``_hash_rounds``.

Contract (both builds, any thread count): :data:`LANES` independent chains; lane ``i`` starts at
``mix64(seed + (i + 1) * GOLDEN)`` and takes ``rounds`` steps ``s = mix64(s + GOLDEN)`` (SplitMix64,
all modulo 2**64). The digest folds the lanes in order: ``h = 0; h = mix64(h ^ s_i)`` for each lane.
The cost is ``LANES * rounds`` rounds, linear in ``rounds``; lanes are what threads share out.
"""

from __future__ import annotations

from runner.kernels import check_threads, extension

__all__ = ["COMPILED", "GOLDEN", "LANES", "MASK", "hash_rounds", "mix64", "py_hash_rounds"]

LANES = 64
"""Independent chains per job (the unit of work a thread takes)."""
GOLDEN = 0x9E3779B97F4A7C15
"""SplitMix64's increment."""
MASK = (1 << 64) - 1
"""Arithmetic is modulo 2**64."""

_ext = extension("_hash_rounds")
COMPILED = _ext is not None
"""True when the compiled build runs."""


def mix64(z: int) -> int:
    """SplitMix64's output function on a 64-bit unsigned int."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def py_hash_rounds(seed: int, rounds: int, threads: int = 1) -> int:
    """The 64-bit digest of ``LANES`` chains of ``rounds`` rounds from ``seed`` (pure Python)."""
    _check(seed, rounds, threads)
    digest = 0
    for lane in range(LANES):
        state = mix64((seed + (lane + 1) * GOLDEN) & MASK)
        for _ in range(rounds):
            state = mix64((state + GOLDEN) & MASK)
        digest = mix64(digest ^ state)
    return digest


def hash_rounds(seed: int, rounds: int, threads: int = 1) -> int:
    """The digest (see the module docstring), over ``threads`` threads."""
    if _ext is not None:
        return int(_ext.hash_rounds(seed, rounds, threads))
    return py_hash_rounds(seed, rounds, threads)


def _check(seed: int, rounds: int, threads: int) -> None:
    check_threads(threads)
    if not 0 <= seed <= MASK:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
