"""Owners' usage and fair share's history (CORRAL_FAIR_SHARE_HALF_LIFE_SEC) kept across restarts and
failovers.

Both live in the control plane's memory (control.shares.OwnerUsage): the thread- and GPU-seconds each
owner's jobs used, and what each share held lately. This keeps a copy of them in the store's
settings, written every :data:`SAVE_SEC` and at a graceful stop, and read back at start. So usage
accounting goes on adding up across upgrades, and a group that had the cluster for the last day does
not start afresh; a standby that takes over a shared PostgreSQL store reads the same copy. A restart
after ``kill -9`` loses at most :data:`SAVE_SEC` of either. What was held between the copy and the
start counts as nothing held: the downtime fades the history as idle time would.

The Prometheus counters of usage count this process's leases only: a restart is a counter reset, which
``rate()`` expects. Adding the kept totals to them would make a restart after ``kill -9`` (which
loses up to a minute) look like a drop, read as a reset, and graph the owner's whole history as one
burst. ListShares shows the kept totals and this run's added (``OwnerUsage.used``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping

from control.clock import Clock
from control.shares import OwnerUsage
from control.store import Store

logger = logging.getLogger(__name__)

SETTING = "share_history"
"""The store setting that holds the copy: ``{"saved_at": unix seconds, "used": {owner: [thread_seconds,
gpu_seconds]}, "shares": {share: [threads, gpus, memory_mb]}}`` (``shares`` with a half-life only)."""
SAVE_SEC = 60.0
"""How often the copy is written (one small row; a restart after kill -9 loses at most this much)."""


class ShareHistory:
    """Loads, saves and keeps saving one OwnerUsage's usage and history."""

    def __init__(self, usage: OwnerUsage, store: Store, clock: Clock) -> None:
        self.usage = usage
        self.store = store
        self.clock = clock

    def load(self) -> None:
        """Take back the kept copy: usage as it was, history faded by the time since. A copy that
        cannot be read is logged and left: accounting and fair share then start afresh."""
        raw = self.store.load_setting(SETTING)
        if raw is None:
            return
        try:
            kept = json.loads(raw)
            saved_at = float(kept["saved_at"])
            if not math.isfinite(saved_at):
                raise ValueError(f"saved_at must be a time, got {kept['saved_at']!r}")
            used = {str(owner): _numbers(value, 2) for owner, value in dict(kept["used"]).items()}
            shares = {str(share): _numbers(value, 3) for share, value in dict(kept["shares"]).items()}
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("share_history_unreadable", extra={"error": f"{type(exc).__name__}: {exc}"})
            return
        self.usage.used_before = {
            owner: (thread_seconds, gpu_seconds) for owner, (thread_seconds, gpu_seconds) in used.items()
        }
        age = self.clock.now() - saved_at
        self.usage.restore(_triples(shares), age)
        logger.info(
            "share_history_loaded", extra={"owners": len(used), "shares": len(shares), "age_sec": round(age, 3)}
        )

    def save(self) -> None:
        """Queue the copy as it is now; it is durable with the next commit."""
        usage = self.usage
        used = {owner: list(usage.used(owner)) for owner in {*usage.thread_seconds, *usage.used_before}}
        kept = {"saved_at": self.clock.now(), "used": used, "shares": usage.history()}
        self.store.put_setting(SETTING, json.dumps(kept, separators=(",", ":")))

    async def run(self) -> None:
        """Save every SAVE_SEC until cancelled."""
        while True:
            await asyncio.sleep(SAVE_SEC)
            self.save()
            try:
                await self.store.commit()
            except Exception:  # the store's own failure is reported where it is noticed
                logger.exception("share_history_save_failed")


def _numbers(value: object, n: int) -> list[float]:
    """``value`` as a list of ``n`` finite numbers >= 0; ValueError otherwise."""
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"expected a list of {n} numbers, got {value!r}")
    numbers = [float(v) for v in value]
    if not all(math.isfinite(v) and v >= 0 for v in numbers):
        raise ValueError(f"expected finite numbers >= 0, got {value!r}")
    return numbers


def _triples(shares: Mapping[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    return {share: (v[0], v[1], v[2]) for share, v in shares.items()}
