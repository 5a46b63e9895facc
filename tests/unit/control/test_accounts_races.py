"""Accounts under concurrency and hostile input, on a real SQLite store: a change is seen only once it
is durable, a login checked against a password that changed meanwhile gives no login, and a login
attempt under a name no account can have leaves nothing behind in memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from control.accounts import Accounts
from control.clock import FakeClock
from control.jobs import JobRecord
from control.store import SQLiteStore
from corral.errors import AlreadyExists, InvalidArgument, NotFound, Unauthenticated

TTL = 600.0
OLD = "old password"
NEW = "new password"
DEADLINE_SEC = 30.0
"""How long a test waits for the change it holds to reach the store's commit."""


class HeldStore(SQLiteStore):
    """A SQLite store whose commits wait while :attr:`held` is set: a commit that is slow to become
    durable (an fsync, a PostgreSQL round trip), held for as long as a test needs."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.held: asyncio.Event | None = None
        """While set and not yet released, commits wait here (None: commits run at once)."""
        self.waiting: asyncio.Event | None = None
        """Set once a commit waits on :attr:`held`."""

    def hold(self) -> None:
        """Make the next commits wait until :meth:`release`."""
        self.held, self.waiting = asyncio.Event(), asyncio.Event()

    def release(self) -> None:
        """Let the held commits go on, and the later ones run at once."""
        assert self.held is not None
        self.held.set()
        self.held = None

    async def reached_commit(self) -> None:
        """Return once a commit waits on the hold (the change before it is queued, not durable)."""
        assert self.waiting is not None
        await asyncio.wait_for(self.waiting.wait(), DEADLINE_SEC)

    async def commit(self) -> None:
        held = self.held
        if held is not None:
            assert self.waiting is not None
            self.waiting.set()
            await held.wait()
        await super().commit()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "corral.db")


@pytest.fixture
def store(path: str) -> Iterator[HeldStore]:
    s = HeldStore(path)
    yield s
    s.close()


@pytest.fixture
def accounts(store: HeldStore) -> Iterator[Accounts]:
    a = Accounts(store, "open", TTL, rounds=10, clock=FakeClock())
    yield a
    a.close()


def stored_sessions(path: str) -> dict[str, str]:
    """What the store holds durably, read by a connection of its own (the store's lock keeps a second
    SQLiteStore out): account name -> session."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return dict(conn.execute("SELECT name, session FROM accounts").fetchall())


def test_a_new_password_counts_only_once_it_is_durable(store: HeldStore, accounts: Accounts, path: str) -> None:
    async def scenario() -> None:
        await accounts.register("alice", OLD)
        before = (await accounts.login("alice", OLD)).token
        store.hold()
        change = asyncio.ensure_future(accounts.set_password("alice", NEW))
        await store.reached_commit()
        # Not durable yet: a crash now would bring the old password back, so the old one is still the
        # password, and logins made with it still stand.
        assert accounts.verify(before) == "alice"
        with pytest.raises(Unauthenticated):
            await accounts.login("alice", NEW)
        assert accounts.verify((await accounts.login("alice", OLD)).token) == "alice"
        store.release()
        await change
        with pytest.raises(Unauthenticated):
            accounts.verify(before)
        assert accounts.verify((await accounts.login("alice", NEW)).token) == "alice"

    asyncio.run(scenario())
    stored = stored_sessions(path)
    entry = accounts.get("alice")
    assert entry is not None and stored == {"alice": entry.session}


def test_a_deleted_account_goes_only_once_that_is_durable(store: HeldStore, accounts: Accounts, path: str) -> None:
    async def scenario() -> None:
        await accounts.register("alice", OLD)
        before = (await accounts.login("alice", OLD)).token
        store.hold()
        delete = asyncio.ensure_future(accounts.delete("alice"))
        await store.reached_commit()
        assert accounts.get("alice") is not None
        assert accounts.verify(before) == "alice"
        store.release()
        await delete
        assert accounts.get("alice") is None
        with pytest.raises(Unauthenticated):
            accounts.verify(before)

    asyncio.run(scenario())
    assert stored_sessions(path) == {}


