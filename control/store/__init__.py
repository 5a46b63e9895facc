"""Durable state: the Store protocol and its implementations.

Modules: ``base`` (the protocol and its small value types), ``rows`` (a job's row, for every SQL
store), ``sqlite`` (SQLiteStore, the embedded default) and ``schema.sql``, ``postgres``
(PostgresStore, shared by an active control plane and its standbys) and ``schema_postgres.sql``.
"""

from control.store.base import (
    AccountEntry,
    AuditEntry,
    AuditPage,
    IdempotencyEntry,
    JobPage,
    JobRows,
    JobTypeEntry,
    PurgeStep,
    Store,
)
from control.store.sqlite import SQLiteStore
from corral.dburl import is_postgres_url

__all__ = [
    "AccountEntry",
    "AuditEntry",
    "AuditPage",
    "IdempotencyEntry",
    "JobPage",
    "JobRows",
    "JobTypeEntry",
    "PurgeStep",
    "SQLiteStore",
    "Store",
    "open_store",
    "sqlite_path",
]


def open_store(url: str, *, sync: str = "normal") -> Store:
    """Open the store named by ``url``: a ``postgresql://`` URL, or a SQLite file path (or
    ``sqlite:///path``). Call :meth:`Store.lead` before writing it.

    Raises:
        OSError: it cannot be opened; the message names it (without a password).
    """
    if is_postgres_url(url):
        from control.store.postgres import PostgresStore  # the driver only for the store that needs it

        return PostgresStore(url)
    return SQLiteStore(sqlite_path(url), sync=sync)


def sqlite_path(url: str) -> str:
    """The file a SQLite store ``url`` names: a path, or ``sqlite:///path`` (``sqlite:////abs/path``)."""
    return url.removeprefix("sqlite:///")
