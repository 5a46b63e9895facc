"""A downgrade and back: the current store after an older release wrote to its database.

Releases before the schema version (fc0639b) cannot tell that a database is newer than they are, and
open it. One from before the label index (b8b2b6c: 8f0de7b, 9a0217a and older) then inserts labelled jobs
without their index rows, and deletes jobs but not theirs. These tests write what such a release writes,
with its own statements (9a0217a's INSERT, which names only the columns it knew, and its purge's DELETE),
and check what the current store makes of it when it opens the database again.

``test_label_searches_are_right_again_after_a_release_without_the_index_wrote`` failed before the store
mended the index at open (control.store.sqlite._mend_labels): the jobs that release inserted were missing
from label searches, and a job given a deleted job's seq took that job's labels.
``test_the_schema_is_the_one_its_version_names`` guards that the schema and SCHEMA_VERSION change together.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

from control.jobs import JobRecord, JobState
from control.store.sqlite import SCHEMA_VERSION, SQLiteStore

# What 9a0217a (2026-11-26) wrote for a job: the columns it knew, in its order (control/store/sqlite.py).
_OLD_COLUMNS = (
    "seq, id, name, type, payload, priority, thread_demand, threads_granted, state, attempts, charged_attempts, "
    "max_attempts, timeout_sec, scheduled_at, created_at, ready_at, started_at, finished_at, queue_seconds, "
    "exec_seconds, worker_id, lease_expires_at, result, error_code, error_message, idempotency_key, labels, updated_at"
)
_OLD_INSERT = f"INSERT INTO jobs ({_OLD_COLUMNS}) VALUES ({', '.join('?' * 28)})"


def _old_row(seq: int, job_id: str, labels: dict[str, str]) -> tuple[object, ...]:
    """A PENDING noop job as that release inserted it."""
    return (
        seq, job_id, "", "noop", "{}", 0, 1, 0, int(JobState.PENDING), 0, 0, 3, 60.0, None, 1.0, 1.0, None, None,
        0.0, 0.0, "", None, "", "", "", "", json.dumps(labels) if labels else "{}", 1.0,
    )  # fmt: skip


def _job(seq: int, labels: dict[str, str]) -> JobRecord:
    job = JobRecord(id=f"job-{seq}", type="noop", payload_json="{}", created_at=1.0, seq=seq, labels=labels)
    return job


def _listed(store: SQLiteStore, labels: dict[str, str]) -> list[str]:
    page = asyncio.run(store.list_jobs([], "", 50, 0, labels=labels))
    return sorted(job.id for job in page.jobs)


def _as_the_old_release(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for sql, args in statements:
            conn.execute(sql, args)


def test_label_searches_are_right_again_after_a_release_without_the_index_wrote(tmp_path: Path) -> None:
    # Given a database this release made and stopped cleanly, with labelled jobs
    path = tmp_path / "corral.db"
    store = SQLiteStore(str(path))
    store.insert([_job(1, {"team": "a"}), _job(2, {}), _job(3, {"team": "a"}), _job(4, {"team": "c"})])
    asyncio.run(store.commit())
    store.close()
    # When a release from before the label index runs on it: it inserts a labelled job, purges job 2, and
    # purges the newest (4); started again, it gives a new job the seq of the purged newest one
    _as_the_old_release(
        path,
        (_OLD_INSERT, _old_row(5, "old-5", {"team": "edge"})),
        ("DELETE FROM jobs WHERE seq = ?", (2,)),
        ("DELETE FROM jobs WHERE seq = ?", (5,)),
        ("DELETE FROM jobs WHERE seq = ?", (4,)),
        (_OLD_INSERT, _old_row(4, "old-4", {"team": "b"})),
        (_OLD_INSERT, _old_row(5, "old-5b", {"team": "edge"})),
    )
    # and this release opens it again
    store = SQLiteStore(str(path))
    try:
        # Then a search by label finds the jobs that release inserted, and a job does not take the labels of
        # the one whose seq it was given
        assert _listed(store, {"team": "edge"}) == ["old-5b"]
        assert _listed(store, {"team": "b"}) == ["old-4"]
        assert _listed(store, {"team": "c"}) == []
        assert _listed(store, {"team": "a"}) == ["job-1", "job-3"]
        # and so it stays as this release goes on: a job it inserts, and a later open
        store.insert([_job(6, {"team": "edge"})])
        asyncio.run(store.commit())
        assert _listed(store, {"team": "edge"}) == ["job-6", "old-5b"]
    finally:
        store.close()
    store = SQLiteStore(str(path))
    try:
        assert _listed(store, {"team": "edge"}) == ["job-6", "old-5b"] and _listed(store, {"team": "a"}) == [
            "job-1",
            "job-3",
        ]
    finally:
        store.close()


def test_a_release_without_the_index_that_only_inserted_costs_an_open_only_its_jobs(tmp_path: Path) -> None:
    # Given a database this release stopped cleanly (it noted the newest job whose labels it indexed)
    path = tmp_path / "corral.db"
    store = SQLiteStore(str(path))
    store.insert([_job(seq, {"team": "a"}) for seq in range(1, 4)])
    asyncio.run(store.commit())
    store.close()
    # When a release from before the label index inserts a labelled job, and this release opens it again
    _as_the_old_release(path, (_OLD_INSERT, _old_row(4, "old-4", {"team": "a"})))
    # (job 1's index row taken out by hand: it comes back only if the open reads every job's labels again)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DELETE FROM job_labels WHERE seq = 1")
        conn.commit()
    store = SQLiteStore(str(path))
    try:
        # Then the job it inserted is found by label, and the open read only the labels of jobs after the note
        assert _listed(store, {"team": "a"}) == ["job-2", "job-3", "old-4"]
    finally:
        store.close()


_SCHEMAS: dict[int, set[str]] = {
    1: {"60e3fcff57da5031028bdf79d6049ba7d6281a5d2aea1d6e4cd6790239e415a7"},
    # The same tables; what changed is how idempotency keys are written in them (control.store.keys).
    2: {"60e3fcff57da5031028bdf79d6049ba7d6281a5d2aea1d6e4cd6790239e415a7"},
}
"""The shapes of the database (sha256 of :func:`_shape`) each schema version names."""


def _shape(path: Path) -> str:
    """The database this release makes, as text: each table's columns (name, type, not null, default, key)
    and each index and trigger as SQLite keeps it (tables by their columns: their SQL keeps comments)."""
    lines: list[str] = []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        for kind, name, table, sql in objects:
            if kind != "table":
                lines.append(f"{kind} {name} on {table}: {' '.join(str(sql).split())}")
                continue
            lines.append(f"table {name}{' without rowid' if 'WITHOUT ROWID' in str(sql).upper() else ''}")
            for _, column, type_, notnull, default, key in conn.execute(f"PRAGMA table_info({name})"):
                lines.append(f"  {column} {type_} notnull={notnull} default={default} pk={key}")
    return "\n".join(lines)


def test_the_schema_is_the_one_its_version_names(tmp_path: Path) -> None:
    """A release that changes the schema so that an older one would misread the database (a column whose
    meaning an older release would not know to honour) must raise SCHEMA_VERSION: the releases since
    fc0639b then refuse the database instead of running its jobs without it. One that changes it harmlessly
    (an index) keeps the version and adds the new digest here, with the reason in the commit."""
    path = tmp_path / "corral.db"
    SQLiteStore(str(path)).close()
    shape = _shape(path)
    digest = hashlib.sha256(shape.encode()).hexdigest()
    assert digest in _SCHEMAS[SCHEMA_VERSION], (
        f"the schema changed (sha256 {digest}) but SCHEMA_VERSION is still {SCHEMA_VERSION}: raise it, or "
        f"if older releases read the new schema right, add this digest for it. The schema now:\n{shape}"
    )
