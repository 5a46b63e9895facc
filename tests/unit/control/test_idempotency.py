"""IdempotencyKeys and IdempotencySweeper: resolution inside one call, expiry in bounded batches, and
the sweep of the SQLite store (keys expired while the control plane was down included)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control import scheduler as scheduler_module
from control.admission import Submission
from control.admission.idempotency import IdempotencyKeys, IdempotencySweeper, sweep_interval
from control.clock import FakeClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import Scheduler
from control.store import IdempotencyEntry, SQLiteStore
from corral.errors import AlreadyExists


def test_resolve_maps_repeats_in_one_call_to_the_first_and_replays_to_the_stored_job() -> None:
    keys = IdempotencyKeys(ttl=10)
    keys.reserve("old", "h-old", "job-1", now=0)
    found = keys.resolve({0: ("new", "h"), 1: ("old", "h-old"), 2: ("new", "h")}, now=5)
    assert found == {1: "job-1", 2: 0}


def test_resolve_refuses_a_repeat_with_another_request_and_changes_nothing() -> None:
    keys = IdempotencyKeys(ttl=10)
    with pytest.raises(AlreadyExists, match=r"jobs\[2\].idempotency_key: key 'k' is used for a different request"):
        keys.resolve({0: ("k", "a"), 2: ("k", "b")}, now=0, field="jobs[{}].idempotency_key")
    assert len(keys) == 0
    keys.reserve("k", "a", "job-1", now=0)
    with pytest.raises(AlreadyExists, match=r"idempotency_key: key 'k' was already used for a different request"):
        keys.resolve({0: ("k", "b")}, now=1)


def test_an_expired_key_resolves_to_nothing() -> None:
    keys = IdempotencyKeys(ttl=10)
    keys.reserve("k", "a", "job-1", now=0)
    assert keys.resolve({0: ("k", "b")}, now=10) == {}


def test_expire_drops_at_most_limit_keys_earliest_first_and_skips_renewed_ones() -> None:
    keys = IdempotencyKeys(ttl=10)
    for i in range(5):
        keys.reserve(f"k{i}", "h", f"job-{i}", now=i)
    keys.reserve("k0", "h", "job-again", now=8)  # renewed: now lives until 18
    assert keys.expire(now=14, limit=2) == 2  # k1, k2 (k0's old expiry is skipped, not counted)
    assert keys.expire(now=14) == 2  # k3, k4
    assert len(keys) == 1 and keys.lookup("k0", "h", now=14) == "job-again"
    assert keys.expire(now=18) == 1 and len(keys) == 0


def test_sweep_interval_is_a_quarter_of_the_ttl_within_bounds() -> None:
    assert sweep_interval(2.0) == 0.5
    assert sweep_interval(86_400) == 60.0
    assert sweep_interval(0.01) == 0.05


def test_sweeper_deletes_expired_keys_from_the_store_in_batches(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    # Given 25 keys that expired while no control plane ran, and 3 live ones
    store = SQLiteStore(path)
    store.put_idempotency([IdempotencyEntry(f"dead-{i}", "h", f"job-{i}", expires_at=100.0 + i) for i in range(25)])
    store.put_idempotency([IdempotencyEntry(f"live-{i}", "h", f"job-l{i}", expires_at=500.0) for i in range(3)])
    asyncio.run(store.commit())
    store.close()

    async def go() -> tuple[int, int, int]:
        s = SQLiteStore(path)
        clock = FakeClock(200.0)
        keys = IdempotencyKeys(ttl=300, entries=s.load_idempotency(clock.now()))
        sweeper = IdempotencySweeper(keys, s, clock, batch=10)
        first = await sweeper.sweep()
        clock.advance(400)  # now 600: the live keys have expired too
        second = await sweeper.sweep()
        left = len(s.load_idempotency(0.0))
        s.close()
        return first, second, left

    # When the sweeper runs (10 keys per transaction), then again once the rest have expired
    first, second, left = asyncio.run(go())

    # Then every expired row is gone, live rows stayed until their time
    assert (first, second, left) == (25, 3, 0)


def test_the_store_sweep_comes_after_queued_writes(tmp_path: Path) -> None:
    async def go() -> list[IdempotencyEntry]:
        s = SQLiteStore(str(tmp_path / "s.db"), sync="full")
        s.put_idempotency([IdempotencyEntry("gone", "h", "job-1", 1.0), IdempotencyEntry("kept", "h", "job-2", 9.0)])
        assert await s.delete_expired_idempotency(5.0, limit=100) == 1
        left = s.load_idempotency(0.0)
        s.close()
        return left

    assert asyncio.run(go()) == [IdempotencyEntry("kept", "h", "job-2", 9.0)]


def test_memory_keeps_the_newest_keys_and_finds_older_ones_in_the_store() -> None:
    stored: dict[str, IdempotencyEntry] = {}
    keys = IdempotencyKeys(ttl=100, fetch=stored.get, capacity=3)
    # Given five keys reserved, committed (the store has them) one after another
    for i in range(5):
        stored[f"k{i}"] = keys.reserve(f"k{i}", f"h{i}", f"job-{i}", now=i)
        keys.committed([f"k{i}"])
    # Then memory holds the newest three, and the older ones still answer, from the store
    assert len(keys) == 3
    assert keys.resolve({0: ("k0", "h0"), 1: ("k4", "h4")}, now=10) == {0: "job-0", 1: "job-4"}
    with pytest.raises(AlreadyExists, match="key 'k1' was already used for a different request"):
        keys.resolve({0: ("k1", "other")}, now=10)
    # and an expired one does not, wherever it is
    assert keys.resolve({0: ("k0", "h0")}, now=100) == {}


def test_keys_not_yet_committed_stay_in_memory_however_many() -> None:
    keys = IdempotencyKeys(ttl=100, fetch=lambda key: None, capacity=2)
    for i in range(4):
        keys.reserve(f"k{i}", "h", f"job-{i}", now=i)
    # The store does not have them yet: dropping one would let a duplicate through
    assert len(keys) == 4 and keys.lookup("k0", "h", now=5) == "job-0"
    keys.committed(["k0", "k1", "k2"])
    assert len(keys) == 2 and keys.lookup("k3", "h", now=5) == "job-3"


def _committed_keys(keys: IdempotencyKeys, stored: dict[str, IdempotencyEntry], names: list[str], now: float) -> None:
    for i, name in enumerate(names):
        stored[name] = keys.reserve(name, "h", f"job-{name}", now=now + i)
        keys.committed([name])


def test_keys_memory_let_go_of_are_read_ahead_off_the_loop_and_no_read_is_made_on_it() -> None:
    stored: dict[str, IdempotencyEntry] = {}
    asked: list[list[str]] = []

    def on_the_loop(key: str) -> IdempotencyEntry | None:
        raise AssertionError(f"read {key!r} on the event loop")

    async def read(wanted: list[str]) -> dict[str, IdempotencyEntry]:
        asked.append(wanted)
        await asyncio.sleep(0)  # as a store's thread answers
        return {key: stored[key] for key in wanted if key in stored}

    async def main() -> None:
        keys = IdempotencyKeys(ttl=100, fetch=on_the_loop, capacity=2, read=read)
        _committed_keys(keys, stored, ["k0", "k1", "k2", "k3"], now=0)
        # Given memory holding k2 and k3 only, a call naming k0 (stored), k3 (in memory) and k9 (nowhere)
        ahead = await keys.read_ahead(["k0", "k3", "k9", "k0"])
        # Then only what memory lacks is read, once, and resolution reads nothing more on the loop
        assert asked == [["k0", "k9"]]
        assert keys.resolve({0: ("k0", "h"), 1: ("k3", "h"), 2: ("k9", "h")}, now=10, ahead=ahead) == {
            0: "job-k0",
            1: "job-k3",
        }
        keys.let_go(ahead)

    asyncio.run(main())


def test_a_key_reserved_while_it_was_read_ahead_is_answered_from_memory_not_from_the_read() -> None:
    stored: dict[str, IdempotencyEntry] = {}

    async def main() -> None:
        started, answer = asyncio.Event(), asyncio.Event()

        async def read(wanted: list[str]) -> dict[str, IdempotencyEntry]:
            started.set()
            found = {key: stored[key] for key in wanted if key in stored}  # the snapshot, before the commit below
            await answer.wait()
            return found

        keys = IdempotencyKeys(ttl=100, fetch=stored.get, capacity=2, read=read)
        _committed_keys(keys, stored, ["k0", "k1", "k2"], now=0)
        # Given a call reading "new" ahead: the store does not have it yet
        call = asyncio.create_task(keys.read_ahead(["new"]))
        await started.wait()
        # When another call reserves and commits it meanwhile, and newer keys push it past memory's room
        stored["new"] = keys.reserve("new", "h", "job-first", now=5)
        keys.committed(["new"])
        _committed_keys(keys, stored, ["k3", "k4", "k5"], now=10)
        answer.set()
        ahead = await call
        # Then the first call finds the job the other made, though its read, older, said there was none:
        # memory kept the key while the call held its read (let go of, the read alone would make a second job)
        assert ahead == {"new": None}
        assert keys.lookup("new", "h", now=20, ahead=ahead) == "job-first"
        # And once the call lets go, memory keeps only its room again
        keys.let_go(ahead)
        assert len(keys) == 2

    asyncio.run(main())


def test_a_key_memory_let_go_of_after_the_read_began_is_read_on_the_loop() -> None:
    stored: dict[str, IdempotencyEntry] = {}

    async def read(wanted: list[str]) -> dict[str, IdempotencyEntry]:
        return {key: stored[key] for key in wanted if key in stored}

    async def main() -> None:
        keys = IdempotencyKeys(ttl=100, fetch=stored.get, capacity=2, read=read)
        _committed_keys(keys, stored, ["k0", "k1", "k2"], now=0)
        # Given a call naming k2, which memory holds, so it is not read ahead
        ahead = await keys.read_ahead(["k2"])
        assert ahead == {}
        # When memory lets it go before the call resolves it
        _committed_keys(keys, stored, ["k3", "k4"], now=10)
        # Then it is still found, read from the store on the loop
        assert keys.lookup("k2", "h", now=20, ahead=ahead) == "job-k2"

    asyncio.run(main())


def test_a_control_plane_answers_replays_of_keys_it_no_longer_keeps_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "MAX_CACHED_KEYS", 10)  # what a restart loads

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        clock = FakeClock()
        scheduler = Scheduler(store, ControlConfig.from_env({}), clock)
        scheduler.idempotency.capacity = 10
        try:
            # Given 50 keyed submissions, of which memory keeps the 10 newest keys
            first = [
                (await scheduler.intake.submit([Submission("noop", {"i": i}, idempotency_key=f"order-{i}")]))[0]
                for i in range(50)
            ]
            assert len(scheduler.idempotency) == 10
            # When the oldest is sent again, the same and with another request
            clock.advance(60)
            (again,) = await scheduler.intake.submit([Submission("noop", {"i": 0}, idempotency_key="order-0")])
            with pytest.raises(AlreadyExists, match="order-1"):
                await scheduler.intake.submit([Submission("noop", {"i": 99}, idempotency_key="order-1")])
            # Then the store answers: the original job, and a refusal
            assert again.id == first[0].id
            assert scheduler.state_counts()[JobState.PENDING] == 50
        finally:
            store.close()
        # And a restart loads only the newest keys, while the older ones still answer
        store = SQLiteStore(str(tmp_path / "c.db"))
        try:
            restarted = Scheduler(store, ControlConfig.from_env({}), clock)
            assert len(restarted.idempotency) == 10
            (replayed,) = await restarted.intake.submit([Submission("noop", {"i": 3}, idempotency_key="order-3")])
            assert replayed.id == first[3].id
        finally:
            store.close()

    asyncio.run(main())
