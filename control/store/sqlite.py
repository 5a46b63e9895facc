"""SQLiteStore: the embedded store (WAL), and the fast real store tests run on.

Writes are queued in order as they happen and written by :meth:`SQLiteStore.commit` in one
transaction (group commit): everything a turn of the event loop changed costs one transaction, and a
burst of submissions one sync, not one each. Reads use a second connection on their own thread; WAL
lets them run while a transaction commits.

A transaction runs on the event loop's thread while it is small: without an fsync it costs tens of
microseconds, less than a hand-off to another thread would. One of more than :data:`OFFLOAD_ROWS`
rows (a batch of thousands of jobs) runs on the store's writer thread instead, so that calls which
need no commit (reads, watches) go on meanwhile, and the transactions queued after it wait their
turn on that thread (it keeps their order). With ``synchronous=FULL`` every transaction runs there.

What a commit survives: with ``synchronous=NORMAL`` (the default) a committed transaction survives
a crash of the process (kill -9); with ``synchronous=FULL`` (CORRAL_DB_SYNC=full) it also survives
power loss, at the cost of an fsync per group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, TypeVar

from control.jobs import TERMINAL, JobRecord, JobState
from control.store import audit_rows
from control.store.base import (
    AccountEntry,
    AuditEntry,
    AuditPage,
    IdempotencyEntry,
    JobPage,
    JobRows,
    JobTypeEntry,
    PurgeStep,
    StandingBy,
)
from control.store.keys import OLD_KEYS, moved_keys
from control.store.lock import DatabaseLock
from control.store.rows import (
    COLUMNS,
    first_page,
    insert_row,
    purge_doomed,
    purge_window,
    read_by_ids,
    read_cancelled_chain,
    record,
    update_row,
)
from corral.errors import Unavailable

logger = logging.getLogger(__name__)

OFFLOAD_ROWS = 2000
"""Rows past which a transaction is written on the writer thread, off the event loop. A row costs
about 6 µs to write here, so a transaction at the limit holds the loop about 12 ms; 10,000 rows held
it 65 ms (measured with a 10,000-job SubmitJobs; 2026-11-28). A batch of up to 1,000 jobs, and every
commit of the dispatch and results path, stays on the loop, where it costs no hand-off."""

_INSERT = f"INSERT INTO jobs ({COLUMNS}) VALUES ({', '.join('?' * len(COLUMNS.split(',')))})"
# Compare-and-set on the fencing token: never let an older attempt overwrite a newer one.
_UPDATE = (
    "UPDATE jobs SET threads_granted=?, state=?, attempts=?, charged_attempts=?, ready_at=?, started_at=?, "
    "finished_at=?, queue_seconds=?, exec_seconds=?, worker_id=?, lease_expires_at=?, result=?, error_code=?, "
    "error_message=?, output=?, updated_at=? WHERE seq=? AND attempts<=?"
)

# Bounded, earliest first (by the expires_at index): one sweep step is one short transaction.
_IDEM_EXPIRE = (
    "DELETE FROM idempotency_keys WHERE key IN "
    "(SELECT key FROM idempotency_keys WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)"
)

# Partial: jobs submitted without a token (owner '') cost no index entry. A query uses it only when its
# WHERE says owner != '' in so many words (see list_jobs).
_OWNER_INDEX = "CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq) WHERE owner != ''"

_ACCOUNT_COLUMNS = "name, password_hash, session, created_at, password_changed_at"

# ListJobs by labels reads this index instead of every job's labels: with 1,000,000 jobs stored, a page
# took 0.3-0.6 s with json_each over the jobs table, and 10-50 ms with the index (python -m bench labels). One row per label of a job,
# written with the job, deleted with it (by its whole key: the purge reads the job's labels first).
_LABELS_TABLE = """
CREATE TABLE job_labels (
    key   TEXT    NOT NULL,
    value TEXT    NOT NULL,
    seq   INTEGER NOT NULL,  -- jobs.seq
    PRIMARY KEY (key, value, seq)
) WITHOUT ROWID
"""
_LABELS_BACKFILL = (
    "INSERT INTO job_labels (key, value, seq) "
    "SELECT l.key, l.value, jobs.seq FROM jobs, json_each(jobs.labels) AS l WHERE jobs.labels != '{}' AND jobs.seq > ?"
)

LABELS_INDEXED = "labels_indexed"
"""The settings row naming the newest job (``"<seq> <id>"``) up to which this release knows the label index
to be whole (see :func:`_mend_labels`)."""

_Op = tuple[str, list[tuple[Any, ...]]]
_T = TypeVar("_T")

CHECKPOINT_SEC = 1.0
"""How often the write-ahead log is copied back into the database file."""

WAL_LIMIT_BYTES = 64 << 20
"""The write-ahead log is cut back to this size once a checkpoint has copied all of it (SQLite's
``journal_size_limit``): it stays at its largest otherwise, after a spell in which it grew."""

WAL_WARN_BYTES = 256 << 20
"""A write-ahead log this large that checkpoints cannot copy back (a reader holds an old snapshot) is
logged as ``store_checkpoint_blocked``, at most every WAL_WARN_EVERY_SEC."""

WAL_WARN_EVERY_SEC = 60.0

FILES_CHECK_SEC = 0.25
"""How often the store looks whether its files are still the ones it opened (see :meth:`SQLiteStore._lost`)."""

_FILES = ("", "-wal", "-shm")
"""The database file and the two SQLite keeps beside it while it is open in WAL mode."""


SCHEMA_VERSION = 2
"""The schema this release writes, kept in the database's ``PRAGMA user_version`` (0: a database made
before it was kept, which _migrate brings up to date). A release that changes the schema so that an
older one would misread it raises it; an older release then refuses the database instead of using it.
2: idempotency keys are kept with their owner whatever the visibility (:mod:`control.store.keys`)."""

_HEADER = b"SQLite format 3\x00"


def _unfit(path: str) -> str:
    """Why the file at ``path`` must not be opened as this release's store ("" when it may): a database
    of a newer schema, another program's database, or one cut short. Reads only.

    Raises:
        sqlite3.Error: it is not a database at all, or cannot be read.
    """
    try:
        with open(path, "rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return ""  # a new database
    if header.startswith(_HEADER) and len(header) == 100:
        page = int.from_bytes(header[16:18], "big")
        page = 65536 if page == 1 else page
        if page and size % page:  # SQLite would take it for an empty database and write a new one over it
            return f"it is cut short ({size} bytes, not a whole number of its {page}-byte pages)"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            return (
                f"it was made by a newer release of Corral (schema version {version}; this release reads up to "
                f"{SCHEMA_VERSION}): run that release, or restore a backup that this one made"
            )
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "jobs" not in tables:
            return "it is not a Corral database (it has tables, but no jobs table)"
    return ""


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a database made by an older release up to schema.sql (which creates only missing tables)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    if "request_id" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN request_id TEXT NOT NULL DEFAULT ''")
    if "owner" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
    if "worker_selector" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN worker_selector TEXT NOT NULL DEFAULT ''")
    if "output" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN output TEXT NOT NULL DEFAULT ''")
    if "depends_on" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN depends_on TEXT NOT NULL DEFAULT ''")
    if "gpu_count" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN gpu_count INTEGER NOT NULL DEFAULT 0")
    if "memory_mb" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0")
    if "notify" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN notify TEXT NOT NULL DEFAULT ''")
    if "start_when" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN start_when INTEGER NOT NULL DEFAULT 0")
    conn.execute(_OWNER_INDEX)
    _mend_labels(conn)
    if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
        _move_keys(conn)


def _move_keys(conn: sqlite3.Connection) -> None:
    """Give the idempotency keys of an older schema their form now (:mod:`control.store.keys`) and record
    :data:`SCHEMA_VERSION`, in one transaction: a crash part way leaves the keys as they were, to be
    moved at the next start."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = moved_keys(conn.execute(OLD_KEYS).fetchall())
        conn.execute("DELETE FROM idempotency_keys")
        conn.executemany(SQLiteStore._SQL["idem_put"], rows)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _mend_labels(conn: sqlite3.Connection) -> None:
    """Make the label index (job_labels) whole: build it for a database made before it, and mend it after
    a release that does not keep it (any release before b8b2b6c) wrote to the database.

    Releases from before SCHEMA_VERSION cannot tell that a database is newer than they are, so such a
    release run on this database (a downgrade) inserts labelled jobs without their index rows, and deletes
    jobs but not theirs; ListJobs and RetryJobs by label then missed those jobs for good, and
    a job given the seq of a deleted one took its labels. So the newest job whose index this release
    knows to be whole is kept in settings (at open, and at a clean close): every job inserted since has a
    greater seq, and its rows are written anew; the index rows past that seq go first, which also drops
    those of deleted jobs whose seq a new job could take (new ones are given seqs past the newest job).
    When that job is gone or another took its seq (the older release deleted it), or nothing is kept (a
    release before this one made or last used the database), the whole index is built again: once, 0.27 s
    with 300,000 jobs (60,000 labelled); an open after that took 11-17 ms, most of it one pass over the index.
    One transaction: a crash part way leaves the index as it was."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        since = 0
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'job_labels'").fetchone() is None:
            conn.execute(_LABELS_TABLE)
        elif kept := conn.execute("SELECT value FROM settings WHERE name = ?", (LABELS_INDEXED,)).fetchone():
            seq, _, job_id = str(kept[0]).partition(" ")
            if seq.isdigit() and _newest_then(conn, int(seq)) == job_id:
                since = int(seq)
        conn.execute("DELETE FROM job_labels WHERE seq > ?", (since,))
        conn.execute(_LABELS_BACKFILL, (since,))
        _keep_labels_mark(conn)
        conn.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            # A damaged page of the jobs, read here first: said as when start-up's load reads it (control.app)
            raise _Unreadable(str(exc)) from exc
        raise


def _newest_then(conn: sqlite3.Connection, seq: int) -> str | None:
    row = conn.execute("SELECT id FROM jobs WHERE seq = ?", (seq,)).fetchone()
    return None if row is None else str(row[0])


def _keep_labels_mark(conn: sqlite3.Connection) -> None:
    """Note the newest job as indexed (see :func:`_mend_labels`): call it only when the index is whole."""
    newest = conn.execute("SELECT seq, id FROM jobs ORDER BY seq DESC LIMIT 1").fetchone()
    mark = "0 " if newest is None else f"{newest[0]} {newest[1]}"
    conn.execute("INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)", (LABELS_INDEXED, mark))


def _connect(path: str, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {'FULL' if sync == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA cache_size = -65536")  # 64 MiB
    # Checkpoints (which sync) run on the reader's thread, never inside a commit on the event loop.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    return conn


def checkpoint(conn: sqlite3.Connection, path: str, warned_at: float) -> float:
    """Copy what it can of the write-ahead log back into the database (PASSIVE: it waits for nobody).
    When a reader holds a snapshot older than the log's end, the log cannot be copied past it, nor
    restarted, and grows with every commit until the disk is full, which then stops the control plane
    with a message about the disk only: so a blocked log past WAL_WARN_BYTES is logged, naming the likely
    cause. Returns when it last warned (``warned_at``, or now)."""
    _busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    if frames <= copied:
        return warned_at
    try:
        size = os.path.getsize(path + "-wal")
    except OSError:
        return warned_at
    now = time.monotonic()
    if size < WAL_WARN_BYTES or now - warned_at < WAL_WARN_EVERY_SEC:
        return warned_at
    logger.warning(
        "store_checkpoint_blocked",
        extra={
            "db": path,
            "wal_mb": round(size / (1 << 20), 1),
            "frames_behind": frames - copied,
            "cause": "a reader holds an old snapshot open: a long query or transaction in another process "
            "(a sqlite3 shell, a backup tool, a monitoring script)",
            "consequence": "the write-ahead log grows with every commit until that reader ends",
        },
    )
    return now


def _account_row(entry: AccountEntry) -> tuple[str, str, str, float, float]:
    return (entry.name, entry.password_hash, entry.session, entry.created_at, entry.password_changed_at)


class SQLiteStore:
    """The embedded store; see the module docstring for what a commit survives."""

    def __init__(self, path: str, *, sync: str = "normal") -> None:
        """Open (or create) the database at ``path`` and hold it (see :mod:`control.store.lock`).

        Raises:
            OSError: the database cannot be opened, is not a Corral database, or another control
                plane holds it; the message names the file.
        """
        self.path = path
        self.sync = sync
        self._lock = DatabaseLock(path)
        try:
            if refused := _unfit(path):  # before anything is written to it
                self._lock.release()
                raise OSError(f"cannot open the database {path}: {refused}")
            self._wconn = _connect(path, sync)
            self._wconn.executescript(resources.files("control.store").joinpath("schema.sql").read_text())
            _migrate(self._wconn)
            self._rconn = _connect(path, sync)
            self._kconn = _connect(path, sync)  # reads by key on the event loop's thread (get_idempotency, states)
        except sqlite3.Error as exc:
            with contextlib.suppress(AttributeError, sqlite3.Error):
                self._wconn.close()
            self._lock.release()
            full = "" if "full" in str(exc) else _when_full(path)
            verb = "read" if isinstance(exc, _Unreadable) else "open"
            raise OSError(f"cannot {verb} the database {path}: {exc}{full}") from exc
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-read")
        # Transactions that run off the event loop, one at a time and in order (see the module docstring).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-write")
        # With synchronous=FULL a commit waits for fsync: every transaction goes to the writer thread.
        self._offload_all = sync == "full"
        self._in_flight = 0  # transactions handed to the writer thread and not yet run there
        self._in_flight_lock = threading.Lock()  # counted up on the loop's thread, down on the writer's
        self._pending: list[_Op] = []
        self._error: BaseException | None = None
        # Held by each write transaction, and by the check that fails the store when its files are lost, so
        # that no write lands after that check's last checkpoint (see _files_lost).
        self._write_lock = threading.Lock()
        self._files: dict[str, tuple[int, int] | None] = {suffix: _identity(path + suffix) for suffix in _FILES}
        self._closed = False
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="store-checkpoint", daemon=True)
        self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        """Copy the WAL back into the database every CHECKPOINT_SEC, off the event loop: a checkpoint
        syncs, and a sync inside a commit would stall every caller waiting on the loop. Every
        FILES_CHECK_SEC, see that the store's files are still there (:meth:`_files_lost`)."""
        conn = _connect(self.path, self.sync)
        try:
            last = time.monotonic()
            warned_at = float("-inf")
            while not self._stop.wait(FILES_CHECK_SEC):
                if self._error is None and (lost := self._lost()):
                    self._files_lost(conn, lost)
                self._hold_lock()
                if time.monotonic() - last < CHECKPOINT_SEC:
                    continue
                last = time.monotonic()
                try:
                    warned_at = checkpoint(conn, self.path, warned_at)
                except sqlite3.Error:
                    logger.exception("store_checkpoint_failed")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            logger.exception("store_checkpoint_failed")
        finally:
            conn.close()

    def _hold_lock(self) -> None:
        """Keep the database's lock file (see :meth:`DatabaseLock.hold`); when another control plane took
        it meanwhile, fail the store, so that this one stops and that one runs the jobs alone."""
        try:
            if self._lock.hold():
                logger.warning("store_lock_restored", extra={"db": self.path, "lock": self._lock.path})
        except OSError as exc:
            with self._write_lock:
                first = self._error is None
                if first:
                    self._error = _FilesLost(str(exc))
            if first:
                logger.critical("store_lock_lost", extra={"db": self.path, "error": str(exc)})

    def _lost(self) -> str:
        """The store's files that are no longer the ones it opened (removed, or another file put in their
        place), as ``"corral.db-wal removed"``; "" while all are there."""
        lost = []
        for suffix, known in self._files.items():
            now = _identity(self.path + suffix)
            if known is None:  # not there at open (SQLite makes it on first use): take the first one seen
                self._files[suffix] = now
            elif now != known:
                lost.append(f"{os.path.basename(self.path)}{suffix} {'removed' if now is None else 'replaced'}")
        return ", ".join(lost)

    def _files_lost(self, conn: sqlite3.Connection, lost: str) -> None:
        """Fail the store: its files were removed or replaced under it (a restore while it ran, a clean-up).

        SQLite goes on writing to the files it has open, so every commit from then on would be lost at
        exit; and a write-ahead log left to a database it does not belong to corrupts that one. So writes
        are refused from now on, which stops the control plane (exit status 3), and what was committed is
        saved first: into the database file (a full checkpoint, through the log still open) when only
        the log or its index went, else into a copy beside the database, named in the message."""
        with self._write_lock:  # no write lands after this: each checks _error under the lock
            if self._error is not None:
                return
            self._error = _FilesLost(f"{lost} while the control plane ran")
        try:  # outside the lock: a copy of a large store takes a while, and the event loop must not wait for it
            if self._files[""] == _identity(self.path):
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    raise sqlite3.OperationalError("the checkpoint was held up by a reader")
                saved = f"what was committed is in {self.path}"
            else:
                copy = f"{self.path}.saved-{time.strftime('%Y%m%dT%H%M%S')}"
                with contextlib.closing(sqlite3.connect(copy)) as dest:
                    conn.backup(dest)
                saved = f"what was committed is saved in {copy}"
        except (sqlite3.Error, OSError) as exc:
            saved = f"what was committed since the last checkpoint could not be saved: {exc}"
        self._error = _FilesLost(f"{lost} while the control plane ran; {saved}")
        logger.critical("store_files_lost", extra={"db": self.path, "error": str(self._error)})

    # ---- writes -------------------------------------------------------------------------------
    def job_rows(self, jobs: Iterable[JobRecord]) -> JobRows:
        return [insert_row(j) for j in jobs]

    def insert(self, jobs: Iterable[JobRecord], rows: JobRows | None = None) -> None:
        jobs = list(jobs)
        self._pending.append(("jobs_insert", self.job_rows(jobs) if rows is None else rows))
        if labelled := [(key, value, j.seq) for j in jobs if j.labels for key, value in j.labels.items()]:
            self._pending.append(("labels_insert", labelled))

    def update(self, jobs: Iterable[JobRecord]) -> None:
        self._pending.append(("jobs_update", [update_row(j) for j in jobs]))

    def put_idempotency(self, entries: Iterable[IdempotencyEntry]) -> None:
        self._pending.append(("idem_put", [(e.key, e.request_hash, e.job_id, e.expires_at) for e in entries]))

    async def delete_expired_idempotency(self, now: float, limit: int) -> int:
        """Delete at most ``limit`` keys expired by ``now``, in a transaction of its own after the
        queued writes."""
        return await self._after_queued(lambda: self._expire_keys(now, limit))

    async def purge_finished(
        self,
        state: JobState,
        before: float,
        limit: int,
        after_seq: int = 0,
        *,
        dependency_failed_before: float | None = None,
    ) -> PurgeStep:
        """One step reads ``limit`` jobs of the state by the index on (state, seq)."""
        return await self._after_queued(lambda: self._purge(state, before, limit, after_seq, dependency_failed_before))

    async def _after_queued(self, step: Callable[[], _T]) -> _T:
        """Write what is queued, then run ``step`` (its own transaction): here, or on the writer
        thread (see :meth:`_here`), which keeps the order of transactions."""
        ops, self._pending = self._pending, []

        def run() -> _T:
            if ops:
                self._write(ops)
            return step()

        if self._here(ops):
            return run()
        return await self._off_loop(run)

    def _here(self, ops: list[_Op]) -> bool:
        """Whether ``ops`` may be written on the event loop's thread, now: no transaction is on the
        writer thread (the connection is not shared between threads, and order is kept), the sync
        setting does not send them all there, and ``ops`` are not too many rows."""
        return not self._in_flight and not self._offload_all and sum(len(rows) for _, rows in ops) <= OFFLOAD_ROWS

    async def _off_loop(self, step: Callable[[], _T]) -> _T:
        """Run ``step`` on the writer thread after what is there already. A caller cancelled meanwhile
        does not cancel it: the writes it carries were taken from the queue and must land.

        Raises:
            Unavailable: the store is closed.
        """
        if self._closed:
            raise Unavailable("store cannot be written: it is closed")
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            done = self._writer.submit(self._counted(step))
        except BaseException:
            self._landed()
            raise
        return await asyncio.shield(asyncio.wrap_future(done))

    def _counted(self, step: Callable[[], _T]) -> Callable[[], _T]:
        """``step``, counted down as soon as it has run (or failed), on the writer thread itself: from
        then on the connection is free, whatever became of the caller or of its event loop."""

        def run() -> _T:
            try:
                return step()
            finally:
                self._landed()

        return run

    def _landed(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1

    def _purge(
        self, state: JobState, before: float, limit: int, after_seq: int, dependency_failed_before: float | None
    ) -> PurgeStep:
        if self._error is not None:
            return PurgeStep([], None)
        conn = self._wconn
        try:
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(purge_window("?"), (int(state), after_seq, limit)).fetchall()
            doomed, next_seq = purge_doomed(rows, before, dependency_failed_before, limit)
            conn.executemany("DELETE FROM jobs WHERE seq = ?", [(seq,) for seq, _, _ in doomed])
            conn.executemany(
                "DELETE FROM job_labels WHERE key = ? AND value = ? AND seq = ?",
                [
                    (key, value, seq)
                    for seq, _, labels in doomed
                    if labels != "{}"
                    for key, value in json.loads(labels).items()
                ],
            )
            conn.execute("COMMIT")
        except sqlite3.Error:  # not fatal: the jobs are deleted by a later sweep
            logger.exception("job_purge_failed")
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return PurgeStep([], None)
        return PurgeStep([id_ for _, id_, _ in doomed], next_seq)

    def _expire_keys(self, now: float, limit: int) -> int:
        if self._error is not None:
            return 0
        try:
            return int(self._wconn.execute(_IDEM_EXPIRE, (now, limit)).rowcount)
        except sqlite3.Error:  # not fatal: the keys are deleted by a later sweep
            logger.exception("idempotency_sweep_failed")
            return 0

    async def lead(self, standing_by: StandingBy | None = None) -> None:
        """At once: the file lock was taken when the store was opened (see :mod:`control.store.lock`)."""

    def put_job_type(self, entry: JobTypeEntry, now: float) -> None:
        self._pending.append(("type_put", [(entry.name, entry.schema_json, entry.description, now)]))

    def put_account(self, entry: AccountEntry) -> None:
        self._pending.append(("account_put", [_account_row(entry)]))

    def delete_account(self, name: str) -> None:
        self._pending.append(("account_delete", [(name,)]))

    def replace_login_key(self, key: bytes) -> None:
        self.put_setting("login_key", key.hex())

    def put_setting(self, name: str, value: str) -> None:
        self._pending.append(("setting_put", [(name, value)]))

    def load_setting(self, name: str) -> str | None:
        row = self._rconn.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def put_audit(self, entry: AuditEntry) -> None:
        self._pending.append(("audit_put", [audit_rows.row(entry)]))

    async def purge_audit(self, before: float, limit: int) -> int:
        return await self._after_queued(lambda: self._purge_audit(before, limit))

    def _purge_audit(self, before: float, limit: int) -> int:
        if self._error is not None:
            return 0
        try:
            return int(self._wconn.execute(audit_rows.purge_sql("?"), (before, limit)).rowcount)
        except sqlite3.Error:  # not fatal: a later sweep deletes them
            logger.exception("audit_purge_failed")
            return 0

    async def commit(self) -> None:
        """Return once every write queued before this call is durable.

        Everything queued since the last commit goes into one transaction (group commit), written
        right here or on the writer thread (see the module docstring)."""
        ops, self._pending = self._pending, []
        if self._here(ops):
            if ops:
                self._write(ops)
        elif ops:
            await self._off_loop(lambda: self._write(ops))
        else:  # wait for the transactions already on the writer thread (it keeps their order)
            await self._off_loop(lambda: None)
        if self._error is not None:
            raise Unavailable(f"store cannot be written: {self._error}")

    def commit_now(self) -> bool:
        if not self._here(self._pending):
            return False
        self._flush()
        if self._error is not None:
            raise Unavailable(f"store cannot be written: {self._error}")
        return True

    def _flush(self) -> None:
        ops, self._pending = self._pending, []
        if ops:
            self._write(ops)

    _SQL = {
        "jobs_insert": _INSERT,
        "jobs_update": _UPDATE,
        "labels_insert": "INSERT INTO job_labels (key, value, seq) VALUES (?,?,?)",
        "idem_put": "INSERT OR REPLACE INTO idempotency_keys (key, request_hash, job_id, expires_at) VALUES (?,?,?,?)",
        "type_put": "INSERT OR REPLACE INTO job_types (name, schema, description, updated_at) VALUES (?,?,?,?)",
        "account_put": f"INSERT OR REPLACE INTO accounts ({_ACCOUNT_COLUMNS}) VALUES (?,?,?,?,?)",
        "account_delete": "DELETE FROM accounts WHERE name = ?",
        "setting_put": "INSERT OR REPLACE INTO settings (name, value) VALUES (?,?)",
        "audit_put": f"INSERT INTO audit ({audit_rows.COLUMNS}) VALUES (?,?,?,?,?,?)",
    }

    def _write(self, ops: list[_Op]) -> None:
        with self._write_lock:
            if self._error is not None:
                return
            conn = self._wconn
            try:
                conn.execute("BEGIN IMMEDIATE")
                for kind, rows in ops:
                    conn.executemany(self._SQL[kind], rows)
                conn.execute("COMMIT")
            except Exception as exc:  # disk full, I/O error: the store is broken, say so everywhere
                logger.exception("store_write_failed")
                self._error = exc
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")

    @property
    def healthy(self) -> bool:
        return self._error is None

    @property
    def failure(self) -> str:
        return "" if self._error is None else str(self._error) or type(self._error).__name__

    # ---- reads --------------------------------------------------------------------------------
    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._reader, fn, self._rconn)

    async def get(self, job_id: str) -> JobRecord | None:
        def q(c: sqlite3.Connection) -> JobRecord | None:
            row = c.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return record(row) if row else None

        result: JobRecord | None = await self._read(q)
        return result

    async def get_many(self, job_ids: Sequence[str]) -> list[JobRecord]:
        def q(c: sqlite3.Connection) -> list[JobRecord]:
            return read_by_ids(c, "?", job_ids)

        result: list[JobRecord] = await self._read(q)
        return result

    async def cancelled_chain(self, job_id: str) -> list[JobRecord]:
        def q(c: sqlite3.Connection) -> list[JobRecord]:
            return read_cancelled_chain(c, "?", job_id)

        result: list[JobRecord] = await self._read(q)
        return result

    async def list_jobs(
        self,
        states: Sequence[JobState],
        job_type: str,
        limit: int,
        offset: int,
        owners: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        *,
        error_code: str = "",
    ) -> JobPage:
        where: list[str] = []
        args: list[Any] = []
        for key, value in (labels or {}).items():
            where.append("seq IN (SELECT seq FROM job_labels WHERE key = ? AND value = ?)")
            args += [key, value]
        if owners:
            where.append(f"owner IN ({','.join('?' * len(owners))}) AND owner != ''")
            args.extend(owners)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(int(s) for s in states)
        if job_type:
            where.append("type = ?")
            args.append(job_type)
        if error_code:
            where.append("error_code = ?")
            args.append(error_code)
        clause = f" WHERE {' AND '.join(where)}" if where else ""

        def q(c: sqlite3.Connection) -> JobPage:
            cursor = c.execute(
                f"SELECT {COLUMNS} FROM jobs{clause} ORDER BY seq DESC LIMIT ? OFFSET ?", (*args, limit, offset)
            )
            rows = first_page(cursor)
            cursor.close()
            total = c.execute(f"SELECT COUNT(*) FROM jobs{clause}", args).fetchone()[0]
            return JobPage([record(r) for r in rows], total)

        page: JobPage = await self._read(q)
        return page

    def load_active(self) -> Iterator[JobRecord]:
        # Row by row: all rows at once held a second copy of a large backlog while it was being loaded
        # (with 1,000,000 jobs queued, the control plane held 1.51 GB after start instead of 1.16 GB).
        done = ",".join(str(int(s)) for s in TERMINAL)
        cursor = self._rconn.execute(f"SELECT {COLUMNS} FROM jobs WHERE state NOT IN ({done}) ORDER BY seq")
        try:
            yield from map(record, cursor)
        finally:
            cursor.close()

    def count_by_state(self) -> dict[JobState, int]:
        rows = self._rconn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {JobState(s): n for s, n in rows}

    def states(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        # On _kconn, not _rconn: the reader thread holds that one through a ListJobs or an audit search,
        # and SubmitJobs calls this on the event loop (0.12 s behind a page of 1,000,000 jobs).
        out: dict[str, JobState] = {}
        ids = list(job_ids)
        for at in range(0, len(ids), 500):
            part = ids[at : at + 500]
            rows = self._kconn.execute(
                f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(part))})", part
            ).fetchall()
            out.update((job_id, JobState(state)) for job_id, state in rows)
        return out

    def max_seq(self) -> int:
        value = self._rconn.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0]
        return int(value)

    def load_idempotency(self, now: float, limit: int | None = None) -> list[IdempotencyEntry]:
        rows = self._rconn.execute(
            "SELECT key, request_hash, job_id, expires_at FROM idempotency_keys WHERE expires_at > ? "
            "ORDER BY expires_at DESC LIMIT ?",
            (now, -1 if limit is None else limit),
        ).fetchall()
        return [IdempotencyEntry(*r) for r in reversed(rows)]

    def get_idempotency(self, key: str) -> IdempotencyEntry | None:
        row = self._kconn.execute(
            "SELECT key, request_hash, job_id, expires_at FROM idempotency_keys WHERE key = ?", (key,)
        ).fetchone()
        return IdempotencyEntry(*row) if row else None

    async def read_idempotency(self, keys: Sequence[str]) -> dict[str, IdempotencyEntry]:
        # On the loop, unlike PostgreSQL's: a read by key of a local file in WAL mode waits for no writer,
        # and costs less than a hop to the reader thread, which a ListJobs page may hold.
        return {key: entry for key in keys if (entry := self.get_idempotency(key)) is not None}

    async def read_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        return self.states(job_ids)  # on the loop, as read_idempotency

    def load_job_types(self) -> list[JobTypeEntry]:
        rows = self._rconn.execute("SELECT name, schema, description FROM job_types").fetchall()
        return [JobTypeEntry(*r) for r in rows]

    async def list_audit(self, match: Mapping[str, str], limit: int, offset: int) -> AuditPage:
        page: AuditPage = await self._read(lambda c: audit_rows.read_page(c, "?", match, limit, offset))
        return page

    def load_accounts(self) -> list[AccountEntry]:
        rows = self._rconn.execute(f"SELECT {_ACCOUNT_COLUMNS} FROM accounts").fetchall()
        return [AccountEntry(*r) for r in rows]

    def login_key(self, candidate: bytes) -> bytes:
        conn = self._wconn
        conn.execute("INSERT OR IGNORE INTO settings (name, value) VALUES ('login_key', ?)", (candidate.hex(),))
        (value,) = conn.execute("SELECT value FROM settings WHERE name = 'login_key'").fetchone()
        return bytes.fromhex(value)

    def close(self) -> None:
        """Write what is still queued, then close both connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writer.shutdown(wait=True)
        self._flush()
        if self._error is None:  # the next open need not look at this run's jobs again (see _mend_labels)
            with contextlib.suppress(sqlite3.Error):
                _keep_labels_mark(self._wconn)
        self._reader.shutdown(wait=True)
        self._stop.set()
        self._checkpointer.join()
        for conn in (self._wconn, self._rconn, self._kconn):
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._lock.release()


class _Unreadable(sqlite3.DatabaseError):
    """The database opened, but a page of it could not be read (damaged): see :func:`_mend_labels`."""


class _FilesLost(OSError):
    """The store's files were removed or replaced under it (see :meth:`SQLiteStore._files_lost`)."""


def _when_full(path: str) -> str:
    """What to add to an error opening ``path`` when its disk is full: SQLite then says "disk I/O error"
    for an existing database (it cannot make the log's index), which does not say what to do."""
    try:
        fs = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return ""
    return " (its disk is full)" if fs.f_bavail * fs.f_frsize < 65536 else ""


def _identity(path: str) -> tuple[int, int] | None:
    """Which file ``path`` names now (device, inode), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:  # gone, or its directory gone with a lost volume
        return None
    return (st.st_dev, st.st_ino)
