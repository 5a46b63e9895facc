"""What a store URL (CORRAL_DB, --db) names, and how logs may show it; no database driver is imported here."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def is_postgres_url(url: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return url.startswith(("postgresql://", "postgres://"))


def describe(url: str) -> str:
    """``url`` as logs and messages may show it: a PostgreSQL URL without its password."""
    if not is_postgres_url(url):
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
