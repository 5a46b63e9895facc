"""Fair share's history kept across restarts (control.share_history), on a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from control.clock import FakeClock
from control.jobs import JobRecord, JobState
from control.registry import Capacity
from control.share_history import SETTING, ShareHistory
from control.shares import OwnerUsage
from control.store import SQLiteStore

HALF_LIFE = 100.0
FOUR_THREADS = Capacity(threads=4, gpus=0, memory_mb=0)


def running(owner: str, threads: int = 1) -> JobRecord:
    job = JobRecord(id=f"{owner}-{threads}", type="noop", payload_json="{}", created_at=0.0, owner=owner)
    job.state, job.threads_granted = JobState.RUNNING, threads
    return job


def keeper(path: Path, clock: FakeClock, half_life: float = HALF_LIFE) -> ShareHistory:
    usage = OwnerUsage(None, half_life, clock.monotonic)
    return ShareHistory(usage, SQLiteStore(str(path)), clock)


def test_a_restart_takes_back_what_each_share_held_lately_faded_by_the_downtime(tmp_path: Path) -> None:
    clock = FakeClock()
    db = tmp_path / "c.db"
    # Given alice, who held all 4 threads for 10 half-lives, and bob one thread for one half-life
    first = keeper(db, clock)
    alice, bob = running("alice", threads=4), running("bob")
    first.usage.started(alice)
    clock.advance(9 * HALF_LIFE)
    first.usage.started(bob)
    clock.advance(HALF_LIFE)
    before = {share: first.usage.recent_share(share, FOUR_THREADS) for share in ("alice", "bob")}
    assert before["alice"] == pytest.approx(1.0, abs=1e-3) and before["bob"] == pytest.approx(0.125)
    # When the control plane stops (saving the copy) and starts again one half-life later
    first.save()
    asyncio.run(first.store.commit())
    first.store.close()
    clock.advance(HALF_LIFE)
    second = keeper(db, clock)
    try:
        second.load()
        # Then each share's history is back, faded by half: the downtime held nothing
        after = {share: second.usage.recent_share(share, FOUR_THREADS) for share in ("alice", "bob")}
        assert after == pytest.approx({share: value / 2 for share, value in before.items()})
        assert second.usage.remembered() == {"alice", "bob"}
    finally:
        second.store.close()


def test_usage_adds_up_across_restarts_with_or_without_a_half_life(tmp_path: Path) -> None:
    clock = FakeClock()
    db = tmp_path / "c.db"
    for run in range(2):
        # Given, in each run, alice's 2-thread job leased for 3 s, then a stop that saves the copy
        k = keeper(db, clock, half_life=0.0)
        try:
            k.load()
            job = running("alice", threads=2)
            job.started_at = clock.now()
            k.usage.started(job)
            clock.advance(3.0)
            job.updated_at = clock.now()
            k.usage.stopped(job)
            k.save()
            asyncio.run(k.store.commit())
            # Then the thread-seconds count both runs' leases; the counters behind /metrics, this run's
            assert k.usage.used("alice") == pytest.approx((6.0 * (run + 1), 0.0))
            assert k.usage.thread_seconds["alice"] == pytest.approx(6.0)
            assert k.usage.remembered() == set()  # without a half-life, no history
        finally:
            k.store.close()


@pytest.mark.parametrize(
    "kept",
    [
        "not json",
        json.dumps({"used": {}, "shares": {}}),
        json.dumps({"saved_at": 1.0, "used": {}, "shares": {"alice": [1.0, 0.0]}}),
        json.dumps({"saved_at": 1.0, "used": {}, "shares": {"alice": [-1.0, 0.0, 0.0]}}),
        json.dumps({"saved_at": 1.0, "used": {}, "shares": {"alice": "1,0,0"}}),
        json.dumps({"saved_at": 1.0, "used": {"alice": [float("inf"), 0]}, "shares": {}}),
        json.dumps({"saved_at": 1.0, "shares": {}}),
        json.dumps({"saved_at": "noon", "used": {}, "shares": {}}),
        '{"saved_at": NaN, "used": {}, "shares": {}}',
        json.dumps([1, 2]),
    ],
)
def test_a_copy_that_cannot_be_read_is_logged_and_history_starts_afresh(
    tmp_path: Path, kept: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    k = keeper(tmp_path / "c.db", clock)
    try:
        k.store.put_setting(SETTING, kept)
        asyncio.run(k.store.commit())
        with caplog.at_level(logging.WARNING):
            k.load()
        assert "share_history_unreadable" in caplog.text
        assert k.usage.recent_share("alice", FOUR_THREADS) == 0.0 and not k.usage.used_before
    finally:
        k.store.close()


def test_shares_whose_history_faded_and_that_hold_nothing_are_forgotten() -> None:
    clock = FakeClock()
    usage = OwnerUsage(None, HALF_LIFE, clock.monotonic)
    once, still = running("once"), running("still")
    usage.started(once)
    usage.started(still)
    clock.advance(HALF_LIFE)
    usage.stopped(once)
    clock.advance(30 * HALF_LIFE)  # a billionth of what it held
    assert set(usage.history()) == {"still"}
    assert usage.remembered() == {"still"}
