"""What a store URL (CORRAL_DB, --db) names, and how logs may show it; no database driver is imported here."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def is_postgres_url(url: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return url.startswith(("postgresql://", "postgres://"))


def describe(url: str) -> str:
    """``url`` as logs, messages and ``corral config --check`` may show it: a PostgreSQL URL without its
    password, whether in the user part or a ``password=`` parameter (libpq takes either)."""
    if not is_postgres_url(url):
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if parts.query:
        params = [
            f"{name}=***" if name.strip().lower() == "password" else param
            for param in parts.query.split("&")
            for name in [param.split("=", 1)[0]]
        ]
        parts = parts._replace(query="&".join(params))
    return urlunsplit(parts)
