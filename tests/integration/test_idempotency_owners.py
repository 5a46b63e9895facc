"""Idempotency keys are kept with their owner whatever CORRAL_JOB_VISIBILITY says, on a real control
plane restarted with another visibility, and on a database an older schema wrote (control.store.keys).

Before, a key was kept as sent while clients were not kept apart and as ``owner:key`` while they were:
a change of the visibility made a key sent again make a second job, and a key ``alice:order-7`` that bob
sent while everyone saw every job became alice's ``order-7``, so that her next submit got bob's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import corral
from control.jobs import JobRecord
from control.store import open_store
from control.store.keys import moved_keys
from tests.conftest import ControlProc
from tests.support.postgres import Cluster

NAMES = ("alice", "bob", "worker")


def _restart(cp: ControlProc, **env: str) -> None:
    assert cp.stop() == 0
    cp.env.update(env)
    cp.start()


@pytest.fixture
def tokens() -> dict[str, str]:
    return {name: secrets.token_urlsafe(24) for name in NAMES}


def _control_plane(make_control_plane: Any, tokens: dict[str, str], visibility: str) -> ControlProc:
    cp: ControlProc = make_control_plane(
        CORRAL_AUTH_TOKENS=",".join(f"{n}:{tokens[n]}" for n in ("alice", "bob")),
        CORRAL_WORKER_TOKEN=tokens["worker"],
        CORRAL_JOB_VISIBILITY=visibility,
    )
    cp.token = tokens["alice"]
    return cp


def _submit(cp: ControlProc, token: str, key: str, a: int) -> corral.Job:
    with corral.Client(cp.address, token=token) as client:
        return client.submit("add_numbers", {"a": a, "b": 1}, idempotency_key=key)


@pytest.mark.parametrize("first", ["all", "owner"])
def test_a_key_finds_its_own_job_and_no_other_client_s_across_visibility_changes(
    make_control_plane: Any, tokens: dict[str, str], first: str
) -> None:
    # Given alice keys a job, and bob sends a key that reads like alice's kept one
    cp = _control_plane(make_control_plane, tokens, first)
    alices = _submit(cp, tokens["alice"], "order-42", 1)
    bobs = _submit(cp, tokens["bob"], "alice:order-7", 2)
    assert (alices.owner, bobs.owner) == ("alice", "bob")
    then = "owner" if first == "all" else "all"
    for visibility in (then, first):
        # When the control plane is restarted with the other visibility (and back)
        _restart(cp, CORRAL_JOB_VISIBILITY=visibility)
        # Then each key sent again finds its own client's job, and makes no second one
        assert _submit(cp, tokens["alice"], "order-42", 1).id == alices.id, visibility
        assert _submit(cp, tokens["bob"], "alice:order-7", 2).id == bobs.id, visibility
        # and alice's "order-7" is a job of her own, never bob's
        mine = _submit(cp, tokens["alice"], "order-7", 3)
        assert mine.id != bobs.id and mine.owner == "alice" and mine.payload == {"a": 3, "b": 1}
        assert _submit(cp, tokens["alice"], "order-7", 3).id == mine.id


def test_a_key_sent_before_tokens_still_finds_its_job_by_those_who_may_see_it(
    make_control_plane: Any, tokens: dict[str, str]
) -> None:
    # Given a keyed job submitted while the control plane asked for no token (it has no owner)
    cp: ControlProc = make_control_plane()
    with corral.Client(cp.address) as client:
        anonymous = client.submit("add_numbers", {"a": 0, "b": 1}, idempotency_key="nightly")
    assert anonymous.owner == ""
    # When tokens are turned on, every client still seeing every job
    _restart(
        cp,
        CORRAL_AUTH_TOKENS=",".join(f"{n}:{tokens[n]}" for n in ("alice", "bob")),
        CORRAL_WORKER_TOKEN=tokens["worker"],
    )
    cp.token = tokens["alice"]
    # Then the key sent again finds that job, for any client (as it did before tokens)
    assert _submit(cp, tokens["alice"], "nightly", 0).id == anonymous.id
    assert _submit(cp, tokens["bob"], "nightly", 0).id == anonymous.id
    # But once clients are kept apart, a client who may not see that job gets one of its own
    _restart(cp, CORRAL_JOB_VISIBILITY="owner")
    own = _submit(cp, tokens["alice"], "nightly", 0)
    assert own.id != anonymous.id and own.owner == "alice"


def test_moved_keys_give_each_old_key_its_owner_s_form() -> None:
    # (key as an older schema kept it, request hash, job id, expires at, the owner of its job)
    old = [
        ("order-42", "h1", "j1", 10.0, "alice"),  # kept as sent (all could see all)
        ("alice:order-9", "h2", "j2", 10.0, "alice"),  # kept with its owner (clients kept apart), or sent so
        ("alice:order-7", "h3", "j3", 10.0, "bob"),  # bob's key that reads like alice's
        ("nightly", "h4", "j4", 10.0, ""),  # a job with no owner
        ("dup", "h5", "j5", 10.0, "alice"),  # alice's "dup", sent once each way: two jobs
        ("alice:dup", "h6", "j6", 20.0, "alice"),
    ]
    moved = {key: (digest, job) for key, digest, job, _ in moved_keys(old)}
    assert moved == {
        "alice:order-42": ("h1", "j1"),
        "alice:alice:order-9": ("h2", "j2"),
        "alice:order-9": ("h2", "j2"),
        "bob:alice:order-7": ("h3", "j3"),
        ":nightly": ("h4", "j4"),
        "alice:alice:dup": ("h6", "j6"),
        "alice:dup": ("h6", "j6"),  # of the two, the one that expires last
    }
    # and no key leads to another owner's job
    owner_of = {job: owner for *_, job, _, owner in [(r[0], r[1], r[2], r[3], r[4]) for r in old]}
    assert all(key.split(":", 1)[0] == owner_of[job] for key, (_, job) in moved.items())


def _older_schema_with_keys(location: str, sql: Callable[[str], list[tuple[object, ...]]], version: str) -> None:
    """Make the store at ``location`` hold two jobs (alice's j1, bob's j3) and a key of each older form,
    plus one whose job is gone, as a release of schema version 1 kept them."""
    store = open_store(location)
    asyncio.new_event_loop().run_until_complete(store.lead())
    store.insert(
        [
            JobRecord(id="j1", seq=1, type="noop", payload_json="{}", created_at=1.0, owner="alice"),
            JobRecord(id="j3", seq=2, type="noop", payload_json="{}", created_at=2.0, owner="bob"),
        ]
    )
    asyncio.new_event_loop().run_until_complete(store.commit())
    store.close()
    later = time.time() + 3600
    for key, job_id in (("order-42", "j1"), ("alice:order-7", "j3"), ("gone", "j9")):
        sql(
            f"INSERT INTO idempotency_keys (key, request_hash, job_id, expires_at) VALUES ('{key}', 'h', '{job_id}', {later})"
        )
    sql(version)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_database_of_the_older_schema_has_its_keys_moved_once(tmp_path: Path, request: Any, kind: str) -> None:
    # Given a database of schema version 1 holding a key of each older form, and one whose job is gone
    if kind == "sqlite":
        location = str(tmp_path / "corral.db")

        def sql(query: str) -> list[tuple[object, ...]]:
            with contextlib.closing(sqlite3.connect(location, isolation_level=None)) as conn:
                return conn.execute(query).fetchall()

        _older_schema_with_keys(location, sql, "PRAGMA user_version = 1")
        version = "PRAGMA user_version"
    else:
        postgres: Cluster = request.getfixturevalue("postgres")
        location = postgres.new_database()

        def sql(query: str) -> list[tuple[object, ...]]:
            return postgres.sql(location, query)

        _older_schema_with_keys(location, sql, "UPDATE corral_schema SET version = 1")
        version = "SELECT version FROM corral_schema"
    # When this release opens it, twice
    for _ in range(2):
        store = open_store(location)
        asyncio.new_event_loop().run_until_complete(store.lead())
        store.close()
        # Then each key is kept with the owner of its job, the one without a job is gone, and the second
        # open changed nothing (the version says the keys were moved)
        assert sql(version) == [(2,)]
        assert {str(k): str(j) for k, j in sql("SELECT key, job_id FROM idempotency_keys")} == {
            "alice:order-42": "j1",
            "bob:alice:order-7": "j3",
        }
