"""A slow PostgreSQL read of one call must not hold up the others: the control plane serves every call
from one event loop, so a round trip made on it stalls them all (GetStats, health checks, workers'
heartbeats) for as long as the server takes. Real control plane and PostgreSQL
(``tests/support/postgres.py``); the server is made slow the way it is in production, by a session that
holds a table's lock (a VACUUM FULL, an ALTER TABLE or a LOCK TABLE by hand).

A call reads ahead, off the event loop, what it needs from the store before it settles its keys and
links with no ``await`` (``IdempotencyKeys.read_ahead``, ``Dependencies.read_ahead``). Before, the two
reads a control plane made while it served, ``PostgresStore.get_idempotency`` (a key older than the
newest ones memory keeps) and ``PostgresStore.states`` (the state of a job a batch reuses by key, no
longer in memory), ran on the event loop, and held up every call for as long as the lock was held."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import psycopg
import pytest

from control.admission.idempotency import MAX_CACHED_KEYS
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import FAST_ENV, ControlProc, wait_until
from tests.support.ports import free_port
from tests.support.postgres import Cluster

CHEAP_CALL_GUARD_SEC = 10.0
"""A hang guard for the cheap call: it fails the test rather than wait for the slow call's end."""


@pytest.fixture
def control(postgres: Cluster, tmp_path: Path) -> Iterator[ControlProc]:
    """A control plane on a new PostgreSQL database of its own."""
    workdir = tmp_path / "control"
    workdir.mkdir()
    cp = ControlProc(workdir, dict(FAST_ENV), port=free_port(), http_port=free_port(), db_url=postgres.new_database())
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


def _restart(cp: ControlProc) -> None:
    assert cp.stop(signal.SIGTERM) == 0
    cp.start()


def _held(url: str, table: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session holding ``table``'s ACCESS EXCLUSIVE lock until it rolls back (as VACUUM FULL does)."""
    conn = psycopg.connect(url)
    conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    return conn


def _waiting(url: str, query_start: str) -> bool:
    """Whether a session runs a query starting with ``query_start``, waiting for a lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND starts_with(query, %s)", (query_start,)
        ).fetchall()
    return bool(rows)


def _batch_replaying_a_finished_job(cp: ControlProc) -> tuple[Callable[[], object], str, str]:
    """A SubmitJobs call that replays a CANCELLED job by its key, and a job that depends on it by index:
    after a restart that job is neither live nor recent, so its state is read from the store by
    ``states()``."""
    stub = cp.jobs
    first = stub.SubmitJob(jobs_pb2.SubmitJobRequest(type="noop", idempotency_key="k-1"), timeout=10).job
    stub.CancelJob(jobs_pb2.CancelJobRequest(id=first.id), timeout=10)
    _restart(cp)
    batch = jobs_pb2.SubmitJobsRequest(
        jobs=[
            jobs_pb2.SubmitJobRequest(type="noop", idempotency_key="k-1"),
            jobs_pb2.SubmitJobRequest(type="noop", depends_on_index=[0], start_when=jobs_pb2.ALL_ENDED),
        ]
    )
    return (lambda: cp.jobs.SubmitJobs(batch, timeout=120)), "jobs", "SELECT id, state FROM jobs"


def _key_past_the_cached_ones(cp: ControlProc) -> tuple[Callable[[], object], str, str]:
    """A SubmitJob call whose key is older than the newest MAX_CACHED_KEYS ones: after a restart it is
    not in memory, so it is read from the store by ``get_idempotency()``."""
    sent = jobs_pb2.SubmitJobRequest(type="noop", idempotency_key="old")
    cp.jobs.SubmitJob(sent, timeout=10)
    assert cp.stop(signal.SIGTERM) == 0
    later = time.time() + 2 * 86400  # expires after "old": newer, so the cache holds these instead
    with (
        psycopg.connect(cp.db_url, autocommit=True) as conn,
        conn.cursor() as cur,
        cur.copy("COPY idempotency_keys (key, request_hash, job_id, expires_at) FROM STDIN") as copy,
    ):
        for n in range(MAX_CACHED_KEYS):
            copy.write_row((f"bulk-{n}", "h", f"job-{n}", later + n))
    cp.start()
    return (lambda: cp.jobs.SubmitJob(sent, timeout=120)), "idempotency_keys", "SELECT key, request_hash"


@pytest.mark.slow
@pytest.mark.parametrize("read", ["states", "get_idempotency"])
def test_a_call_whose_store_read_is_slow_holds_up_no_other_call(control: ControlProc, read: str) -> None:
    cp = control
    slow_call, table, query = {"states": _batch_replaying_a_finished_job, "get_idempotency": _key_past_the_cached_ones}[
        read
    ](cp)
    # Given a session holding the lock of the table the call reads (the read waits for it)
    holder = _held(cp.db_url, table)
    pool = ThreadPoolExecutor(max_workers=1)
    slow: Future[object] = pool.submit(slow_call)
    try:
        wait_until(lambda: _waiting(cp.db_url, query), 30, what=f"the {read} read to wait for the lock")
        # When another client makes a cheap call meanwhile (a channel of its own)
        with grpc.insecure_channel(cp.address) as channel:
            stats = jobs_pb2_grpc.JobServiceStub(channel).GetStats(
                jobs_pb2.GetStatsRequest(), timeout=CHEAP_CALL_GUARD_SEC
            )
        # Then it is answered while the slow call is still in flight
        assert not slow.done()
        assert stats.workers == 0
    finally:
        holder.rollback()
        holder.close()
        done = threading.Event()
        slow.add_done_callback(lambda _: done.set())
        assert done.wait(60), "the slow call did not end once the lock was let go"
        pool.shutdown()
    # and the slow call ends well once the lock is let go
    assert slow.exception() is None
