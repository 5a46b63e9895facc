"""Durable state: the Store protocol and its implementations.

Modules: ``base`` (the protocol and its small value types), ``sqlite`` (SQLiteStore, the embedded
default), ``schema.sql`` (the DDL).
"""

from control.store.base import IdempotencyEntry, JobPage, JobTypeEntry, Store
from control.store.sqlite import SQLiteStore

__all__ = ["IdempotencyEntry", "JobPage", "JobTypeEntry", "SQLiteStore", "Store", "open_store"]


def open_store(url: str, *, sync: str = "normal") -> Store:
    """Open the store named by ``url``: a SQLite file path (or ``sqlite:///path``)."""
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
    return SQLiteStore(path, sync=sync)
