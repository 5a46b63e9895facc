"""PostgresStore: the shared store. Several control planes on one database, one active at a time.

The active control plane holds a session-level advisory lock (:data:`LOCK_KEY`) on its write
connection for as long as it runs. Another control plane started on the same database is a standby:
:meth:`PostgresStore.lead` waits until the lock is free, so it opens no port and dispatches nothing
until the active one has gone, and then takes over from what is committed (its workers reconnect to
it and it re-adopts their running jobs, as after a restart). A job is never leased by two control
planes at once.

Every write goes through the connection that holds the lock, so writing and leading end together:
when that session ends (the process dies, the server restarts, an operator terminates it), PostgreSQL
drops the lock and no write of the old session can commit after it. The store then says it cannot be
written and the old control plane stops (exit status 3); a probe each :data:`PROBE_SEC` checks the
lock while nothing is written, so an idle control plane that lost it stops too. Reads hold no lock:
a read connection whose session was ended is replaced at its next read, and the control plane reads on.

Writes are queued and committed in groups on one thread (one round trip to the server per group).
What a commit survives is the server's to say: with PostgreSQL's defaults (``fsync`` and
``synchronous_commit`` on) a committed transaction survives a crash of either process and a power
loss. ``CORRAL_DB_SYNC`` applies to SQLite only.

The database keeps the version of its schema (:data:`SCHEMA_VERSION`, in the one-row table
``corral_schema``). A control plane refuses, before it writes anything or stands by, a database a newer
release made (a higher version) and one with tables named like Corral's that are not Corral's (no
version and not the columns every release made); a database made before the version was kept, with
Corral's tables, is taken as this version and gains the row with the next schema step.

Text columns cannot hold NUL in PostgreSQL, and one such value would fail its whole group commit
(and so stop the control plane, again after each restart). What comes from job code rather than
through admission (a job's printed output, error code and message and result, a job type's
description) has NUL characters replaced by U+FFFD; what admission checked has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg import sql

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
from corral import logs
from corral.dburl import describe
from corral.errors import Unavailable

logger = logging.getLogger(__name__)

LOCK_KEY = 0x636F7272
"""The advisory lock the active control plane holds (one per database; below 2^31, so that
``pg_locks.objid`` shows it as it is)."""

PROBE_SEC = 1.0
"""How often the active control plane checks that it still holds the lock while it writes nothing."""

STANDBY_POLL_SEC = 0.25
"""How often a standby tries the lock: the longest a takeover waits after the active one has gone."""

CONNECT_TIMEOUT_SEC = 10

RECONNECT_SEC = 1.0
"""How often a standby that lost its connection to the server tries again."""

SCHEMA_LOCK_TIMEOUT_SEC = 1.0
"""How long the schema step of :meth:`PostgresStore.lead` waits for a table's lock (another session
holds it: a pg_dump, a VACUUM FULL, DDL by hand) before it gives up, leaves as much time to the queries
queued behind its request, and tries again."""

SCHEMA_VERSION = 2
"""The schema this release makes, kept in the table ``corral_schema`` (no row: a database made before it
was kept, which the schema step brings up to date). A release that changes the schema so that an older
one would misread it raises it; an older release then refuses the database instead of using it.
2: idempotency keys are kept with their owner whatever the visibility (:mod:`control.store.keys`)."""

_FIRST_COLUMNS = {
    "jobs": (
        "seq", "id", "name", "type", "payload", "priority", "thread_demand", "threads_granted", "state", "attempts",
        "charged_attempts", "max_attempts", "timeout_sec", "scheduled_at", "created_at", "ready_at", "started_at",
        "finished_at", "queue_seconds", "exec_seconds", "worker_id", "lease_expires_at", "result", "error_code",
        "error_message", "idempotency_key", "labels", "updated_at", "request_id", "owner", "worker_selector",
        "output", "depends_on",
    ),
    "idempotency_keys": ("key", "request_hash", "job_id", "expires_at"),
    "job_types": ("name", "schema", "description", "updated_at"),
    "accounts": ("name", "password_hash", "session", "created_at", "password_changed_at"),
    "settings": ("name", "value"),
    "audit": ("seq", "time", "actor", "action", "target", "outcome", "request_id"),
    "corral_schema": ("version",),
}  # fmt: skip
"""Corral's tables and the columns each had when a release first made it (those added since, the schema
step adds): a database without a version whose tables of these names lack one is not Corral's."""
_EVERY_RELEASE = ("jobs", "idempotency_keys", "job_types")
"""The tables every release made, in one transaction: a database of Corral's has all three or none."""
_TABLES = (
    "SELECT c.relname::text, c.relkind::text, n.nspname::text, ARRAY(SELECT a.attname::text FROM pg_attribute a "
    "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relname = ANY(%s)"
)
"""Corral's tables in the schema CREATE TABLE makes them in (the first of the search path), by plain
catalog reads: all of one snapshot, so a schema another control plane is making shows all or nothing."""
_VERSION_PUT = (
    "INSERT INTO corral_schema (version) VALUES (%s) "
    "ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version WHERE corral_schema.version < EXCLUDED.version"
)

