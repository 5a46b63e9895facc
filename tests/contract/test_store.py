"""One conformance suite for every Store implementation: each test taking ``location`` or ``store`` runs
on SQLite and on PostgreSQL (the session's throw-away cluster); then what is particular to each."""

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from control import jobs
from control.jobs import DEPENDENCY_FAILED, JobRecord, JobState, StartWhen
from control.notify import NotifyTarget
from control.store import (
    AccountEntry,
    AuditEntry,
    IdempotencyEntry,
    JobPage,
    JobTypeEntry,
    PurgeStep,
    SQLiteStore,
    Store,
    audit_rows,
    open_store,
)
from control.store import postgres as postgres_module
from control.store import rows as rows_module
from control.store.lock import DatabaseLock
from control.store.postgres import LOCK_KEY
from control.store.sqlite import OFFLOAD_ROWS
from corral.errors import Unavailable
from tests.conftest import wait_until
from tests.support.ports import dead_address
from tests.support.postgres import Cluster

T = TypeVar("T")


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    cluster: Cluster = request.getfixturevalue("postgres")
    return cluster.new_database()


def opened(location: str) -> Store:
    """The store at ``location``, opened and leading (ready to be written)."""
    s = open_store(location)
    run(s.lead())
    return s


@pytest.fixture
def store(location: str) -> Iterator[Store]:
    s = opened(location)
    yield s
    s.close()


def record(seq: int, type_: str = "noop", state: JobState = JobState.PENDING) -> JobRecord:
    job = JobRecord(id=f"job-{seq}", seq=seq, type=type_, payload_json='{"n": 1}', created_at=float(seq),
                    labels={"team": "ü"})  # fmt: skip
    job.state = state
    return job


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.new_event_loop().run_until_complete(coro)


@contextlib.contextmanager
def reopened(location: str, inserted: list[JobRecord], updated: Sequence[JobRecord] = ()) -> Iterator[Store]:
    """A store at ``location`` that committed ``inserted`` (then ``updated``) and was closed, open again."""
    s = opened(location)
    s.insert(inserted)
    if updated:
        s.update(updated)
    run(s.commit())
    s.close()
    s = opened(location)
    try:
        yield s
    finally:
        s.close()


def test_insert_commit_get_roundtrip(store: Store) -> None:
    job = record(1)
    store.insert([job])

    async def go() -> JobRecord | None:
        await store.commit()
        return await store.get("job-1")

    got = run(go())
    assert got is not None
    assert (got.id, got.type, got.payload_json, got.labels, got.state) == (
        job.id,
        "noop",
        '{"n": 1}',
        {"team": "ü"},
        JobState.PENDING,
    )


def test_update_is_compare_and_set_on_the_attempt(store: Store) -> None:
    job = record(1)
    store.insert([job])
    jobs.lease(job, "w1", 1, now=2.0, grace=1)
    jobs.fail_attempt(job, 1, jobs.ERROR, "x", now=3.0, delay=0)
    jobs.promote(job, 3.0)
    jobs.lease(job, "w2", 1, now=4.0, grace=1)
    store.update([job])  # attempt 2 stored
    stale = record(1)
    stale.attempts = 1
    stale.state = JobState.SUCCEEDED
    store.update([stale])  # an older attempt must not overwrite it

    async def go() -> JobRecord | None:
        await store.commit()
        return await store.get("job-1")

    got = run(go())
    assert got is not None
    assert (got.attempts, got.state, got.worker_id) == (2, JobState.RUNNING, "w2")


def test_list_filters_orders_newest_first_and_counts(store: Store) -> None:
    store.insert(
        [record(i, "a" if i % 2 else "b", JobState.SUCCEEDED if i < 5 else JobState.PENDING) for i in range(1, 11)]
    )

    async def go() -> JobPage:
        await store.commit()
        return await store.list_jobs([JobState.PENDING], "a", 2, 1)

    page = run(go())
    assert page.total == 3  # 5, 7, 9
    assert [j.seq for j in page.jobs] == [7, 5]


def test_list_filters_by_the_error_an_attempt_ended_with(store: Store) -> None:
    jobs_ = [record(i, state=JobState.FAILED) for i in range(1, 6)]
    for job, code in zip(jobs_, ["TIMEOUT", "ERROR", "TIMEOUT", "", "WORKER_LOST"], strict=True):
        job.error_code = code
    jobs_[3].state = JobState.SUCCEEDED
    store.insert(jobs_)

    async def go(code: str) -> list[int]:
        await store.commit()
        page = await store.list_jobs([JobState.FAILED], "", 10, 0, error_code=code)
        assert page.total == len(page.jobs)
        return [j.seq for j in page.jobs]

    assert run(go("TIMEOUT")) == [3, 1]
    assert run(go("WORKER_LOST")) == [5]
    assert run(go("")) == [5, 3, 2, 1]
    assert run(go("NO_SUCH_CODE")) == []


def test_list_filters_by_labels_of_any_characters(store: Store) -> None:
    jobs_ = [record(i) for i in range(1, 6)]
    jobs_[0].labels = {"team": "edge", "tier": "gold"}
    jobs_[1].labels = {"team": "edge"}
    jobs_[2].labels = {'a.b "c"': "ü", "$[0]": "x"}
    jobs_[3].labels = {"team": "edge-2"}
    store.insert(jobs_)

    async def go(labels: dict[str, str]) -> list[int]:
        await store.commit()
        page = await store.list_jobs([], "", 10, 0, labels=labels)
        assert page.total == len(page.jobs)
        return [j.seq for j in page.jobs]

    assert run(go({"team": "edge"})) == [2, 1]
    assert run(go({"team": "edge", "tier": "gold"})) == [1]
    assert run(go({'a.b "c"': "ü", "$[0]": "x"})) == [3]
    assert run(go({"team": "ü"})) == [5]  # record()'s own label
    assert run(go({"team": "nobody"})) == []
    assert run(go({})) == [5, 4, 3, 2, 1]


