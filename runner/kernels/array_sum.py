"""Exact sum of a sequence of integers: the pure-Python reference kernel.

Python ints never overflow, so the result is exact however close the inputs are to the int64
limits. A compiled twin with the same signature will take over when it is built.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["array_sum"]


def array_sum(values: Sequence[int], threads: int = 1) -> int:
    """The exact sum of ``values`` (0 when empty); ``threads`` is a hint the reference ignores."""
    return sum(values)
