"""The audit log's rows (see :mod:`control.audit`), shared by every SQL store: the columns, the
filters a listing may use, and the reads, written once for any DB-API connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from control.store.base import AuditEntry, AuditPage

COLUMNS = "time, actor, action, target, outcome, request_id"
"""What an event stores; ``seq`` is the store's own (an increasing key)."""
FILTERS = ("actor", "action", "target", "outcome")
"""The columns a listing may ask for an exact value of."""


def row(entry: AuditEntry) -> tuple[float, str, str, str, str, str]:
    """The values an INSERT of ``entry`` writes, in :data:`COLUMNS` order (``seq`` is left to the store)."""
    return (entry.time, entry.actor, entry.action, entry.target, entry.outcome, entry.request_id)


def read_page(conn: Any, placeholder: str, match: Mapping[str, str], limit: int, offset: int) -> AuditPage:
    """:meth:`Store.list_audit` on ``conn`` (SQLite or PostgreSQL, whose parameters are written
    ``placeholder``). Unknown keys of ``match`` are a bug of the caller: KeyError, not a silent filter."""
    unknown = set(match) - set(FILTERS)
    if unknown:
        raise KeyError(f"no audit filter {sorted(unknown)}")
    wanted = [(column, match[column]) for column in FILTERS if match.get(column)]
    where = " AND ".join(f"{column} = {placeholder}" for column, _ in wanted)
    clause = f" WHERE {where}" if where else ""
    args = [value for _, value in wanted]
    rows = conn.execute(
        f"SELECT {COLUMNS}, seq FROM audit{clause} ORDER BY seq DESC LIMIT {placeholder} OFFSET {placeholder}",
        (*args, limit, offset),
    ).fetchall()
    total = conn.execute(f"SELECT COUNT(*) FROM audit{clause}", args).fetchone()[0]
    return AuditPage([AuditEntry(*r) for r in rows], int(total))


def purge_sql(placeholder: str) -> str:
    """Deletes the oldest events recorded by a time, at most a number of them (time, limit)."""
    # Oldest by time, as the index on (time, seq) holds them: ordered by seq alone, the planner walks
    # the whole log in seq order to find none old enough (every sweep between two expiries).
    return (
        f"DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE time <= {placeholder} "
        f"ORDER BY time, seq LIMIT {placeholder})"
    )