def test_an_attempt_s_output_is_stored_and_updated(location: str) -> None:
    job = record(1)
    jobs.lease(job, "w1", 1, now=2.0, grace=1)
    jobs.succeed(job, 1, "{}", now=3.0, exec_seconds=1.0, output="hello\nü\n")
    with reopened(location, [record(1)], [job]) as s:
        got = run(s.get("job-1"))
        assert got is not None and got.output == "hello\nü\n"


def test_dependencies_survive_reopen_and_states_are_read_by_id(location: str) -> None:
    first, second = record(1), record(2)
    first.state = JobState.SUCCEEDED
    second.depends_on = ("job-1", "gone")
    with reopened(location, [first, second]) as s:
        assert [j.depends_on for j in s.load_active()] == [("job-1", "gone")]
        assert s.states(["job-1", "job-2", "gone"]) == {"job-1": JobState.SUCCEEDED, "job-2": JobState.PENDING}


def test_states_read_on_the_event_loop_do_not_wait_for_the_reader_s_query(location: str) -> None:
    """SubmitJobs reads states on the event loop; they were read on the reader thread's connection, so
    the loop waited for whatever that thread was reading (0.12 s behind a ListJobs of 1,000,000 jobs)."""
    with reopened(location, [record(1)]) as s:
        reader: Any = s  # the implementations' own connection and thread, to keep the reader busy
        release = threading.Event()
        busy = threading.Event()

        def held() -> bool:
            busy.set()
            return release.wait(3)

        if location.startswith("postgresql://"):
            query = "SELECT pg_sleep(3)"
        else:
            reader._rconn.create_function("held", 0, held)
            query = "SELECT held()"
        reading = reader._reader.submit(lambda: reader._rconn.execute(query).fetchall())
        try:
            # Given the reader thread in a query on its connection (3 s)
            if location.startswith("postgresql://"):
                with psycopg.connect(location, autocommit=True) as conn:
                    deadline = time.monotonic() + 10
                    while not conn.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE query = %s AND state = 'active'", (query,)
                    ).fetchall():
                        assert time.monotonic() < deadline, "the reader's query did not start"
                        time.sleep(0.01)
            else:
                assert busy.wait(10), "the reader's query did not start"
            # When states are read meanwhile, Then they come at once
            started = time.monotonic()
            assert s.states(["job-1", "gone"]) == {"job-1": JobState.PENDING}
            assert s.states([]) == {}
            assert time.monotonic() - started < 1.0
        finally:
            release.set()
            reading.result(timeout=10)


