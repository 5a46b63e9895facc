"""Submission rate limits: token buckets, one for everybody and one per client.

A :class:`TokenBucket` holds up to ``burst`` tokens and gains ``rate`` tokens a second; a job takes
one. :class:`SubmitRateLimiter` charges a submission's fresh jobs to the global bucket
(``RATE_LIMIT_JOBS_PER_MIN`` / ``CORRAL_RATE_LIMIT_BURST``) and to the caller's own bucket
(``CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN`` / ``CORRAL_RATE_LIMIT_PER_CLIENT_BURST``), both or
neither: a batch that does not fit whole is refused whole, and a refused submission takes no token.

Over the limit is :class:`~corral.errors.RateLimited` with the seconds until the submission would
fit. A batch larger than a bucket's burst can never fit, so it is :class:`~corral.errors.InvalidArgument`
on ``jobs`` (split the batch) rather than a delay that would never work.

Time comes from the caller (``now``, from a :class:`~control.clock.Clock`), so tests drive it.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from control.clock import Clock
from corral.errors import InvalidArgument, RateLimited

EPSILON = 1e-9
"""Float slack when comparing token counts (0.1 s at 10/s is 0.9999999999 tokens)."""

MAX_CLIENT_BUCKETS = 100_000
"""Per-client buckets kept at most; past it the least recently used one is forgotten."""


class TokenBucket:
    """Holds up to ``burst`` tokens, refilled at ``rate`` tokens per second; starts full.

    The refill is computed lazily from the time of the last call. A clock that steps backwards
    refills nothing (and never takes tokens away).
    """

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be > 0, got {rate!r}")
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def _refill(self, now: float) -> None:
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = now

    def available(self, now: float) -> float:
        """Tokens in the bucket at ``now``."""
        self._refill(now)
        return self.tokens

    def wait(self, n: float, now: float) -> float:
        """Seconds until ``n`` tokens are there: 0 when they are now, ``inf`` when ``n`` > burst."""
        if n > self.burst + EPSILON:
            return math.inf
        self._refill(now)
        missing = n - self.tokens
        return 0.0 if missing <= EPSILON else missing / self.rate

    def take(self, n: float, now: float) -> bool:
        """Take ``n`` tokens if they are all there (True); otherwise take none (False)."""
        self._refill(now)
        if self.tokens + EPSILON < n:
            return False
        self.tokens = max(0.0, self.tokens - n)
        return True

    def full(self, now: float) -> bool:
        """True when the bucket is full: forgetting it changes nothing (a new one starts full)."""
        return self.available(now) + EPSILON >= self.burst


def default_burst(per_min: float) -> int:
    """The burst when none is configured: a minute's worth of jobs (at least 1)."""
    return max(1, math.ceil(per_min))


class SubmitRateLimiter:
    """The global and per-client submission buckets; ``per_min`` 0 turns a level off.

    Args:
        clock: where "now" comes from.
        per_min: jobs a minute across all clients (RATE_LIMIT_JOBS_PER_MIN); 0 = no global limit.
        burst: the global bucket's size; 0 = :func:`default_burst`.
        client_per_min: jobs a minute for each client; 0 = no per-client limit.
        client_burst: each client's bucket size; 0 = :func:`default_burst`.
        max_clients: per-client buckets kept at most (least recently used forgotten first).
    """

    def __init__(
        self,
        clock: Clock,
        per_min: float = 0.0,
        burst: int = 0,
        client_per_min: float = 0.0,
        client_burst: int = 0,
        max_clients: int = MAX_CLIENT_BUCKETS,
    ) -> None:
        self.clock = clock
        now = clock.now()
        self.per_min = per_min
        self.client_per_min = client_per_min
        self.global_bucket = TokenBucket(per_min / 60, burst or default_burst(per_min), now) if per_min > 0 else None
        self.client_burst = (client_burst or default_burst(client_per_min)) if client_per_min > 0 else 0
        self.max_clients = max_clients
        self._clients: OrderedDict[str, TokenBucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """True when any limit is on (off, a submission pays nothing here)."""
        return self.global_bucket is not None or self.client_burst > 0

    @property
    def per_client(self) -> bool:
        """True when submissions are also limited per client (the caller's identity is needed)."""
        return self.client_burst > 0

    def admit(self, client: str, n: int, batch: bool = False) -> None:
        """Charge ``n`` jobs to the global bucket and to ``client``'s, all or nothing.

        Raises:
            RateLimited: a bucket lacks tokens now; ``retry_after`` is when both would have them.
            InvalidArgument: (``jobs``) ``n`` is more than a bucket can ever hold.
        """
        if n <= 0 or not self.enabled:
            return
        now = self.clock.now()
        levels: list[tuple[TokenBucket, str]] = []
        if self.global_bucket is not None:
            levels.append((self.global_bucket, f"global limit of {self.per_min:g} jobs/min"))
        new_bucket: TokenBucket | None = None
        if self.client_burst > 0:
            what = f"per-client limit of {self.client_per_min:g} jobs/min (client {client or 'unknown'})"
            bucket = self._clients.get(client)
            if bucket is None:
                # Kept only once the call is admitted: a refused newcomer's bucket would still be full, and
                # keeping it would let callers refused by the global limit grow the table without bound
                # (only an admitted call prunes it).
                bucket = new_bucket = TokenBucket(self.client_per_min / 60, self.client_burst, now)
            else:
                self._clients.move_to_end(client)
            levels.append((bucket, what))
        wait, over = 0.0, ""
        for bucket, what in levels:
            w = bucket.wait(n, now)
            if math.isinf(w):
                raise InvalidArgument(
                    "jobs" if batch else "",
                    f"a batch of {n} jobs can never fit the submission {what} (burst {bucket.burst:g}); "
                    f"send at most {bucket.burst:g} jobs per batch",
                )
            if w > wait:
                wait, over = w, what
        if wait > 0:
            raise RateLimited(
                f"submission rate limit: {n} job{'s' if n != 1 else ''} would go over the {over}; "
                # In the whole seconds that Retry-After, the retry-after trailer and RetryInfo carry (rounded
                # up): the client's RateLimited.retry_after said 1.0 where this said 0.119s.
                f"retry after {math.ceil(wait)}s",
                retry_after=wait,
            )
        for bucket, _ in levels:
            bucket.take(n, now)
        if new_bucket is not None:
            self._clients[client] = new_bucket
        self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget idle clients: full buckets from the least recently used end (a couple per call, so
        memory follows the active clients at O(1) a call), and the oldest past ``max_clients``."""
        clients = self._clients
        for _ in range(2):
            if not clients:
                return
            oldest = next(iter(clients.values()))
            if not oldest.full(now):
                break
            clients.popitem(last=False)
        while len(clients) > self.max_clients:
            clients.popitem(last=False)

    def __len__(self) -> int:
        """Per-client buckets held (tests check that idle clients are forgotten)."""
        return len(self._clients)