PAGE_FETCH_ROWS = 20
"""Rows a ListJobs page fetches from the server at a time: past the page's cap
(:data:`control.store.rows.PAGE_TEXT_BYTES`) it holds at most this many more rows, and a page of 50
small jobs (ListJobs' default) takes three fetches."""

# A group's new jobs go in by one COPY (a statement each cost the control plane more CPU per job), and
# each changed job by one compare-and-set UPDATE, pipelined: never let an older attempt overwrite a newer one.
_COPY_JOBS = f"COPY jobs ({COLUMNS}) FROM STDIN"
_CHANGED = (
    "threads_granted, state, attempts, charged_attempts, ready_at, started_at, finished_at, queue_seconds, "
    "exec_seconds, worker_id, lease_expires_at, result, error_code, error_message, output, updated_at"
)
"""The columns an update writes, in the order of :func:`control.store.rows.update_row`."""
_UPDATE = f"UPDATE jobs SET {', '.join(f'{c}=%s' for c in _CHANGED.split(', '))} WHERE seq=%s AND attempts<=%s"
_SQL = {
    "idem_put": (
        "INSERT INTO idempotency_keys (key, request_hash, job_id, expires_at) VALUES (%s,%s,%s,%s) "
        "ON CONFLICT (key) DO UPDATE SET request_hash=EXCLUDED.request_hash, job_id=EXCLUDED.job_id, "
        "expires_at=EXCLUDED.expires_at"
    ),
    "type_put": (
        "INSERT INTO job_types (name, schema, description, updated_at) VALUES (%s,%s,%s,%s) "
        "ON CONFLICT (name) DO UPDATE SET schema=EXCLUDED.schema, description=EXCLUDED.description, "
        "updated_at=EXCLUDED.updated_at"
    ),
    "account_put": (
        "INSERT INTO accounts (name, password_hash, session, created_at, password_changed_at) "
        "VALUES (%s,%s,%s,%s,%s) ON CONFLICT (name) DO UPDATE SET password_hash=EXCLUDED.password_hash, "
        "session=EXCLUDED.session, created_at=EXCLUDED.created_at, password_changed_at=EXCLUDED.password_changed_at"
    ),
    "account_delete": "DELETE FROM accounts WHERE name = %s",
    "setting_put": (
        "INSERT INTO settings (name, value) VALUES (%s,%s) ON CONFLICT (name) DO UPDATE SET value=EXCLUDED.value"
    ),
    "audit_put": f"INSERT INTO audit ({audit_rows.COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s)",
}
_IDEM_EXPIRE = (
    "DELETE FROM idempotency_keys WHERE key IN "
    "(SELECT key FROM idempotency_keys WHERE expires_at <= %s ORDER BY expires_at LIMIT %s)"
)
_HOLDER = (
    "SELECT a.application_name, a.client_addr::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = %s AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)
_HOLDS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 0 AND objid = %s "
    "AND pid = pg_backend_pid()"
)
# Positions of the error message and the output in an update row and an insert row (see rows.py).
_JOB_TEXT = ("worker_id", "result", "error_code", "error_message", "output")
"""The text a job's attempts write (from the worker and job code, not checked at admission)."""
_UPDATE_TEXT = tuple(i for i, c in enumerate(_CHANGED.replace(" ", "").split(",")) if c in _JOB_TEXT)
_INSERT_TEXT = tuple(COLUMNS.replace(" ", "").split(",").index(c) for c in _JOB_TEXT)