def test_states_of_a_postgres_store_that_lost_its_server_are_unavailable(postgres: Cluster) -> None:
    # Given a leading store whose connections the server ended, and that cannot connect again (a read
    # whose session ended is tried once on a new one: that one cannot be had either)
    url = postgres.new_database()
    s = opened(url)
    try:
        database = url.rsplit("/", 1)[1]
        postgres.sql(postgres.url("postgres"), f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
        postgres.sql(postgres.url("postgres"), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                               f"WHERE datname = '{database}'")  # fmt: skip
        # Then reading states says the store cannot be read, as other reads do, not a driver error
        with pytest.raises(Unavailable, match="store cannot be read"):
            s.states(["job-1"])
    finally:
        s.close()


def test_the_chain_a_failure_cancelled_is_found_by_exact_ids_however_long(location: str) -> None:
    # job-1 failed; job-2 and job-4 were cancelled for it, job-7 for job-2, and job-8 for job-7;
    # job-3 was cancelled by request; job-5 was cancelled for job-11, whose id starts like job-1's;
    # job-6 waits for job-1
    jobs_ = [record(n) for n in range(1, 9)]
    for job in (*jobs_[1:5], *jobs_[6:8]):
        job.state, job.error_code = JobState.CANCELLED, "DEPENDENCY_FAILED"
    jobs_[1].depends_on = ("job-1",)
    jobs_[2].depends_on, jobs_[2].error_code = ("job-1",), "CANCELLED"
    jobs_[3].depends_on = ("job-0", "job-1")
    jobs_[4].depends_on = ("job-11",)
    jobs_[5].depends_on = ("job-1",)
    jobs_[6].depends_on = ("job-2", "job-6")
    jobs_[7].depends_on = ("job-7",)
    with reopened(location, jobs_) as s:
        assert [j.id for j in run(s.cancelled_chain("job-1"))] == ["job-2", "job-4", "job-7", "job-8"]
        assert [j.id for j in run(s.cancelled_chain("job-11"))] == ["job-5"]
        assert run(s.cancelled_chain("job")) == []
        chain = run(s.cancelled_chain("job-1"))
        assert chain[2].depends_on == ("job-2", "job-6") and chain[2].error_code == "DEPENDENCY_FAILED"


def test_many_jobs_are_read_by_id_past_the_statement_s_parameter_limit(location: str) -> None:
    jobs_ = [record(n) for n in range(1, 1202)]
    with reopened(location, jobs_) as s:
        asked = [f"job-{n}" for n in range(1201, 0, -2)] + ["job-0", "job-1202", "job-1'"]
        found = run(s.get_many(asked))
        assert sorted(j.id for j in found) == sorted(f"job-{n}" for n in range(1, 1202, 2))
        assert run(s.get_many([])) == []


def test_worker_selectors_survive_reopen(location: str) -> None:
    picky, plain = record(1), record(2)
    picky.worker_selector = (("gpu", "a100"), ("zone", "ü"))
    with reopened(location, [picky, plain]) as s:
        assert {j.id: j.worker_selector for j in s.load_active()} == {"job-1": picky.worker_selector, "job-2": ()}


def test_gpus_and_memory_asked_for_survive_reopen(location: str) -> None:
    big, plain = record(1), record(2)
    big.gpu_count, big.memory_mb = 2, 40960
    with reopened(location, [big, plain]) as s:
        assert {j.id: (j.gpu_count, j.memory_mb) for j in s.load_active()} == {"job-1": (2, 40960), "job-2": (0, 0)}
        page = run(s.list_jobs([], "", 10, 0))
        assert {j.id: j.gpu_count for j in page.jobs} == {"job-1": 2, "job-2": 0}


def test_notify_targets_and_start_when_survive_reopen(location: str) -> None:
    told, plain = record(1), record(2)
    told.notify = (
        NotifyTarget(email="ops@example.test"),
        NotifyTarget(webhook_url="http://127.0.0.1:9/ü", on=(JobState.FAILED,)),
    )
    told.start_when = StartWhen.ALL_ENDED
    with reopened(location, [told, plain]) as s:
        assert {j.id: j.notify for j in s.load_active()} == {"job-1": told.notify, "job-2": ()}
        assert {j.id: j.start_when for j in s.load_active()} == {
            "job-1": StartWhen.ALL_ENDED,
            "job-2": StartWhen.ALL_SUCCEEDED,
        }


def test_list_by_owner_and_owners_survive_reopen(location: str) -> None:
    jobs_ = [record(i) for i in range(1, 7)]
    for job in jobs_:
        job.owner = {1: "alice", 2: "bob", 4: "alice", 5: "bob"}.get(job.seq, "")
    with reopened(location, jobs_) as s:
        page = run(s.list_jobs([], "", 50, 0, owners=["alice"]))
        assert ([j.seq for j in page.jobs], page.total) == ([4, 1], 2)
        owners = {j.seq: j.owner for j in run(s.list_jobs([], "", 50, 0)).jobs}
        assert owners == {6: "", 5: "bob", 4: "alice", 3: "", 2: "bob", 1: "alice"}
        assert run(s.list_jobs([], "", 50, 0, owners=["alice", "bob"])).total == 4
        assert run(s.list_jobs([], "", 50, 0, owners=["carol"])).total == 0


def test_a_page_stops_before_its_payloads_and_results_outgrow_an_answer(store: Store) -> None:
    # Given 5 finished jobs with 4 MiB results and one with a result larger than a page
    jobs_ = [record(i, state=JobState.SUCCEEDED) for i in range(1, 7)]
    for job in jobs_[:5]:
        job.result_json = '{"x":"' + "a" * (4 << 20) + '"}'
    jobs_[5].result_json = '{"x":"' + "b" * (12 << 20) + '"}'
    store.insert(jobs_)
    run(store.commit())
    # Then a page holds what fits in 10 MiB, the first job always, and total counts them all
    first = run(store.list_jobs([], "", 50, 0))
    assert ([j.seq for j in first.jobs], first.total) == ([6], 6)
    second = run(store.list_jobs([], "", 50, 1))
    assert ([j.seq for j in second.jobs], second.total) == ([5, 4], 6)
    assert [j.seq for j in run(store.list_jobs([], "", 1, 3)).jobs] == [3]


def test_purge_deletes_finished_jobs_of_one_state_past_a_time(store: Store) -> None:
    # Given jobs finished at 100, 200 and 300 in each terminal state, and live ones
    jobs_ = []
    for i, (state, finished) in enumerate(
        [(s, t) for t in (100.0, 200.0, 300.0) for s in (JobState.SUCCEEDED, JobState.FAILED)], start=1
    ):
        job = record(i, state=state)
        job.finished_at = finished
        jobs_.append(job)
    jobs_ += [record(7), record(8, state=JobState.RUNNING)]
    store.insert(jobs_)
    # When SUCCEEDED jobs finished by 250 are purged (the insert still queued: it is written first)
    gone = run(store.purge_finished(JobState.SUCCEEDED, 250.0, 1000))
    # Then exactly those go, and no job of the state is left past them
    assert sorted(gone.ids) == ["job-1", "job-3"] and gone.next_seq is None
    left = run(store.list_jobs([], "", 50, 0))
    assert sorted(j.id for j in left.jobs) == ["job-2", "job-4", "job-5", "job-6", "job-7", "job-8"]
    assert store.count_by_state() == {
        JobState.SUCCEEDED: 1,
        JobState.FAILED: 3,
        JobState.PENDING: 1,
        JobState.RUNNING: 1,
    }
    # and a step looks only at `limit` jobs of the state, so it reads a bounded range; the next goes on
    assert run(store.purge_finished(JobState.FAILED, 1000.0, 2)) == PurgeStep(["job-2", "job-4"], 4)
    assert run(store.purge_finished(JobState.FAILED, 1000.0, 2, 4)) == PurgeStep(["job-6"], None)
    assert run(store.purge_finished(JobState.FAILED, 1000.0, 2)) == PurgeStep([], None)


def test_a_purge_walks_past_jobs_that_finished_late_and_stops_at_jobs_too_new(store: Store) -> None:
    """A step used to be the oldest `limit` jobs of the state: jobs submitted long ago that finished
    late (re-driven from the dead-letter queue, scheduled far ahead) filled it, and nothing behind them
    was purged until they expired too."""
    # Given, in submission order: 3 jobs that finished late, 3 past their retention, 3 submitted since
    jobs_ = []
    for seq, finished in enumerate([900.0] * 3 + [100.0] * 3 + [950.0] * 3, start=1):
        job = record(seq, state=JobState.SUCCEEDED)
        job.created_at = float(seq) if seq <= 6 else 800.0 + seq
        job.finished_at = finished
        jobs_.append(job)
    store.insert(jobs_)
    # When a purge with the cut-off at 500 walks the state 3 jobs a step
    steps = [run(store.purge_finished(JobState.SUCCEEDED, 500.0, 3))]
    while steps[-1].next_seq is not None:
        steps.append(run(store.purge_finished(JobState.SUCCEEDED, 500.0, 3, steps[-1].next_seq)))
    # Then it deletes the three past their retention, behind the late ones, and stops at the new ones
    assert steps == [PurgeStep([], 3), PurgeStep(["job-4", "job-5", "job-6"], 6), PurgeStep([], None)]


def test_jobs_cancelled_by_a_failed_dependency_are_kept_to_their_own_cut_off(store: Store) -> None:
    # Given cancelled jobs that finished at 100, one of them cancelled because a job it waited for failed
    plain, chained = record(1, state=JobState.CANCELLED), record(2, state=JobState.CANCELLED)
    for job in (plain, chained):
        job.finished_at = 100.0
    plain.error_code, chained.error_code = "CANCELLED", DEPENDENCY_FAILED
    store.insert([plain, chained])
    # When cancelled jobs finished by 500 are purged, those cancelled by a dependency only by 50
    step = run(store.purge_finished(JobState.CANCELLED, 500.0, 10, dependency_failed_before=50.0))
    # Then only the plain one goes; the other goes once its own cut-off passes
    assert step.ids == ["job-1"]
    assert run(store.purge_finished(JobState.CANCELLED, 500.0, 10, dependency_failed_before=150.0)).ids == ["job-2"]


def test_active_counts_keys_and_types_survive_reopen(location: str) -> None:
    s = opened(location)
    s.insert([record(1), record(2, state=JobState.SUCCEEDED)])
    s.put_idempotency([IdempotencyEntry("k", "h", "job-1", expires_at=100.0)])
    s.put_job_type(JobTypeEntry("custom", '{"type": "object"}', "d"), now=1.0)
    run(s.commit())
    s.close()
    s = opened(location)
    assert [j.id for j in s.load_active()] == ["job-1"]
    assert s.count_by_state() == {JobState.PENDING: 1, JobState.SUCCEEDED: 1}
    assert s.max_seq() == 2
    assert s.load_idempotency(now=50.0) == [IdempotencyEntry("k", "h", "job-1", 100.0)]
    assert s.load_idempotency(now=150.0) == []
    assert s.load_job_types() == [JobTypeEntry("custom", '{"type": "object"}', "d")]
    s.close()


def test_accounts_and_the_login_key_survive_reopen_and_a_delete_sticks(location: str) -> None:
    alice = AccountEntry("alice", "$2b$10$hash", "s1", created_at=1.0, password_changed_at=1.0)
    bob = AccountEntry("bob", "$2b$10$other", "s2", created_at=2.0, password_changed_at=2.0)
    s = opened(location)
    key = s.login_key(b"k" * 32)
    assert key == b"k" * 32
    s.put_account(alice)
    s.put_account(bob)
    s.put_account(replace(alice, password_hash="$2b$10$new", session="s3", password_changed_at=3.0))
    s.delete_account("bob")
    run(s.commit())
    s.close()
    s = opened(location)
    try:
        # The first key stays: a second control plane (or a restart) gets the same one, not its own.
        assert s.login_key(b"x" * 32) == key
        assert s.load_accounts() == [AccountEntry("alice", "$2b$10$new", "s3", 1.0, 3.0)]
        s.replace_login_key(b"n" * 32)  # every login ended: the new key is the one from now on
        run(s.commit())
    finally:
        s.close()
    s = opened(location)
    try:
        assert s.login_key(b"y" * 32) == b"n" * 32
    finally:
        s.close()


def test_settings_survive_reopen_and_a_new_value_replaces_the_old(location: str) -> None:
    s = opened(location)
    assert s.load_setting("share_history") is None
    s.put_setting("share_history", '{"v": "ü"}')
    s.put_setting("share_history", '{"v": 2}')
    run(s.commit())
    s.close()
    s = opened(location)
    try:
        assert s.load_setting("share_history") == '{"v": 2}'
        assert s.load_setting("other") is None
    finally:
        s.close()


def test_the_audit_log_lists_newest_first_by_exact_filters_survives_reopen_and_purges_oldest(location: str) -> None:
    s = opened(location)
    for n in range(6):
        who = "alice" if n % 2 else "bob"
        s.put_audit(AuditEntry(float(n), who, "job.cancel", f"job-{n}", "OK" if n < 4 else "NOT_FOUND", f"r{n}"))
    s.put_audit(AuditEntry(9.0, "ali%", "job.retry", "job-ü\x00", "OK", "r9"))  # text from callers, NUL too
    run(s.commit())
    s.close()
    s = opened(location)
    try:
        everything = run(s.list_audit({}, 100, 0))
        assert everything.total == 7 and [e.time for e in everything.events] == [9.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
        seqs = [e.seq for e in everything.events]
        assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == 7
        alice = run(s.list_audit({"actor": "alice", "outcome": "OK"}, 100, 0))
        assert [(e.target, e.request_id) for e in alice.events] == [("job-3", "r3"), ("job-1", "r1")]
        assert run(s.list_audit({"actor": "ali"}, 100, 0)).total == 0  # exact, not a prefix or a pattern
        page = run(s.list_audit({"action": "job.cancel"}, 2, 1))
        assert page.total == 6 and [e.target for e in page.events] == ["job-4", "job-3"]
        # Purge: the oldest recorded by the time, at most the limit, in order.
        assert run(s.purge_audit(before=3.0, limit=2)) == 2
        assert run(s.purge_audit(before=3.0, limit=10)) == 2
        assert [e.target for e in run(s.list_audit({}, 100, 0)).events][-1] == "job-4"
    finally:
        s.close()


class _Recording:
    """A connection that keeps each statement run through it, with its arguments, to be explained."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        self.statements.append((sql, tuple(args)))
        return self.conn.execute(sql, args)


def _plan(location: str, sql: str, args: tuple[Any, ...]) -> str:
    """How the database would run ``sql``: SQLite's query plan, or PostgreSQL's with sequential scans
    priced out (on a small table they win anyway; this asks whether an index can serve the query)."""
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")
            return "\n".join(str(row[0]) for row in conn.execute(f"EXPLAIN {sql}", args))
    with contextlib.closing(sqlite3.connect(location)) as conn:
        return "\n".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))


def test_the_audit_sweep_and_a_target_search_read_an_index_not_the_whole_log(location: str) -> None:
    """Both scanned the whole log: the sweep every minute, finding nothing old enough between expiries
    (0.11 s a sweep at 2,000,000 events on SQLite, on the event loop), and a search by target (0.26 s)."""
    # Given a store's audit log
    s = opened(location)
    s.put_audit(AuditEntry(1.0, "alice", "job.cancel", "job-1", "OK", "r1"))
    run(s.commit())
    s.close()
    postgres = location.startswith("postgresql://")
    p = "%s" if postgres else "?"
    # When a sweep and a search by target are planned, as the stores run them
    sweep = [(audit_rows.purge_sql(p), (0.5, 1000))]
    search = _Recording(psycopg.connect(location, autocommit=True) if postgres else sqlite3.connect(location))
    with contextlib.closing(search.conn):
        assert audit_rows.read_page(search, p, {"target": "job-1"}, 50, 0).total == 1
    # Then each finds its rows by an index on the column it filters, and none reads the whole table
    for column, statements in (("time", sweep), ("target", search.statements)):
        for sql, args in statements:
            plan = _plan(location, sql, args)
            if postgres:
                indexed = "Seq Scan" not in plan and re.search(rf'Index Cond: \(+"?{column}"? ', plan)
            else:
                indexed = "SCAN audit" not in plan and re.search(rf"USING (COVERING )?INDEX \w+ \({column}[<=]", plan)
            assert indexed, (sql, plan)


def test_request_ids_survive_reopen_and_an_older_database_gains_the_column(tmp_path: Path) -> None:
    # Given a database as an older release made it: a jobs table without request_id, one job in it
    path = str(tmp_path / "old.db")
    s = SQLiteStore(path)
    s.insert([record(1)])
    run(s.commit())
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX IF EXISTS jobs_by_owner")
    conn.execute("ALTER TABLE jobs DROP COLUMN start_when")
    conn.execute("ALTER TABLE jobs DROP COLUMN notify")
    conn.execute("ALTER TABLE jobs DROP COLUMN memory_mb")
    conn.execute("ALTER TABLE jobs DROP COLUMN gpu_count")
    conn.execute("ALTER TABLE jobs DROP COLUMN depends_on")
    conn.execute("ALTER TABLE jobs DROP COLUMN output")
    conn.execute("ALTER TABLE jobs DROP COLUMN worker_selector")
    conn.execute("ALTER TABLE jobs DROP COLUMN owner")
    conn.execute("ALTER TABLE jobs DROP COLUMN request_id")
    conn.commit()
    conn.close()

    # When this release opens it, the old job loads (no request id known) and new jobs keep theirs
    s = SQLiteStore(path)
    (old,) = s.load_active()
    assert old.request_id is None
    job = record(2)
    job.request_id = "req-2"
    s.insert([job])
    run(s.commit())
    s.close()
    s = SQLiteStore(path)
    assert {j.id: j.request_id for j in s.load_active()} == {"job-1": None, "job-2": "req-2"}
    assert {j.id: j.owner for j in s.load_active()} == {"job-1": "", "job-2": ""}
    assert {j.id: j.worker_selector for j in s.load_active()} == {"job-1": (), "job-2": ()}
    assert {j.id: j.depends_on for j in s.load_active()} == {"job-1": (), "job-2": ()}
    assert {j.id: (j.gpu_count, j.memory_mb) for j in s.load_active()} == {"job-1": (0, 0), "job-2": (0, 0)}
    s.close()


def test_the_label_index_is_built_for_an_older_database_and_follows_inserts_and_purges(tmp_path: Path) -> None:
    # Given a database as a release before the label index made it, with labelled and plain jobs
    path = str(tmp_path / "old.db")
    s = SQLiteStore(path)
    jobs_ = [record(n, state=JobState.SUCCEEDED) for n in range(1, 5)]
    jobs_[0].labels, jobs_[1].labels, jobs_[2].labels = {"team": "ü", "a.b": "[1]"}, {"team": "ü"}, {}
    for job in jobs_:
        job.finished_at = 100.0
    s.insert(jobs_)
    run(s.commit())
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE job_labels")
    conn.commit()
    conn.close()

    def index_rows() -> list[tuple[str, str, int]]:
        with contextlib.closing(sqlite3.connect(path)) as c:
            return sorted(c.execute("SELECT key, value, seq FROM job_labels"))

    def listed(labels: dict[str, str]) -> list[str]:
        return sorted(j.id for j in run(s.list_jobs([], "", 50, 0, labels=labels)).jobs)

    # When this release opens it, the index is built from the stored labels
    s = SQLiteStore(path)
    assert index_rows() == [("a.b", "[1]", 1), ("team", "ü", 1), ("team", "ü", 2), ("team", "ü", 4)]
    assert listed({"team": "ü"}) == ["job-1", "job-2", "job-4"] and listed({"a.b": "[1]"}) == ["job-1"]
    # and it follows new jobs and purged ones
    s.insert([record(5)])
    run(s.commit())
    assert listed({"team": "ü"}) == ["job-1", "job-2", "job-4", "job-5"]
    assert sorted(run(s.purge_finished(JobState.SUCCEEDED, 200.0, 10)).ids) == ["job-1", "job-2", "job-3", "job-4"]
    assert index_rows() == [("team", "ü", 5)]
    assert listed({"team": "ü"}) == ["job-5"]
    s.close()


def test_a_database_is_held_by_one_store_at_a_time(tmp_path: Path) -> None:
    path = str(tmp_path / "held.db")
    first = SQLiteStore(path)
    with pytest.raises(OSError, match=rf"in use by another control plane \(pid {os.getpid()}\)"):
        SQLiteStore(path)
    first.close()
    SQLiteStore(path).close()  # closing lets it go


def test_a_lock_file_that_cannot_be_locked_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Some network file systems refuse flock (ENOLCK); this one does not, so flock is made to refuse here.
    # Before, it was reported as "cannot create corral.db.lock", which it had just created.
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "corral.db"
    said = f"cannot open the database {path}: cannot lock {path}.lock: No locks available"
    with pytest.raises(OSError, match=re.escape(said)):
        DatabaseLock(str(path))


def test_a_database_reached_through_a_symlink_is_held_by_the_same_lock(tmp_path: Path) -> None:
    # Given a control plane's store on corral.db, and another path that leads to the same file
    path = tmp_path / "corral.db"
    first = SQLiteStore(str(path))
    (tmp_path / "current.db").symlink_to(path)
    (tmp_path / "data").symlink_to(tmp_path, target_is_directory=True)
    try:
        # Then a second store on either path is refused: it would load and run the same queued jobs
        for other in (tmp_path / "current.db", tmp_path / "data" / "corral.db"):
            with pytest.raises(OSError, match=rf"in use by another control plane \(pid {os.getpid()}\)"):
                SQLiteStore(str(other))
    finally:
        first.close()
    SQLiteStore(str(tmp_path / "current.db")).close()  # and once the first let go, the symlink's opens


def test_a_file_that_is_not_a_database_is_named_and_not_held(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, but a file someone keeps\n" * 100)
    with pytest.raises(OSError, match=rf"cannot open the database {path}: file is not a database"):
        SQLiteStore(str(path))
    assert path.read_text().startswith("not a database")
    DatabaseLock(str(path)).release()  # the failed open let its lock go
    with pytest.raises(OSError, match="there is no directory"):
        SQLiteStore(str(tmp_path / "no" / "such" / "c.db"))
    SQLiteStore(str(tmp_path / "fine.db")).close()


def _count_jobs(path: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])


def test_a_large_transaction_goes_to_the_writer_thread_and_what_follows_waits_its_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "big.db")
    batch = [record(seq) for seq in range(1, OFFLOAD_ROWS + 2)]  # one row past the limit (labels: as many more)

    async def go() -> None:
        s = SQLiteStore(path)
        try:
            s.insert(batch)
            big = asyncio.ensure_future(s.commit())
            await asyncio.sleep(0)  # the batch is handed to the writer thread
            started = record(len(batch), state=JobState.RUNNING)
            started.attempts = 1
            s.update([started])
            # Not on the loop's thread while the batch is on the writer's: the update would race it
            # on one connection, and could land first and match no row.
            assert not s.commit_now()
            await s.commit()
            await big
            assert big.done() and big.exception() is None
            s.insert([record(OFFLOAD_ROWS + 5)])
            assert s.commit_now(), "small transactions run on the loop's thread again"
        finally:
            s.close()

    run(go())
    assert _count_jobs(path) == len(batch) + 1
    s = SQLiteStore(path)
    try:
        got = run(s.get(batch[-1].id))
        assert got is not None and got.state is JobState.RUNNING and got.attempts == 1, "the update came after"
    finally:
        s.close()


def test_a_large_transaction_lands_when_its_caller_is_cancelled(tmp_path: Path) -> None:
    path = str(tmp_path / "cancelled.db")
    first = [record(seq) for seq in range(1, OFFLOAD_ROWS + 2)]
    second = [record(seq) for seq in range(OFFLOAD_ROWS + 2, 2 * OFFLOAD_ROWS + 3)]

    async def go() -> None:
        s = SQLiteStore(path)
        try:
            s.insert(first)
            ahead = asyncio.ensure_future(s.commit())
            await asyncio.sleep(0)
            s.insert(second)
            behind = asyncio.ensure_future(s.commit())
            await asyncio.sleep(0)  # queued on the writer thread behind the first
            behind.cancel()  # its caller goes (a client's deadline, a closed stream)
            with contextlib.suppress(asyncio.CancelledError):
                await behind
            await ahead
            await s.commit()  # nothing queued: waits for what is on the writer thread
            assert _count_jobs(path) == len(first) + len(second), "the cancelled caller's writes landed"
            s.insert([record(2 * OFFLOAD_ROWS + 5)])
            assert s.commit_now()
        finally:
            s.close()

    run(go())
    assert _count_jobs(path) == len(first) + len(second) + 1


def test_a_large_transaction_left_by_a_closed_event_loop_lands_and_the_next_loop_writes_as_usual(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "loops.db")
    batch = [record(seq) for seq in range(1, OFFLOAD_ROWS + 2)]
    s = SQLiteStore(path)
    try:
        left: list[asyncio.Future[None]] = []

        async def leave() -> None:  # a loop that ends while its large transaction is on the writer thread
            s.insert(batch)
            left.append(asyncio.ensure_future(s.commit()))
            await asyncio.sleep(0)

        asyncio.run(leave())

        async def next_loop() -> None:
            await s.commit()  # nothing queued: waits for what is on the writer thread
            s.insert([record(OFFLOAD_ROWS + 5)])
            assert s.commit_now(), "the transaction left behind is no longer counted once it ran"

        asyncio.run(next_loop())
        assert _count_jobs(path) == len(batch) + 1
    finally:
        s.close()


def test_a_large_transaction_after_close_is_refused_as_unavailable(tmp_path: Path) -> None:
    s = SQLiteStore(str(tmp_path / "closed.db"))
    s.close()
    s.insert([record(seq) for seq in range(1, OFFLOAD_ROWS + 2)])
    with pytest.raises(Unavailable, match="closed"):
        run(s.commit())


# ---- PostgreSQL: one active control plane per database, the others stand by ----------------------------


def test_a_second_postgres_store_stands_by_until_the_first_lets_go(postgres: Cluster) -> None:
    url = postgres.new_database()
    first = opened(url)
    second = open_store(url)

    async def go() -> None:
        waiting = asyncio.ensure_future(second.lead())
        # While the first holds the database, the second does not lead (nor may it write)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting), 1.0)
        first.close()
        # and once the first has gone, it takes over and sees what the first committed
        await asyncio.wait_for(waiting, 10.0)

    first.insert([record(1)])
    run(first.commit())
    run(go())
    assert [j.id for j in second.load_active()] == ["job-1"]
    second.insert([record(2)])
    run(second.commit())
    second.close()


def test_a_postgres_store_whose_session_is_ended_stops_being_writable(postgres: Cluster) -> None:
    # Given a leading store, idle (nothing queued)
    url = postgres.new_database()
    s = opened(url)
    assert s.healthy
    # When an operator ends its write session (which also drops its lock: another may lead now)
    postgres.sql(
        url,
        f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = {LOCK_KEY}",
    )
    # Then the store says it cannot be written, without a write to find out, and refuses commits
    deadline = time.monotonic() + 10
    while s.healthy:
        assert time.monotonic() < deadline, "the store did not notice it lost its session"
        time.sleep(0.05)
    s.insert([record(1)])
    with pytest.raises(Unavailable, match="store cannot be written"):
        run(s.commit())
    s.close()
    # and nothing it queued after that was written
    again = opened(url)
    assert run(again.get("job-1")) is None
    again.close()


def test_a_leading_postgres_store_whose_read_sessions_are_ended_reads_on_with_new_ones(postgres: Cluster) -> None:
    # Given a leading store with a job and a live idempotency key, committed
    url = postgres.new_database()
    s = opened(url)
    s.insert([record(1)])
    s.put_idempotency([IdempotencyEntry("k1", "h", "job-1", 9e9)])
    run(s.commit())
    # When every session of it but the one that holds the lock is ended (a proxy or the server's
    # idle_session_timeout ending idle connections, an operator's clean-up)
    ended = postgres.sql(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'corral-control %' "
        f"AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = {LOCK_KEY})",
    )
    assert len(ended) == 2  # its reader and its key look-ups
    # Then it still leads, and every read, on the reader's thread or on the event loop, answers from
    # new sessions rather than UNAVAILABLE for as long as it runs
    try:
        for _ in range(2):
            got = run(s.get("job-1"))
            assert got is not None and got.id == "job-1"
            assert run(s.list_jobs([], "", 10, 0)).total == 1
            assert s.states(["job-1", "job-9"]) == {"job-1": JobState.PENDING}
            assert s.get_idempotency("k1") == IdempotencyEntry("k1", "h", "job-1", 9e9)
        assert s.healthy
        s.insert([record(2)])
        run(s.commit())
        assert run(s.get("job-2")) is not None
    finally:
        s.close()
    # and closing it ends the new sessions too (the server drops a session from pg_stat_activity once its
    # backend has seen the connection close, a moment after close() returns)
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'corral-control %'"
    wait_until(lambda: postgres.sql(url, count) == [(0,)], 10, what="the store's sessions to end")


def test_nul_from_job_code_is_kept_as_a_replacement_character_not_a_failed_commit(postgres: Cluster) -> None:
    # Given what job code wrote with NUL in it: an error code and message, printed output, a type's text
    url = postgres.new_database()
    job = record(1)
    jobs.lease(job, "w1", 1, now=2.0, grace=1)
    jobs.fail_attempt(job, 1, "OOPS\x00", "bad\x00byte", now=3.0, delay=0)
    job.output = "a\x00b"
    s = opened(url)
    s.put_job_type(JobTypeEntry("plugin", '{"type": "object"}', "made \x00 here"), now=1.0)  # names: checked
    run(s.commit())
    s.close()
    # Then it is stored (the commit did not fail) with U+FFFD in place of each NUL
    with reopened(url, [record(1)], [job]) as s:
        got = run(s.get("job-1"))
        assert got is not None
        assert (got.error_code, got.error_message, got.output) == ("OOPS\ufffd", "bad\ufffdbyte", "a\ufffdb")
        assert s.load_job_types() == [JobTypeEntry("plugin", '{"type": "object"}', "made \ufffd here")]


def test_a_postgres_page_fetches_its_rows_as_it_fills_not_all_at_once(
    postgres: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client-side cursor took every row of a page before the cap trimmed it: ListJobs of 1,000 jobs
    with 1 MiB payloads brought 1 GB into the control plane for a 10 MiB answer."""
    fed: list[tuple[type, int]] = []

    def spied(rows: Any) -> list[Sequence[Any]]:
        fed.append((type(rows), getattr(rows, "itersize", 0)))
        return rows_module.first_page(rows)

    monkeypatch.setattr(postgres_module, "first_page", spied)
    # Given 30 jobs with 1 MiB payloads
    url = postgres.new_database()
    big = []
    for seq in range(1, 31):
        job = record(seq)
        job.payload_json = '{"x":"' + "p" * (1 << 20) + '"}'
        big.append(job)
    with reopened(url, big) as s:
        # When a page of up to 1,000 is listed
        page = run(s.list_jobs([], "", 1000, 0))
    # Then it stops at the cap, and its rows came from a server-side cursor a few at a time
    assert ([j.seq for j in page.jobs], page.total) == (list(range(30, 21, -1)), 30)
    ((kind, itersize),) = fed
    assert issubclass(kind, psycopg.ServerCursor) and 0 < itersize <= 50


def test_a_postgres_server_that_is_not_there_is_named_without_the_password() -> None:
    address = dead_address()
    with pytest.raises(OSError, match=rf"cannot open the database postgresql://u:\*\*\*@{address}/db: ") as err:
        open_store(f"postgresql://u:secret@{address}/db")
    assert "secret" not in str(err.value)


def test_an_older_postgres_database_gains_the_gpu_and_memory_columns(postgres: Cluster) -> None:
    # Given a database as the first PostgreSQL release made it: no gpu_count or memory_mb, one job in it
    url = postgres.new_database()
    s = opened(url)
    s.insert([record(1)])
    run(s.commit())
    s.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobs DROP COLUMN gpu_count")
        conn.execute("ALTER TABLE jobs DROP COLUMN memory_mb")
    # When this release opens it and stores a job that asks for a GPU, both load
    gpu = record(2)
    gpu.gpu_count, gpu.memory_mb = 1, 512
    with reopened(url, [gpu]) as s:
        assert {j.id: (j.gpu_count, j.memory_mb) for j in s.load_active()} == {"job-1": (0, 0), "job-2": (1, 512)}


def test_a_postgres_database_made_before_the_schema_version_was_kept_is_used_and_records_it(postgres: Cluster) -> None:
    # Given a database as the first PostgreSQL release left it: no schema version, none of the tables
    # and columns added since, one job in it
    url = postgres.new_database()
    with reopened(url, [record(1)]):
        pass
    for table in ("corral_schema", "accounts", "settings", "audit"):
        postgres.sql(url, f"DROP TABLE {table}")
    for column in ("gpu_count", "memory_mb", "notify", "start_when"):
        postgres.sql(url, f"ALTER TABLE jobs DROP COLUMN {column}")
    # When this release opens it, nothing is written before it leads
    s = open_store(url)
    try:
        assert postgres.sql(url, "SELECT to_regclass('corral_schema') IS NULL") == [(True,)]
        # Then it leads, with the job, and records its schema version
        run(s.lead())
        assert [j.id for j in s.load_active()] == ["job-1"]
        assert postgres.sql(url, "SELECT version FROM corral_schema") == [(postgres_module.SCHEMA_VERSION,)]
        s.put_account(AccountEntry("ann", "$2b$x", "s1", 1.0, 1.0))
        run(s.commit())
    finally:
        s.close()


def test_a_postgres_takeover_during_a_dump_does_not_wait_for_it(postgres: Cluster) -> None:
    """Every takeover ran ALTER TABLE ... ADD COLUMN IF NOT EXISTS, whose ACCESS EXCLUSIVE lock is asked
    for before the column is looked for: it waited for as long as a pg_dump read the jobs table."""
    url = postgres.new_database()
    opened(url).close()
    # Given a session reading the tables as pg_dump does, for as long as it takes
    with psycopg.connect(url) as dump:
        dump.execute("LOCK TABLE jobs, idempotency_keys, job_types, accounts, settings, audit IN ACCESS SHARE MODE")
        s = open_store(url)
        try:
            # When another control plane takes the lead, Then it does so at once
            run(asyncio.wait_for(s.lead(), 5.0))
            s.insert([record(1)])
            run(s.commit())
        finally:
            dump.rollback()
            s.close()


def test_an_older_postgres_database_gains_its_columns_once_a_dump_lets_go_of_jobs_and_readers_pass_meanwhile(
    postgres: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(postgres_module, "SCHEMA_LOCK_TIMEOUT_SEC", 0.2)
    # Given a database without the columns added since the first release, being dumped
    url = postgres.new_database()
    first = opened(url)
    first.insert([record(1)])
    run(first.commit())
    first.close()
    postgres.sql(url, "ALTER TABLE jobs DROP COLUMN start_when")
    dump = psycopg.connect(url)
    dump.execute("LOCK TABLE jobs IN ACCESS SHARE MODE")
    s = open_store(url)

    def read_jobs() -> int:
        with psycopg.connect(url, autocommit=True) as reader:
            reader.execute("SET lock_timeout = '3s'")
            row = reader.execute("SELECT count(*) FROM jobs").fetchone()
            return int(row[0]) if row else -1

    async def go() -> None:
        leading = asyncio.ensure_future(s.lead())
        try:
            # When a control plane takes the lead, it says why it waits
            deadline = time.monotonic() + 10
            while "store_schema_locked" not in caplog.messages:
                assert time.monotonic() < deadline and not leading.done(), "no word of the locked table"
                await asyncio.sleep(0.02)
            # and queries of the table are not held up behind its request meanwhile
            for _ in range(3):
                assert await asyncio.to_thread(read_jobs) == 1
            assert not leading.done()
        finally:
            dump.rollback()
        # Then it leads once the dump has gone
        await asyncio.wait_for(leading, 10.0)

    try:
        with caplog.at_level(logging.WARNING, logger="control.store.postgres"):
            run(go())
        ended = record(2)
        ended.start_when = StartWhen.ALL_ENDED
        s.insert([ended])
        run(s.commit())
        assert {j.id: j.start_when for j in s.load_active()} == {
            "job-1": StartWhen.ALL_SUCCEEDED,
            "job-2": StartWhen.ALL_ENDED,
        }
    finally:
        dump.close()
        s.close()
