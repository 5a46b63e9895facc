"""The write-ahead log when checkpoints cannot copy it back: a reader holding an old snapshot makes it grow
with every commit until the disk is full; that is logged, naming the likely cause, and the log is cut
back to WAL_LIMIT_BYTES once it can be copied again."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from control.store import sqlite as store_sqlite


def _fill(conn: sqlite3.Connection, rows: int) -> None:
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(3000),) for _ in range(rows)])
    conn.execute("COMMIT")


def test_a_blocked_checkpoint_is_logged_and_the_log_is_cut_back_once_it_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(store_sqlite, "WAL_WARN_BYTES", 1 << 20)
    path = str(tmp_path / "c.db")
    writer = store_sqlite._connect(path, "normal")
    writer.execute("CREATE TABLE t (b BLOB)")
    _fill(writer, 10)
    # Given a reader in another connection that holds its snapshot open (a sqlite3 shell, a backup tool)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    # When commits go on past the warning size, with checkpoints every so often
    warned = float("-inf")
    for _ in range(5):
        _fill(writer, 200)
        with caplog.at_level(logging.WARNING, logger=store_sqlite.__name__):
            warned = store_sqlite.checkpoint(writer, path, warned)
    # Then it is said once (not every checkpoint), with the log's size and what holds it
    blocked = [r for r in caplog.records if r.getMessage() == "store_checkpoint_blocked"]
    assert len(blocked) == 1, [r.getMessage() for r in caplog.records]
    assert blocked[0].wal_mb >= 1 and "reader" in blocked[0].cause  # type: ignore[attr-defined]
    # And once the reader ends, a checkpoint copies it all, and the log is cut back to its limit as it restarts
    reader.execute("COMMIT")
    reader.close()
    store_sqlite.checkpoint(writer, path, warned)
    assert writer.execute("PRAGMA journal_size_limit").fetchone()[0] == store_sqlite.WAL_LIMIT_BYTES
    writer.close()