_Op = tuple[str, list[tuple[Any, ...]]]
_T = TypeVar("_T")


def _without_nul(row: tuple[Any, ...], columns: Sequence[int]) -> tuple[Any, ...]:
    if not any("\x00" in row[i] for i in columns):
        return row
    values = list(row)
    for i in columns:
        values[i] = values[i].replace("\x00", "\ufffd")
    return tuple(values)


def _schema_state(conn: psycopg.Connection[Any]) -> tuple[str, bool]:
    """Why the database ``conn`` is on must not be used as this release's store ("" when it may), and
    whether the schema step must record :data:`SCHEMA_VERSION` in it. Reads only.

    Raises:
        psycopg.Error: the catalog or the version cannot be read.
    """
    found = {
        name: (kind, schema, set(columns))
        for name, kind, schema, columns in conn.execute(_TABLES, (list(_FIRST_COLUMNS),))
    }
    version: int | None = None
    if (kept := found.get("corral_schema")) is not None and kept[0] in ("r", "p") and "version" in kept[2]:
        row = conn.execute(
            sql.SQL("SELECT max(version) FROM {}").format(sql.Identifier(kept[1], "corral_schema"))
        ).fetchone()
        version = None if row is None or row[0] is None else int(row[0])
    if version is not None:
        if version > SCHEMA_VERSION:
            return (
                f"it was made by a newer release of Corral (schema version {version}; this release reads up to "
                f"{SCHEMA_VERSION}): run that release, or restore a backup that this one made",
                False,
            )
        return "", version < SCHEMA_VERSION
    if not found:
        return "", True  # a new database
    # Tables named like Corral's and no version: a database made before the version was kept, when they
    # are Corral's; else another program's tables (or Corral's, cut down by hand), which it must not write.
    wrong = []
    for name in sorted(found):
        kind, _, columns = found[name]
        if kind not in ("r", "p"):
            wrong.append(f"{name} is not a table")
        elif missing := [c for c in _FIRST_COLUMNS[name] if c not in columns]:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            wrong.append(f"its table {name} has no column {shown}")
    if absent := [name for name in _EVERY_RELEASE if name not in found]:
        wrong.append(f"it has {', '.join(sorted(found))} but no {', '.join(absent)}")
    if wrong:
        return f"it is not a Corral database ({'; '.join(wrong)}; and it records no schema version)", False
    return "", True


def _application_name() -> str:
    # pg_stat_activity shows it: a standby names the active control plane by it. At most 63 bytes.
    return f"corral-control {socket.gethostname()[:32]} pid {os.getpid()}"


