"""When and where a worker connects again: which control-plane address the next session tries, and
how long it waits first (see :mod:`worker.connection` for the session itself).

An attempt that does not register moves on to the next address, round the list; the wait grows with
whole rounds of the list, not with attempts, so a dead first address costs one short wait before the
next one is tried. After a session registered, the next attempt goes to the same address first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["RECONNECT_BASE_SEC", "AddressRotation", "reconnect_delay"]

RECONNECT_BASE_SEC = 0.05
"""First reconnect delay (before jitter)."""


def reconnect_delay(retry: int, cap: float, rng: random.Random) -> float:
    """Seconds to wait before reconnect attempt ``retry`` (0-based): uniform(d/2, d), d = min(cap, 0.05*2**n)."""
    ceiling = min(cap, RECONNECT_BASE_SEC * 2 ** min(retry, 30))
    return rng.uniform(ceiling / 2, ceiling)


class AddressRotation:
    """Which control-plane address the next session tries, and the wait before it (module docstring).

    ``retry`` counts the attempts since the last registered session (or the start); the wait grows
    with the rounds, ``retry // len(addresses)``, so it grows only once every address was tried.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        """Start with the first address."""
        if not addresses:
            raise ValueError("AddressRotation needs at least one address")
        self.addresses = tuple(addresses)
        self._index = 0
        self.retry = 0
        """Attempts that did not register since the last one that did."""

    @property
    def current(self) -> str:
        """The address the next attempt goes to."""
        return self.addresses[self._index]

    def ended(self, registered: bool) -> None:
        """Record how the attempt on :attr:`current` went: ``registered`` stays there, else move on."""
        if registered:
            self.retry = 0
        else:
            self.retry += 1
            self._index = (self._index + 1) % len(self.addresses)

    def delay(self, cap: float, rng: random.Random) -> float:
        """Seconds to wait before the next attempt: :func:`reconnect_delay` of the rounds done."""
        return reconnect_delay(self.retry // len(self.addresses), cap, rng)
