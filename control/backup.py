"""``python -m control.backup DEST [--db PATH]`` (``corral backup``): a consistent copy of a live store.

Copying ``corral.db`` with ``cp`` while a control plane runs can catch it between two writes, and
misses what still sits in ``corral.db-wal``. This reads the database in one read transaction with
SQLite's online backup, while the control plane goes on (WAL lets it write meanwhile), so the copy is
the store as it was at one instant: every job acknowledged before the backup began is in it.

The copy is written to ``DEST.partial``, checked (``PRAGMA quick_check``, and that it is a Corral
store), and only then renamed to ``DEST``, which must not exist yet. It prints the jobs in the copy by
state and exits 0; any failure is one line on stderr and exit 1 (2 for a bad command line).

Restore: stop the control plane, move the backup to the database path (removing the old
``-wal``/``-shm`` files), start it. The backup is one instant: jobs that were running then are
recovered as running and, as their workers are not there to report them, run again; jobs submitted
after it are not in it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from control.jobs import JobState
from control.store import sqlite_path
from corral.dburl import describe, is_postgres_url

__all__ = ["BackupError", "backup", "main"]


class BackupError(Exception):
    """The backup cannot be made; the message says why, naming the file."""


def backup(database: str, dest: str) -> dict[str, int]:
    """Copy the Corral store at ``database`` to ``dest`` (see the module); returns jobs by state name.

    Raises:
        BackupError: the database is missing or not a Corral store, ``dest`` exists, or the copy failed.
    """
    if is_postgres_url(database):
        raise BackupError(
            f"{describe(database)} is a PostgreSQL database: back it up with PostgreSQL's own tools "
            "(pg_dump, or the server's continuous archiving); this command copies a SQLite store"
        )
    database = sqlite_path(database)  # CORRAL_DB may name it as the control plane takes it: sqlite:///path
    if not os.path.isfile(database):
        raise BackupError(f"there is no database {database} (CORRAL_DB, --db)")
    if os.path.lexists(dest):
        raise BackupError(f"{dest} exists: give the backup a new name")
    partial = f"{dest}.partial"
    try:
        source = sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot open {database}: {exc}") from None
    try:
        with contextlib.closing(source), contextlib.closing(sqlite3.connect(partial)) as copy:
            _check_corral(source, database)
            source.backup(copy)
            if (verdict := copy.execute("PRAGMA quick_check").fetchone()[0]) != "ok":
                raise BackupError(f"the copy of {database} does not check out: {verdict}")
            counts = _counts(copy)
        os.replace(partial, dest)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {database} to {dest}: {exc}") from None
    except OSError as exc:
        raise BackupError(f"cannot write {dest}: {exc.strerror or exc}") from None
    finally:
        # With the partial copy goes its rollback journal, which a copy that failed part way (a full disk)
        # leaves beside it.
        for leftover in (partial, f"{partial}-journal", f"{partial}-wal", f"{partial}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    return counts


def _check_corral(conn: sqlite3.Connection, database: str) -> None:
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{database} is not a Corral database: {exc}") from None
    if "jobs" not in tables:
        raise BackupError(f"{database} is not a Corral database (it has no jobs table)")


def _counts(conn: sqlite3.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
    return {JobState(state).name: count for state, count in rows}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="corral backup",
        description="Copy a Corral store consistently, while its control plane runs.",
    )
    parser.add_argument("dest", help="the backup file to write (must not exist)")
    parser.add_argument(
        "--db",
        default=os.environ.get("CORRAL_DB") or "corral.db",
        help="the control plane's database (default $CORRAL_DB or corral.db)",
    )
    args = parser.parse_args(argv)
    try:
        counts = backup(args.db, args.dest)
    except BackupError as exc:
        print(f"corral backup: {exc}", file=sys.stderr)
        return 1
    jobs = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no jobs"
    print(f"backed up {args.db} to {args.dest}: {jobs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