class PostgresStore:
    """The shared store; see the module docstring for leading, standing by and what a commit survives."""

    def __init__(self, url: str) -> None:
        """Connect to the database at ``url``. The store is not written, nor its schema made, before
        :meth:`lead` returns.

        Raises:
            OSError: the server cannot be reached or refuses the connection, or the database is one this
                release must not use (made by a newer release, or not Corral's: see the module
                docstring); the message names the database (without its password) and why.
        """
        self.url = url
        self.where = describe(url)
        self._connections: list[psycopg.Connection[Any]] = []
        try:
            self._wconn = self._connect()
            self._rconn = self._connect()
            self._kconn = self._connect()  # reads by key on the event loop's thread (get_idempotency, states)
            # Before standing by: a database it must not use is said now, not at a takeover hours later.
            refused = self._unfit()
        except psycopg.Error as exc:
            self._close_connections()
            raise OSError(f"cannot open the database {self.where}: {_reason(exc)}") from None
        if refused:
            self._close_connections()
            raise OSError(f"cannot open the database {self.where}: {refused}")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-write")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-read")
        self._pending: list[_Op] = []
        self._error: BaseException | None = None
        self._leading = False
        self._closed = False
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None

    def _unfit(self) -> str:
        """:func:`_schema_state`'s refusal, read before the lock is held (so without a write), in one
        snapshot. A table's lock another session holds skips it: the schema step checks again, under
        the lock, before it writes."""
        conn = self._rconn
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                conn.execute(f"SET LOCAL lock_timeout = {round(SCHEMA_LOCK_TIMEOUT_SEC * 1000)}")
                return _schema_state(conn)[0]
        except psycopg.errors.LockNotAvailable:
            return ""

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SEC,
            application_name=_application_name(),
            # A server that went silent (no FIN, no RST) is noticed within about 25 s, not TCP's minutes.
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        self._connections.append(conn)
        return conn

    # ---- leading ------------------------------------------------------------------------------
    async def lead(self, standing_by: StandingBy | None = None) -> None:
        """Return once this store holds the database's lock, its schema made: at once when no other
        control plane holds it, else (a standby) when that one has gone. A schema step that needs a
        table another session holds (an older database gaining a column during a pg_dump) gives up
        after SCHEMA_LOCK_TIMEOUT_SEC and is tried again until it gets the lock, rather than left waiting
        in the lock's queue."""
        loop = asyncio.get_running_loop()
        logged = False
        while True:
            try:
                if await loop.run_in_executor(self._writer, self._try_lock):
                    break
            except OSError as exc:
                if not logged:  # at start-up: the database cannot be used, say so now
                    raise
                # A standby outlives an outage of the server (a restart, a failover of its own): it
                # connects again, and waits on as long as another control plane holds the lock.
                logger.warning(logs.STORE_UNREACHABLE, extra={"db": self.where, "error": str(exc)})
                await asyncio.sleep(RECONNECT_SEC)
                with contextlib.suppress(psycopg.Error):
                    self._wconn = await loop.run_in_executor(self._writer, self._replace, self._wconn)
                continue
            if not logged:
                logged = True
                holder = await loop.run_in_executor(self._reader, self._holder)
                logger.info(logs.STORE_STANDBY, extra={"db": self.where, "active": holder})
                if standing_by is not None:
                    await standing_by(holder)
            await asyncio.sleep(STANDBY_POLL_SEC)
        if logged:  # connections idle for as long as it stood by may have been ended meanwhile
            self._rconn = await loop.run_in_executor(self._reader, self._alive, self._rconn)
            self._kconn = await loop.run_in_executor(self._reader, self._alive, self._kconn)
        blocked = False
        while reason := await loop.run_in_executor(self._writer, self._make_schema):
            # A request waiting for a table's lock holds up every query of that table queued after it:
            # give way between tries rather than wait for as long as the other session keeps it.
            if not blocked:
                blocked = True
                logger.warning("store_schema_locked", extra={"db": self.where, "error": reason})
            await asyncio.sleep(SCHEMA_LOCK_TIMEOUT_SEC)
        self._leading = True
        logger.info(logs.STORE_LEADING, extra={"db": self.where, "waited": logged})
        self._prober = threading.Thread(target=self._probe_loop, name="store-probe", daemon=True)
        self._prober.start()

    def _replace(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """A new connection in place of ``conn`` (closed). ``conn`` may have been replaced before, by a
        try that could not connect: it is then no longer among the connections to close."""
        with contextlib.suppress(psycopg.Error):
            conn.close()
        with contextlib.suppress(ValueError):
            self._connections.remove(conn)
        return self._connect()

    def _alive(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """``conn`` if it still answers, else a new connection.

        Raises:
            OSError: no new connection can be made either.
        """
        try:
            conn.execute("SELECT 1")
            return conn
        except psycopg.Error:
            pass
        try:
            return self._replace(conn)
        except psycopg.Error as exc:
            raise OSError(f"cannot open the database {self.where}: {_reason(exc)}") from None

    def _try_lock(self) -> bool:
        try:
            row = self._wconn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
        except psycopg.Error as exc:
            raise OSError(f"cannot lock the database {self.where}: {_reason(exc)}") from None
        return bool(row and row[0])

    def _holder(self) -> str:
        with contextlib.suppress(psycopg.Error):
            row = self._rconn.execute(_HOLDER, (LOCK_KEY,)).fetchone()
            if row:
                return f"{row[0]} from {row[1] or 'a local socket'}"
        return "unknown"

    def _make_schema(self) -> str:
        """Make what schema_postgres.sql makes and record :data:`SCHEMA_VERSION`, in one transaction: ""
        once made, else why a table's lock could not be had within SCHEMA_LOCK_TIMEOUT_SEC (nothing was
        made: try again). The database is checked again first, under the lock: a newer release may have
        led it while this one stood by.

        Raises:
            OSError: the database must not be used (nothing was written), or the schema cannot be made
                (the server is gone, a permission is missing).
        """
        ddl = resources.files("control.store").joinpath("schema_postgres.sql").read_text()
        refused = ""
        try:
            with self._wconn.transaction() as tx:
                self._wconn.execute(f"SET LOCAL lock_timeout = {round(SCHEMA_LOCK_TIMEOUT_SEC * 1000)}")
                refused, stale = _schema_state(self._wconn)
                if refused:
                    raise psycopg.Rollback(tx)
                self._wconn.execute(ddl)
                if stale:  # an older schema's (or none): its keys take their form now, in this transaction
                    rows = moved_keys(self._wconn.execute(OLD_KEYS).fetchall())
                    self._wconn.execute("DELETE FROM idempotency_keys")
                    with self._wconn.cursor() as cur:
                        cur.executemany(_SQL["idem_put"], rows)
                    self._wconn.execute(_VERSION_PUT, (SCHEMA_VERSION,))
        except psycopg.errors.LockNotAvailable as exc:
            return _reason(exc)
        except psycopg.Error as exc:
            raise OSError(f"cannot create the tables in {self.where}: {_reason(exc)}") from None
        if refused:
            raise OSError(f"cannot open the database {self.where}: {refused}")
        return ""

    def _probe_loop(self) -> None:
        while not self._stop.wait(PROBE_SEC):
            with contextlib.suppress(RuntimeError):  # the writer was shut down: closing
                self._writer.submit(self._probe).result()

    def _probe(self) -> None:
        if self._error is not None or self._closed:
            return
        try:
            row = self._wconn.execute(_HOLDS, (LOCK_KEY,)).fetchone()
        except psycopg.Error as exc:
            self._fail(exc)
            return
        if not row or row[0] != 1:
            self._fail(RuntimeError(f"this control plane no longer holds the lock of {self.where}"))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            logger.error("store_write_failed", extra={"db": self.where, "error": _reason(exc)})
            self._error = exc

    # ---- writes -------------------------------------------------------------------------------
    def job_rows(self, jobs: Iterable[JobRecord]) -> JobRows:
        return [_without_nul(insert_row(j), _INSERT_TEXT) for j in jobs]

    def insert(self, jobs: Iterable[JobRecord], rows: JobRows | None = None) -> None:
        self._pending.append(("jobs_insert", self.job_rows(jobs) if rows is None else rows))

    def update(self, jobs: Iterable[JobRecord]) -> None:
        self._pending.append(("jobs_update", [_without_nul(update_row(j), _UPDATE_TEXT) for j in jobs]))

    def put_idempotency(self, entries: Iterable[IdempotencyEntry]) -> None:
        self._pending.append(("idem_put", [(e.key, e.request_hash, e.job_id, e.expires_at) for e in entries]))

    def put_job_type(self, entry: JobTypeEntry, now: float) -> None:
        row = (entry.name, entry.schema_json, entry.description, now)
        self._pending.append(("type_put", [_without_nul(row, (1, 2))]))

    def put_account(self, entry: AccountEntry) -> None:
        row = (entry.name, entry.password_hash, entry.session, entry.created_at, entry.password_changed_at)
        self._pending.append(("account_put", [row]))

    def delete_account(self, name: str) -> None:
        self._pending.append(("account_delete", [(name,)]))

    def replace_login_key(self, key: bytes) -> None:
        self.put_setting("login_key", key.hex())

    def put_setting(self, name: str, value: str) -> None:
        self._pending.append(("setting_put", [(name, value)]))

    def load_setting(self, name: str) -> str | None:
        row = self._rconn.execute("SELECT value FROM settings WHERE name = %s", (name,)).fetchone()
        return None if row is None else str(row[0])

    def put_audit(self, entry: AuditEntry) -> None:
        # Names and request ids come from callers: a NUL, which PostgreSQL's text refuses, must not fail a commit.
        self._pending.append(("audit_put", [_without_nul(audit_rows.row(entry), (1, 2, 3, 4, 5))]))

    async def purge_audit(self, before: float, limit: int) -> int:
        def step() -> int:
            if self._error is not None:
                return 0
            try:
                return self._wconn.execute(audit_rows.purge_sql("%s"), (before, limit)).rowcount
            except psycopg.Error as exc:
                self._fail(exc)
                return 0

        return await self._after_queued(step)

    async def commit(self) -> None:
        """Return once every write queued before this call is committed: everything queued since the
        last commit in one transaction, on the writer thread (in order)."""
        ops, self._pending = self._pending, []
        await asyncio.get_running_loop().run_in_executor(self._writer, self._write, ops)
        if self._error is not None:
            raise Unavailable(f"store cannot be written: {_reason(self._error)}")

    def commit_now(self) -> bool:
        """Always False: a commit is a round trip to the server, made off the event loop."""
        if self._error is not None:
            raise Unavailable(f"store cannot be written: {_reason(self._error)}")
        return False

    def _write(self, ops: list[_Op]) -> None:
        if self._error is not None or not ops:
            return
        if not self._leading:
            self._fail(RuntimeError("written before it holds the database lock"))
            return
        conn = self._wconn
        try:
            with conn.transaction(), conn.cursor() as cur:
                # All of a group's new jobs first (a job is changed only once stored), then for each job
                # the change the writes one by one, in order, would leave: the last of those with the
                # newest attempt (the compare-and-set refuses an older one after it).
                fresh = [row for kind, rows in ops if kind == "jobs_insert" for row in rows]
                changed: dict[int, tuple[Any, ...]] = {}
                for kind, rows in ops:
                    if kind == "jobs_update":
                        for row in rows:
                            seen = changed.get(row[16])
                            if seen is None or row[2] >= seen[2]:
                                changed[row[16]] = row
                if fresh:
                    with cur.copy(_COPY_JOBS) as copy:
                        for row in fresh:
                            copy.write_row(row)
                if changed:
                    cur.executemany(_UPDATE, list(changed.values()))
                for kind, rows in ops:
                    if rows and kind in _SQL:
                        cur.executemany(_SQL[kind], rows)
        except Exception as exc:  # the server went away, the session was ended, a full disk there
            self._fail(exc)

    async def _after_queued(self, step: Callable[[], _T]) -> _T:
        ops, self._pending = self._pending, []

        def run() -> _T:
            self._write(ops)
            return step()

        return await asyncio.get_running_loop().run_in_executor(self._writer, run)

    async def delete_expired_idempotency(self, now: float, limit: int) -> int:
        """Delete at most ``limit`` keys expired by ``now``, in a transaction of its own after the
        queued writes."""

        def step() -> int:
            if self._error is not None:
                return 0
            try:
                return self._wconn.execute(_IDEM_EXPIRE, (now, limit)).rowcount
            except psycopg.Error as exc:
                self._fail(exc)
                return 0

        return await self._after_queued(step)

    async def purge_finished(
        self,
        state: JobState,
        before: float,
        limit: int,
        after_seq: int = 0,
        *,
        dependency_failed_before: float | None = None,
    ) -> PurgeStep:
        """As :class:`control.store.sqlite.SQLiteStore` does, after the queued writes."""

        def step() -> PurgeStep:
            if self._error is not None:
                return PurgeStep([], None)
            conn = self._wconn
            try:
                with conn.transaction():
                    rows = conn.execute(purge_window("%s"), (int(state), after_seq, limit)).fetchall()
                    doomed, next_seq = purge_doomed(rows, before, dependency_failed_before, limit)
                    if doomed:
                        conn.execute("DELETE FROM jobs WHERE seq = ANY(%s)", ([seq for seq, _, _ in doomed],))
            except psycopg.Error as exc:
                self._fail(exc)
                return PurgeStep([], None)
            return PurgeStep([id_ for _, id_, _ in doomed], next_seq)

        return await self._after_queued(step)

    @property
    def healthy(self) -> bool:
        return self._error is None

    @property
    def failure(self) -> str:
        return "" if self._error is None else _reason(self._error)

    # ---- reads --------------------------------------------------------------------------------
    async def _read(self, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._on, "_rconn", fn)

    def _on(self, which: str, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``fn`` on the read connection named ``which`` (``_rconn`` or ``_kconn``), on a new one, once,
        when that one's session has ended. Writes end with their session (see the module docstring),
        but a read connection is no lock's: one that sat idle and was ended (a proxy or a server setting
        that ends idle sessions, an operator's clean-up) failed every GetJob, ListJobs and idempotency
        look-up of a control plane that led on, for as long as it ran.

        Raises:
            Unavailable: the read failed, or no new session could be had.
        """
        conn: psycopg.Connection[Any] = getattr(self, which)
        try:
            return fn(conn)
        except psycopg.Error as exc:
            # The query failed, not the session; or the store is closed, or failed and on its way out (a
            # connect to a server that is gone would hold the event loop for up to CONNECT_TIMEOUT_SEC).
            if not conn.closed or self._closed or self._error is not None:
                raise Unavailable(f"store cannot be read: {_reason(exc)}") from None
        try:
            conn = self._replace(conn)
        except psycopg.Error as exc:
            raise Unavailable(f"store cannot be read: {_reason(exc)}") from None
        setattr(self, which, conn)
        logger.info("store_reconnected", extra={"db": self.where})
        try:
            return fn(conn)
        except psycopg.Error as exc:
            raise Unavailable(f"store cannot be read: {_reason(exc)}") from None

    async def get(self, job_id: str) -> JobRecord | None:
        def q(c: psycopg.Connection[Any]) -> JobRecord | None:
            row = c.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone()
            return record(row) if row else None

        return await self._read(q)

    async def get_many(self, job_ids: Sequence[str]) -> list[JobRecord]:
        def q(c: psycopg.Connection[Any]) -> list[JobRecord]:
            return read_by_ids(c, "%s", job_ids)

        result: list[JobRecord] = await self._read(q)
        return result

    async def cancelled_chain(self, job_id: str) -> list[JobRecord]:
        def q(c: psycopg.Connection[Any]) -> list[JobRecord]:
            return read_cancelled_chain(c, "%s", job_id)

        return await self._read(q)

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
        if labels:
            # As the partial GIN index jobs_by_labels is written, so that the planner may use it.
            where.append("labels != '{}' AND labels::jsonb @> %s::jsonb")
            args.append(json.dumps(dict(labels)))
        if owners:
            where.append("owner = ANY(%s) AND owner != ''")
            args.append(list(owners))
        if states:
            where.append("state = ANY(%s)")
            args.append([int(s) for s in states])
        if job_type:
            where.append("type = %s")
            args.append(job_type)
        if error_code:
            where.append("error_code = %s")
            args.append(error_code)
        clause = f" WHERE {' AND '.join(where)}" if where else ""

        def q(c: psycopg.Connection[Any]) -> JobPage:
            # A server-side cursor, PAGE_FETCH_ROWS at a time, so first_page's cap bounds what is fetched:
            # a client-side one took the whole page first (1,000 jobs of 1 MiB payloads: 1 GB).
            with c.transaction(), c.cursor(name="corral_page") as cur:
                cur.itersize = PAGE_FETCH_ROWS
                cur.execute(
                    f"SELECT {COLUMNS} FROM jobs{clause} ORDER BY seq DESC LIMIT %s OFFSET %s", (*args, limit, offset)
                )
                rows = first_page(cur)
            total_row = c.execute(f"SELECT COUNT(*) FROM jobs{clause}", args).fetchone()
            return JobPage([record(r) for r in rows], int(total_row[0]) if total_row else 0)

        return await self._read(q)

    def load_active(self) -> Iterator[JobRecord]:
        # A server-side cursor, a batch at a time: a backlog can be millions of rows.
        done = [int(s) for s in TERMINAL]
        with self._rconn.transaction(), self._rconn.cursor(name="corral_active") as cur:
            cur.itersize = 2000
            cur.execute(f"SELECT {COLUMNS} FROM jobs WHERE NOT (state = ANY(%s)) ORDER BY seq", (done,))
            yield from map(record, cur)

    def count_by_state(self) -> dict[JobState, int]:
        rows = self._rconn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {JobState(s): int(n) for s, n in rows}

    def states(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        # On _kconn, as get_idempotency: the reader thread may be using _rconn, and SubmitJobs calls this
        # on the event loop. No ids, no round trip.
        ids = list(job_ids)
        if not ids:
            return {}
        rows = self._on(
            "_kconn", lambda c: c.execute("SELECT id, state FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall()
        )
        return {job_id: JobState(state) for job_id, state in rows}

    async def read_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        ids = list(job_ids)
        if not ids:
            return {}
        rows = await self._read(lambda c: c.execute("SELECT id, state FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall())
        return {job_id: JobState(state) for job_id, state in rows}

    def max_seq(self) -> int:
        row = self._rconn.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
        return int(row[0]) if row else 0

    def load_idempotency(self, now: float, limit: int | None = None) -> list[IdempotencyEntry]:
        rows = self._rconn.execute(
            "SELECT key, request_hash, job_id, expires_at FROM idempotency_keys WHERE expires_at > %s "
            "ORDER BY expires_at DESC LIMIT %s",
            (now, limit),
        ).fetchall()
        return [IdempotencyEntry(*r) for r in reversed(rows)]

    def get_idempotency(self, key: str) -> IdempotencyEntry | None:
        row = self._on(
            "_kconn",
            lambda c: c.execute(
                "SELECT key, request_hash, job_id, expires_at FROM idempotency_keys WHERE key = %s", (key,)
            ).fetchone(),
        )
        return IdempotencyEntry(*row) if row else None

    async def read_idempotency(self, keys: Sequence[str]) -> dict[str, IdempotencyEntry]:
        wanted = list(keys)
        if not wanted:
            return {}
        rows = await self._read(
            lambda c: c.execute(
                "SELECT key, request_hash, job_id, expires_at FROM idempotency_keys WHERE key = ANY(%s)", (wanted,)
            ).fetchall()
        )
        return {row[0]: IdempotencyEntry(*row) for row in rows}

    def load_job_types(self) -> list[JobTypeEntry]:
        rows = self._rconn.execute("SELECT name, schema, description FROM job_types").fetchall()
        return [JobTypeEntry(*r) for r in rows]

    async def list_audit(self, match: Mapping[str, str], limit: int, offset: int) -> AuditPage:
        return await self._read(lambda c: audit_rows.read_page(c, "%s", match, limit, offset))

    def load_accounts(self) -> list[AccountEntry]:
        rows = self._rconn.execute(
            "SELECT name, password_hash, session, created_at, password_changed_at FROM accounts"
        ).fetchall()
        return [AccountEntry(*r) for r in rows]

    def login_key(self, candidate: bytes) -> bytes:
        conn = self._rconn
        # ON CONFLICT DO NOTHING: of two control planes making the key at once, the first one's stays.
        conn.execute(
            "INSERT INTO settings (name, value) VALUES ('login_key', %s) ON CONFLICT (name) DO NOTHING",
            (candidate.hex(),),
        )
        (value,) = conn.execute("SELECT value FROM settings WHERE name = 'login_key'").fetchone() or (candidate.hex(),)
        return bytes.fromhex(value)

    def close(self) -> None:
        """Write what is still queued, then close the connections (which lets the lock go). Idempotent."""
        if self._closed:
            return
        self._stop.set()
        if self._prober is not None:
            self._prober.join()
        ops, self._pending = self._pending, []
        with contextlib.suppress(RuntimeError):
            self._writer.submit(self._write, ops).result()
        self._closed = True
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._close_connections()

    def _close_connections(self) -> None:
        for conn in self._connections:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def _reason(exc: BaseException) -> str:
    """One line from a driver error (psycopg's messages can run over several)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
