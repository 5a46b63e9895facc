"""The only source of "now" in the control plane.

Domain code takes a :class:`Clock` so that tests can drive time with :class:`FakeClock` instead of
sleeping. Times are Unix seconds (floats): they are persisted and compared across restarts.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Tells the time."""

    def now(self) -> float:
        """Unix time in seconds."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that a change of the system time does not move (for "how long since")."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        """Unix time in seconds from the system clock, which jumps when the system time is set (an NTP step)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds from :func:`time.monotonic`: only differences mean anything; setting the system time leaves it."""
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._steady = start

    def now(self) -> float:
        """The fake Unix time in seconds: ``start``, plus every :meth:`advance` and :meth:`step` since."""
        return self._now

    def monotonic(self) -> float:
        """The fake steady time in seconds: ``start``, plus every :meth:`advance` since (a :meth:`step` leaves it)."""
        return self._steady

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self._now += seconds
        self._steady += seconds

    def step(self, seconds: float) -> None:
        """Move only the system time by ``seconds`` (either way), as ``date -s`` or an NTP step does."""
        self._now += seconds
