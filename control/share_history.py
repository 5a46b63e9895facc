"""Fair share's history (CORRAL_FAIR_SHARE_HALF_LIFE_SEC) kept across restarts and failovers.

What each share held lately (control.shares.OwnerUsage) lives in the control plane's memory. This
keeps a copy in the store's settings, written every :data:`SAVE_SEC` and at a graceful stop, and read
back at start, so that a group that had the cluster for the last day does not start afresh at each
upgrade; a standby that takes over a shared PostgreSQL store reads the same copy. What was held
between the copy and the start counts as nothing held: a restart after ``kill -9`` loses at most
:data:`SAVE_SEC` of history, and the downtime fades what was kept as idle time would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

from control.clock import Clock
from control.shares import OwnerUsage
from control.store import Store

logger = logging.getLogger(__name__)

SETTING = "share_history"
"""The store setting that holds the copy: ``{"saved_at": unix seconds, "shares": {share: [threads,
gpus, memory_mb]}}``."""
SAVE_SEC = 60.0
"""How often the copy is written (one small row; a restart after kill -9 loses at most this much)."""


class ShareHistory:
    """Loads, saves and keeps saving one OwnerUsage's history; nothing without a half-life."""

    def __init__(self, usage: OwnerUsage, store: Store, clock: Clock) -> None:
        self.usage = usage
        self.store = store
        self.clock = clock

    def load(self) -> None:
        """Take back the kept copy, faded by the time since it was saved. A copy that cannot be read is
        logged and left: fair share then starts without history, as before there was one."""
        if not self.usage.remembers:
            return
        raw = self.store.load_setting(SETTING)
        if raw is None:
            return
        try:
            kept = json.loads(raw)
            saved_at = float(kept["saved_at"])
            shares = {str(share): _holdings(value) for share, value in dict(kept["shares"]).items()}
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("share_history_unreadable", extra={"error": f"{type(exc).__name__}: {exc}"})
            return
        self.usage.restore(shares, self.clock.now() - saved_at)
        logger.info(
            "share_history_loaded", extra={"shares": len(shares), "age_sec": round(self.clock.now() - saved_at, 3)}
        )

    def save(self) -> None:
        """Queue the copy as it is now; it is durable with the next commit."""
        if self.usage.remembers:
            kept = {"saved_at": self.clock.now(), "shares": self.usage.history()}
            self.store.put_setting(SETTING, json.dumps(kept, separators=(",", ":")))

    async def run(self) -> None:
        """Save every SAVE_SEC until cancelled."""
        if not self.usage.remembers:
            return
        while True:
            await asyncio.sleep(SAVE_SEC)
            self.save()
            try:
                await self.store.commit()
            except Exception:  # the store's own failure is reported where it is noticed
                logger.exception("share_history_save_failed")


def _holdings(value: object) -> tuple[float, float, float]:
    """``[threads, gpus, memory_mb]`` as three finite numbers >= 0; ValueError otherwise."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"holdings must be [threads, gpus, memory_mb], got {value!r}")
    threads, gpus, memory_mb = (float(v) for v in value)
    if not all(math.isfinite(v) and v >= 0 for v in (threads, gpus, memory_mb)):
        raise ValueError(f"holdings must be finite and >= 0, got {value!r}")
    return threads, gpus, memory_mb
