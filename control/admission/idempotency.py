"""Idempotency keys: the same key with the same request returns the original job.

A key is remembered (durably, in the store) with a digest of the request that first used it and
the job it made, for ``ttl`` seconds. The same key with an equal request maps to that job; with a
different request it is refused with AlreadyExists. After ``ttl`` the key is forgotten: using it
again makes a new job.

Concurrent duplicates: :meth:`IdempotencyKeys.resolve` and :meth:`IdempotencyKeys.reserve` run on
the event loop with no ``await`` between them (see ``Intake.submit``), so of any number of
concurrent submissions with one key exactly one makes the job; the others see its reservation and
get that job. Inside one batch, a repeated key maps to the batch's first job with that key, and a
batch that reuses a key for a different request is refused whole, before anything is reserved.

Memory: the store holds every live key; memory holds the newest :data:`MAX_CACHED_KEYS` of them.
Once it has let older ones go, a call reads the keys it names that memory lacks from the store ahead,
off the event loop (:meth:`IdempotencyKeys.read_ahead`: a read on the loop stalled every call the
control plane served for as long as the store took, a locked table's whole wait on PostgreSQL). What
was read counts only where memory has nothing: a key reserved meanwhile is in memory, and is kept there
until the call has settled (:meth:`IdempotencyKeys.let_go`), so a read made before that reservation's
commit is never taken for the truth. A key memory let go of after the read began, which the read did not
cover, is read on the loop, as before. Keys of submissions not yet committed are always in memory. At about 450 bytes a key, keeping every live key (a day's worth
by default) would take about 4 GB for a client that keys 100 jobs a second.

Expiry: :class:`IdempotencySweeper` removes expired keys from memory and from the store every
:func:`sweep_interval` seconds, at most :data:`SWEEP_BATCH` at a time (yielding to the event loop
between batches), so a sweep never holds the store or the loop for long. Lookups ignore expired
keys anyway, so the sweep only bounds memory and disk, never decides an answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from control.clock import Clock
from control.store.base import IdempotencyEntry
from control.turns import pause
from corral.errors import AlreadyExists

logger = logging.getLogger(__name__)

MAX_CACHED_KEYS = 100_000
"""Keys kept in memory (the newest); older live ones are read from the store when asked for."""
SWEEP_BATCH = 1000
"""Most keys one sweep step deletes (one short store transaction)."""
SWEEP_INTERVAL_MAX_SEC = 60.0
"""The sweep runs at least this often."""
SWEEP_INTERVAL_MIN_SEC = 0.05


def sweep_interval(ttl: float) -> float:
    """Seconds between sweeps for keys that live ``ttl`` seconds: a quarter of the TTL, within
    [SWEEP_INTERVAL_MIN_SEC, SWEEP_INTERVAL_MAX_SEC], so an expired key lingers at most that long."""
    return min(SWEEP_INTERVAL_MAX_SEC, max(SWEEP_INTERVAL_MIN_SEC, ttl / 4))


Ahead = Mapping[str, IdempotencyEntry | None]
"""What :meth:`IdempotencyKeys.read_ahead` read from the store for a call: each key memory lacked, with
its stored entry or None."""

Earlier = str | int
"""What :meth:`IdempotencyKeys.resolve` finds for a submission: the id of the job a previous request
made (str), or the index of an earlier submission of the same call with the same key (int)."""


def sent_key(key: str) -> str:
    """The key as the client sent it, of ``key`` as it is kept (``owner:key``)."""
    _, kept_with_owner, sent = key.partition(":")
    return sent if kept_with_owner else key


def unowned_form(key: str) -> str:
    """``key`` (``owner:key``) as a job with no owner keeps it: one submitted with no client token, or
    before the store kept owners. Every client that may see such a job (all, while clients are not kept
    apart; admins) finds it by its key, as every client did before tokens were turned on."""
    return ":" + sent_key(key)


class IdempotencyKeys:
    """Live keys: the newest in memory, in expiry order, the rest in the store (see the module)."""

    def __init__(
        self,
        ttl: float,
        entries: Iterable[IdempotencyEntry] = (),
        fetch: Callable[[str], IdempotencyEntry | None] | None = None,
        capacity: int = MAX_CACHED_KEYS,
        complete: bool = True,
        read: Callable[[list[str]], Awaitable[dict[str, IdempotencyEntry]]] | None = None,
    ) -> None:
        """``entries``: keys to start with (the newest from the store); ``fetch``: reads one key from
        the store on the event loop (None: memory is all there is); ``read``: reads keys from the store
        off it, for :meth:`read_ahead` (None: only ``fetch``); ``complete``: ``entries`` are all the live
        keys, so the store is asked only once memory has let some go."""
        self.ttl = ttl
        self.capacity = capacity
        self._fetch = fetch
        self._read = read
        self._complete = complete
        self._pinned: Counter[str] = Counter()
        """Keys a call has read ahead and not let go of: kept in memory once reserved (see the module)."""
        self._keys: OrderedDict[str, IdempotencyEntry] = OrderedDict(
            (e.key, e) for e in sorted(entries, key=lambda e: e.expires_at)
        )
        self._pending: set[str] = set()
        """Reserved, not yet known committed: never dropped from memory, since the store lacks them."""
        self._trim()

    def __len__(self) -> int:
        """Keys in memory."""
        return len(self._keys)

    async def read_ahead(self, keys: Iterable[str]) -> Ahead:
        """Read from the store, off the event loop, those of ``keys`` that memory may have let go of, for
        :meth:`lookup` and :meth:`resolve` to use after an ``await``; ``{}`` when memory holds every live
        key. Call :meth:`let_go` with the answer once the call has reserved its keys (or failed).

        Raises:
            Unavailable: a shared store's server cannot be read.
        """
        if self._read is None or self._complete:
            return {}
        wanted = [key for key in dict.fromkeys(keys) if key not in self._keys]
        if not wanted:
            return {}
        self._pinned.update(wanted)
        try:
            found = await self._read(wanted)
        except BaseException:
            self.let_go(dict.fromkeys(wanted))
            raise
        return {key: found.get(key) for key in wanted}

    def let_go(self, ahead: Ahead) -> None:
        """The call that read ``ahead`` has settled its keys: memory may let them go again."""
        if ahead:
            self._pinned.subtract(ahead.keys())
            for key in ahead:
                if self._pinned[key] <= 0:
                    del self._pinned[key]
            self._trim()

    def lookup(
        self,
        key: str,
        request_hash: str,
        now: float,
        field: str = "idempotency_key",
        ahead: Ahead | None = None,
        unowned: bool = False,
    ) -> str | None:
        """The job id this key already made for an equal request, else None. ``key`` is kept with its
        owner (``owner:key``, :meth:`control.access.Access.idempotency_key`); ``unowned``: the caller may
        see jobs that have no owner, and the key, when it is not its own, may be one such a job made
        (see :func:`unowned_form`). ``ahead``: what :meth:`read_ahead` read for this call, used where
        memory has nothing.

        Raises:
            AlreadyExists: the key is live and was used with a different request.
        """
        entry = self._live(key, now, ahead)
        if entry is None and unowned:
            entry = self._live(unowned_form(key), now, ahead)
        if entry is None:
            return None
        if entry.request_hash != request_hash:
            raise AlreadyExists(
                f"{field}: key {sent_key(key)!r} was already used for a different request (job {entry.job_id}); "
                "use a new key for a new job"
            )
        return entry.job_id

    def _live(self, key: str, now: float, ahead: Ahead | None) -> IdempotencyEntry | None:
        entry = self._keys.get(key)
        if entry is None and self._fetch is not None and not self._complete:
            # An older key, no longer in memory: read ahead by this call, or (let go of by memory only
            # after the read began) read now.
            entry = ahead[key] if ahead is not None and key in ahead else self._fetch(key)
        return None if entry is None or entry.expires_at <= now else entry

    def resolve(
        self,
        keyed: Mapping[int, tuple[str, str]],
        now: float,
        field: str = "idempotency_key",
        ahead: Ahead | None = None,
        unowned: bool = False,
    ) -> dict[int, Earlier]:
        """For submissions ``{index: (key, request hash)}`` of one call: what each maps to, if anything.

        ``field`` names the key in errors; a ``{}`` in it is replaced by the index (``jobs[{}].idempotency_key``);
        ``ahead`` and ``unowned`` as for :meth:`lookup`. Changes nothing, so a refused call leaves no
        reservation behind.

        Raises:
            AlreadyExists: a key is live for a different request, or repeats in the call with another request.
        """
        found: dict[int, Earlier] = {}
        first: dict[str, int] = {}
        for i, (key, digest) in keyed.items():
            name = field.format(i)
            j = first.get(key)
            if j is not None:
                if keyed[j][1] != digest:
                    raise AlreadyExists(
                        f"{name}: key {sent_key(key)!r} is used for a different request at {field.format(j)} in the same "
                        "call; use a new key for a new job"
                    )
                found[i] = j
                continue
            job_id = self.lookup(key, digest, now, name, ahead, unowned)
            if job_id is not None:
                found[i] = job_id
            first[key] = i
        return found

    def reserve(self, key: str, request_hash: str, job_id: str, now: float) -> IdempotencyEntry:
        """Remember the key for ``job_id`` until ``now + ttl``; returns the entry to persist. Call
        :meth:`committed` once the store has it."""
        entry = IdempotencyEntry(key, request_hash, job_id, now + self.ttl)
        self._keys[key] = entry
        self._keys.move_to_end(key)
        self._pending.add(key)
        return entry

    def forget(self, key: str, job_id: str) -> bool:
        """Take ``key`` as expired if it still names ``job_id`` (a job that is gone: see
        ``control.intake``); returns whether it did. The store keeps its row until a reservation of the key
        replaces it or it expires; memory keeps the key as expired meanwhile, so that the row is not read
        back."""
        entry = self._keys.get(key)
        if entry is None and self._fetch is not None and not self._complete:
            entry = self._fetch(key)
        if entry is None or entry.job_id != job_id:
            return False
        self._keys[key] = IdempotencyEntry(key, entry.request_hash, job_id, 0.0)
        return True

    def committed(self, keys: Iterable[str]) -> None:
        """The store now holds these reserved keys: memory may let them go when it is full."""
        self._pending.difference_update(keys)
        self._trim()

    def _trim(self) -> None:
        keys = self._keys
        while len(keys) > self.capacity:
            oldest = next(iter(keys))
            if oldest in self._pending or oldest in self._pinned:
                break
            del keys[oldest]
            self._complete = False

    def expire(self, now: float, limit: int | None = None) -> int:
        """Drop up to ``limit`` (default: all) keys that expired by ``now`` from memory; returns how many."""
        dropped = 0
        keys = self._keys
        while keys and (limit is None or dropped < limit):
            key, entry = next(iter(keys.items()))
            if entry.expires_at > now:
                break
            del keys[key]  # expired: no lookup would use it, stored or not
            self._pending.discard(key)
            dropped += 1
        return dropped


class KeyStore(Protocol):
    """The part of :class:`control.store.Store` the sweeper uses."""

    async def delete_expired_idempotency(self, now: float, limit: int) -> int:
        """Delete at most ``limit`` keys expired by ``now`` and return how many (``limit``: more may be left),
        as :meth:`control.store.Store.delete_expired_idempotency` does."""
        ...


class IdempotencySweeper:
    """Deletes expired keys from memory and the store, in bounded batches (see the module docstring)."""

    def __init__(
        self,
        keys: IdempotencyKeys,
        store: KeyStore,
        clock: Clock,
        interval: float | None = None,
        batch: int = SWEEP_BATCH,
    ) -> None:
        self.keys = keys
        self.store = store
        self.clock = clock
        self.interval = sweep_interval(keys.ttl) if interval is None else interval
        self.batch = batch
        self.swept = 0
        """Keys deleted from the store so far."""

    async def sweep(self) -> int:
        """Delete every key expired by now, ``batch`` at a time; returns how many rows the store dropped."""
        total = 0
        while True:
            now = self.clock.now()
            in_memory = self.keys.expire(now, self.batch)
            in_store = await self.store.delete_expired_idempotency(now, self.batch)
            total += in_store
            if in_memory < self.batch and in_store < self.batch:
                break
            await pause()  # let submissions and results in between two batches
        self.swept += total
        return total

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled."""
        while True:
            try:
                await self.sweep()
            except Exception:  # a failed sweep must not stop later ones; lookups stay correct meanwhile
                logger.exception("idempotency_sweep_failed")
            await asyncio.sleep(self.interval)
