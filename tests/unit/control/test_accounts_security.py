"""The failure table of control.accounts against a caller who would unlock a name without guessing: by
logins the hashing queue refused, by logins it gave up on, or by filling the table with made-up names;
and login tokens that are only accepted in one spelling. A real SQLite store and a clock the tests move."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from control.accounts import FAILURE_WINDOW_SEC, MAX_FAILURES, Accounts
from control.clock import FakeClock
from control.store import SQLiteStore
from corral.errors import AlreadyExists, RateLimited, Unauthenticated
from tests.unit.control.test_accounts import PASSWORD, TTL, login, run


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def accounts(tmp_path: Path, clock: FakeClock) -> Iterator[Accounts]:
    store = SQLiteStore(str(tmp_path / "corral.db"))
    # bcrypt's cheapest cost: these tests make a few hundred failed logins, each a real hash.
    a = Accounts(store, "open", TTL, rounds=4, clock=clock)
    run(a.register("victim", PASSWORD))
    yield a
    a.close()
    store.close()


def _fail(accounts: Accounts, name: str, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(Unauthenticated):
            login(accounts, name, "not the password")


def _locked(accounts: Accounts, name: str = "victim") -> bool:
    try:
        login(accounts, name, PASSWORD)
    except RateLimited as e:
        return "failed" in str(e)
    return False


def test_logins_the_full_hashing_queue_refused_are_no_failures(accounts: Accounts) -> None:
    accounts.max_waiting = 0  # 64 hashings wait already: every login is refused before any hash
    for _ in range(3 * MAX_FAILURES):
        with pytest.raises(RateLimited, match="too many logins"):
            login(accounts, "victim", "not the password")
    accounts.max_waiting = 64
    assert accounts.verify(login(accounts, "victim")) == "victim"  # no guess was checked: nothing to hold


def test_a_spray_the_full_queue_refused_does_not_unlock_a_name(accounts: Accounts) -> None:
    # The probe's attack: lock the victim, then 100,000 made-up names refused cheaply while the queue is full.
    _fail(accounts, "victim", MAX_FAILURES)
    assert _locked(accounts)
    accounts.max_waiting = 0

    async def spray() -> None:
        for i in range(100_000):
            with pytest.raises(RateLimited):
                await accounts.login(f"spray{i}", "x" * 8)

    run(spray())
    accounts.max_waiting = 64
    assert _locked(accounts)


def test_logins_given_up_on_before_their_hash_ran_are_no_failures(accounts: Accounts) -> None:
    # One hashing thread, held busy: the guesses wait for it, and their callers go away meanwhile.
    accounts._hasher.shutdown()
    accounts._hasher = ThreadPoolExecutor(max_workers=1)
    busy = threading.Event()

    async def scenario() -> None:
        held = asyncio.get_running_loop().run_in_executor(accounts._hasher, busy.wait)
        guesses = [asyncio.ensure_future(accounts.login("victim", f"guess {i}")) for i in range(MAX_FAILURES)]
        await asyncio.sleep(0)  # each is past its throttle check and waits for the thread
        for guess in guesses:
            guess.cancel()
        assert all(
            isinstance(r, asyncio.CancelledError) for r in await asyncio.gather(*guesses, return_exceptions=True)
        )
        busy.set()
        await held

    run(scenario())
    assert accounts.verify(login(accounts, "victim")) == "victim"


def test_a_full_table_first_drops_the_failures_whose_window_passed(accounts: Accounts, clock: FakeClock) -> None:
    accounts.max_tracked = 10
    _fail(accounts, "victim", MAX_FAILURES - 1)  # one guess short of locked
    for i in range(9):
        _fail(accounts, f"old{i}")
    clock.advance(FAILURE_WINDOW_SEC / 2)
    _fail(accounts, "victim")  # now locked: its first failures are still in the window
    clock.advance(FAILURE_WINDOW_SEC / 2 + 1)  # the olds' window passed, not all of the victim's
    for i in range(9):
        _fail(accounts, f"new{i}")
    assert len(accounts._failures) <= 10
    assert "victim" in accounts._failures and not any(n.startswith("old") for n in accounts._failures)


def test_a_full_table_never_drops_a_locked_name(accounts: Accounts, clock: FakeClock) -> None:
    accounts.max_tracked = 4
    run(accounts.register("other", PASSWORD))
    _fail(accounts, "victim", MAX_FAILURES)
    _fail(accounts, "other", MAX_FAILURES)
    for i in range(50):  # made-up names, each refused after a real hash: they push out one another only
        _fail(accounts, f"spray{i}")
        assert len(accounts._failures) <= 4
    assert _locked(accounts, "victim") and _locked(accounts, "other")


def test_when_every_tracked_name_is_locked_new_names_go_untracked_and_nobody_is_unlocked(
    accounts: Accounts, clock: FakeClock
) -> None:
    accounts.max_tracked = 2
    run(accounts.register("other", PASSWORD))
    run(accounts.register("third", PASSWORD))
    _fail(accounts, "victim", MAX_FAILURES)
    _fail(accounts, "other", MAX_FAILURES)
    _fail(accounts, "third", 3 * MAX_FAILURES)  # no room: refused as wrong, but not counted
    assert set(accounts._failures) == {"victim", "other"}
    assert _locked(accounts, "victim") and _locked(accounts, "other") and not _locked(accounts, "third")
    clock.advance(FAILURE_WINDOW_SEC)  # the locks lapse: room again
    _fail(accounts, "third", MAX_FAILURES)
    assert _locked(accounts, "third") and not _locked(accounts, "victim")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_login_is_accepted_in_its_one_spelling_only(accounts: Accounts) -> None:
    token = login(accounts, "victim")
    header, claims, signature = token.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    assert _b64(raw) == signature
    # The same bytes spelt otherwise: padding, or other bits past the end of the last character.
    last = _b64(raw)[-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    twin = alphabet[alphabet.index(last) ^ 1]  # 32 bytes in 43 characters: the last 2 bits are spare
    assert base64.urlsafe_b64decode(signature[:-1] + twin + "=") == raw
    for spelling in (
        token + "=",
        token + "==",
        f"{header}.{claims}=.{signature}",
        f"{header}=.{claims}.{signature}",
        f"{header}.{claims}.{signature[:-1]}{twin}",
        f" {token}",
        f"{header}.{claims}.{signature}+",
    ):
        with pytest.raises(Unauthenticated, match="invalid token"):
            accounts.verify(spelling)
    assert accounts.verify(token) == "victim"


def test_a_name_that_differs_from_another_only_in_case_is_taken(tmp_path: Path, clock: FakeClock) -> None:
    # OPS beside the admin token ops, or Victim beside victim, read alike in the audit log
    store = SQLiteStore(str(tmp_path / "c.db"))
    a = Accounts(store, "open", TTL, rounds=4, clock=clock, reserved=lambda: frozenset({"ops"}))
    try:
        run(a.register("victim", PASSWORD))
        for name, other in (("OPS", "ops"), ("Victim", "victim"), ("VICTIM", "victim")):
            with pytest.raises(AlreadyExists, match=f"the name {other!r} only in case"):
                run(a.register(name, PASSWORD))
        assert run(a.register("victim2", PASSWORD)).name == "victim2"  # another name entirely is fine
    finally:
        a.close()
        store.close()
