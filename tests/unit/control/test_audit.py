"""The audit log on a real SQLite store with a clock the tests move: recording, retention, actions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from control import audit as audit_module
from control.api.audited import audited
from control.audit import AuditLog
from control.clock import FakeClock
from control.store import SQLiteStore
from corral import logs


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "corral.db"))
    yield s
    s.close()


def test_an_event_names_the_call_s_principal_and_request_id_and_is_committed(store: SQLiteStore) -> None:
    log = AuditLog(store, FakeClock(), retention_sec=0)

    async def go() -> None:
        logs.current_principal.set("alice")
        logs.current_request.set("r-1")
        await log.record("job.cancel", "j" * 1000, "OK")

    asyncio.run(go())
    (event,) = asyncio.run(store.list_audit({}, 10, 0)).events
    assert (event.actor, event.action, event.outcome, event.request_id) == ("alice", "job.cancel", "OK", "r-1")
    assert event.target == "j" * audit_module.MAX_TARGET


def test_events_past_their_retention_are_swept_and_kept_for_ever_with_zero(store: SQLiteStore) -> None:
    clock = FakeClock()
    log = AuditLog(store, clock, retention_sec=100)

    async def go() -> tuple[int, int]:
        for n in range(3):
            await log.record("job.retry", f"job-{n}", "OK")
            clock.advance(60)
        first = await log.sweep()  # now = start + 180: the events of +0 and +60 are past 100 s
        return first, (await store.list_audit({}, 10, 0)).total

    assert asyncio.run(go()) == (2, 1)
    forever = AuditLog(store, clock, retention_sec=0)
    asyncio.run(forever.run())  # returns at once: nothing to sweep


def test_only_the_known_actions_can_be_audited() -> None:
    with pytest.raises(ValueError, match=r"ACTIONS"):
        audited("job.delete", lambda request: "")
