"""Accounts on a real SQLite store with a clock the tests move: passwords, logins, their end."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jwt
import pytest

from control.accounts import FAILURE_WINDOW_SEC, MAX_FAILURES, Accounts, LoginGrant
from control.auth import LOGIN_EXPIRES
from control.clock import FakeClock
from control.jobs import JobRecord, JobState
from control.store import SQLiteStore
from corral.errors import AlreadyExists, InvalidArgument, NotFound, RateLimited, Unauthenticated

T = TypeVar("T")
TTL = 600.0
PASSWORD = "correct horse"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "corral.db"))
    yield s
    s.close()


@pytest.fixture
def accounts(store: SQLiteStore, clock: FakeClock) -> Iterator[Accounts]:
    a = Accounts(store, "open", TTL, rounds=10, reserved=lambda: {"ops"}, clock=clock)
    yield a
    a.close()


def login(accounts: Accounts, name: str = "alice", password: str = PASSWORD) -> str:
    return run(accounts.login(name, password)).token


def test_a_login_stands_for_its_account_until_it_expires(accounts: Accounts, clock: FakeClock) -> None:
    run(accounts.register("alice", PASSWORD))
    token = login(accounts)
    LOGIN_EXPIRES.set(None)
    assert accounts.verify(token) == "alice"
    assert LOGIN_EXPIRES.get() == clock.now() + TTL
    clock.advance(TTL - 1)
    assert accounts.verify(token) == "alice"
    clock.advance(1)
    with pytest.raises(Unauthenticated, match="expired"):
        accounts.verify(token)


def test_only_a_token_signed_with_the_store_s_key_is_a_login(
    accounts: Accounts, tmp_path: Path, clock: FakeClock
) -> None:
    run(accounts.register("alice", PASSWORD))
    token = login(accounts)
    head, body, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    # Flip one bit of the signature's first byte: changing its last characters can leave the
    # decoded bytes unchanged (a 32-byte signature's final character carries 2 unused bits).
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[0] ^= 1
    tampered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    forged_body = base64.urlsafe_b64encode(json.dumps({**claims, "sub": "bob"}).encode()).rstrip(b"=").decode()
    other_store = SQLiteStore(str(tmp_path / "other.db"))
    try:
        other = Accounts(other_store, "open", TTL, rounds=10, clock=clock)
        run(other.register("alice", PASSWORD))
        elsewhere = login(other)  # the same name and claims, another control plane's key
        other.close()
    finally:
        other_store.close()
    unsigned = jwt.encode(claims, key="", algorithm="none")
    wrong_issuer = jwt.encode({**claims, "iss": "someone"}, accounts._key, algorithm="HS256")
    no_session = jwt.encode({k: v for k, v in claims.items() if k != "sid"}, accounts._key, algorithm="HS256")
    for bad in (
        f"{head}.{forged_body}.{signature}",
        f"{head}.{body}.{tampered}",
        elsewhere,
        unsigned,
        wrong_issuer,
        no_session,
        "a.b.c",
    ):
        with pytest.raises(Unauthenticated, match="invalid token"):
            accounts.verify(bad)
    assert accounts.verify(token) == "alice"


def test_a_new_password_or_a_deleted_account_ends_earlier_logins(accounts: Accounts) -> None:
    run(accounts.register("alice", PASSWORD))
    first = login(accounts)
    run(accounts.set_password("alice", "battery staple"))
    with pytest.raises(Unauthenticated, match="ended"):
        accounts.verify(first)
    with pytest.raises(Unauthenticated, match="wrong name or password"):
        login(accounts)
    second = login(accounts, password="battery staple")
    assert accounts.verify(second) == "alice"
    run(accounts.delete("alice"))
    with pytest.raises(Unauthenticated, match="ended"):
        accounts.verify(second)
    # A later account of the same name does not bring the old logins back.
    run(accounts.register("alice", "battery staple"))
    with pytest.raises(Unauthenticated, match="ended"):
        accounts.verify(second)
    with pytest.raises(NotFound, match="'nobody'"):
        run(accounts.delete("nobody"))


def test_a_wrong_name_and_a_wrong_password_get_the_same_answer(accounts: Accounts) -> None:
    run(accounts.register("alice", PASSWORD))
    messages = set()
    for name, password in (
        ("alice", "not it at all"),
        ("mallory", PASSWORD),
        ("mallory", ""),
        ("alice", PASSWORD + "x"),
    ):
        with pytest.raises(Unauthenticated) as caught:
            login(accounts, name, password)
        messages.add(caught.value.message)
    assert messages == {"wrong name or password"}
    # A name no account can have (the rule is public) is refused as such: it tells nothing, and costs no hash.
    for name in ("", "al ice", "a" * 65):
        with pytest.raises(InvalidArgument) as refused:
            login(accounts, name, PASSWORD)
        assert refused.value.field == "name"


def test_a_password_past_72_bytes_is_refused_and_never_matches_its_first_72(accounts: Accounts) -> None:
    long = "p" * 72
    run(accounts.register("alice", long))
    with pytest.raises(InvalidArgument) as caught:
        run(accounts.register("bob", long + "q"))
    assert caught.value.field == "password" and "72 bytes" in caught.value.message
    with pytest.raises(Unauthenticated):
        login(accounts, "alice", long + "q")  # bcrypt alone would read only the first 72 bytes
    assert accounts.verify(login(accounts, "alice", long)) == "alice"


def test_repeated_failures_slow_one_name_down_until_the_window_passes(accounts: Accounts, clock: FakeClock) -> None:
    run(accounts.register("alice", PASSWORD))
    run(accounts.register("bob", PASSWORD))
    for _ in range(MAX_FAILURES):
        with pytest.raises(Unauthenticated):
            login(accounts, "alice", "guess-guess")
    with pytest.raises(RateLimited, match="'alice'") as caught:
        login(accounts)  # even the right password: the guesser cannot tell
    assert 0 < caught.value.retry_after <= FAILURE_WINDOW_SEC
    assert accounts.verify(login(accounts, "bob")) == "bob"  # another name is not slowed
    clock.advance(FAILURE_WINDOW_SEC)
    assert accounts.verify(login(accounts)) == "alice"


@pytest.mark.parametrize(
    ("name", "password", "field", "rule"),
    [
        ("", PASSWORD, "name", "1 to 64"),
        ("a" * 65, PASSWORD, "name", "1 to 64"),
        ("al ice", PASSWORD, "name", "[A-Za-z0-9._@-]"),
        ("ålice", PASSWORD, "name", "[A-Za-z0-9._@-]"),
        ("alice:x", PASSWORD, "name", "[A-Za-z0-9._@-]"),
        ("alice", "seven77", "password", "8 to 72 bytes"),
        ("alice", "", "password", "8 to 72 bytes"),
        ("alice", "ü" * 37, "password", "got 74"),
    ],
)
def test_bad_names_and_passwords_are_refused_and_store_nothing(
    accounts: Accounts, store: SQLiteStore, name: str, password: str, field: str, rule: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        run(accounts.register(name, password))
    assert caught.value.field == field and rule in caught.value.message
    assert accounts.all() == [] and store.load_accounts() == []


def test_a_taken_or_reserved_name_is_refused(accounts: Accounts) -> None:
    run(accounts.register("alice", "pässwörd"))  # 10 bytes of UTF-8
    with pytest.raises(AlreadyExists, match="already exists"):
        run(accounts.register("alice", PASSWORD))
    with pytest.raises(AlreadyExists, match="configured client token"):
        run(accounts.register("ops", PASSWORD))
    assert [a.name for a in accounts.all()] == ["alice"]
    assert accounts.verify(login(accounts, "alice", "pässwörd")) == "alice"


def test_accounts_and_logins_outlive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    path = str(tmp_path / "corral.db")
    store = SQLiteStore(path)
    first = Accounts(store, "open", TTL, rounds=10, clock=clock)
    run(first.register("alice", PASSWORD))
    token = login(first)
    first.close()
    store.close()
    store = SQLiteStore(path)
    try:
        again = Accounts(store, "open", TTL, rounds=10, clock=clock)
        assert again.verify(token) == "alice"
        assert [a.name for a in again.all()] == ["alice"]
        again.close()
    finally:
        store.close()


def test_guesses_sent_together_are_held_to_the_same_number(accounts: Accounts) -> None:
    run(accounts.register("alice", PASSWORD))

    async def burst() -> list[BaseException | LoginGrant]:
        tries = [accounts.login("alice", f"guess-{n:04d}") for n in range(4 * MAX_FAILURES)]
        return await asyncio.gather(*tries, return_exceptions=True)

    outcomes = run(burst())
    # Each attempt counts from its start: only the first MAX_FAILURES were checked at all.
    assert sum(isinstance(o, Unauthenticated) for o in outcomes) == MAX_FAILURES
    assert sum(isinstance(o, RateLimited) for o in outcomes) == 3 * MAX_FAILURES


def test_past_the_waiting_limit_a_login_is_refused_not_queued(accounts: Accounts) -> None:
    for name in ("alice", "bob", "carol", "dave"):
        run(accounts.register(name, PASSWORD))
    accounts.max_waiting = 2

    async def together() -> list[BaseException | LoginGrant]:
        return await asyncio.gather(
            *(accounts.login(n, PASSWORD) for n in ("alice", "bob", "carol", "dave")), return_exceptions=True
        )

    outcomes = run(together())
    assert [type(o).__name__ for o in outcomes] == ["LoginGrant", "LoginGrant", "RateLimited", "RateLimited"]
    assert "at once" in str(outcomes[2])
    assert accounts.verify(login(accounts, "carol")) == "carol"  # once the others are done


def test_ending_all_logins_ends_every_account_s_and_outlives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    path = str(tmp_path / "corral.db")
    store = SQLiteStore(path)
    accounts = Accounts(store, "open", TTL, rounds=10, clock=clock)
    for name in ("alice", "bob"):
        run(accounts.register(name, PASSWORD))
    before = [login(accounts, name) for name in ("alice", "bob")]
    assert [accounts.verify(t) for t in before] == ["alice", "bob"]  # and now cached
    run(accounts.end_all_logins())
    for token in before:
        with pytest.raises(Unauthenticated, match="invalid token"):
            accounts.verify(token)
    after = login(accounts, "alice")  # the password is unchanged
    assert accounts.verify(after) == "alice"
    accounts.close()
    store.close()
    store = SQLiteStore(path)
    try:
        again = Accounts(store, "open", TTL, rounds=10, clock=clock)
        assert again.verify(after) == "alice"  # the new key is the stored one
        with pytest.raises(Unauthenticated):
            again.verify(before[0])
        again.close()
    finally:
        store.close()


# ---- a name that still owns jobs ----------------------------------------------------------------------


def own(store: SQLiteStore, owner: str, seq: int) -> None:
    """Store a finished job of ``owner`` (finished at 1.0: a purge with a later cut-off takes it)."""
    job = JobRecord(
        id=f"{owner}-{seq}", seq=seq, type="noop", payload_json='{"secret": 1}', created_at=0.0, owner=owner
    )
    job.state, job.finished_at = JobState.SUCCEEDED, 1.0
    store.insert([job])
    run(store.commit())


def handed_over(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The names whose jobs an account was made over, as logged (at warning level)."""
    return [
        getattr(r, "account", "") for r in caplog.records if r.levelno == logging.WARNING and hasattr(r, "former_jobs")
    ]