def test_a_registration_counts_only_once_it_is_durable_and_a_second_one_of_the_name_is_refused(
    store: HeldStore, accounts: Accounts, path: str
) -> None:
    async def scenario() -> None:
        store.hold()
        first = asyncio.ensure_future(accounts.register("alice", OLD))
        await store.reached_commit()
        assert accounts.get("alice") is None
        with pytest.raises(Unauthenticated):
            await accounts.login("alice", OLD)
        second = asyncio.ensure_future(accounts.register("alice", NEW))
        store.release()
        await first
        with pytest.raises(Exception, match="already exists"):
            await second
        assert accounts.verify((await accounts.login("alice", OLD)).token) == "alice"

    asyncio.run(scenario())
    entry = accounts.get("alice")
    assert entry is not None and stored_sessions(path) == {"alice": entry.session}


@pytest.mark.parametrize("first", ["password", "delete"])
def test_a_delete_racing_a_password_change_leaves_memory_and_store_agreeing(
    store: HeldStore, accounts: Accounts, path: str, first: str
) -> None:
    async def scenario() -> None:
        await accounts.register("alice", OLD)
        store.hold()
        change = (
            asyncio.ensure_future(accounts.set_password("alice", NEW))
            if first == "password"
            else asyncio.ensure_future(accounts.delete("alice"))
        )
        await store.reached_commit()
        other = (
            asyncio.ensure_future(accounts.delete("alice"))
            if first == "password"
            else asyncio.ensure_future(accounts.set_password("alice", NEW))
        )
        # Let the second change run as far as it can (hashing a password takes threads' time) while the
        # first one's commit is held.
        await asyncio.wait({other}, timeout=0.5)
        store.release()
        await change
        if first == "password":
            await other  # the delete goes after the new password: no account is left
        else:
            with pytest.raises(NotFound):
                await other  # the account it would change is gone

    asyncio.run(scenario())
    assert accounts.get("alice") is None
    assert stored_sessions(path) == {}


async def waited_for(lock: asyncio.Lock) -> None:
    """Return once a task waits for ``lock``; fail after DEADLINE_SEC."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_SEC
    while not lock._waiters:
        assert asyncio.get_running_loop().time() < deadline, "nothing came to wait for the lock"
        await asyncio.sleep(0.01)


def test_a_job_of_the_name_that_lands_while_its_registration_hashes_refuses_it(
    store: HeldStore, accounts: Accounts, path: str
) -> None:
    async def scenario() -> None:
        async with accounts._changes():  # Given the changes held: the registration checks, hashes and waits
            register = asyncio.ensure_future(accounts.register("alice", NEW))
            await waited_for(accounts._changes())
            # When a job of alice's lands meanwhile (the last submission of a deleted account of that name)
            store.insert([JobRecord(id="alice-1", type="noop", payload_json="{}", created_at=0.0, owner="alice")])
            await store.commit()
        # Then the check made under the lock refuses the name
        with pytest.raises(AlreadyExists, match="still owns jobs"):
            await register

    asyncio.run(scenario())
    assert accounts.get("alice") is None and stored_sessions(path) == {}


def test_a_login_checked_against_a_password_changed_meanwhile_gives_no_login(accounts: Accounts) -> None:
    # One hashing thread: the new password's hashing is queued before the login's check, and finishes
    # first, so the change lands while the old password is being checked (on a busy control plane the
    # two threads of a 4-core machine give the same order by chance).
    accounts._hasher = ThreadPoolExecutor(1, thread_name_prefix="password-hash")

    async def scenario() -> None:
        await accounts.register("alice", OLD)
        change = asyncio.ensure_future(accounts.set_password("alice", NEW))
        await asyncio.sleep(0)  # the new password is being hashed
        # Someone who knew the old password (the reason for the change) logs in with it meanwhile.
        with pytest.raises(Unauthenticated):
            await accounts.login("alice", OLD)
        await change
        assert accounts.verify((await accounts.login("alice", NEW)).token) == "alice"

    asyncio.run(scenario())


def test_logins_under_names_no_account_can_have_keep_nothing(accounts: Accounts) -> None:
    tries = 40

    async def scenario() -> None:
        for _ in range(tries):
            # Made here and dropped after the call, as a request's name is: 256 KiB each (a gRPC message
            # may hold 4 MiB), so a name kept for the failure count shows.
            with pytest.raises(InvalidArgument, match="must be 1 to 64"):
                await accounts.login(os.urandom(1 << 17).hex(), OLD)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(scenario())
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Keeping the names would be 10 MiB; a few hundred KiB of loop and thread state is all the
    # attempts may leave.
    assert kept < 2 << 20, f"{kept} bytes kept after {tries} refused logins"
