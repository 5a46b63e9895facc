"""Retry backoff: capped exponential with full jitter.

The delay before retry ``n`` (the attempt that failed was attempt ``n``, n >= 1) is drawn uniformly
from ``[0, min(cap, base * 2**(n-1))]`` ("full jitter"), so retries of many jobs that failed
together spread out instead of arriving in waves. With the defaults (base 1 s, cap 300 s) the
upper bounds are 1, 2, 4, 8, ... 256, 300, 300, ... seconds.

The exponent is clamped before it is evaluated, so no attempt number can overflow.
"""

from __future__ import annotations

import math
import random


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """Upper bound of the delay after failed attempt ``attempt``: ``min(cap, base * 2**(attempt-1))``."""
    if base <= 0 or cap <= 0:
        return 0.0
    exponent = max(0, attempt - 1)
    # 2**exponent exceeds cap/base as soon as exponent > log2(cap/base): stop there.
    limit = math.log2(cap / base) if cap > base else 0.0
    if exponent > limit:
        return cap
    return min(cap, base * (2.0**exponent))


def retry_delay(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retrying after failed attempt ``attempt`` (full jitter, see module doc)."""
    return rng.uniform(0.0, backoff_ceiling(attempt, base=base, cap=cap))
