"""Idempotency keys: the same key with the same request returns the original job.

A key is remembered (durably, in the store) with a digest of the request that first used it and
the job it made, for ``ttl`` seconds. The same key with an equal request maps to that job; with a
different request it is refused with AlreadyExists. Checking and reserving happen in one step on
the event loop, so concurrent duplicates cannot both create a job.
"""

from __future__ import annotations

from collections.abc import Iterable

from control.store.base import IdempotencyEntry
from corral.errors import AlreadyExists


class IdempotencyKeys:
    """Live keys by name (loaded from the store at start-up)."""

    def __init__(self, ttl: float, entries: Iterable[IdempotencyEntry] = ()) -> None:
        self.ttl = ttl
        self._keys: dict[str, IdempotencyEntry] = {e.key: e for e in entries}

    def lookup(self, key: str, request_hash: str, now: float, field: str = "idempotency_key") -> str | None:
        """The job id this key already made for an equal request, else None. Raises AlreadyExists when
        the key was used with a different request."""
        entry = self._keys.get(key)
        if entry is None or entry.expires_at <= now:
            return None
        if entry.request_hash != request_hash:
            raise AlreadyExists(
                f"{field}: key {key!r} was already used for a different request (job {entry.job_id}); "
                "use a new key for a new job"
            )
        return entry.job_id

    def reserve(self, key: str, request_hash: str, job_id: str, now: float) -> IdempotencyEntry:
        """Remember the key for ``job_id``; returns the entry to persist."""
        entry = IdempotencyEntry(key, request_hash, job_id, now + self.ttl)
        self._keys[key] = entry
        return entry

    def forget(self, key: str) -> None:
        self._keys.pop(key, None)

    def expire(self, now: float) -> int:
        """Drop expired keys from memory; returns how many."""
        dead = [k for k, e in self._keys.items() if e.expires_at <= now]
        for k in dead:
            del self._keys[k]
        return len(dead)