def test_a_deleted_account_s_name_that_owns_jobs_is_not_open_to_registration(
    accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # Given alice's job, and her account deleted
    run(accounts.register("alice", PASSWORD))
    own(store, "alice", 1)
    run(accounts.delete("alice"))
    # When anyone registers the name, Then it is refused, and nothing is stored
    with pytest.raises(AlreadyExists, match=r"still owns jobs of a former account or token.*an admin may create it"):
        run(accounts.register("alice", "mallory's password"))
    assert accounts.get("alice") is None and store.load_accounts() == []
    with pytest.raises(Unauthenticated):
        login(accounts, "alice", "mallory's password")
    # When one who manages accounts creates it, Then it is made (the hand-over), and logged as such
    with caplog.at_level(logging.WARNING, logger="control.accounts"):
        run(accounts.register("alice", "handed over", by_admin=True))
    assert accounts.verify(login(accounts, "alice", "handed over")) == "alice"
    assert handed_over(caplog) == ["alice"]


def test_where_admins_create_accounts_they_may_hand_a_name_over(
    store: SQLiteStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    own(store, "alice", 1)
    accounts = Accounts(store, "admin", TTL, rounds=10, clock=clock)
    try:
        with caplog.at_level(logging.WARNING, logger="control.accounts"):
            run(accounts.register("alice", PASSWORD))  # CORRAL_ACCOUNTS=admin: only admins get here
        assert [a.name for a in accounts.all()] == ["alice"] and handed_over(caplog) == ["alice"]
    finally:
        accounts.close()


def test_a_name_is_free_again_once_its_jobs_are_purged(
    accounts: Accounts, store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # A name that never had a job is free, and its registration is no hand-over.
    with caplog.at_level(logging.WARNING, logger="control.accounts"):
        run(accounts.register("bob", PASSWORD))
    own(store, "alice", 1)
    own(store, "alice", 2)
    with pytest.raises(AlreadyExists, match="still owns jobs"):
        run(accounts.register("alice", PASSWORD))
    step = run(store.purge_finished(JobState.SUCCEEDED, 10.0, 100))  # retention deletes both
    assert sorted(step.ids) == ["alice-1", "alice-2"]
    with caplog.at_level(logging.WARNING, logger="control.accounts"):
        run(accounts.register("alice", PASSWORD))
    assert [a.name for a in accounts.all()] == ["alice", "bob"] and handed_over(caplog) == []


def test_a_token_name_removed_by_a_reload_is_not_open_to_registration_while_it_owns_jobs(
    store: SQLiteStore, clock: FakeClock
) -> None:
    tokens = {"ops", "carol"}
    accounts = Accounts(store, "open", TTL, rounds=10, reserved=lambda: tokens, clock=clock)
    try:
        own(store, "carol", 1)
        tokens.discard("carol")  # the token file no longer names carol
        with pytest.raises(AlreadyExists, match="still owns jobs of a former account or token"):
            run(accounts.register("carol", PASSWORD))
        assert accounts.all() == []
    finally:
        accounts.close()
